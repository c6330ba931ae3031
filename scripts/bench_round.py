"""Benchmarks (`make bench`): the cost of Flower's simulation against plain PyTorch, bf16, and scale.

(a) light: FedAvg on FMNIST Dir(0.6), 100 SuperNodes, 10 sampled per round, 10 local steps of batch
    16. Simulated round = `flwr run` in the Simulation Engine (SuperLink, Ray actors, message
    serialization), its round time minus centralized evaluation, median over rounds >= 2 (round 1
    pays start-up). Plain = one process, no Flower: for the same 10 clients, copy the global
    weights, run the same `train` loop, average the weights (FedAvg). Ratio = simulated / plain.
(b) paper: the same at the papers' local work (10 local epochs per round).
(c) precision: samples/s of the CNN's training loop at batch 16 and 64, fp32 vs bf16 autocast.
(d) scale: 1,000 / 10,000 / 100,000 clients (IID partitions; Fashion-MNIST has 60,000 training images,
    so at 100,000 clients 40% hold none), hosted by 100 simulated SuperNodes (run-config num-clients),
    10 clients per round: seconds from launch to the end of round 1, the median round, and the growth of
    the machine's used memory (MemTotal - MemAvailable, sampled every 0.2 s; shared pages count once).

Both sides use the machine's cores: the simulation runs one ClientApp per core with one thread
each (Flower's default here), the plain loop runs clients one after the other with torch's
default threads. Nothing else should run meanwhile.

(e) SHEFL and AdaptiveFL, 2 light rounds with 10,000 clients on 100 SuperNodes.
(f) only when named: Co-Boosting's server step (hetfl.oneshot_app.coboost.co_boost) alone, 20 FMNIST CNN members
    and the authors' settings (30 generator steps, batch 128), its first --coboost-epochs epochs: seconds per epoch
    and the line a + b e through them (the distillation's pool grows by a batch an epoch), summed to 200 epochs.

    python scripts/bench_round.py                 # a-e (~25 min on 2 cores)
    python scripts/bench_round.py --only a c      # a subset
    python scripts/bench_round.py --only f        # ~20 min on 2 cores
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hetfl import launch  # noqa: E402
from hetfl.methods import validate  # noqa: E402
from hetfl.common.models import get_state, set_state  # noqa: E402
from hetfl.common.nodes import sample_clients  # noqa: E402
from hetfl.common.task import make_model  # noqa: E402
from hetfl.common.train import Normalizer, train  # noqa: E402
from hetfl.data.load import load_partition  # noqa: E402
from hetfl.data.spec import DataSpec  # noqa: E402

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


def samples_per_s(model, data, norm, batch: int, precision: str, seconds: float, warmup: int = 20,
                  max_steps: int = 5000) -> tuple[float, float]:
    """(training samples/s, warm-up seconds) of the real `train` loop: `warmup` steps, then doubling step counts
    until one measurement lasts `seconds` (or `max_steps`)."""
    t0 = time.perf_counter()
    train(model, data, norm, steps=warmup, batch_size=batch, precision=precision)
    warm, steps = time.perf_counter() - t0, 50
    while True:
        res = train(model, data, norm, steps=steps, batch_size=batch, precision=precision)
        if res.seconds >= seconds or steps >= max_steps:
            return steps * batch / res.seconds, warm
        steps *= 2


def precision_throughput(seconds: float = 4.0) -> dict:
    """Training samples/s of the FMNIST CNN with the real `train` loop, fp32 vs bf16 autocast, batch 16 and 64."""
    cfg = validate({"dataset": "fashion_mnist", "data-source": "local", "partitioner": "iid"})
    data = load_partition(DataSpec.from_config(cfg, 10), 0, cfg["cache-dir"])
    norm, out = Normalizer("fashion_mnist"), {}
    for batch in (16, 64):
        for precision in ("fp32", "bf16"):
            rate, _ = samples_per_s(make_model(cfg), data, norm, batch, precision, seconds)
            out[f"{precision}_b{batch}_samples_per_s"] = rate
    out["torch_threads"] = torch.get_num_threads()
    return out


def _used_memory_bytes() -> int:
    """The machine's used memory (total - available, psutil's reading of /proc/meminfo): shared pages count once,
    unlike a sum of RSS."""
    import psutil

    mem = psutil.virtual_memory()
    return mem.total - mem.available


def scale_probe(rounds: int, results_dir: str, clients: int, supernodes: int) -> dict:
    """Launch-to-round-1 seconds, median round and the growth of the machine's used memory with `clients` clients
    hosted by `supernodes` simulated SuperNodes (FedAvg, light work, 10 clients a round)."""
    base, peak, stop = _used_memory_bytes(), [0], threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _used_memory_bytes())
            time.sleep(0.2)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    t0 = time.perf_counter()
    try:
        setting = {**SCALE, "num-clients": clients if clients > supernodes else 0, "min-available-nodes": supernodes,
                   "fraction-train": 10 / clients}
        rows, run_dir = simulated(setting, rounds, supernodes, results_dir, f"scale{clients}")
    finally:
        stop.set()
        t.join()
    wall = time.perf_counter() - t0
    trained = [r for r in rows if r["round"] >= 1]
    # launch -> end of round 1: the whole launch minus what the ServerApp measured after round 1 (that tail holds the
    # later rounds and the shutdown is left in, so this is an upper bound)
    to_round1 = wall - (rows[-1]["elapsed_s"] - trained[0]["elapsed_s"])
    return {"clients": clients, "supernodes": supernodes, "clients_per_round": len(trained[-1].get("clients", [])),
            "launch_to_round1_s": to_round1, "discovery_and_round0_eval_s": rows[0]["elapsed_s"],
            "round_s_median": statistics.median(r["round_s"] for r in trained),
            "round_s_median_without_eval": statistics.median(r["round_s"] - r["eval_s"] for r in trained),
            "memory_growth_gb": (peak[0] - base) / 1e9, "wall_s": wall, "run_dir": str(run_dir)}


METHODS_AT_SCALE = {  # (e): 2 light rounds, 10 clients a round, IID partitions, hosted by 100 SuperNodes
    "shefl": ("configs/shefl/fmnist-dir0.6.toml", {"local-steps": 10, "local-epochs": 1, "batch-size": 16}),
    "adaptivefl": ("configs/quickstart-adaptivefl.toml", {"local-steps": 10}),
}


def methods_at_scale(clients: int, supernodes: int, results_dir: str) -> dict:
    """Seconds from launch to the end of round 1 and of round 2 for SHEFL and AdaptiveFL with `clients` clients.

    FENS is not run here: every client uploads its model once and downloads the whole ensemble, so at
    10,000 clients each client would receive 10,000 INT8 CNNs (17 GB): its design bounds it to tens of
    clients (docs/architecture.md#scale).
    """
    out = {}
    for name, (preset, over) in METHODS_AT_SCALE.items():
        t0 = time.perf_counter()
        run_dir = launch.run(preset, {**over, "num-clients": clients, "min-available-nodes": supernodes,
                                      "fraction-train": 10 / clients, "partitioner": "iid", "num-server-rounds": 2,
                                      "max-test-samples": 2000, "checkpoint": False,
                                      "run-name": f"bench-{name}{clients}-{time.strftime('%Y%m%d-%H%M%S')}"},
                             num_supernodes=supernodes, results_dir=results_dir)
        wall = time.perf_counter() - t0
        rows = json.loads((run_dir / "metrics.json").read_text())["rounds"]
        out[name] = {"clients": clients, "supernodes": supernodes, "wall_s": wall,
                     "launch_to_round1_s": wall - (rows[-1]["elapsed_s"] - rows[1]["elapsed_s"]),
                     "round_s": [r["round_s"] for r in rows[1:]], "clients_per_round": [len(r["clients"]) for r in rows[1:]],
                     "accuracy": rows[-1]["accuracy"], "run_dir": str(run_dir)}
    return out


def coboost_epochs(epochs: int, full: int = 200) -> dict:
    """(f): seconds per epoch of Co-Boosting's server step over random 20-member FMNIST CNN ensembles (the cost does
    not depend on what the members learnt), and the least-squares line through them summed over `full` epochs."""
    from hetfl.common.models import build_model
    from hetfl.common.train import Normalizer
    from hetfl.oneshot_app.coboost import co_boost
    from hetfl.oneshot_app.keys import CoBoostParams

    torch.manual_seed(0)
    members = [build_model("cnn", 10, (1, 28, 28)) for _ in range(20)]
    stamps = [time.perf_counter()]
    co_boost(members, build_model("cnn", 10, (1, 28, 28)), CoBoostParams(epochs=epochs), (1, 28, 28), 10,
             Normalizer("fashion_mnist"), 0, epoch_end=lambda e, w: stamps.append(time.perf_counter()))
    t = np.diff(stamps)
    b, a = np.polyfit(np.arange(1, len(t) + 1), t, 1)
    return {"epoch_s": t.tolist(), "fit_a_s": float(a), "fit_b_s": float(b), "full_epochs": full,
            "full_h": float(sum(a + b * e for e in range(1, full + 1)) / 3600), "cpu": torch.backends.cpu.get_cpu_capability()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="*", choices=("a", "b", "c", "d", "e", "f"), default=["a", "b", "c", "d", "e"])
    p.add_argument("--coboost-epochs", type=int, default=10, help="Co-Boosting epochs timed (f)")
    p.add_argument("--rounds", type=int, default=6, help="rounds of the light setting (a)")
    p.add_argument("--paper-rounds", type=int, default=4, help="rounds at 10 local epochs (b)")
    p.add_argument("--scale-rounds", type=int, default=3, help="rounds of the scale probe (d)")
    p.add_argument("--scale-clients", type=int, nargs="*", default=[1_000, 10_000, 100_000])
    p.add_argument("--scale-supernodes", type=int, default=100, help="simulated SuperNodes hosting the clients (d)")
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
        out["d_scale"] = [scale_probe(a.scale_rounds, a.results_dir, n, min(n, a.scale_supernodes)) for n in a.scale_clients]
    if "e" in a.only:
        out["e_methods_at_scale"] = methods_at_scale(10_000, a.scale_supernodes, a.results_dir)
    if "f" in a.only:
        out["f_coboost"] = coboost_epochs(a.coboost_epochs)
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
    for d in out.get("d_scale", []):
        print(f"(d) {d['clients']:,} clients on {d['supernodes']} SuperNodes: launch to end of round 1 "
              f"{d['launch_to_round1_s']:.1f} s, median round {d['round_s_median']:.2f} s "
              f"({d['round_s_median_without_eval']:.2f} s without evaluation), used memory +{d['memory_growth_gb']:.2f} GB")
    for name, e in out.get("e_methods_at_scale", {}).items():
        print(f"(e) {name}, {e['clients']:,} clients on {e['supernodes']} SuperNodes: launch to end of round 1 "
              f"{e['launch_to_round1_s']:.1f} s, rounds {', '.join(f'{x:.1f}' for x in e['round_s'])} s")
    if "f_coboost" in out:
        f = out["f_coboost"]
        print(f"(f) Co-Boosting's server step: epochs {', '.join(f'{x:.1f}' for x in f['epoch_s'])} s; "
              f"t(e) = {f['fit_a_s']:.1f} + {f['fit_b_s']:.2f} e, {f['full_epochs']} epochs about {f['full_h']:.1f} h")
    Path(a.results_dir).mkdir(parents=True, exist_ok=True)
    (Path(a.results_dir) / f"bench-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
