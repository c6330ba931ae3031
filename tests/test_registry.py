"""The method registry, the model registry and the pre-flight checks (docs/architecture.md)."""

import ast
from pathlib import Path

import pytest
import torch

from hetfl import launch, methods
from hetfl.common.config import ConfigError, Key
from hetfl.methods import SCHEMA, validate
from hetfl.common.models import MODELS, build_model
from hetfl.common.registry import NODE_QUERY, MethodSpec
from hetfl.data.catalog import DATASETS

ROOT = Path(__file__).resolve().parent.parent


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
    return out


def test_common_imports_no_method_package():
    packages = {p.split(".")[1] for p in methods.PACKAGES} | {"methods", "client_app", "server_app", "launch", "cluster"}
    for path in (ROOT / "hetfl" / "common").glob("*.py"):
        bad = [m for m in _imports(path) if m.startswith("hetfl.") and m.split(".")[1] in packages]
        assert not bad, f"{path.name} imports {bad}"


def test_data_imports_nothing_of_hetfl_but_itself():
    """hetfl/data stands below hetfl.common and the method packages, which build on it."""
    for path in (ROOT / "hetfl" / "data").glob("*.py"):
        bad = [m for m in _imports(path) if m.split(".")[0] == "hetfl" and not m.startswith("hetfl.data")]
        bad += [f"{'.' * n.level}{n.module or ''}" for n in ast.walk(ast.parse(path.read_text()))
                if isinstance(n, ast.ImportFrom) and n.level > 1]
        assert not bad, f"{path.name} imports {bad}"


def test_no_function_over_60_lines_without_a_one_line_reason():
    """A function of hetfl/ longer than 60 lines (signature and docstring included) carries a comment line right above
    its ``def`` (or its decorators) saying why."""
    long = []
    for path in sorted((ROOT / "hetfl").rglob("*.py")):
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno + 1 > 60:
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                if not lines[first - 2].strip().startswith("#"):
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert not long, long


def test_every_declared_entry_point_resolves_and_every_message_type_is_served():
    from hetfl.client_app import app

    served = set(app._registered_funcs)
    for name, spec in methods.METHODS.items():
        assert callable(methods.server_for(name))
        for mtype in spec.handlers:
            assert callable(methods.handler_for(name, mtype))
            assert (mtype if "." in mtype else f"{mtype}.default") in served
    assert NODE_QUERY in served
    assert set(SCHEMA["method"].choices) == set(methods.METHODS)


def test_message_type_strings_are_written_once():
    """Each message type string appears as a literal in exactly one module (its package's __init__)."""
    literals: dict[str, list[str]] = {}
    for path in (ROOT / "hetfl").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                literals.setdefault(node.value, []).append(str(path.relative_to(ROOT)))
    for mtype in methods.message_types() + [NODE_QUERY]:
        if mtype == "train":
            continue  # Flower's own default message type
        assert len(literals.get(mtype, [])) == 1, (mtype, literals.get(mtype))


def test_handler_for_an_undeclared_message_type_names_the_method():
    with pytest.raises(ValueError, match="'fedavg' has no handler for message type 'train.shefl'"):
        methods.handler_for("fedavg", "train.shefl")


def test_a_new_method_is_one_declaration(monkeypatch):
    """What a fourth package's `METHOD` does once listed: its name and keys validate, its entry points resolve."""
    def check(cfg):
        if cfg["method"] == "toy" and cfg["toy-k"] > cfg["num-server-rounds"]:
            raise ConfigError("run-config key 'toy-k' too large")

    spec = MethodSpec(names=("toy",), server="hetfl.baselines.server_app:run",
                      handlers={"train.toy": "hetfl.baselines.client_app:train"},
                      keys=(Key("toy-k", int, 1, "toy: k", min=1),), check=check)
    specs = (*methods.SPECS, spec)
    schema = methods.compose_schema(specs)
    monkeypatch.setattr(methods, "METHODS", methods.method_table(specs))
    cfg = schema.validate({"method": "toy", "toy-k": 2, "num-server-rounds": 3})
    assert cfg["toy-k"] == 2 and methods.handler_for("toy", "train.toy").__name__ == "train"
    assert "toy" in schema["method"].choices and "toy" not in methods.SCHEMA["method"].choices  # values, not state
    with pytest.raises(ConfigError, match="toy-k"):
        schema.validate({"method": "toy", "toy-k": 5, "num-server-rounds": 3})
    with pytest.raises(ConfigError, match="unknown run-config key 'toy-k'"):
        methods.validate({"method": "fedavg", "toy-k": 2})
    with pytest.raises(RuntimeError, match="declared by two packages"):
        methods.method_table((*specs, MethodSpec(names=("toy",), server="x:y")))


IMAGE_DATASETS = [n for n, d in DATASETS.items() if d.kind == "image"]


@pytest.mark.parametrize("model", [n for n, s in MODELS.items() if s.kind == "image"])
def test_model_registry_knows_which_inputs_each_model_runs_on(model):
    """A pair the registry accepts builds and runs a forward pass; a pair it rejects fails in the forward pass."""
    for ds in IMAGE_DATASETS:
        info = DATASETS[ds]
        why = MODELS[model].unsupported(info.kind, info.shape)
        try:
            with torch.no_grad():
                out = build_model(model, info.num_classes, info.shape, width=0.25).eval()(torch.zeros(2, *info.shape))
            ran = out.shape == (2, info.num_classes)
        except (RuntimeError, ValueError):
            ran = False
        assert ran == (why is None), (model, ds, why)
        if why is None:
            validate({"model": model, "dataset": ds})
        else:
            with pytest.raises(ConfigError, match=f"'model' = '{model}' does not fit dataset '{ds}'"):
                validate({"model": model, "dataset": ds})


def test_prunable_models_are_the_ones_with_widths():
    for name, spec in MODELS.items():
        if spec.prunable:
            assert build_model(name, 10, (3, 32, 32), widths=spec.widths) is not None
        elif spec.builder is not None:
            with pytest.raises(ValueError, match="per-layer widths"):
                build_model(name, 10, (3, 32, 32), widths=(8,))
    with pytest.raises(ConfigError, match="width-prunable"):
        validate({"method": "adaptivefl", "model": "mobilenetv2", "dataset": "cifar10"})


# --- pre-flight: one line, exit 2, nothing started ------------------------------------------------

@pytest.mark.parametrize("args,fragment", [
    (["configs/quickstart.toml", "--set", 'model="text"'], "'model' = 'text' does not fit dataset 'fashion_mnist'"),
    (["configs/quickstart.toml", "--run-config", 'model="text" lr=0.1'], "'model' = 'text' does not fit dataset"),
    # Flower's own --run-config syntax: strings quoted, and a preset never after the overrides
    (["configs/quickstart.toml", "--set", "model=text"], "--set 'model=text': 'text' is not a TOML value; quote strings"),
    (["--set", "lr=0.1", "configs/quickstart.toml"], "--set 'configs/quickstart.toml': expected key=value pairs"),
    (["configs/quickstart.toml", "--supernodes", "10"], "'min-available-nodes' = 20 exceeds the 10 simulated SuperNodes"),
    (["configs/quickstart.toml", "--supernodes", "20", "--set", 'dataset="cifar10"'], "'dataset' = 'cifar10': no local files"),
    (["configs/quickstart.toml", "--supernodes", "20", "--set", "lr=-1"], "'lr' = -1 is out of range"),
    (["configs/nope.toml"], "preset 'configs/nope.toml' does not exist"),
    (["configs/quickstart.toml", "--set", "lr"], "--set 'lr': expected key=value pairs"),
])
def test_launcher_bad_input_is_one_line_and_exit_2_before_anything_starts(args, fragment, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(launch, "superlink", lambda *a, **k: pytest.fail("a SuperLink was started"))
    assert launch.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and fragment in err[0], err


@pytest.fixture
def no_hf_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache, no offline switch and no proxy: whether the hub is tried is up to pre-flight.
    huggingface_hub reads its settings (HF_HOME, HF_HUB_CACHE, HF_HUB_OFFLINE, HF_ENDPOINT) from the environment
    once, when imported: they are set on its constants here."""
    from huggingface_hub import constants

    for var in ("HF_DATASETS_OFFLINE", "HF_DATASETS_CACHE", "http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setattr(constants, "HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "https://huggingface.co")
    return tmp_path / "hf"


@pytest.mark.parametrize("source,tried", [("auto", "no local files found (looked in data-dir = '') and the hub"),
                                          ("hub", "the Hugging Face hub")])
def test_a_dataset_neither_here_nor_on_the_hub_fails_preflight_at_once(source, tried, no_hf_cache, capsys, monkeypatch):
    """data-source auto (every CIFAR, SVHN and AG News preset) or hub, no local files, the hub unreachable: one line
    naming the dataset, what was tried and how to get it, exit 2, within seconds (it once failed 46 s later in the
    ClientApps with 3 tracebacks). The hub is looked at once (the probe is replaced: no network in tests)."""
    from hetfl.data import hub

    calls = []
    monkeypatch.setattr(hub, "_probe_hub", lambda hub_id, timeout: calls.append((hub_id, timeout)) or
                        f"the hub did not answer within {timeout:g} s ({hub.hub_endpoint()}/api/datasets/{hub_id})")
    monkeypatch.setattr(launch, "superlink", lambda *a, **k: pytest.fail("a SuperLink was started"))
    monkeypatch.chdir(ROOT)
    t0 = __import__("time").monotonic()
    assert launch.main(["configs/quickstart.toml", "--set", 'dataset="cifar10"', f'data-source="{source}"']) == 2
    assert __import__("time").monotonic() - t0 < 5
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: run-config key 'dataset' = 'cifar10': {tried} is not usable here (the hub did not answer "
                   f"within 5 s (https://huggingface.co/api/datasets/uoft-cs/cifar10); data-source = {source!r}); "
                   f"to get it: {DATASETS['cifar10'].how_to_get}" + (", and set data-source = 'local'" if source == "hub" else
                                                                     ", or let this machine reach huggingface.co")]
    assert calls == [("uoft-cs/cifar10", hub.HUB_PROBE_TIMEOUT_S)]


def test_preflight_sends_nothing_offline_and_takes_a_cached_hub_dataset(no_hf_cache, monkeypatch):
    from huggingface_hub import constants

    from hetfl.data import hub

    monkeypatch.setattr(hub, "_probe_hub", lambda *a: pytest.fail("the hub was contacted"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(launch.PreflightError, match="'cifar10': no local files found .* not in the Hugging Face cache "
                                                    "and HF_HUB_OFFLINE is set; data-source = 'auto'"):
        launch.preflight({"dataset": "cifar10", "data-source": "auto"})
    with pytest.raises(launch.PreflightError, match="'digits': the Hugging Face hub is not usable here \\(it has no "
                                                    "Hugging Face hub version"):
        launch.preflight({"dataset": "digits", "data-source": "hub"})
    (no_hf_cache / "datasets" / "uoft-cs___cifar10").mkdir(parents=True)  # what `datasets` caches a hub load as
    for source in ("auto", "hub"):
        assert launch.preflight({"dataset": "cifar10", "data-source": source})["dataset"] == "cifar10"
    assert launch.preflight({"dataset": "digits", "data-source": "auto"})["dataset"] == "digits"  # local: scikit-learn


def test_the_hub_probe_is_one_bounded_request(no_hf_cache, monkeypatch):
    """The real probe against a hub on loopback: a 200 is usable, a 404 names the code, and a hub that accepts
    the connection but never answers costs the time limit, not more."""
    import http.server
    import socket
    import threading
    import time

    from huggingface_hub import constants

    from hetfl.data import hub

    class Hub(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            there = self.path == "/api/datasets/org/there"
            body = b'{"id": "org/there"}' if there else b""
            self.send_response(200 if there else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)  # accepts (in the kernel) and never answers
    try:
        monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.server_port}")
        assert hub.hub_unavailable("org/there", timeout=5) is None
        assert "the hub answered HTTP 404" in hub.hub_unavailable("org/gone", timeout=5)
        monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{silent.getsockname()[1]}")
        t0 = time.monotonic()
        assert hub.hub_unavailable("org/there", timeout=0.5).startswith("the hub did not answer")
        assert time.monotonic() - t0 < 2
    finally:
        server.shutdown()
        server.server_close()
        silent.close()


def test_cuda_device_on_a_machine_without_one_fails_preflight(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(launch.PreflightError, match="'torch-device' = 'cuda:1': this machine has 0 CUDA"):
        launch.preflight({"torch-device": "cuda:1"})


def test_debug_shows_the_traceback(monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(ConfigError):
        launch.main(["configs/quickstart.toml", "--debug", "--set", 'model="text"'])


def test_cluster_submit_checks_before_starting(capsys, monkeypatch):
    from hetfl import cluster

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(cluster, "local_cluster", lambda *a, **k: pytest.fail("a cluster was started"))
    assert cluster.main(["--nodes", "2", "--submit", "configs/quickstart.toml", "--set", "dirichlet-alpha=0"]) == 2
    assert "'dirichlet-alpha' = 0" in capsys.readouterr().err


def test_every_method_has_the_title_readers_know_it_by():
    """Results pages and plots name methods through the registry (hetfl.methods.title), not a table of their own."""
    from hetfl.methods import METHODS, title

    missing = [m for m in METHODS if m not in METHODS[m].titles]
    assert missing == [], missing
    assert title("fedcvae") == "FedCVAE-Ens" and title("all-large") == "All-Large"
    assert len({title(m) for m in METHODS}) == len(METHODS)  # no two methods share a name on a page
