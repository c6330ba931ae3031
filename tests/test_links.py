"""Devices on real links: one whose uplink is shaped with tbf (a phone's or a board's uplink) and one whose link
goes down for 30 s in the middle of a round, each in its own network namespace, with a SuperLink in a third
(docs/deployment.md#links).

The run finishes every round, for FedAvg and SHEFL, and no update is lost: the slow device's CNN upload (6.9 MB:
~14 s at 4 Mbit/s, ~55 s at 1 Mbit/s) is waited for (the round timeout is an upper bound only, far above it), and the
dropped device's SuperNode keeps retrying while its link is down, so its reply of that round arrives once the link
is back; it is sampled and heard again in the next round. Each round's row names every client's bytes. Nothing here
is judged by the clock. Two rounds a run: the link goes down as round 1 starts (once round 0's row is written), so
round 1 waits for the dropped device and round 2 samples and hears it again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hetfl import launch

from .conftest import after_round, require_fmnist
from .netns import network, require_namespaces

ROOT = Path(__file__).resolve().parent.parent
NET = "10.78.0"
HOSTS = {"server": f"{NET}.1", "fast": f"{NET}.10", "slow": f"{NET}.11", "drop": f"{NET}.12"}
CLIENT = {"fast": 0, "slow": 1, "drop": 2}
PORT = 9093
RATE = "4mbit"
DOWN_S = 30.0
TIMEOUT_S = 900.0  # round-timeout: an upper bound only (a hang guard), never what ends a round here
RUNS = {
    "fedavg": {},
    "shefl": {"method": "shefl", "shefl-models": 2, "shefl-hpc-per-round": 1},
}
COMMON = {"dataset": "fashion_mnist", "data-source": "local", "model": "cnn", "partitioner": "dirichlet",
          "dirichlet-alpha": 1.0, "fraction-train": 1.0, "local-steps": 3, "batch-size": 32, "lr": 0.05,
          "momentum": 0.9, "max-test-samples": 300, "num-server-rounds": 2, "min-available-nodes": 3,
          "round-timeout": TIMEOUT_S, "checkpoint": False}


def _ns_run(ns: str, *cmd: str) -> None:
    subprocess.run(["ip", "netns", "exec", ns, *cmd], check=True, capture_output=True, text=True)


def _start(ns: str, cmd: list[str], env: dict, log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(["ip", "netns", "exec", ns, *cmd], env=env, stdout=out, stderr=subprocess.STDOUT,
                                cwd=ROOT, start_new_session=True)


@pytest.mark.slow
def test_a_slow_device_and_a_dropping_device_on_real_links(tmp_path):
    require_namespaces()
    require_fmnist()
    env = {k: v for k, v in os.environ.items() if k not in ("FLWR_HOME", "PYTHONPATH")}
    env.update(PATH=os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]]), FLWR_DISABLE_UPDATE_CHECK="1",
               FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1", HF_HUB_OFFLINE="1")
    procs: list[subprocess.Popen] = []
    with network(f"hfl{os.getpid()}-ln", HOSTS) as ns:
        try:
            # the slow device's uplink: its own egress, shaped as a phone's or a board's uplink is
            shaped = subprocess.run(["ip", "netns", "exec", ns["slow"], "tc", "qdisc", "add", "dev", "eth0", "root",
                                     "tbf", "rate", RATE, "burst", "32kbit", "latency", "400ms"], capture_output=True,
                                    text=True)
            if shaped.returncode != 0:
                pytest.skip(f"no tbf qdisc here (tc: {shaped.stderr.strip() or shaped.returncode})")
            link_home = tmp_path / "server"
            link = [sys.executable, "-m", "hetfl.cluster", "superlink", "--address", HOSTS["server"], "--port",
                    str(PORT), "--insecure", "--home", str(link_home)]
            procs.append(_start(ns["server"], link, env, tmp_path / "superlink.log"))
            deadline = time.monotonic() + 120
            while "SuperLink serving on" not in (tmp_path / "superlink.log").read_text(errors="replace"):
                assert procs[0].poll() is None and time.monotonic() < deadline, (tmp_path / "superlink.log").read_text()
                time.sleep(0.3)
            for host, client in CLIENT.items():
                node = (f"partition-id={client} num-partitions=3 client-id={client} "
                        f"device-class=\"{'hpc' if host == 'fast' else 'lpc'}\"")
                # each device as docs/deployment.md starts one: a SuperNode and its warm SuperExec (the multi-host
                # test runs plain flower-supernode too)
                cmd = [sys.executable, "-m", "hetfl.cluster", "supernode", "--superlink", f"{HOSTS['server']}:{PORT}",
                       "--insecure", "--home", str(tmp_path / host), "--node-config", node]
                procs.append(_start(ns[host], cmd, {**env, "FLWR_HOME": str(tmp_path / host)}, tmp_path / f"{host}.log"))
            results = tmp_path / "results"
            app = launch.stage_app(ROOT, tmp_path / "app")  # what `flwr run .` packs: the project without .venv
            for name, over in RUNS.items():
                rc_file = launch.write_run_config(tmp_path / f"{name}.toml", None,
                                                  {**COMMON, **over, "run-name": name, "results-dir": str(results)})
                metrics = results / name / "metrics.json"

                def drop(ns_drop=ns["drop"]):  # round 1 is starting: the link goes down for DOWN_S, then comes back
                    _ns_run(ns_drop, "ip", "link", "set", "eth0", "down")
                    time.sleep(DOWN_S)
                    _ns_run(ns_drop, "ip", "link", "set", "eth0", "up")

                watcher, _ = after_round(metrics, drop, rounds=0)
                run = subprocess.run(["ip", "netns", "exec", ns["server"], "flwr", "run", ".", "hetfl", "--stream",
                                      "--run-config", str(rc_file)], env={**env, "FLWR_HOME": str(link_home)}, cwd=app,
                                     capture_output=True, text=True, timeout=900)
                watcher.join(120)
                assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
                m = json.loads(metrics.read_text())
                rows = m["rounds"]
                assert m["summary"]["rounds_completed"] == 2, (name, m["summary"])
                ups = [r["bytes_up_by_client"] for r in rows[1:]]
                # every round heard every device: the slow one's update was waited for, the dropped one's arrived
                # after its link came back (round 1), and it was sampled and heard again in round 2
                # One exception, Flower's and not the link's: under heavy load Flower 1.41's SuperNode once forwarded
                # the dropped device's round-1 reply before its ClientApp had pushed the reply's arrays, and the push
                # then failed ("ObjectPushError ... push session may have expired or been replaced"); that reply
                # arrives as an error. Tolerated only with that signature in the device's log, in round 1 only.
                flower_race = "ObjectPushError" in (tmp_path / "drop.log").read_text(errors="replace")
                heard = [r["replies"] for r in rows[1:]]
                assert heard == [3, 3] or (flower_race and heard == [2, 3] and rows[1]["failures"] == 1), (name, heard)
                assert all(set(u) == {"0", "1", "2"} and min(u.values()) > 0 for u in ups), (name, ups)
                assert CLIENT["drop"] in rows[2]["clients"], (name, rows[2])
                # the link really was down while the device tried to reach the SuperLink
                assert "Connection attempt failed" in (tmp_path / "drop.log").read_text(errors="replace")
                print(f"{name}: round s {[round(r['round_s'], 1) for r in rows[1:]]}, "
                      f"slow device up {[u[str(CLIENT['slow'])] for u in ups]} B")
        finally:
            launch.stop_tree(procs, timeout=10)
    assert launch.process_tree({p.pid for p in procs}) == []
