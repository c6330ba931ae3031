"""AdaptiveFL, All-Large and HeteroFL to convergence (docs/results/adaptivefl-converge.md), each at the learning rate
the tuning protocol chose for it with the same budget.

    python scripts/adaptivefl_converge.py --steps tune            # lr grid per method (hetfl.tune; resumable)
    python scripts/adaptivefl_converge.py --steps converge        # the chosen lr until convergence (resumable)
    python scripts/adaptivefl_converge.py                         # the page's table from the committed runs

Setting: the presets ``configs/<method>/fmnist-dir0.6.toml`` (100 clients, 10% a round, Dir(0.6), 5 local epochs,
batch 50, lr x 0.998^round, momentum 0.5; the authors' defaults), seed 0, in-process engine, 100 nodes.

* ``tune``: ``lr`` from {0.01, 0.03, 0.1} on the validation half (``eval-split = "test-half"``), every value for
  ``--tune-rounds`` rounds (grid, no pruning): the same budget for the three methods.
* ``converge``: the chosen value with checkpoints, in chunks: first ``--min-rounds`` rounds, then ``--chunk`` more
  until the mean validation accuracy of the last 10 rounds differs from that of the 10 before by less than 0.2
  points, or ``--max-rounds``. Each chunk's metrics.json is copied to ``docs/results/adaptivefl-converge/``; a
  stopped process (or session) continues from the last checkpoint under ``results/adaptivefl-converge/``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hetfl.common.results import copy_files  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "results/adaptivefl-converge"
DOCS = ROOT / "docs/results/adaptivefl-converge"
PAGE = ROOT / "docs/results/adaptivefl-converge.md"
METHODS = {"adaptivefl": "AdaptiveFL (RL)", "all-large": "All-Large", "heterofl": "HeteroFL"}
GRID = "0.01,0.03,0.1"
NODES = 100
TOLERANCE = 0.002  # 0.2 points of accuracy
BEGIN, END = "<!-- table: scripts/adaptivefl_converge.py -->", "<!-- end table -->"


def preset(method: str) -> dict:
    return tomllib.loads((ROOT / f"configs/{method}/fmnist-dir0.6.toml").read_text())


def step_tune(method: str, rounds: int) -> dict:
    from hetfl.tune import TuneSpec, parse_space, tune

    spec = TuneSpec(base=preset(method), space=tuple(parse_space(f"lr={GRID}")), trials=len(GRID.split(",")),
                    rounds=rounds, nodes=NODES, sampler="grid", seed=0, prune=False)
    summary = tune(spec, OUT / f"tune-{method}", final=False)
    keep(OUT / f"tune-{method}", DOCS / f"tune-{method}", ["summary.json", "trials/*/metrics.json"])
    return summary


def moved(rows: list[dict]) -> float | None:
    """|mean validation accuracy of the last 10 rounds - that of the 10 before| (None before round 20)."""
    val = [r["val_accuracy"] for r in rows if r["round"] >= 1]
    if len(val) < 20:
        return None
    return abs(statistics.mean(val[-10:]) - statistics.mean(val[-20:-10]))


def step_converge(method: str, min_rounds: int, chunk: int, max_rounds: int) -> dict:
    from hetfl.inprocess import run_in_process

    lr = json.loads((DOCS / f"tune-{method}" / "summary.json").read_text())["best"]["values"]["lr"]
    target = min_rounds
    while True:
        cfg = {**preset(method), "lr": lr, "eval-split": "test-half", "checkpoint": True, "resume": True,
               "num-server-rounds": target}
        m = run_in_process(cfg, NODES, OUT, f"converge-{method}")
        keep(OUT / f"converge-{method}", DOCS / f"converge-{method}", ["metrics.json"])
        d = moved(m["rounds"])
        print(f"{method}: {target} rounds, validation moved {d if d is None else round(100 * d, 3)} points", flush=True)
        if (d is not None and d < TOLERANCE) or target >= max_rounds:
            return m
        target = min(target + chunk, max_rounds)


def keep(src: Path, dst: Path, patterns: list[str]) -> None:
    copy_files([f for pattern in patterns for f in sorted(src.glob(pattern))], src, dst)


def table() -> str:
    out = ["| method | lr chosen (validation after the tuning rounds) | rounds run | validation moved in the last 10 "
           "rounds (points) | final test accuracy (%) | mean of the last 10 rounds (%) | full / M / S levels, last round (%) |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    for method, label in METHODS.items():
        s = DOCS / f"tune-{method}" / "summary.json"
        c = DOCS / f"converge-{method}" / "metrics.json"
        pick = ""
        if s.exists():
            summ = json.loads(s.read_text())
            pick = f"{summ['best']['values']['lr']:g} ({100 * summ['best']['val_accuracy']:.2f}; " + ", ".join(
                f"{t['values']['lr']:g}: {100 * t['val_accuracy']:.2f}" for t in summ["trials"] if t["val_accuracy"]) + ")"
        if not c.exists():
            out.append(f"| {label} | {pick or 'not run'} | not run | | | | |")
            continue
        rows = json.loads(c.read_text())["rounds"]
        d = moved(rows)
        last = rows[-1]
        levels = " / ".join(f"{100 * last[k]:.2f}" for k in ("acc_L1", "acc_M1", "acc_S1") if k in last)
        out.append(f"| {label} | {pick} | {last['round']} | {'' if d is None else f'{100 * d:.2f}'} | "
                   f"{100 * last['accuracy']:.2f} | {100 * statistics.mean(r['accuracy'] for r in rows[-10:]):.2f} | {levels} |")
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(prog="python scripts/adaptivefl_converge.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", nargs="*", default=[], choices=("tune", "converge"))
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--tune-rounds", type=int, default=20)
    p.add_argument("--min-rounds", type=int, default=150)
    p.add_argument("--chunk", type=int, default=50)
    p.add_argument("--max-rounds", type=int, default=400)
    a = p.parse_args()
    if a.steps:
        from hetfl.common.task import setup_logging

        setup_logging()
    for step in a.steps:
        for method in a.methods:
            if step == "tune":
                step_tune(method, a.tune_rounds)
            else:
                step_converge(method, a.min_rounds, a.chunk, a.max_rounds)
    if PAGE.exists():
        from fmt import write_between

        write_between(PAGE, BEGIN, END, table())
        print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
