"""What the SuperLink's state store costs: one FedAvg run on a local cluster, the SuperLink's state in its SQLite
file and in memory, in turn (docs/deployment.md#superlink-state).

Each run: a local cluster (``hetfl.cluster.local_cluster``) of `--nodes` SuperNodes, the quickstart CNN on
Fashion-MNIST, full participation, 2 local steps; the SuperLink process's user + system CPU while the run goes.
Run it alone on the machine.

    python scripts/superlink_state.py [--nodes 4] [--rounds 3] [--repeats 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hetfl import cluster  # noqa: E402

RUN = {"dataset": "fashion_mnist", "data-source": "local", "model": "cnn", "batch-size": 32, "lr": 0.05,
       "momentum": 0.9, "method": "fedavg", "fraction-train": 1.0, "local-steps": 2, "max-test-samples": 200}


def cpu_s(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def one(state_file: bool, nodes: int, rounds: int) -> tuple[float, float]:
    """(SuperLink CPU seconds during the run, wall seconds of the run)."""
    with tempfile.TemporaryDirectory(prefix="hetfl-state-") as d:
        with cluster.local_cluster(nodes, Path(d) / "flwr", state_file=state_file) as c:
            c0, t0 = cpu_s(c.link.proc.pid), time.monotonic()
            cluster.submit(c, None, {**RUN, "num-server-rounds": rounds, "min-available-nodes": nodes,
                                     "run-name": "state"}, results_dir=Path(d), timeout=900)
            return cpu_s(c.link.proc.pid) - c0, time.monotonic() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=2)
    a = p.parse_args()
    for _ in range(a.repeats):
        for state_file in (True, False):
            cpu, wall = one(state_file, a.nodes, a.rounds)
            print(f"state {'file  ' if state_file else 'memory'}: SuperLink CPU {cpu:5.1f} s during the run "
                  f"({wall:.1f} s wall)", flush=True)


if __name__ == "__main__":
    main()
