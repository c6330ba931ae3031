"""A 3-node cluster on this machine whose devices measure themselves (issue #77's acceptance run; docs/fleets.md).

A SuperLink and three SuperNodes on loopback, none declaring a profile: node 0 free, node 1 in a cgroup capped at
50% of a core, node 2 at 20% (each SuperNode with its SuperExec and ClientApps inside its cap; cgroup v1, root).
Run A (SHEFL, measure-devices) measures the devices and assigns the classes; `hetfl fleet measure` writes its
fleet; run B (AdaptiveFL, a round budget between the devices' predicted full-model times, another seed) shows the
capacities the devices gave themselves and its real round times, which `hetfl fleet check` sets against the fleet's
simulated clock. Prints every number the closing note gives; stops everything it started.

    python scripts/measured_cluster.py --out /tmp/measured-cluster
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hetfl import launch  # noqa: E402

CAPS = {1: 0.5, 2: 0.2}  # node -> share of one core
RUN = {"dataset": "fashion_mnist", "data-source": "local", "model": "cnn", "partitioner": "iid", "fraction-train": 1.0,
       "local-steps": 20, "batch-size": 32, "lr": 0.05, "max-test-samples": 500, "num-server-rounds": 3,
       "min-available-nodes": 3, "checkpoint": False, "measure-devices": True, "client-threads": 1}


def _wait(log: Path, text: str, proc: subprocess.Popen, seconds: float = 180.0) -> None:
    end = time.monotonic() + seconds
    while text not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > end:
            raise RuntimeError(f"{log}: {text!r} did not appear:\n{log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.3)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="/tmp/measured-cluster")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("FLWR_HOME", "PYTHONPATH")}
    env.update(PATH=os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]]), FLWR_DISABLE_UPDATE_CHECK="1",
               FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1", HF_HUB_OFFLINE="1", HOME=str(out / "user"),
               OMP_WAIT_POLICY="PASSIVE")
    port, link_home, procs, groups = launch.free_port(), out / "server", [], contextlib.ExitStack()

    def start(cmd: list[str], log: Path) -> subprocess.Popen:
        with open(log, "wb") as f:
            procs.append(subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT,
                                          start_new_session=True))
        return procs[-1]

    def run(name: str, over: dict) -> dict:
        rc = launch.write_run_config(out / f"{name}.toml", None, {**RUN, **over, "run-name": name,
                                                                  "results-dir": str(out / "results")})
        r = subprocess.run(["flwr", "run", ".", "hetfl", "--stream", "--run-config", str(rc)],
                           env={**env, "FLWR_HOME": str(link_home)}, cwd=app, capture_output=True, text=True, timeout=1800)
        if r.returncode:
            raise RuntimeError(r.stdout[-3000:] + r.stderr[-3000:])
        return json.loads((out / "results" / name / "metrics.json").read_text())

    try:
        link = start([sys.executable, "-m", "hetfl.cluster", "superlink", "--port", str(port), "--insecure",
                      "--state", "memory", "--home", str(link_home)], out / "superlink.log")
        _wait(out / "superlink.log", "SuperLink serving on", link)
        for i in range(3):
            node = [sys.executable, "-m", "hetfl.cluster", "supernode", "--superlink", f"127.0.0.1:{port}",
                    "--insecure", "--node-config", f"partition-id={i} num-partitions=3 client-id={i}"]
            if i in CAPS:
                node = launch.in_cgroup(groups.enter_context(launch.cpu_capped(f"hetfl-cluster-{os.getpid()}-{i}",
                                                                                CAPS[i])), node)
            _wait(out / f"node{i}.log", "SuperNode of", start(node, out / f"node{i}.log"))
        app = launch.stage_app(ROOT, out / "app")
        a_run = run("measure-shefl", {"method": "shefl", "shefl-models": 2, "shefl-hpc-per-round": 1,
                                      "shefl-hpc-fraction": 0.34, "seed": 0})
        fleet = out / "measured.toml"
        subprocess.run([sys.executable, "-m", "hetfl.fleets", "measure", str(out / "results" / "measure-shefl" /
                                                                           "metrics.json"), "-o", str(fleet)], check=True)
        from hetfl import methods
        from hetfl.adaptivefl_app.task import pool_of
        from hetfl.common.costs import step_flops
        from hetfl.common.rundata import model_input_shape

        cfg = methods.validate({**RUN, "method": "adaptivefl"})
        pool = pool_of(cfg)
        full = step_flops(pool.build(len(pool) - 1), tuple(model_input_shape(cfg)), RUN["batch-size"]) * RUN["local-steps"]
        t = sorted(full / d["flops-per-s"] for d in a_run["measured_devices"].values())
        budget = math.sqrt(t[0] * t[1])  # the fastest device affords the full model, the others less
        b_run = run("check-adaptivefl", {"method": "adaptivefl", "adaptivefl-round-budget-s": budget, "seed": 1})
        check = subprocess.run([sys.executable, "-m", "hetfl.fleets", "check", str(fleet),
                                str(out / "results" / "check-adaptivefl" / "metrics.json")], capture_output=True,
                               text=True, check=True).stdout
        print(f"CPU: {__import__('torch').backends.cpu.get_cpu_capability()}; caps (share of a core): node 0 none, "
              f"{', '.join(f'node {n} {c:g}' for n, c in CAPS.items())}")
        for c, d in sorted(a_run["measured_devices"].items()):
            print(f"client {c}: {d['samples-per-s']:.1f} samples/s, {d['flops-per-s'] / 1e9:.2f} GFLOP/s, "
                  f"{d['memory-bytes'] / 2**30:.1f} GiB free; SHEFL class {a_run['roles']['measured'][c].upper()}")
        for r in a_run["rounds"][1:]:
            print(f"run A round {r['round']}: reply s {r['reply_s_by_client']}, train s {r['train_s_by_client']}")
        print(f"AdaptiveFL budget {budget:.2f} s; pool sizes {[e.size for e in pool.entries]}")
        for r in b_run["rounds"][1:]:
            print(f"run B round {r['round']}: capacity {r.get('capacity_by_client')}, largest back "
                  f"{r.get('largest_back_by_client')}, reply s {r['reply_s_by_client']}, train s {r['train_s_by_client']}")
        print(fleet.read_text())
        print(check)
    finally:
        launch.stop_tree(procs, timeout=10.0)
        groups.close()  # the cgroups removed
    return 0


if __name__ == "__main__":
    sys.exit(main())
