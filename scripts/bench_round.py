"""Benchmark: wall time of a simulated FedAvg round vs a plain PyTorch loop doing the same local work.

Simulated: `flwr run` in the Simulation Engine (SuperLink, Ray actors, message
serialization), FMNIST Dir(0.6), 100 SuperNodes, 10 sampled per round, 10 local steps of
batch 16, lr 0.01. The per-round training time is the server's send_and_receive time
(`comm_s`: dispatch, client training, replies) plus aggregation, i.e. the round time
minus centralized evaluation, averaged over rounds 2..R (round 1 pays one-off start-up).

Plain: one process, no Flower: for each of 10 sampled partitions copy the global
weights, run the same `train` loop (same steps, batch, lr), then average the weights
(FedAvg). Same machine, torch's default threads.

    python scripts/bench_round.py --rounds 6
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hetfl import launch  # noqa: E402
from hetfl.common.config import validate  # noqa: E402
from hetfl.common.data import DataSpec, load_partition  # noqa: E402
from hetfl.common.models import get_state, set_state  # noqa: E402
from hetfl.common.train import Normalizer, train  # noqa: E402
from hetfl.common.task import make_model  # noqa: E402

SETTING = {
    "method": "fedavg", "dataset": "fashion_mnist", "partitioner": "dirichlet", "dirichlet-alpha": 0.6,
    "model": "cnn", "fraction-train": 0.1, "min-available-nodes": 100, "local-steps": 10, "batch-size": 16,
    "lr": 0.01,
}


def plain_rounds(cfg: dict, rounds: int, clients: int = 10, num_partitions: int = 100) -> list[float]:
    """Seconds per round of a plain sequential FedAvg loop (no evaluation)."""
    model = make_model(cfg)
    norm = Normalizer(cfg["dataset"])
    spec = DataSpec.from_config(cfg, num_partitions)
    parts = {i: load_partition(spec, i, cfg["cache-dir"]) for i in range(num_partitions)}  # pre-load (sim caches too)
    rng = random.Random(0)
    times = []
    for rnd in range(rounds):
        t0 = time.perf_counter()
        global_state = get_state(model)
        acc, total = None, 0
        for pid in rng.sample(range(num_partitions), clients):
            set_state(model, global_state)
            res = train(model, parts[pid], norm, steps=cfg["local-steps"], batch_size=cfg["batch-size"], lr=cfg["lr"], seed=rnd * 1000 + pid)
            st = get_state(model)
            w = res.num_examples
            acc = {k: v.astype(np.float64) * w for k, v in st.items()} if acc is None else {k: acc[k] + st[k] * w for k in acc}
            total += w
        set_state(model, {k: v / total for k, v in acc.items()})
        times.append(time.perf_counter() - t0)
    return times


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--results-dir", default="results/bench")
    a = p.parse_args()
    cfg = validate(SETTING)
    run_dir = launch.run(None, {**SETTING, "num-server-rounds": a.rounds, "run-name": f"bench-{time.strftime('%Y%m%d-%H%M%S')}"},
                         num_supernodes=100, results_dir=a.results_dir)
    rows = json.loads((run_dir / "metrics.json").read_text())["rounds"]
    steady = [r for r in rows if r["round"] >= 2]
    sim = [r["round_s"] - r["eval_s"] for r in steady]
    comm = [r["comm_s"] for r in steady]
    client = [r.get("client_train_s", float("nan")) for r in steady]
    torch.set_num_threads(torch.get_num_threads())
    plain = plain_rounds(cfg, a.rounds)[1:]
    s, pl = statistics.median(sim), statistics.median(plain)
    out = {
        "sim_round_s_median": s, "sim_send_and_receive_s_median": statistics.median(comm),
        "sim_client_train_s_mean": statistics.mean(client), "plain_round_s_median": pl, "ratio": s / pl,
        "eval_s_median": statistics.median(r["eval_s"] for r in steady), "rounds_measured": len(steady), "run_dir": str(run_dir),
    }
    print(json.dumps(out, indent=2))
    print(f"\nsimulated FedAvg round (no eval): {s:.3f} s | plain PyTorch loop: {pl:.3f} s | ratio {s / pl:.2f}x")
    (run_dir / "bench.json").write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
