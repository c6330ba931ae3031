"""Devices on real links: one whose uplink is shaped with tbf (a phone's or a board's uplink) and one whose link
goes down as round 1 starts, each in its own network namespace, with a SuperLink in a third
(docs/deployment.md#links).

The run finishes every round, for FedAvg and SHEFL, and nothing is lost that Flower's rules keep: the slow device's
CNN upload (6.9 MB: ~14 s at 4 Mbit/s) is waited for (the round timeout is an upper bound only, far above it). The
outage is set against Flower's liveness rule, the SuperLink's only clock on a device: a SuperNode heartbeats every
17.5-22.5 s and is taken offline 60 s (HEARTBEAT_PATIENCE x 30 s) after its last acknowledged heartbeat.
- FedAvg: the link is down for 10 s, so the device's heartbeats resume well before the earliest expiry (37.5 s after
  the drop): its SuperNode keeps retrying and its reply of that round arrives once the link is back.
- SHEFL: the link is down for 75 s, past the latest expiry whatever the heartbeat's phase: the SuperLink answers for
  the device with NODE_UNAVAILABLE, the round goes on with the other two updates, and the device, back, is waited
  for (min-available-nodes), sampled and heard in round 2.
Both outcomes are fixed by the outage's length alone; a 30-s outage (this test's first version) raced the heartbeat
and failed a CI run. Each round's row names every client's bytes and its failures' reasons; the kernel's count of
the device's packets that found no route shows the outage met its traffic. Nothing here is judged by the clock.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from flwr.common.constant import HEARTBEAT_DEFAULT_INTERVAL, HEARTBEAT_PATIENCE

from hetfl import launch

from .conftest import after_round, require_fmnist
from .netns import network, require_namespaces

ROOT = Path(__file__).resolve().parent.parent
NET = "10.78.0"
HOSTS = {"server": f"{NET}.1", "fast": f"{NET}.10", "slow": f"{NET}.11", "drop": f"{NET}.12"}
CLIENT = {"fast": 0, "slow": 1, "drop": 2}
PORT = 9093
RATE = "4mbit"
PATIENCE_S = HEARTBEAT_PATIENCE * HEARTBEAT_DEFAULT_INTERVAL  # 60 s without a heartbeat: the node is offline
SHORT_DOWN_S = 10.0  # back before the earliest expiry (last heartbeat 22.5 s before the drop: expiry at 37.5 s)
LONG_DOWN_S = PATIENCE_S + 15.0  # away past the latest expiry (a heartbeat just before the drop: expiry at 60 s)
TIMEOUT_S = 900.0  # round-timeout: an upper bound only (a hang guard), never what ends a round here
RUNS = {  # run -> (run config, seconds the dropping device's link is down as round 1 starts)
    "fedavg": ({}, SHORT_DOWN_S),
    "shefl": ({"method": "shefl", "shefl-models": 2, "shefl-hpc-per-round": 1}, LONG_DOWN_S),
}
COMMON = {"dataset": "fashion_mnist", "data-source": "local", "model": "cnn", "partitioner": "dirichlet",
          "dirichlet-alpha": 1.0, "fraction-train": 1.0, "local-steps": 3, "batch-size": 32, "lr": 0.05,
          "momentum": 0.9, "max-test-samples": 300, "num-server-rounds": 2, "min-available-nodes": 3,
          "round-timeout": TIMEOUT_S, "checkpoint": False}


def _ns_run(ns: str, *cmd: str) -> None:
    subprocess.run(["ip", "netns", "exec", ns, *cmd], check=True, capture_output=True, text=True)


def _no_route(ns: str) -> int:
    """Packets namespace `ns` had to drop so far because no route led anywhere (its Ip OutNoRoutes counter): with
    its only link down, every packet it tries to send, TCP's retransmissions included."""
    lines = subprocess.run(["ip", "netns", "exec", ns, "cat", "/proc/net/snmp"], check=True, capture_output=True,
                           text=True).stdout.splitlines()
    ip = [line.split()[1:] for line in lines if line.startswith("Ip:")]
    return int(dict(zip(ip[0], ip[1]))["OutNoRoutes"])


def _start(ns: str, cmd: list[str], env: dict, log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(["ip", "netns", "exec", ns, *cmd], env=env, stdout=out, stderr=subprocess.STDOUT,
                                cwd=ROOT, start_new_session=True)


@pytest.mark.hosts
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
                    str(PORT), "--insecure", "--state", "memory", "--home", str(link_home)]
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
            for name, (over, down_s) in RUNS.items():
                rc_file = launch.write_run_config(tmp_path / f"{name}.toml", None,
                                                  {**COMMON, **over, "run-name": name, "results-dir": str(results)})
                metrics = results / name / "metrics.json"
                log_from = (tmp_path / "drop.log").stat().st_size  # this run's part of the device's log

                sent_down: dict[str, int] = {}

                def drop(ns_drop=ns["drop"], down_s=down_s, sent_down=sent_down):  # round 1 starts: link down, back
                    _ns_run(ns_drop, "ip", "link", "set", "eth0", "down")
                    before = _no_route(ns_drop)
                    time.sleep(down_s)
                    sent_down["packets"] = _no_route(ns_drop) - before
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
                heard = [(r["replies"], r["errors"]) for r in rows[1:]]
                device_log = (tmp_path / "drop.log").read_bytes()[log_from:].decode(errors="replace")
                if down_s < PATIENCE_S:
                    # every round heard every device: the slow one's update was waited for, the dropped one's arrived
                    # after its link came back (round 1), and it was sampled and heard again in round 2.
                    # One exception, Flower's and not the link's: under heavy load Flower 1.41's SuperNode once
                    # forwarded the dropped device's round-1 reply before its ClientApp had pushed the reply's arrays,
                    # and the push then failed ("ObjectPushError ... push session may have expired or been
                    # replaced"). Tolerated only with that signature in this run's device log, in round 1 only.
                    flower_race = "ObjectPushError" in device_log
                    assert heard == [(3, {}), (3, {})] or (flower_race and heard[1] == (3, {}) and heard[0][0] == 2
                                                           and sum(heard[0][1].values()) == 1), (name, heard)
                    assert all(set(u) == {"0", "1", "2"} and min(u.values()) > 0 for u in ups), (name, ups)
                else:
                    # the device was away past Flower's patience: the SuperLink answered for it (NODE_UNAVAILABLE), the
                    # round went on with the two real updates; round 2 waited for the device and heard all three
                    assert heard == [(2, {"NODE_UNAVAILABLE": 1}), (3, {})], (name, heard)
                    real = {c: b for c, b in ups[0].items() if c != str(CLIENT["drop"])}
                    assert set(real) == {"0", "1"} and min(real.values()) > 0, (name, ups[0])
                    assert ups[0].get(str(CLIENT["drop"]), 0) < 0.01 * min(real.values()), (name, ups[0])
                    assert set(ups[1]) == {"0", "1", "2"} and min(ups[1].values()) > 0, (name, ups[1])
                assert CLIENT["drop"] in rows[2]["clients"], (name, rows[2])
                # the link really was down while the device tried to reach the SuperLink: its packets found no
                # route. Counted by the kernel, not read from Flower's log: whether Flower logs a failed attempt
                # depends on where its calls stand when the link goes (a call already sent just waits), and one CI
                # run saw no such line in a 10-s outage. The SuperNode pulls at least every 3 s, so a 10-s outage
                # always holds some of its packets.
                assert sent_down.get("packets", 0) > 0, (name, sent_down, device_log[-2000:])
                print(f"{name}: round s {[round(r['round_s'], 1) for r in rows[1:]]}, packets with no route "
                      f"{sent_down['packets']}, "
                      f"slow device up {[u[str(CLIENT['slow'])] for u in ups]} B")
        finally:
            launch.stop_tree(procs, timeout=10)
    assert launch.process_tree({p.pid for p in procs}) == []
