"""AdaptiveFL's BatchNorm reading, measured (docs/results/adaptivefl-bn.md): All-Large and AdaptiveFL with BatchNorm
normalising by batch statistics (the authors' pool, ``track_running_stats=False``) against running statistics (the
authors' All-Large in ``main_fed.py``), on a BatchNorm model at a small scale.

    python scripts/adaptivefl_bn.py --train [--seeds 0 1 2 --rounds 20]   # the runs (minutes; finished ones reused)
    python scripts/adaptivefl_bn.py                                       # the page's table and plot from the runs

Setting: scikit-learn's digits (8x8, 10 classes), ResNet-8 at width 0.25, 20 clients Dir(0.6), half of them a round,
2 local epochs of batch 16, the AdaptiveFL presets' optimiser otherwise (``configs/<method>/fmnist-dir0.6.toml``);
in-process engine. Everything but ``adaptivefl-bn`` is the same between the two arms of a pair, seed for seed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ROOT = Path(__file__).resolve().parent.parent
NAME = "adaptivefl-bn-digits"
RUNS = ROOT / "docs/results" / NAME / "runs"
PAGE = ROOT / "docs/results/adaptivefl-bn.md"
PLOT = ROOT / "docs/results" / f"{NAME}.png"
METHODS = {"all-large": "All-Large", "adaptivefl": "AdaptiveFL"}
MODES = {"batch": "batch statistics (authors' pool)", "running": "running statistics (authors' All-Large)"}
NODES = 20
SETTING = {"dataset": "digits", "model": "resnet8", "width": 0.25, "min-available-nodes": NODES, "fraction-train": 0.5,
           "local-epochs": 2, "batch-size": 16, "eval-batch-size": 256, "checkpoint": False}
BEGIN, END = "<!-- table: scripts/adaptivefl_bn.py -->", "<!-- end table -->"


def run_name(method: str, mode: str, seed: int) -> str:
    return f"{method}-bn{mode}-s{seed}"


def train(methods: list[str], seeds: list[int], rounds: int) -> None:
    from hetfl.inprocess import run_in_process

    for seed in seeds:
        for method in methods:
            for mode in MODES:
                name = run_name(method, mode, seed)
                if (RUNS / name / "metrics.json").exists():
                    print(f"reuse {name}")
                    continue
                cfg = {**tomllib.loads((ROOT / f"configs/{method}/fmnist-dir0.6.toml").read_text()), **SETTING,
                       "adaptivefl-bn": mode, "seed": seed, "num-server-rounds": rounds}
                m = run_in_process(cfg, NODES, ROOT / "results" / NAME, name)
                (RUNS / name).mkdir(parents=True, exist_ok=True)
                (RUNS / name / "metrics.json").write_text(json.dumps(m, indent=1))
                print(f"{name}: {100 * m['summary']['final_accuracy']:.2f}%")


def _runs(method: str, mode: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(RUNS.glob(f"{method}-bn{mode}-s*/metrics.json"))]


def _mean_sd(values: list[float]) -> str:
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}" if len(values) > 1 else f"{values[0]:.2f}"


def _last10(m: dict) -> float:
    return 100 * statistics.mean(r["accuracy"] for r in m["rounds"][-10:])


def table() -> str:
    out = [("| method | BatchNorm at evaluation | seeds | final (%) | mean of the last 10 rounds (%) | "
           "paired difference, running - batch (points, last 10 rounds) |"), "| --- | --- | --- | --- | --- | --- |"]
    for method, label in METHODS.items():
        batch, running = _runs(method, "batch"), _runs(method, "running")
        for mode, runs in (("batch", batch), ("running", running)):
            if not runs:
                out.append(f"| {label} | {MODES[mode]} | | not run | | |")
                continue
            seeds = ",".join(str(m["config"]["seed"]) for m in runs)
            diff = ""
            if mode == "running" and len(batch) == len(running):
                diff = _mean_sd([_last10(r) - _last10(b) for r, b in zip(running, batch, strict=True)])
            out.append(f"| {label} | {MODES[mode]} | {seeds} | {_mean_sd([100 * m['summary']['final_accuracy'] for m in runs])} "
                       f"| {_mean_sd([_last10(m) for m in runs])} | {diff} |")
    return "\n".join(out)


def plot() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from matplotlib.ticker import MaxNLocator

    fig, (ax, zoom) = plt.subplots(1, 2, figsize=(10, 4.2))
    late: list[float] = []
    for method, label in METHODS.items():
        for mode, style in (("batch", "-"), ("running", "--")):
            runs = _runs(method, mode)
            if not runs:
                continue
            acc = 100 * np.array([[r["accuracy"] for r in m["rounds"][1:]] for m in runs])
            x = np.arange(1, acc.shape[1] + 1)
            n = f"mean ± min..max over {len(runs)} seeds" if len(runs) > 1 else "n=1"
            line, = ax.plot(x, acc.mean(0), style, label=f"{label}, {mode} statistics ({n})")
            half = x >= x[-1] // 2
            zoom.plot(x[half], acc.mean(0)[half], style, color=line.get_color())
            late += list(acc[:, half].ravel())
            if len(runs) > 1:
                for a_, xs in ((ax, x), (zoom, x[half])):
                    sel = slice(None) if a_ is ax else half
                    a_.fill_between(xs, acc.min(0)[sel], acc.max(0)[sel], color=line.get_color(), alpha=0.15)
    for a_ in (ax, zoom):
        a_.set_xlabel("round")
        a_.grid(alpha=0.3)
        a_.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("test accuracy of the full model (%)")
    ax.set_title("all rounds", fontsize=9)
    zoom.set_title("second half, y-axis zoomed", fontsize=9)
    if late:
        zoom.set_ylim(min(late) - 0.5, max(late) + 0.5)
    fig.suptitle("digits, ResNet-8 (width 0.25), 20 clients Dir(0.6): BatchNorm batch vs running statistics", fontsize=10)
    fig.legend(*ax.get_legend_handles_labels(), loc="lower center", ncol=2, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    fig.savefig(PLOT, dpi=110)
    print(f"wrote {PLOT}")


def main() -> int:
    p = argparse.ArgumentParser(prog="python scripts/adaptivefl_bn.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--train", action="store_true")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--rounds", type=int, default=20)
    a = p.parse_args()
    if a.train:
        from hetfl.common.task import setup_logging

        setup_logging()
        train(a.methods, a.seeds, a.rounds)
    from fmt import write_between

    write_between(PAGE, BEGIN, END, table())
    plot()
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
