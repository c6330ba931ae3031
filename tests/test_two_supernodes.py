"""Two wrapped SuperNodes on one host (issue #75): `python -m hetfl.cluster supernode` twice, with neither --home nor a
runtime port given, beside a SuperLink on loopback. Each gets its own free Runtime API port and its own default home
(~/.flwr/supernode-<client-id>), and a run trains on both; a third that asks for a taken port, or a home another live
SuperNode holds, stops in one line (exit 2) before any process starts. On the same two SuperNodes, examples/shefl-digits
(a Flower App of its own on hetfl's public API, issue #78) runs with `flwr run . hetfl` and gives the in-process
run's numbers on two nodes that declare the same."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hetfl import launch

from .conftest import require_fmnist

ROOT = Path(__file__).resolve().parent.parent
RUN = {"dataset": "fashion_mnist", "data-source": "local", "model": "cnn", "partitioner": "iid", "fraction-train": 1.0,
       "local-steps": 2, "batch-size": 32, "lr": 0.05, "max-test-samples": 200, "num-server-rounds": 1,
       "min-available-nodes": 2, "checkpoint": False, "run-name": "two"}


def _wait_for(log: Path, text: str, proc: subprocess.Popen, seconds: float = 120.0) -> str:
    deadline = time.monotonic() + seconds
    while text not in (out := log.read_text(errors="replace")):
        assert proc.poll() is None and time.monotonic() < deadline, out[-3000:]
        time.sleep(0.3)
    return out


@pytest.mark.slow
def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_two_wrapped_supernodes_run_side_by_side_on_one_host(tmp_path):
    require_fmnist()
    home = tmp_path / "user"  # the devices' $HOME: their default homes go under it
    env = {k: v for k, v in os.environ.items() if k not in ("FLWR_HOME", "PYTHONPATH")}
    env.update(PATH=os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]]), FLWR_DISABLE_UPDATE_CHECK="1",
               FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1", HF_HUB_OFFLINE="1", HOME=str(home))
    port = launch.free_port()
    procs: list[subprocess.Popen] = []

    def start(cmd: list[str], log: Path) -> subprocess.Popen:
        with open(log, "wb") as out:
            procs.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                          start_new_session=True))
        return procs[-1]

    def node(i: int, *extra: str) -> list[str]:
        return [sys.executable, "-m", "hetfl.cluster", "supernode", "--superlink", f"127.0.0.1:{port}", "--insecure",
                *extra, "--node-config", f'partition-id={i} num-partitions={max(2, i + 1)} client-id={i} '
                                         'device-class="hpc" capacity="weak"']  # the two that run: 2 partitions

    try:
        link_home = tmp_path / "server"
        link = start([sys.executable, "-m", "hetfl.cluster", "superlink", "--port", str(port), "--insecure",
                      "--state", "memory", "--home", str(link_home)], tmp_path / "superlink.log")
        _wait_for(tmp_path / "superlink.log", "SuperLink serving on", link)
        ports = []
        for i in (0, 1):
            p = start(node(i), tmp_path / f"node{i}.log")
            out = _wait_for(tmp_path / f"node{i}.log", "SuperNode of", p)
            ports.append(int(re.search(r"--port (\d+)", out).group(1)))
        assert len(set(ports)) == 2, ports  # each its own Runtime API
        for i in (0, 1):
            lock = home / ".flwr" / f"supernode-{i}" / "supernode.lock"
            assert lock.read_text().strip() == str(procs[1 + i].pid), lock  # each its own home, held by its process
        # a third asking for a taken port, and one whose default home is held: one line each, nothing started. The
        # log line comes before the Runtime API listens: wait for it to listen, or a loaded machine races the check
        deadline = time.monotonic() + 120
        while not _listening(ports[0]):
            assert time.monotonic() < deadline, f"node 0's Runtime API never listened on {ports[0]}"
            time.sleep(0.2)
        taken = subprocess.run(node(2, "--runtime-port", str(ports[0])), env=env, cwd=ROOT, capture_output=True,
                               text=True, timeout=60)
        errors = [ln for ln in taken.stderr.splitlines() if not ln.startswith("warning: --insecure")]
        assert taken.returncode == 2 and errors == [
            f"error: --runtime-port {ports[0]}: 127.0.0.1:{ports[0]} is in use (another SuperNode on this host?); "
            "expected a free port, or no --runtime-port for a free one"], taken.stderr
        held = subprocess.run(node(1), env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
        errors = [ln for ln in held.stderr.splitlines() if not ln.startswith("warning: --insecure")]
        assert held.returncode == 2 and len(errors) == 1, held.stderr
        assert f"is in use by another SuperNode (pid {procs[2].pid})" in held.stderr, held.stderr
        # a run on both
        app = launch.stage_app(ROOT, tmp_path / "app")
        rc_file = launch.write_run_config(tmp_path / "run.toml", None, {**RUN, "results-dir": str(tmp_path / "results")})
        run = subprocess.run(["flwr", "run", ".", "hetfl", "--stream", "--run-config", str(rc_file)],
                             env={**env, "FLWR_HOME": str(link_home)}, cwd=app, capture_output=True, text=True,
                             timeout=600)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        m = json.loads((tmp_path / "results" / "two" / "metrics.json").read_text())
        row = m["rounds"][1]
        assert m["summary"]["rounds_completed"] == 1 and row["replies"] == 2 and row["failures"] == 0, row
        assert set(row["bytes_up_by_client"]) == {"0", "1"}, row["bytes_up_by_client"]
        assert all(p.poll() is None for p in procs), [p.poll() for p in procs]  # nobody died of a taken port
        # the SHEFL example on the same SuperNodes: the in-process run's numbers on two nodes declaring the same
        from .test_examples import EXAMPLES, in_process

        out = tmp_path / "example.json"
        run = subprocess.run(["flwr", "run", ".", "hetfl", "--stream", "--run-config", f"out='{out}'"],
                             env={**env, "FLWR_HOME": str(link_home)}, cwd=EXAMPLES / "shefl-digits",
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0 and out.exists(), (run.stdout + run.stderr)[-4000:]
        got = json.loads(out.read_text())
        assert got == in_process("shefl-digits", nodes=2, node_config={"device-class": "hpc", "capacity": "weak"}), got
        assert got["2"]["accuracy"] > got["0"]["accuracy"] + 0.1, got
    finally:
        launch.stop_tree(procs, timeout=10.0)
