"""Real slow devices on one machine (issue #77): two SuperNodes beside a SuperLink on loopback, one of them (the
SuperNode, its SuperExec and every ClientApp it starts) in a cgroup capped at 20% of a core (cgroup v1
``cpu.cfs_quota_us``), neither declaring a device profile. Each measures itself at discovery (measure-devices): the
capped one measures at least 2x slower, becomes SHEFL's low-power client, and under a per-round time budget gets a
smaller AdaptiveFL capacity (and so submodel) than the other. Skipped, with the reason, where the cgroup cannot be
made. The assertions are ratios: the cap is a hard limit, but the free node's rate is whatever share of a core it
gets, so the test runs alone (marker ``alone``, after the other hosts tests in make test-deploy): beside the
multi-host walk-through on a 2-core AVX2 machine the free node measured 120 samples/s against the capped one's 62
(a ratio of 0.51, the free node at about 0.39 of a core), where alone it gets most of a core."""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hetfl import launch

from .conftest import require_fmnist
from .test_two_supernodes import _wait_for

ROOT = Path(__file__).resolve().parent.parent
CPU = launch.CPU_CGROUP
QUOTA = 0.2  # of one core
RUN = {"dataset": "fashion_mnist", "data-source": "local", "model": "cnn", "partitioner": "iid", "fraction-train": 1.0,
       "local-steps": 4, "batch-size": 32, "lr": 0.05, "max-test-samples": 200, "num-server-rounds": 1,
       "min-available-nodes": 2, "checkpoint": False, "measure-devices": True, "measure-seconds": 2.0,
       "client-threads": 1}


def _cgroup(stack: contextlib.ExitStack, name: str) -> Path:
    """A cgroup v1 cpu group capped at QUOTA of a core, removed when the test ends, or a skip naming why it cannot be
    made here."""
    if os.geteuid() != 0 or not (CPU / "cpu.cfs_quota_us").exists():
        pytest.skip(f"no writable cgroup v1 cpu controller at {CPU} (root: {os.geteuid() == 0})")
    try:
        return stack.enter_context(launch.cpu_capped(name, QUOTA))
    except OSError as ex:
        pytest.skip(f"cannot make the cgroup {CPU / name}: {ex}")


def _full_model_seconds(flops_per_s: float) -> float:
    """The predicted seconds of a round's local work (RUN's local steps) on AdaptiveFL's full model L1."""
    from hetfl import methods
    from hetfl.adaptivefl_app.task import pool_of
    from hetfl.common.costs import step_flops
    from hetfl.common.rundata import model_input_shape

    cfg = methods.validate({**RUN, "method": "adaptivefl"})
    pool = pool_of(cfg)
    flops = step_flops(pool.build(len(pool) - 1), tuple(model_input_shape(cfg)), RUN["batch-size"])
    return RUN["local-steps"] * flops / flops_per_s


@pytest.mark.hosts
@pytest.mark.alone
@pytest.mark.slow
def test_a_capped_device_measures_slower_becomes_an_lpc_and_affords_a_smaller_submodel(tmp_path):
    require_fmnist()
    stack = contextlib.ExitStack()
    group = _cgroup(stack, f"hetfl-test-{os.getpid()}")
    env = {k: v for k, v in os.environ.items() if k not in ("FLWR_HOME", "PYTHONPATH")}
    env.update(PATH=os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]]), FLWR_DISABLE_UPDATE_CHECK="1",
               FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1", HF_HUB_OFFLINE="1", HOME=str(tmp_path / "user"))
    port, link_home, procs = launch.free_port(), tmp_path / "server", []

    def start(cmd: list[str], log: Path) -> subprocess.Popen:
        with open(log, "wb") as out:
            procs.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                          start_new_session=True))
        return procs[-1]

    def run(name: str, over: dict) -> dict:
        rc_file = launch.write_run_config(tmp_path / f"{name}.toml", None,
                                          {**RUN, **over, "run-name": name, "results-dir": str(tmp_path / "results")})
        out = subprocess.run(["flwr", "run", ".", "hetfl", "--stream", "--run-config", str(rc_file)],
                             env={**env, "FLWR_HOME": str(link_home)}, cwd=app, capture_output=True, text=True,
                             timeout=600)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        return json.loads((tmp_path / "results" / name / "metrics.json").read_text())

    try:
        link = start([sys.executable, "-m", "hetfl.cluster", "superlink", "--port", str(port), "--insecure",
                      "--state", "memory", "--home", str(link_home)], tmp_path / "superlink.log")
        _wait_for(tmp_path / "superlink.log", "SuperLink serving on", link)
        for i in (0, 1):  # no device-class, no capacity: each node measures itself
            node = [sys.executable, "-m", "hetfl.cluster", "supernode", "--superlink", f"127.0.0.1:{port}",
                    "--insecure", "--node-config", f"partition-id={i} num-partitions=2 client-id={i}"]
            if i == 1:  # into the capped cgroup before it starts: everything it starts inherits the cap
                node = launch.in_cgroup(group, node)
            _wait_for(tmp_path / f"node{i}.log", "SuperNode of", start(node, tmp_path / f"node{i}.log"))
        app = launch.stage_app(ROOT, tmp_path / "app")

        shefl = run("shefl", {"method": "shefl", "shefl-models": 2, "shefl-hpc-per-round": 1, "shefl-hpc-fraction": 0.5})
        capped_tree = launch.process_tree({procs[2].pid})
        assert len(capped_tree) >= 2 and all(f"cpu,cpuacct:/{group.name}" in Path(f"/proc/{p}/cgroup").read_text()
                                             or f":cpu:/{group.name}" in Path(f"/proc/{p}/cgroup").read_text()
                                             for p in capped_tree), capped_tree  # its SuperExec and ClientApps too
        dev = shefl["measured_devices"]
        fast, slow = dev["0"], dev["1"]
        assert slow["samples-per-s"] <= 0.5 * fast["samples-per-s"], dev  # the cap shows as a sustained rate
        assert slow["memory-bytes"] > 0 and "cnn" in slow["measured-on"], slow
        assert shefl["roles"]["measured"] == {"0": "hpc", "1": "lpc"}, shefl["roles"]
        row = shefl["rounds"][1]
        assert set(row["reply_s_by_client"]) == {"0", "1"}, row
        assert all(row["reply_s_by_client"][c] >= row["train_s_by_client"][c] > 0 for c in ("0", "1")), row

        # a budget between the two devices' predicted full-model times (their geometric mean): the free device
        # affords the full model, the capped one a smaller submodel
        budget = math.sqrt(_full_model_seconds(fast["flops-per-s"]) * _full_model_seconds(slow["flops-per-s"]))
        ada = run("adaptivefl", {"method": "adaptivefl", "adaptivefl-round-budget-s": budget})
        caps = ada["rounds"][1]["capacity_by_client"]
        back = ada["rounds"][1]["largest_back_by_client"]
        assert caps["1"] < caps["0"], (caps, ada["measured_devices"])
        assert all(back[c] <= caps[c] for c in back), (back, caps)  # every returned model fits its device
        print(f"measured: {dev}; SHEFL roles {shefl['roles']['measured']}; AdaptiveFL budget {budget:.2f} s, "
              f"capacities {caps}; reply s {row['reply_s_by_client']}, train s {row['train_s_by_client']}")
    finally:
        launch.stop_tree(procs, timeout=10.0)
        stack.close()  # the cgroup removed, nothing we started left in it
