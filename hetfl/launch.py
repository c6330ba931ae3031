"""Run the app in Flower's Simulation Engine with a SuperLink this process owns.

``flwr run .`` in Flower 1.41 auto-starts a detached SuperLink that outlives the run.
This launcher instead starts ``flower-superlink --simulation`` on free loopback ports
with a private FLWR_HOME, submits the run with ``flwr run . <connection> --stream``,
and stops the SuperLink's whole process group (ServerApp/simulation executors and Ray
included) when the run ends or fails. It is what ``make run``, the reproduce scripts and
the end-to-end tests use:

    python -m hetfl.launch configs/fedavg/fmnist-dir0.6.toml --supernodes 100 \
        --set num-server-rounds=30

It prints the run's results directory and final accuracy, and exits non-zero when the
run fails or leaves no metrics.json. With ``--ray-address HEAD:PORT`` the simulation joins a running
Ray cluster of several hosts instead of starting Ray on this one (docs/ray-cluster.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LAST_SESSION: int | None = None  # pid of the most recent SuperLink, for leak checks


def free_port(*taken: int) -> int:
    """An unused TCP port on 127.0.0.1, none of `taken`: ports handed out before and not bound yet (the OS may give
    a released port again at once: a SuperLink whose health server drew its main port exited 1)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in taken:
            return port


def _bin(name: str) -> str:
    """Path of a console script of this interpreter's environment."""
    cand = Path(sys.executable).parent / name
    return str(cand) if cand.exists() else (shutil.which(name) or name)


def flwr_env(flwr_home: Path) -> dict[str, str]:
    """Environment for flwr processes: private FLWR_HOME, no per-run dependency installs."""
    env = os.environ.copy()
    # SuperLink/SuperExec spawn flwr console scripts by name: put this environment's first
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["FLWR_HOME"] = str(flwr_home)
    env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
    env["FLWR_DISABLE_UPDATE_CHECK"] = "1"
    env.setdefault("RAY_DEDUP_LOGS", "0")
    # Ray's FutureWarning about CUDA_VISIBLE_DEVICES for num_gpus=0 actors: a note on a future default, not on this run
    env["PYTHONWARNINGS"] = ",".join(filter(None, [env.get("PYTHONWARNINGS"), "ignore::FutureWarning:ray._private.worker"]))
    return env


# Flower's simulation prints these for every run: a note on its default federation size (the launcher always sets
# num-supernodes) and how to change it (--supernodes does). The launcher leaves them out of what it relays.
FLOWER_NOISE = (b"default simulated SuperNodes changed from 10 to 2", b"To change federation size, use the following",
                b"flwr federation simulation-config")


def relayed(line: bytes) -> bool:
    """Whether the launcher shows a line of the run's stream (False for :data:`FLOWER_NOISE`)."""
    return not any(n in line for n in FLOWER_NOISE)


@dataclass
class SuperLink:
    """A running SuperLink process group and how to reach it."""

    proc: subprocess.Popen
    home: Path
    connection: str  # name of the connection in FLWR_HOME/config.toml
    address: str  # host:port of the HTTP API (Control, Fleet and Runtime)
    cmd: list[str] = field(default_factory=list)  # how it was started (restart)
    env: dict[str, str] = field(default_factory=dict)

    def restart(self, timeout: float = 15.0) -> None:
        """Stop the SuperLink (the runs' ServerApps with it) and start it again with the same command, state file,
        address and certificates, as a server that reboots does; SuperNodes reconnect by themselves."""
        self.stop(timeout)
        with open(self.home / "superlink.stdout", "ab") as out:
            self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        _wait_port(self.address, self.proc, self.home / "superlink.log")

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the SuperLink and everything it started (SuperExec, ServerApp, simulation, Ray).

        Flower's executors start sessions of their own and Ray's daemons process groups
        of their own, so neither a process group nor a session covers them all. The
        process tree is found by parent links and by session ids (which survive when a
        parent exits and its children are re-parented), SIGTERMed, and SIGKILLed if
        still alive after `timeout`.
        """
        stop_tree([self.proc], timeout)


def stop_tree(procs: list[subprocess.Popen], timeout: float = 15.0) -> None:
    """SIGTERM `procs` and every process descending from them (:func:`process_tree`), SIGKILL what is still alive
    after `timeout`, and reap `procs`."""
    found: set[int] = {p.pid for p in procs}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        live = process_tree(found)
        found |= set(live)
        for pid in live:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for p in procs:
                p.poll()  # reap the roots
            live = process_tree(found)
            found |= set(live)
            if not live:
                break
            time.sleep(0.2)
        if not live:
            break
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(5)


def _proc_table() -> dict[int, tuple[int, int, str]]:
    """pid -> (ppid, session id, status) of every process (psutil; the session id by os.getsid)."""
    import psutil

    table = {}
    for proc in psutil.process_iter(["ppid", "status"]):
        try:
            table[proc.pid] = (proc.info["ppid"], os.getsid(proc.pid), proc.info["status"])
        except (OSError, psutil.Error):  # gone meanwhile, or not ours to ask
            continue
    return table


def process_tree(roots: set[int]) -> list[int]:
    """Live (non-zombie) processes descending from `roots` by parent link or by session id.

    Flower's executors start sessions of their own and Ray's daemons are re-parented when their parent exits, so a
    parent walk alone misses some; a session id survives re-parenting.
    """
    import psutil

    table = _proc_table()
    found, changed = set(roots), True
    while changed:
        changed = False
        for pid, (ppid, sid, _) in table.items():
            if pid not in found and (ppid in found or sid in found):
                found.add(pid)
                changed = True
    return sorted(p for p in found if p in table and table[p][2] != psutil.STATUS_ZOMBIE)


CPU_CGROUP = Path("/sys/fs/cgroup/cpu")  # cgroup v1's cpu controller


@contextlib.contextmanager
def cpu_capped(name: str, share: float, root: Path = CPU_CGROUP) -> Iterator[Path]:
    """A cgroup v1 cpu group that caps its processes at `share` of one core (``cpu.cfs_quota_us`` over a 100 ms
    period): a slow device on this machine (root; docs/fleets.md#measured). Processes left in it when the block ends
    go back to the root group, and the group is removed. OSError where it cannot be made."""
    group = root / name
    group.mkdir()
    try:
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text(str(int(share * 100000)))
        yield group
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError), open(root / "cgroup.procs", "w") as f:
                f.write(pid)
        group.rmdir()


def in_cgroup(group: Path, cmd: list[str]) -> list[str]:
    """`cmd` run inside `group` from its start: everything it starts (a SuperNode's SuperExec and ClientApps) too."""
    return ["sh", "-c", f'echo $$ > {group}/cgroup.procs && exec "$@"', "sh", *cmd]


def connect_address(host: str, port: int) -> str:
    """host:port that reaches a server bound to `host` from this machine (a wildcard means loopback; IPv6 in [])."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _wait_port(address: str, proc: subprocess.Popen, log_file: Path, timeout: float = 60.0) -> None:
    host, port = address.rsplit(":", 1)
    host = host.strip("[]")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"flower-superlink exited with {proc.returncode}; see {log_file}")
        try:
            socket.create_connection((host, int(port)), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"flower-superlink did not listen on {address} within {timeout}s; see {log_file}")


@contextlib.contextmanager
def superlink(home: Path | None = None, simulation: bool = True, extra_args: list[str] | None = None,
              tls: bool = False, state_file: bool | None = None, host: str = "127.0.0.1",
              port: int | None = None, env: dict[str, str] | None = None) -> Iterator[SuperLink]:
    """Start a SuperLink (own process group) on `host`:`port` (default: a free loopback port); stop it on exit.

    `host` other than loopback serves it to other machines (``python -m hetfl.cluster --address``,
    docs/deployment.md); the connection written to `<home>/config.toml` reaches it from this machine. With `tls`, `extra_args` carry --ssl-* files and the connection trusts `<home>/certs/ca.crt`.
    `state_file` keeps the SuperLink's state (runs, messages) in `<home>/state.db` (SQLite) instead
    of memory; default: only for a deployment SuperLink. In simulation every model passes through
    this state twice a round: with SQLite a light FedAvg round (`make bench` (a)) took 2.62 s
    instead of 1.93 s. `env` adds variables to its environment (``RAY_ADDRESS``: the simulation joins that Ray
    cluster, docs/ray-cluster.md).
    """
    if state_file is None:
        state_file = not simulation
    own_home = home is None
    home = Path(tempfile.mkdtemp(prefix="hetfl-flwr-")) if home is None else home
    home.mkdir(parents=True, exist_ok=True)
    # Flower 1.41 serves the Control, Fleet and Runtime APIs on one HTTP port.
    port = port or free_port()
    address = connect_address(host, port)
    log_file = home / "superlink.log"
    cmd = [
        _bin("flower-superlink"), *([] if tls else ["--insecure"]), "--isolation", "subprocess",
        "--host", host, "--port", str(port),
        "--health-server-address", f"127.0.0.1:{free_port(port)}",
        "--log-file", str(log_file), "--disable-runtime-dependency-installation",
    ] + (["--database", str(home / "state.db")] if state_file else []) + (["--simulation"] if simulation else []) + (extra_args or [])
    security = f'root-certificates = "{home / "certs" / "ca.crt"}"\n' if tls else "insecure = true\n"
    (home / "config.toml").write_text(
        '[superlink]\ndefault = "hetfl"\n\n[superlink.hetfl]\n'
        f'address = "{address}"\n{security}'
    )
    run_env = {**flwr_env(home), **(env or {})}
    with open(home / "superlink.stdout", "wb") as out:
        proc = subprocess.Popen(cmd, env=run_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    link = SuperLink(proc, home, "hetfl", address, cmd, run_env)
    global LAST_SESSION
    LAST_SESSION = proc.pid
    try:
        _wait_port(address, proc, log_file)
        yield link
    finally:
        link.stop()
        if own_home and os.environ.get("HETFL_KEEP_FLWR_HOME") != "1":
            shutil.rmtree(home, ignore_errors=True)


def write_run_config(path: Path, config_file: str | None, overrides: dict[str, Any]) -> Path:
    """Merge the preset file and the overrides into one TOML file (flwr takes a file or pairs, not both)."""
    import tomli_w

    merged = tomllib.loads(Path(config_file).read_text()) if config_file else {}
    merged.update(overrides)
    path.write_text(tomli_w.dumps(merged))
    return path


class PreflightError(ValueError):
    """Something that would make the run fail is wrong before any process starts (one line: key, value, allowed)."""


def load_preset(config_file: str | None) -> dict[str, Any]:
    """The preset's keys (empty without a file); PreflightError if the file is missing or not TOML."""
    if not config_file:
        return {}
    path = Path(config_file)
    if not path.is_file():
        raise PreflightError(f"preset {config_file!r} does not exist; expected a TOML file such as configs/quickstart.toml")
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise PreflightError(f"preset {config_file!r} is not valid TOML: {err}") from None


def preflight(run_config: dict[str, Any], num_supernodes: int | None = None) -> dict[str, Any]:
    """Check what can be checked before a SuperLink, Ray or any ClientApp starts; return the validated config.

    The config's keys, types and ranges, no key that the method does not read, and whether the model fits the
    dataset (:func:`validate`); that the
    dataset can be loaded from its `data-source` on this machine (a ``hub:``/``dir:`` dataset: that it is readable,
    has the columns and labels the keys name, and a test split or ``server-data-path``); that ``server-data-path``
    fits the run; that files the method's ``MethodSpec.preflight`` reads exist and fit (a saved ensemble to reuse,
    checked on its settings only); that a bring-your-own ``model`` builds and maps a batch to logits; that a CUDA `torch-device` exists here
    (simulation and local clusters run here); and that `min-available-nodes` does not exceed the simulated federation.
    Raises :class:`~hetfl.common.config.ConfigError` or :class:`PreflightError` with one line.
    """
    from hetfl.methods import validate
    from hetfl.common.models import MODELS, check_builder
    from hetfl.common.registry import load
    from hetfl.methods import spec_for

    cfg = validate(run_config, given=run_config)  # a preset and its overrides: every key was set by the user
    spec = spec_for(cfg["method"])
    if spec.preflight:  # files the config names, read on this host (a saved ensemble to reuse)
        load(spec.preflight)(cfg)
    info = _preflight_data(cfg)
    if cfg["model"] not in MODELS:  # an import path: build it and run one batch
        from hetfl.common.rundata import model_input_shape

        try:
            check_builder(cfg["model"], info.num_classes, model_input_shape(cfg))
        except ValueError as err:
            raise PreflightError(str(err)) from None
    _preflight_devices(cfg)
    _preflight_federation(cfg, num_supernodes)
    return cfg


def _preflight_data(cfg: dict[str, Any]):
    """The dataset loads from its `data-source` here (a bring-your-own one: readable, with the named columns and
    labels, fitting the run), and ``server-data-path`` is read as the ServerApp will; returns its DatasetInfo."""
    from hetfl.common.config import check_dataset_fits
    from hetfl.data.byo import LocalDataError, is_byo
    from hetfl.data.catalog import DATASETS, DatasetUnavailable

    name, source = cfg["dataset"], cfg["data-source"]
    if is_byo(name):
        try:
            info = _reference_preflight(cfg)
        except (LocalDataError, DatasetUnavailable) as err:
            raise PreflightError(str(err)) from None
        check_dataset_fits(cfg, info)
    else:
        info = DATASETS[name]
        _check_dataset_present(name, source, cfg["data-dir"], info)
    if cfg["server-data-path"]:
        from hetfl.data.load import SERVER_SPLITS, load_local_data

        where = f"run-config key 'server-data-path' = {cfg['server-data-path']!r}"
        try:  # the server's evaluation (and FedBE's holdout) set, read and checked as the ServerApp will
            for split in SERVER_SPLITS[: 2 if cfg["server-holdout"] else 1]:
                load_local_data(cfg["server-data-path"], info, where, split, cfg["cache-dir"], strict_split=split == "holdout")
        except LocalDataError as err:
            raise PreflightError(str(err)) from None
    return info


def _preflight_devices(cfg: dict[str, Any]) -> None:
    """A CUDA `torch-device` or `server-torch-device` exists on this machine (simulation and local clusters run here)."""
    for key in ("torch-device", "server-torch-device"):
        dev = str(cfg.get(key, ""))
        if dev.startswith("cuda"):
            import torch

            index = int(dev.partition(":")[2] or 0)
            if not torch.cuda.is_available() or index >= torch.cuda.device_count():
                raise PreflightError(f"run-config key '{key}' = {dev!r}: this machine has "
                                     f"{torch.cuda.device_count()} CUDA device(s); expected 'auto', 'cpu' or an existing cuda:N")


def _preflight_federation(cfg: dict[str, Any], num_supernodes: int | None) -> None:
    """`num-clients` and `min-available-nodes` fit the simulated federation of `num_supernodes` SuperNodes."""
    if num_supernodes is not None and 0 < cfg["num-clients"] < num_supernodes:
        raise PreflightError(f"run-config key 'num-clients' = {cfg['num-clients']} is fewer than the {num_supernodes} "
                             f"simulated SuperNodes; expected 0 (one client per SuperNode) or >= {num_supernodes}")
    if num_supernodes is not None and cfg["min-available-nodes"] > num_supernodes:
        raise PreflightError(f"run-config key 'min-available-nodes' = {cfg['min-available-nodes']} exceeds the "
                             f"{num_supernodes} simulated SuperNodes; expected <= {num_supernodes} (or more --supernodes)")


def check_ray_address(address: str, timeout: float = 5.0) -> str:
    """`address` (``host:port`` of a Ray head's GCS, ``ray start --head --port``) if something listens there, else
    :class:`PreflightError` in one line. The simulation's ``ray.init()`` joins that cluster (docs/ray-cluster.md)."""
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit():
        raise PreflightError(f"--ray-address {address!r}: expected HOST:PORT of a Ray head (ray start --head --port PORT)")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as err:
        raise PreflightError(f"--ray-address {address!r}: no Ray head answers there ({err.strerror or err}); start one "
                             f"with `ray start --head --node-ip-address {host} --port {port}`, or leave --ray-address "
                             "out to run Ray on this machine only") from None
    return address


def _check_dataset_present(name: str, source: str, data_dir: str, info) -> None:
    """A built-in dataset can be read from its `data-source` here: local files (``local``, ``auto``), else the
    Hugging Face cache or one request to the hub within ``HUB_PROBE_TIMEOUT_S`` (``hub``, ``auto``; none with
    ``HF_HUB_OFFLINE``). Raises :class:`PreflightError` with one line: the dataset, what was tried, how to get it."""
    from hetfl.data.hub import hub_unavailable
    from hetfl.data.readers import local_available

    if source != "hub" and local_available(name, data_dir):
        return
    looked = f"data-dir = {data_dir!r}" + "".join(f", {d}" for d in info.local_dirs)
    if source == "local":
        raise PreflightError(f"run-config key 'dataset' = {name!r}: no local files found (data-source = 'local'; looked "
                             f"in {looked}); to get it: {info.how_to_get}")
    why = hub_unavailable(info.hub_id)
    if why is None:
        return
    tried = "no local files found" + (f" (looked in {looked})" if source == "auto" else "") + " and the hub"
    if source == "hub":
        tried = "the Hugging Face hub"
    raise PreflightError(f"run-config key 'dataset' = {name!r}: {tried} is not usable here ({why}; data-source = "
                         f"{source!r}); to get it: {info.how_to_get}" + (", and set data-source = 'local'" if source == "hub" else
                                                                         ", or let this machine reach huggingface.co"))


def _reference_preflight(cfg: dict[str, Any]):
    """Describe a ``hub:``/``dir:`` dataset (columns, labels, first row) and check that the server has a test set."""
    from hetfl.common.rundata import dataset_info
    from hetfl.data.byo import LocalDataError, read_reference

    info = dataset_info(cfg)
    if not cfg["server-data-path"] and "test" not in read_reference(cfg["dataset"]):
        raise LocalDataError(f"run-config key 'dataset' = {cfg['dataset']!r}: has no split named 'test' for the server's "
                             "evaluation; add one, or set run-config key 'server-data-path' (a save_to_disk directory)")
    return info


def uses_cuda(cfg: dict[str, Any]) -> bool:
    """Whether the run's ClientApps train on CUDA on this machine (`torch-device` = cuda*, or auto with a GPU)."""
    if cfg.get("torch-device", "auto") == "cpu":
        return False
    import torch

    return torch.cuda.is_available()


def write_app(root: Path, package: str, server: str, client: str, config: dict[str, Any]) -> Path:
    """A minimal Flower App at `root` (for measuring Flower itself or probing where its processes run, as
    tests/test_superexec.py does): package `package` whose modules `server` and `client` (their sources)
    each define `app`, and the run config `config` (strings, numbers, booleans) as its defaults."""
    import json

    (root / package).mkdir(parents=True)
    (root / "pyproject.toml").write_text("\n".join([
        '[build-system]', 'requires = ["setuptools>=68"]', 'build-backend = "setuptools.build_meta"', '',
        '[project]', f'name = "{package}"', 'version = "0.0.1"', 'dependencies = []', '',
        '[tool.setuptools.packages.find]', f'include = ["{package}*"]', '', '[tool.flwr.app]', f'publisher = "{package}"',
        '', '[tool.flwr.app.components]', f'serverapp = "{package}.server:app"', f'clientapp = "{package}.client:app"',
        '', '[tool.flwr.app.config]', *(f"{k} = {json.dumps(v)}" for k, v in config.items()), '']))
    for name, text in (("__init__", ""), ("server", server), ("client", client)):
        (root / package / f"{name}.py").write_text(text)
    return root


def stage_app(app_dir: Path, dest: Path) -> Path:
    """`app_dir` without its git-ignored files and directories (hard links, a copy across file systems) at `dest`.

    Flower 1.41's `flwr run <dir>` lists every file under `dir` (resolving each path) before it filters them into
    the FAB, and the project's `.venv` alone holds ~56,000 files: 7-15 s of every run here. The FAB only takes
    files that the app's `.gitignore` keeps (Flower filters with these same patterns), so the staged tree builds
    the same FAB, byte for byte (tests/test_deploy.py), in milliseconds.
    """
    from flwr.cli.utils import build_pathspec, load_gitignore_patterns

    ignored = build_pathspec(load_gitignore_patterns(app_dir / ".gitignore"))
    for dirpath, dirnames, filenames in os.walk(app_dir):
        rel = Path(dirpath).relative_to(app_dir)
        dirnames[:] = [d for d in dirnames if d != ".git" and Path(dirpath, d) != dest
                       and not ignored.match_file(f"{(rel / d).as_posix()}/")]
        for name in filenames:
            src, target = Path(dirpath) / name, dest / rel / name
            if src.is_symlink() or ignored.match_file((rel / name).as_posix()):
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(src, target)
            except OSError:
                shutil.copy2(src, target)
    return dest


def flwr_run(link: SuperLink, app_dir: Path, config_file: str | None, overrides: dict[str, Any],
             num_supernodes: int | None, client_cpus: int = 1, timeout: float | None = None,
             log_path: Path | None = None, client_gpus: float = 0.0) -> int:
    """Submit a run to `link` and stream its logs until it ends; returns flwr's exit code.

    `num_supernodes` sets the simulated federation (None for a deployment SuperLink), with `client_cpus`
    CPUs (an integer, as Flower expects) and a fraction `client_gpus` of a GPU per simulated ClientApp.
    """
    run_config = write_run_config(link.home / f"run-config-{time.time_ns()}.toml", config_file, overrides)
    staged = stage_app(app_dir, Path(tempfile.mkdtemp(prefix="app-", dir=link.home)))
    cmd = [_bin("flwr"), "run", str(staged), link.connection, "--stream", "--run-config", str(run_config)]
    if num_supernodes is not None:
        fed = (f"num-supernodes={num_supernodes} client-resources-num-cpus={int(client_cpus)} "
               f"client-resources-num-gpus={client_gpus:g}")
        cmd += ["--federation-config", fed]
    with open(log_path, "wb") if log_path else contextlib.nullcontext() as logf:
        proc = subprocess.Popen(cmd, env=flwr_env(link.home), cwd=app_dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert proc.stdout is not None
        try:
            deadline = None if timeout is None else time.monotonic() + timeout
            for line in proc.stdout:
                if not relayed(line):
                    continue
                sys.stdout.buffer.write(line)
                sys.stdout.flush()
                if logf:
                    logf.write(line)
                if deadline and time.monotonic() > deadline:
                    proc.kill()
                    raise TimeoutError(f"run exceeded {timeout}s")
            return proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
            shutil.rmtree(staged, ignore_errors=True)


def setup_signals() -> None:
    """Turn the first SIGTERM or SIGINT into KeyboardInterrupt so that context managers stop what they started
    (SIGINT is ignored by default in processes started in the background by a shell), and ignore the ones after it:
    a second Ctrl-C, or `timeout` passing on the SIGTERM it got, must not cut that clean-up short and orphan the
    SuperNodes (each stop is bounded: SIGKILL after its timeout)."""
    def _ignore(signum, frame):  # a handler, not SIG_IGN: a process started during the clean-up must not inherit it
        pass

    def _raise(signum, frame):
        signal.signal(signal.SIGTERM, _ignore)
        signal.signal(signal.SIGINT, _ignore)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _raise)
    signal.signal(signal.SIGINT, _raise)


@contextlib.contextmanager
def config_errors(debug: bool = False) -> Iterator[None]:
    """Turn a ConfigError/PreflightError into one line on stderr and exit code 2 (the traceback only with `debug`)."""
    from hetfl.common.config import ConfigError

    try:
        yield
    except (ConfigError, PreflightError) as err:
        if debug:
            raise
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


def absolute_paths(run_config: dict[str, Any], base: Path | None = None) -> dict[str, Any]:
    """The run-config path values that are relative (``dataset = "dir:..."``, ``server-data-path``, ``fleet``), made
    absolute against `base` (default: the current directory): the ServerApp and ClientApps run elsewhere."""
    base = Path.cwd() if base is None else base
    out: dict[str, Any] = {}
    ds = run_config.get("dataset", "")
    if isinstance(ds, str) and ds.startswith("dir:") and not Path(ds[4:]).is_absolute():
        out["dataset"] = "dir:" + str((base / ds[4:]).resolve())
    for key in ("server-data-path", "fleet"):
        path = run_config.get(key, "")
        if isinstance(path, str) and path and not Path(path).is_absolute():
            out[key] = str((base / path).resolve())
    return out


def run_config_args(items: list[str], flag: str = "--run-config") -> dict[str, Any]:
    """Run-config overrides as Flower's ``flwr run --run-config`` reads them (its own ``parse_config_args``):
    ``key=value`` pairs, in one string or several, with TOML values (strings quoted: ``model="text"``), or one TOML
    file. Raises PreflightError in one line naming the flag, the item and what is allowed."""
    from flwr.common.config import parse_config_args

    items = [i for i in items if i.strip()]
    if len(items) == 1 and items[0].endswith(".toml"):
        if not Path(items[0]).is_file():
            raise PreflightError(f"{flag} {items[0]!r}: no such TOML file")
        return parse_config_args(items)
    out: dict[str, Any] = {}
    for item in items:
        for token in _tokens(item):
            if "=" not in token or token.startswith("="):
                raise PreflightError(f"{flag} {token!r}: expected key=value pairs (a preset file goes before {flag}, "
                                     "or alone after it)")
            try:
                out.update(parse_config_args([token]))
            except Exception:  # Flower raises click.ClickException for a value that is not TOML
                k, _, v = token.partition("=")
                raise PreflightError(f"{flag} {token!r}: {v!r} is not a TOML value; quote strings as Flower's "
                                     f"--run-config does: {k}=\"{v}\" (in a shell: '{k}=\"{v}\"')") from None
    return out


def _tokens(item: str) -> list[str]:
    """The key=value pairs of one argument, split where Flower's parser splits them (quoted values keep spaces)."""
    import re

    return [m.group(0) for m in re.finditer(r"""(?:[^\s'"=]+=(?:'[^']*'|"[^"]*"|\S+))|\S+""", item)]


def parse_set(items: list[str]) -> dict[str, Any]:
    """``--set key=value ...``: the alias of ``--run-config``, parsed the same way (:func:`run_config_args`)."""
    return run_config_args(items, "--set")


CLIENT_NODES = 100  # simulated SuperNodes for --clients: Flower's message pump costs time per SuperNode on every pass


def run(config_file: str | None = None, overrides: dict[str, Any] | None = None, num_supernodes: int = 10,
        client_cpus: int = 1, results_dir: str | Path = "results", timeout: float | None = None,
        app_dir: Path = ROOT, client_gpus: float | None = None, ray_address: str | None = None) -> Path:
    """Check (:func:`preflight`), run one simulation, and return its results directory (raises on failure).

    `client_gpus` is the GPU fraction per simulated ClientApp; None = 0.25 when the run trains on CUDA
    (four ClientApps share a GPU), else 0. `ray_address` (``host:port``) runs the ClientApps on that running Ray
    cluster, as many at once as its nodes' CPUs/GPUs fit (docs/ray-cluster.md); None: Ray on this machine.
    """
    overrides = dict(overrides or {})
    preset = load_preset(config_file)
    run_name = overrides.get("run-name") or preset.get("run-name") or (
        f"{Path(config_file).parent.name + '-' + Path(config_file).stem if config_file else 'run'}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    )
    overrides["run-name"] = run_name
    overrides["results-dir"] = str(Path(results_dir).resolve())
    overrides.update(absolute_paths({**preset, **overrides}))  # dir: datasets and server-data-path, like results-dir
    cfg = preflight({**preset, **overrides}, num_supernodes)  # fail fast, before any process starts
    env = {"RAY_ADDRESS": check_ray_address(ray_address)} if ray_address else None
    if client_gpus is None:
        client_gpus = 0.25 if uses_cuda(cfg) else 0.0
    run_dir = Path(results_dir).resolve() / run_name
    metrics = run_dir / "metrics.json"
    with superlink(env=env) as link:
        rc = flwr_run(link, app_dir, config_file, overrides, num_supernodes, client_cpus, timeout, client_gpus=client_gpus)
        if rc != 0 or not metrics.exists():  # the SuperLink's own log says why (its home is removed on the way out)
            kept = _keep_superlink_log(link, run_dir)
            raise RuntimeError(f"run failed (flwr exit {rc}); no {metrics}; the SuperLink's log: {kept}")
    data = json.loads(metrics.read_text())
    check_outcome(data)
    return run_dir


def _keep_superlink_log(link: SuperLink, run_dir: Path) -> Path:
    """Copy the SuperLink's log and output (where the simulation's own errors go) into one file beside the failed
    run's results (empty where the SuperLink wrote neither); its path."""
    run_dir.mkdir(parents=True, exist_ok=True)
    kept = run_dir / "superlink.log"
    parts = [(link.home / name).read_text(errors="replace") for name in ("superlink.log", "superlink.stdout")
             if (link.home / name).exists()]
    kept.write_text("\n".join(parts))
    return kept


def check_outcome(data: dict[str, Any]) -> None:
    """RuntimeError if a run's metrics.json records a failed outcome: it stopped before its last round, or it ran every
    round without ever accepting a client update (``stopped``, written by the round loop)."""
    if not completed(data) or data.get("stopped"):
        why = f": {data['stopped']['reason']}" if data.get("stopped") else "; see the log above"
        raise RuntimeError(f"run failed after {data['summary']['rounds_completed']} rounds{why}")


def completed(data: dict[str, Any]) -> bool:
    """Whether a run's metrics.json records every round it was asked for (up to `stop-after-round` where set)."""
    config = data["config"]
    wanted = min(config["num-server-rounds"], config.get("stop-after-round") or config["num-server-rounds"])
    return data["summary"]["rounds_completed"] >= wanted


RUN_CONFIG_HELP = ('run-config overrides as Flower\'s flwr run --run-config takes them: "key=value ..." with TOML '
                   'values (strings quoted: \'model="cnn" lr=0.05\'), or one TOML file')


def add_run_config_args(p: argparse.ArgumentParser | Any) -> None:
    """``--run-config "k=v ..."`` (Flower's syntax) and ``--set k=v ...`` (its alias) on a command's parser."""
    p.add_argument("--run-config", action="append", default=[], metavar='"KEY=VALUE ..."', help=RUN_CONFIG_HELP)
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="the same overrides as separate arguments (parsed as --run-config)")


def overrides_of(a: argparse.Namespace) -> dict[str, Any]:
    """The overrides of :func:`add_run_config_args`' options (``--set`` after ``--run-config``)."""
    return {**run_config_args(a.run_config), **parse_set(a.set)}


def main(argv: list[str] | None = None, prog: str = "python -m hetfl.launch") -> int:
    p = argparse.ArgumentParser(prog=prog, description="Run one simulation of a preset in Flower's Simulation Engine "
                                "(a SuperLink this process owns and stops), then print its results directory and "
                                "final accuracy.", epilog="e.g. %(prog)s configs/quickstart.toml --run-config "
                                "'num-server-rounds=5 local-steps=20'")
    p.add_argument("config", nargs="?", help="run-config preset (TOML), e.g. configs/fedavg/fmnist-dir0.6.toml")
    add_run_config_args(p)
    p.add_argument("--supernodes", type=int, default=None,
                   help="number of simulated SuperNodes (default: the run's min-available-nodes, or min(--clients, 100) "
                        "with --clients)")
    p.add_argument("--clients", type=int, default=None,
                   help="clients of the federation (run-config num-clients): each SuperNode hosts several; "
                        "min-available-nodes becomes the SuperNode count unless --set gives it (docs/architecture.md#scale)")
    p.add_argument("--client-cpus", type=int, default=1, help="CPUs per simulated ClientApp (an integer Ray resource)")
    p.add_argument("--client-gpus", type=float, default=None,
                   help="fraction of a GPU per simulated ClientApp (default: 0.25 when training on CUDA, else 0)")
    p.add_argument("--ray-address", default=None, metavar="HOST:PORT",
                   help="run the ClientApps on this running Ray cluster (ray start --head ... on one host, ray start "
                        "--address=HOST:PORT on the others) instead of starting Ray here (docs/ray-cluster.md)")
    p.add_argument("--results-dir", default="results", help="where the run's directory is written (default: results)")
    p.add_argument("--timeout", type=float, default=None, help="kill the run after this many seconds")
    p.add_argument("--debug", action="store_true", help="show tracebacks of configuration errors")
    p.add_argument("--keys", action="store_true", help="list every run-config key (default, methods, meaning) and exit")
    a = p.parse_args(argv)
    if a.keys:
        from hetfl.keys import table

        print(table())
        return 0
    setup_signals()  # SIGTERM/SIGINT stop the SuperLink tree (and Ray) instead of orphaning it
    try:
        with config_errors(a.debug):
            overrides = overrides_of(a)
            supernodes = a.supernodes
            if a.clients is not None:
                supernodes = supernodes or min(a.clients, CLIENT_NODES)
                overrides["num-clients"] = a.clients
                overrides.setdefault("min-available-nodes", supernodes)
            if supernodes is None:  # as many SuperNodes as the run waits for
                from hetfl.methods import SCHEMA

                supernodes = int({**load_preset(a.config), **overrides}.get("min-available-nodes",
                                                                             SCHEMA["min-available-nodes"].default))
            run_dir = run(a.config, overrides, supernodes, a.client_cpus, a.results_dir, a.timeout,
                          client_gpus=a.client_gpus, ray_address=a.ray_address)
    except KeyboardInterrupt:
        print("interrupted: stopped the SuperLink and everything it started", file=sys.stderr)
        return 130
    except RuntimeError as err:  # the run failed or stopped early (e.g. no client succeeded): its log says why
        print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
        return 1
    except SystemExit as err:
        return int(err.code or 0)
    from hetfl.common.results import summary_lines

    print("\n" + "\n".join(summary_lines(json.loads((run_dir / "metrics.json").read_text()), run_dir)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
