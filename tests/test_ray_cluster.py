"""The Simulation Engine on a Ray cluster of two hosts, as docs/ray-cluster.md runs it.

The hosts are Linux network namespaces on this machine (tests/netns.py): ``head`` (10.78.0.1) runs the Ray head and
the launcher (SuperLink, ServerApp, aggregation, evaluation), ``worker`` (10.78.0.2) runs a Ray worker that joins
it; each Ray node offers one CPU, so each hosts one ClientApp actor (two hosts, not three: the namespaces share this
machine's two cores). A short SHEFL run (two models, HPC and LPC roles: the richest messages of the three methods)
on the two hosts must complete with ClientApp work done on both (each round's ``hosts``: replies per Ray node
address, named by the ClientApps themselves) and the same per-round accuracy, loss, bytes and clients as the same
run in one process (the in-process engine: the same code and seeds; tests/test_e2e.py shows the Simulation Engine on
one host gives those numbers too). Until 2026-11-28 a FedAvg run came first: it added a launch (~40 s alone, the
test's longest phase under load) and nothing Ray-specific, since every method crosses Ray the same way.
Every process the test started is killed by PID (``ray stop`` would stop every Ray process of the machine, other
users' too), and the namespaces are deleted, on failure as well. Skipped, with the reason, where namespaces cannot be
made or Ray's nodes cannot start.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from hetfl import launch

from .conftest import require_fmnist
from .netns import network, ns_pids, require_namespaces, routes
from .test_determinism import _rows

ROOT = launch.ROOT
NET = "10.78.0"
HOSTS = {"head": f"{NET}.1", "worker": f"{NET}.2"}
HEAD = f"{HOSTS['head']}:6379"
SUPERNODES = 4
COMMON = {"num-server-rounds": 2, "min-available-nodes": SUPERNODES, "fraction-train": 1.0, "local-steps": 3,
          "max-test-samples": 300, "seed": 0, "checkpoint": False}
RUNS = {  # a short run of the quickstart preset (Fashion-MNIST, Dir(0.6), CNN)
    "shefl": {"method": "shefl", "shefl-models": 2, "shefl-hpc-per-round": 1},
}
RAY = str(Path(sys.executable).parent / "ray")
# A hang guard, not a speed check: the test waits on each command's exit. ~2.5 min on a quiet machine, 5 min at a
# load average of 11 on 2 cores; once, beside the rest of the suite and two experiments (load average 8-9), the old
# 540 s budget ran out before the last launch and failed a correct run.
BUDGET = 1800


class Cluster:
    """Commands in the hosts' namespaces, each host with its own Ray temp dir and partition cache."""

    def __init__(self, namespaces: dict[str, str], tmp: Path) -> None:
        # Ray's unix sockets live under its temp dir (at most 107 characters in all): a short path of our own
        self.ns, self.tmp = namespaces, Path(tempfile.mkdtemp(prefix="hray", dir="/tmp"))
        self.results = tmp / "results"
        self.logs = tmp
        self.deadline = time.monotonic() + BUDGET

    def env(self, host: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("FLWR_HOME", "RAY_ADDRESS", "PYTHONPATH")}
        env.update(PATH=os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]]), HF_HUB_OFFLINE="1",
                   HETFL_CACHE=str(self.tmp / host / "cache"), RAY_USAGE_STATS_ENABLED="0",
                   FLWR_DISABLE_UPDATE_CHECK="1", FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1")
        return env

    def run(self, host: str, argv: list[str], log: str, timeout: float) -> subprocess.CompletedProcess:
        """`argv` in `host`'s namespace, from the project's root, output to `<tmp>/<log>.log`; within the budget."""
        timeout = min(timeout, self.deadline - time.monotonic())
        assert timeout > 0, f"the test's {BUDGET} s are spent before {log}"
        with open(self.logs / f"{log}.log", "w") as out:
            return subprocess.run(["ip", "netns", "exec", self.ns[host], *argv], cwd=ROOT, env=self.env(host),
                                  stdout=out, stderr=subprocess.STDOUT, timeout=timeout)

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")[-4000:]

    def ray_start(self, host: str) -> None:
        """`ray start` on `host` (the head with --head): one CPU, no GPU, a small object store; skip if it fails."""
        (self.tmp / host).mkdir(parents=True, exist_ok=True)
        role = ["--head", "--port", HEAD.split(":")[1], "--include-dashboard", "false"] if host == "head" else \
            ["--address", HEAD]
        argv = [RAY, "start", *role, "--node-ip-address", HOSTS[host], "--num-cpus", "1", "--num-gpus", "0",
                "--object-store-memory", str(100 * 2**20), "--temp-dir", str(self.tmp / host / "ray"),
                "--disable-usage-stats"]
        if self.run(host, argv, f"ray-{host}", timeout=90).returncode != 0:
            pytest.skip(f"`ray start` failed on {host} ({HOSTS[host]}): {self.log(f'ray-{host}')}")

    def wait_for_nodes(self, n: int, timeout: float = 60) -> None:
        """Until the head reports `n` alive Ray nodes; skip if they do not join in time."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.run("head", [RAY, "status", "--address", HEAD], "ray-status", timeout=60)
            status = self.log("ray-status")
            active = status.partition("Active:")[2].partition("Pending:")[0]
            if active.count("node_") >= n:
                return
            time.sleep(1)
        pytest.skip(f"Ray's workers did not join the head at {HEAD} within {timeout:g} s: {status}")

    def launch(self, name: str, over: dict) -> dict:
        """A run through `python -m hetfl.launch --ray-address` on the head; its metrics.json."""
        sets = [f"{k}={json.dumps(v) if isinstance(v, (bool, str)) else v}" for k, v in {**COMMON, **over, "run-name": name}.items()]
        r = self.run("head", [sys.executable, "-m", "hetfl.launch", "configs/quickstart.toml", "--ray-address", HEAD,
                              "--supernodes", str(SUPERNODES), "--results-dir", str(self.results), "--timeout", "900",
                              "--set", *sets], name, timeout=900)
        kept = self.results / name / "superlink.log"  # a failed run's SuperLink log (hetfl.launch keeps it)
        why = "\n".join(kept.read_text(errors="replace").splitlines()[-40:]) if kept.exists() else ""
        assert r.returncode == 0, f"{name}: exit {r.returncode}\n{self.log(name)}\n{why}"
        return json.loads((self.results / name / "metrics.json").read_text())

    def stop(self) -> list[int]:
        """SIGTERM every process in the hosts' namespaces (Ray's daemons and workers, what the launcher left), SIGKILL
        what is still there after 5 s; the PIDs still alive after that (none expected)."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for ns in self.ns.values():
                for pid in ns_pids(ns):
                    try:
                        os.kill(pid, sig)
                    except ProcessLookupError:
                        pass
            deadline = time.monotonic() + (5 if sig == signal.SIGTERM else 15)
            while (left := [p for ns in self.ns.values() for p in ns_pids(ns)]) and time.monotonic() < deadline:
                time.sleep(0.3)
            if not left:
                break
        shutil.rmtree(self.tmp, ignore_errors=True)
        return left


def test_ray_address_where_no_head_answers_fails_in_one_line_before_anything_starts(capsys):
    before = launch.LAST_SESSION
    address = f"127.0.0.1:{launch.free_port()}"  # nothing listens there
    assert launch.main(["configs/quickstart.toml", "--supernodes", "20", "--ray-address", address]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: --ray-address '{address}': no Ray head answers there") and "\n" not in err, err
    assert launch.main(["configs/quickstart.toml", "--supernodes", "20", "--ray-address", "head-without-port"]) == 2
    assert "expected HOST:PORT" in capsys.readouterr().err
    assert launch.LAST_SESSION == before  # no SuperLink was started


def _hosts_of(m: dict) -> list[dict[str, int]]:
    return [r["hosts"] for r in m["rounds"]]


@pytest.mark.hosts
@pytest.mark.slow
def test_shefl_on_a_ray_cluster_of_two_hosts_matches_one_process(tmp_path, task_identity):
    from .inprocess import run_in_process

    require_namespaces()
    require_fmnist()
    t0 = time.monotonic()
    with network(f"hfl{os.getpid()}-ray", HOSTS) as namespaces:
        cluster = Cluster(namespaces, tmp_path)
        try:
            for ns in namespaces.values():  # traffic only among the hosts: their /24, no default route
                table = routes(ns)
                assert table and all(r.startswith(f"{NET}.0/24 dev eth0 ") for r in table), table
            preset = launch.load_preset(str(ROOT / "configs" / "quickstart.toml"))
            one = {name: run_in_process({**preset, **COMMON, **over}, SUPERNODES, tmp_path / "one", name)
                   for name, over in RUNS.items()}
            t_one = time.monotonic() - t0
            cluster.ray_start("head")
            cluster.ray_start("worker")
            cluster.wait_for_nodes(2)
            t_up = time.monotonic() - t0
            two = {name: cluster.launch(f"{name}-2hosts", over) for name, over in RUNS.items()}
            t_two = time.monotonic() - t0
            did = {}
            for name in RUNS:
                a, b = one[name], two[name]
                assert a["summary"]["rounds_completed"] == b["summary"]["rounds_completed"] == 2, name
                # the same per-round numbers: accuracy, loss, bytes down and up, sampled clients
                assert _rows(b) == _rows(a), name
                # every reply names its host, and both hosts did the work
                rows, allowed = b["rounds"], set(HOSTS.values())
                for r in rows[1:]:
                    assert set(r["hosts"]) <= allowed and sum(r["hosts"].values()) == r["replies"] > 0, (name, r)
                assert set(rows[0]["hosts"]) <= allowed, (name, rows[0])  # the discovery answers
                did[name] = {}
                for r in b["rounds"][1:]:
                    for h, n in r["hosts"].items():
                        did[name][h] = did[name].get(h, 0) + n
                assert set(did[name]) == set(HOSTS.values()), (name, _hosts_of(b))
        finally:
            left = cluster.stop()
        assert not left, f"still running after SIGKILL: {left}"
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not [ns for ns in namespaces.values() if ns in listed], listed
    print(f"Ray cluster: in-process runs done at {t_one:.0f} s, 2 Ray nodes up at {t_up:.0f} s, two-host runs done at "
          f"{t_two:.0f} s, cleaned up at {time.monotonic() - t0:.0f} s; training replies per host: {did} "
          f"(load average {os.getloadavg()[0]:.1f})")
