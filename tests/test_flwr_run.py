"""The plain `flwr run .` path (README, "Plain `flwr run .`"): Flower's own auto-started local SuperLink.

The end-to-end test runs the README's commands: `flwr run . --run-config <preset> --federation-config ...
--stream` with the venv's bin first on PATH and a private FLWR_HOME, then stops the local SuperLink the
documented way (`kill $(lsof -t -sTCP:LISTEN -iTCP@127.0.0.1:<port>)`). Its ports come from Flower's
FLWR_LOCAL_SUPERLINK_HTTP_API_PORT / FLWR_LOCAL_CONTROL_API_PORT (free ones, so that a SuperLink a user
already runs on the default 127.0.0.1:39091 is neither reused nor stopped). The fast tests check that a
min-available-nodes larger than the federation fails at once with one clear line instead of waiting.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import pytest

from hetfl.common import nodes, task
from hetfl.common.comm import MeteredGrid
from hetfl.common.config import ConfigError
from hetfl.launch import ROOT, free_port, process_tree

from .conftest import require_fmnist


class FakeClock:
    """Stands in for the `time` module inside hetfl.common.nodes: sleep() advances monotonic() at once."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class GrowingGrid:
    """A grid whose connected nodes grow by one at each look, up to `final` (nodes joining over time)."""

    def __init__(self, final: int, start: int = 1) -> None:
        self.final, self.n = final, start - 1

    def get_node_ids(self):
        self.n = min(self.n + 1, self.final)
        return list(range(100 + self.n, 100, -1))  # unsorted on purpose


def _sim_grid(num_nodes: int):
    """A simulation grid (Flower's InMemoryGrid) with `num_nodes` nodes, without a LinkState."""
    from flwr.superlink.grid import InMemoryGrid

    class SimGrid(InMemoryGrid):
        def __init__(self) -> None:  # no state: only get_node_ids is used
            pass

        def get_node_ids(self):
            return list(range(1, num_nodes + 1))

    return SimGrid()


@pytest.fixture
def clock(monkeypatch):
    c = FakeClock()
    monkeypatch.setattr(nodes, "time", c)
    return c


def test_quickstart_on_a_smaller_simulated_federation_fails_at_once_with_one_clear_line(clock):
    """The issue's case: configs/quickstart.toml (min-available-nodes = 20) on 10 simulated SuperNodes used to
    wait 600 s in silence; the simulation registers all its nodes at once, so it now fails after 5 s."""
    min_nodes = tomllib.loads((ROOT / "configs" / "quickstart.toml").read_text())["min-available-nodes"]
    assert min_nodes == 20
    with pytest.raises(ConfigError) as err:
        nodes.wait_for_nodes(MeteredGrid(_sim_grid(10)), min_nodes)
    msg = str(err.value)
    assert "\n" not in msg
    assert "'min-available-nodes' = 20" in msg and "10 SuperNodes connected" in msg and "num-supernodes=20" in msg
    assert 5.0 <= clock.now <= 6.0


def test_deployment_waits_while_nodes_keep_joining_then_fails_when_they_stop(clock):
    # 1, 2, ..., 6 nodes, one per second: no failure while the count grows (stall 120 s by default)
    assert nodes.wait_for_nodes(GrowingGrid(final=6), 6) == list(range(101, 107))
    assert clock.now == pytest.approx(5.0)
    # 3 nodes join, then none: fails 120 s after the last join, not at the 600 s timeout
    clock.now = 0.0
    with pytest.raises(ConfigError, match=r"'min-available-nodes' = 8 exceeds the 3 SuperNodes connected"):
        nodes.wait_for_nodes(GrowingGrid(final=3), 8)
    assert 122.0 <= clock.now <= 124.0


def test_enough_nodes_return_at_once_and_no_node_times_out(clock):
    assert nodes.wait_for_nodes(_sim_grid(3), 3) == [1, 2, 3]
    assert clock.now == 0.0
    with pytest.raises(TimeoutError, match=r"no SuperNode connected within 30 s \(min-available-nodes = 2\)"):
        nodes.wait_for_nodes(_sim_grid(0), 2, timeout=30.0)
    assert clock.now == pytest.approx(30.0)


def test_waiting_is_logged(clock, caplog, monkeypatch):
    import logging

    monkeypatch.setattr(task.log, "propagate", True)  # setup_logging() turns it off in a process that ran an app
    with caplog.at_level(logging.INFO, logger="hetfl"), pytest.raises(ConfigError):
        nodes.wait_for_nodes(_sim_grid(2), 4, stall=40.0)
    lines = [r.getMessage() for r in caplog.records if r.name == "hetfl"]
    assert lines[0] == "waiting for min-available-nodes = 4 SuperNodes: 2 connected"
    assert any(line.startswith("still waiting for min-available-nodes = 4 SuperNodes: 2 connected after 30") for line in lines)


# --- end to end: `flwr run .` with Flower's own local SuperLink ---------------------------------------------

RUN_CONFIG = {  # configs/quickstart.toml, made small: 2 nodes, 2 rounds, 3 local steps, 1000 test samples
    "method": "fedavg", "dataset": "fashion_mnist", "data-source": "local", "partitioner": "dirichlet",
    "dirichlet-alpha": 0.6, "model": "cnn", "num-server-rounds": 2, "fraction-train": 1.0,
    "min-available-nodes": 2, "local-steps": 3, "batch-size": 32, "lr": 0.05, "momentum": 0.9,
    "max-test-samples": 1000,
}


def _start_time(pid: int) -> int | None:
    """Start time of a live process (field 22 of /proc/<pid>/stat), to tell it from a later one with its pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def _still_ours(seen: dict[int, int | None]) -> list[int]:
    """Live processes of the run: those seen (same pid and start time) and their descendants."""
    return process_tree({pid for pid, start in seen.items() if start is not None and _start_time(pid) == start})


def _listener(port: int) -> list[int]:
    """PIDs listening on 127.0.0.1:<port>, as the README's stop command finds them."""
    out = subprocess.run(["lsof", "-t", "-sTCP:LISTEN", f"-iTCP@127.0.0.1:{port}"], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


@pytest.mark.slow
def test_plain_flwr_run_completes_streams_rounds_writes_results_and_leaves_nothing(tmp_path):
    require_fmnist()
    if shutil.which("lsof") is None:
        pytest.skip("lsof (the README's stop command) is not installed")
    import tomli_w

    run_name = f"test-flwr-run-{os.getpid()}-{time.time_ns()}"
    preset = tmp_path / "preset.toml"
    preset.write_text(tomli_w.dumps({**RUN_CONFIG, "run-name": run_name}))
    port = free_port()
    control_port = free_port(port)
    bin_dir = Path(sys.executable).parent
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")]),
        "FLWR_HOME": str(tmp_path / "flwr-home"),
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(port),
        "FLWR_LOCAL_CONTROL_API_PORT": str(control_port),
    }
    run_dir = ROOT / "results" / run_name  # README: results/<run-name>/ in the directory `flwr run` started the SuperLink
    cmd = ["flwr", "run", ".", "--run-config", str(preset),
           "--federation-config", "num-supernodes=2 client-resources-num-cpus=1", "--stream"]
    seen: dict[int, int | None] = {}  # pid -> start time of every process the run started
    lines: list[str] = []

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)

    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        deadline = time.monotonic() + 240
        while proc.poll() is None and time.monotonic() < deadline:
            for pid in process_tree({proc.pid}):  # flwr, SuperLink, SuperExec, flwr-simulation, Ray
                seen.setdefault(pid, _start_time(pid))
            time.sleep(0.5)
        if proc.poll() is None:
            pytest.fail("flwr run did not end within 240 s:\n" + "".join(lines[-40:]))
        reader.join(10)
        out = "".join(lines)
        assert proc.returncode == 0, out[-4000:]
        assert f"Starting local SuperLink on 127.0.0.1:{port}" in out, out[-4000:]
        # per-round progress, streamed: one line per round with its accuracy
        for rnd in (0, 1, 2):
            assert re.search(rf"hetfl: \[round {rnd}/2\] acc 0\.\d{{4}}", out), out[-4000:]
        assert f"results: {run_dir} (metrics.json, metrics.csv, accuracy.png, tensorboard/, final_model.safetensors)" in out
        import json

        summary = json.loads((run_dir / "metrics.json").read_text())["summary"]
        assert summary["rounds_completed"] == 2
        # Flower leaves its local SuperLink running after the run ...
        link = _listener(port)
        assert len(link) == 1 and link[0] in seen
        for pid in process_tree(set(link)):
            seen.setdefault(pid, _start_time(pid))
        # ... and the README's command stops it with everything it started
        subprocess.run(["bash", "-c", f"kill $(lsof -t -sTCP:LISTEN -iTCP@127.0.0.1:{port})"], check=True)
        stop_by = time.monotonic() + 30
        while (left := _still_ours(seen)) and time.monotonic() < stop_by:
            time.sleep(0.3)
        assert left == [], f"left behind: {left}"
        assert _listener(port) == []
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in _still_ours(seen):  # a failing test leaks nothing
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(run_dir, ignore_errors=True)


def test_a_failed_launch_keeps_the_superlinks_log_and_names_it(tmp_path, monkeypatch):
    """A run that ends without its metrics.json (flwr exit 0 and no ServerApp output, as a Ray-cluster run once did)
    must say where the SuperLink's own log went: its home is removed when the launcher returns."""
    import pytest

    from hetfl import launch

    home = tmp_path / "home"
    home.mkdir()
    (home / "superlink.log").write_text("ERROR the simulation process failed: why it failed\n")

    @contextlib.contextmanager
    def fake_superlink(env=None):
        yield launch.SuperLink(None, home, "hetfl", "127.0.0.1:1", [], {})

    monkeypatch.setattr(launch, "superlink", fake_superlink)
    monkeypatch.setattr(launch, "flwr_run", lambda *a, **kw: 0)  # flwr ended "well", and nothing was written
    with pytest.raises(RuntimeError) as err:
        launch.run(None, {"dataset": "digits", "run-name": "r"}, num_supernodes=2, results_dir=tmp_path / "results")
    kept = tmp_path / "results" / "r" / "superlink.log"
    assert str(kept) in str(err.value) and "\n" not in str(err.value)
    assert "why it failed" in kept.read_text()
