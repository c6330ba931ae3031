"""examples/ (issue #78): Flower apps of their own that use hetfl's public API, each beside its FedAvg twin.

Each example is a Flower App with its own pyproject, model and data (an MLP on scikit-learn's digits). The tests
count its Python against the twin's (at most 30 lines more), check that it uses only names in ``hetfl.__all__``,
run it in process twice (other random node ids, the same numbers), and run it with ``flwr run .`` in the Simulation
Engine: accuracy rises and every round's metric equals the in-process run's at the same seed; the SHEFL example also
against a SuperLink and two SuperNodes (the Deployment Engine: tests/test_two_supernodes.py).
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

import hetfl
from hetfl.inprocess import task_identity
from hetfl.launch import free_port

from .test_flwr_run import _listener, _start_time, _still_ours
from .test_start import UserGrid

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TWIN = "fedavg-digits"
SEEDED = ("shefl-digits", "adaptivefl-digits", "fens-digits")  # one per seed method
NODES = 4


def _package(example: str) -> Path:
    return EXAMPLES / example / example.replace("-", "_")


def trained(example: str, metrics: dict) -> bool:
    """Whether a run trained: accuracy rose by 0.3 over the rounds; FENS's round 0 is after its one-shot phase 1
    (the ensemble, 10 classes: 0.1 by chance) and its rounds train the aggregator, so there: far above chance."""
    if example == "fens-digits":
        return metrics["0"]["accuracy"] > 0.6 and sorted(metrics) == ["0", "1", "2"]
    return metrics["2"]["accuracy"] > metrics["0"]["accuracy"] + 0.3


def _lines(example: str) -> int:
    return sum(len(p.read_text().splitlines()) for p in _package(example).glob("*.py"))


def _config(example: str) -> dict:
    return tomllib.loads((EXAMPLES / example / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]


@contextlib.contextmanager
def _importable(example: str):
    sys.path.insert(0, str(EXAMPLES / example))
    try:
        yield importlib.import_module(example.replace("-", "_") + ".server_app"), \
            importlib.import_module(example.replace("-", "_") + ".client_app")
    finally:
        sys.path.remove(str(EXAMPLES / example))


def in_process(example: str, nodes: int = NODES, node_config: dict | None = None, **overrides) -> dict[str, dict[str, float]]:
    """The example's ServerApp on an in-process grid of `nodes` nodes (`node_config`: what every node declares)."""
    cfg = {**_config(example), **overrides}
    with _importable(example) as (server, client), task_identity():
        metrics = server.run(UserGrid(client.app, nodes, cfg, node_config), cfg)
    return {str(r): dict(m) for r, m in metrics.items()}


@pytest.mark.parametrize("example", SEEDED)
def test_an_example_is_at_most_30_lines_more_than_its_fedavg_twin_and_uses_only_the_public_api(example):
    assert _lines(example) <= _lines(TWIN) + 30, (_lines(example), _lines(TWIN))
    used = set()
    for path in _package(example).glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hetfl"):
                pytest.fail(f"{path.name}: imports from {node.module}; the examples use `import hetfl` only")
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "hetfl":
                used.add(node.attr)
    assert used and used <= set(hetfl.__all__), used - set(hetfl.__all__)


@pytest.mark.parametrize("example", SEEDED)
def test_an_example_trains_and_is_the_same_run_at_other_node_ids(example):
    a, b = in_process(example), in_process(example)
    assert a == b  # UserGrid draws other node ids and shuffles the replies in each run
    assert trained(example, a), a


def test_the_fedavg_twin_trains():
    """Flower's FedAvg samples node ids with `random`: the twin's runs differ at other node ids (the examples' do not)."""
    a = in_process(TWIN)
    assert trained(TWIN, a), a


@pytest.mark.slow
def test_examples_run_with_flwr_run_in_the_simulation_engine_as_in_process(tmp_path):
    """`flwr run .` in each seed method's example directory (Flower's auto-started local SuperLink, one for all of them, stopped
    the README's way after): exit 0, and the per-round metrics the ServerApp wrote equal the in-process run's."""
    if shutil.which("lsof") is None:
        pytest.skip("lsof (the README's stop command) is not installed")
    port = free_port()
    control_port = free_port(port)
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
           "FLWR_HOME": str(tmp_path / "flwr-home"), "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
           "FLWR_DISABLE_UPDATE_CHECK": "1", "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(port),
           "FLWR_LOCAL_CONTROL_API_PORT": str(control_port)}
    seen: dict[int, int | None] = {}
    try:
        for example in SEEDED:  # the twin is Flower's FedAvg app: in process is enough (test_the_fedavg_twin_trains)
            out = tmp_path / f"{example}.json"
            cmd = ["flwr", "run", ".", "--run-config", f"out='{out}'", "--federation-config",
                   f"num-supernodes={NODES} client-resources-num-cpus=1", "--stream"]
            run = subprocess.run(cmd, cwd=EXAMPLES / example, env=env, capture_output=True, text=True, timeout=300)
            assert run.returncode == 0 and out.exists(), (run.stdout + run.stderr)[-4000:]
            got = json.loads(out.read_text())
            assert got == in_process(example), (example, got, run.stdout[-2000:])  # the log names a node left plain
            assert trained(example, got), got
        for pid in _listener(port):
            seen.setdefault(pid, _start_time(pid))
        subprocess.run(["bash", "-c", f"kill $(lsof -t -sTCP:LISTEN -iTCP@127.0.0.1:{port})"], check=True)
        stop_by = time.monotonic() + 30
        while _still_ours(seen) and time.monotonic() < stop_by:
            time.sleep(0.3)
    finally:
        for pid in _listener(port):
            seen.setdefault(pid, _start_time(pid))
        for pid in _still_ours(seen):  # a failing test leaks nothing
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


# The SHEFL example on a SuperLink and two SuperNodes (the Deployment Engine) runs in
# tests/test_two_supernodes.py, on the two SuperNodes that test starts.
