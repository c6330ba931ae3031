"""Benchmarks (`make bench`): the cost of Flower's simulation against plain PyTorch, bf16, and scale.

(a) light: FedAvg on FMNIST Dir(0.6), 100 SuperNodes, 10 sampled per round, 10 local steps of batch
    16. Simulated round = `flwr run` in the Simulation Engine (SuperLink, Ray actors, message
    serialization), its round time minus centralized evaluation, median over rounds >= 2 (round 1
    pays start-up). Plain = one process, no Flower: for the same 10 clients, copy the global
    weights, run the same `train` loop, average the weights (FedAvg). Ratio = simulated / plain.
(b) paper: the same at the papers' local work (10 local epochs per round).
(c) precision: samples/s of the CNN's training loop at batch 16 and 64, fp32 vs bf16 autocast.
(d) scale: 10,000 simulated SuperNodes (IID partitions, 10 clients per round): seconds for the
    discovery of every node, seconds per round, and the peak resident memory of the whole process
    tree (launcher, SuperLink, ServerApp, Ray), sampled every 0.2 s.

Both sides use the machine's cores: the simulation runs one ClientApp per core with one thread
each (Flower's default here), the plain loop runs clients one after the other with torch's
default threads. Nothing else should run meanwhile.

    python scripts/bench_round.py                 # all four (~20 min on 2 cores)
    python scripts/bench_round.py --only a c      # a subset
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hetfl import launch  # noqa: E402
from hetfl.common.config import validate  # noqa: E402
from hetfl.common.data import DataSpec, load_partition  # noqa: E402
from hetfl.common.models import get_state, set_state  # noqa: E402
from hetfl.common.nodes import sample_clients  # noqa: E402
from hetfl.common.task import make_model  # noqa: E402
from hetfl.common.train import Normalizer, train  # noqa: E402

LIGHT = {
    "method": "fedavg", "dataset": "fashion_mnist", "data-source": "local", "partitioner": "dirichlet",
    "dirichlet-alpha": 0.6, "model": "cnn", "fraction-train": 0.1, "min-available-nodes": 100, "local-steps": 10,
    "batch-size": 16, "lr": 0.01, "checkpoint": False,
}
PAPER = {**LIGHT, "local-steps": 0, "local-epochs": 10}
SCALE = {**LIGHT, "partitioner": "iid", "fraction-train": 0.001, "min-available-nodes": 10_000, "max-test-samples": 2000}


def plain_rounds(cfg: dict, rounds: int, num_partitions: int = 100) -> list[float]:
    """Seconds per round of a plain sequential FedAvg loop over the clients the simulation samples (no evaluation)."""
    model = make_model(cfg)
    norm = Normalizer(cfg["dataset"])
    spec = DataSpec.from_config(cfg, num_partitions)
    parts = {i: load_partition(spec, i, cfg["cache-dir"]) for i in range(num_partitions)}  # pre-load (sim caches too)
    k = max(int(num_partitions * cfg["fraction-train"]), 1)
    times = []
    for rnd in range(1, rounds + 1):
        t0 = time.perf_counter()
        global_state = get_state(model)
        acc, total = None, 0
        for pid in sample_clients(range(num_partitions), k, cfg["seed"], rnd):
            set_state(model, global_state)
            res = train(model, parts[pid], norm, steps=cfg["local-steps"], epochs=cfg["local-epochs"],
                        batch_size=cfg["batch-size"], lr=cfg["lr"], seed=rnd * 1000 + pid)
            st = get_state(model)
            w = res.num_examples
            acc = {k: v.astype(np.float64) * w for k, v in st.items()} if acc is None else {k: acc[k] + st[k] * w for k in acc}
            total += w
        set_state(model, {k: v / total for k, v in acc.items()})
        times.append(time.perf_counter() - t0)
    return times


def simulated(setting: dict, rounds: int, supernodes: int, results_dir: str, tag: str) -> tuple[list[dict], Path]:
    run_dir = launch.run(None, {**setting, "num-server-rounds": rounds, "run-name": f"bench-{tag}-{time.strftime('%Y%m%d-%H%M%S')}"},
                         num_supernodes=supernodes, results_dir=results_dir)
    return json.loads((run_dir / "metrics.json").read_text())["rounds"], run_dir


def versus_plain(setting: dict, rounds: int, results_dir: str, tag: str) -> dict:
    rows, run_dir = simulated(setting, rounds, 100, results_dir, tag)
    steady = [r for r in rows if r["round"] >= 2]
    sim = statistics.median(r["round_s"] - r["eval_s"] for r in steady)
    plain = statistics.median(plain_rounds(validate(setting), rounds)[1:])
    return {"sim_round_s": sim, "sim_send_and_receive_s": statistics.median(r["comm_s"] for r in steady),
            "sim_client_train_s_mean": statistics.mean(r.get("client_train_s", float("nan")) for r in steady),
            "plain_round_s": plain, "ratio": sim / plain, "rounds_measured": len(steady), "run_dir": str(run_dir)}


def precision_throughput(seconds: float = 4.0) -> dict:
    """Training samples/s of the FMNIST CNN with the real `train` loop, fp32 vs bf16 autocast, batch 16 and 64."""
    cfg = validate({"dataset": "fashion_mnist", "data-source": "local", "partitioner": "iid"})
    data = load_partition(DataSpec.from_config(cfg, 10), 0, cfg["cache-dir"])
    norm, out = Normalizer("fashion_mnist"), {}
    for batch in (16, 64):
        for precision in ("fp32", "bf16"):
            model = make_model(cfg)
            train(model, data, norm, steps=20, batch_size=batch, precision=precision)  # warm-up
            steps = 50
            while True:
                res = train(model, data, norm, steps=steps, batch_size=batch, precision=precision)
                if res.seconds >= seconds or steps >= 5000:
                    break
                steps *= 2
            out[f"{precision}_b{batch}_samples_per_s"] = steps * batch / res.seconds
    out["torch_threads"] = torch.get_num_threads()
    return out


def _tree_rss_bytes(roots: set[int]) -> int:
    total = 0
    for pid in launch.process_tree(roots):
        try:
            with open(f"/proc/{pid}/status") as f:
                total += next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            pass
    return total


def scale_probe(rounds: int, results_dir: str, nodes: int = 10_000) -> dict:
    """Peak memory of the whole process tree and seconds per round with `nodes` simulated SuperNodes."""
    peak, stop = [0], threading.Event()

    def watch() -> None:
        while not stop.is_set():
            roots = {os.getpid()} | ({launch.LAST_SESSION} if launch.LAST_SESSION else set())
            peak[0] = max(peak[0], _tree_rss_bytes(roots))
            time.sleep(0.2)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    t0 = time.perf_counter()
    try:
        rows, run_dir = simulated({**SCALE, "min-available-nodes": nodes}, rounds, nodes, results_dir, "scale")
    finally:
        stop.set()
        t.join()
    trained = [r for r in rows if r["round"] >= 1]
    return {"supernodes": nodes, "clients_per_round": len(trained[-1].get("clients", [])),
            "peak_rss_gb": peak[0] / 1e9, "round_s_median": statistics.median(r["round_s"] - r["eval_s"] for r in trained),
            "discovery_and_round0_eval_s": rows[0]["elapsed_s"], "wall_s": time.perf_counter() - t0,
            "run_dir": str(run_dir)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="*", choices=("a", "b", "c", "d"), default=["a", "b", "c", "d"])
    p.add_argument("--rounds", type=int, default=6, help="rounds of the light setting (a)")
    p.add_argument("--paper-rounds", type=int, default=4, help="rounds at 10 local epochs (b)")
    p.add_argument("--scale-rounds", type=int, default=3, help="rounds of the scale probe (d)")
    p.add_argument("--scale-nodes", type=int, default=10_000)
    p.add_argument("--results-dir", default="results/bench")
    a = p.parse_args()
    launch.setup_signals()
    out: dict[str, dict] = {}
    if "a" in a.only:
        out["a_light"] = versus_plain(LIGHT, a.rounds, a.results_dir, "light")
    if "b" in a.only:
        out["b_paper"] = versus_plain(PAPER, a.paper_rounds, a.results_dir, "paper")
    if "c" in a.only:
        out["c_precision"] = precision_throughput()
    if "d" in a.only:
        out["d_scale"] = scale_probe(a.scale_rounds, a.results_dir, a.scale_nodes)
    print(json.dumps(out, indent=2))
    print()
    for key, label in (("a_light", "light (10 steps)"), ("b_paper", "paper (10 epochs)")):
        if key in out:
            r = out[key]
            print(f"({key[0]}) {label}: simulated round {r['sim_round_s']:.3f} s | plain loop {r['plain_round_s']:.3f} s | "
                  f"ratio {r['ratio']:.2f}x")
    if "c_precision" in out:
        c = out["c_precision"]
        print("(c) samples/s: " + ", ".join(f"{k.replace('_samples_per_s', '')} {v:.0f}" for k, v in c.items() if k.endswith("_per_s")))
    if "d_scale" in out:
        d = out["d_scale"]
        print(f"(d) {d['supernodes']} SuperNodes: {d['round_s_median']:.2f} s/round, peak RSS of the process tree "
              f"{d['peak_rss_gb']:.2f} GB, discovery of every node + round-0 evaluation {d['discovery_and_round0_eval_s']:.1f} s")
    Path(a.results_dir).mkdir(parents=True, exist_ok=True)
    (Path(a.results_dir) / f"bench-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
