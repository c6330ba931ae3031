"""The learning-rate grid table of FENS's iterative baselines (docs/results/fens-fmnist.md#iterative).

    python scripts/grid_table.py docs/results/fens-iterative-fmnist-dir0.1-lrgrid-r10/runs \
        --fens docs/results/fens-fmnist-dir0.1/runs/fens-fmnist-dir0.1-s0/metrics.json

One row per grid run (``<method>-<preset>-lr<v>-s<seed>/metrics.json``): test accuracy by round, the means over the
last rounds on test and validation and the pick (``reproduce.grid_picks``: validation where every point of the
method recorded it), the first round whose test accuracy reaches the FENS run's final accuracy with the client
traffic up to it (``reproduce.client_mb``), the run's client traffic and seconds a round. Prints markdown.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reproduce import client_mb, grid_picks  # noqa: E402

from hetfl.common.results import load_metrics  # noqa: E402
from hetfl.methods import SCHEMA  # noqa: E402

NAMES = {"fedavg": "FedAvg", "fedprox": "FedProx", "fednova": "FedNova", "scaffold": "Scaffold", "fedyogi": "FedYogi",
         "fedadam": "FedAdam", "fedavg-stc": "FedAvg-STC"}  # in the table's order


def table(runs_dir: Path, fens_final: float) -> list[str]:
    grids: dict[str, list[tuple[str, dict, dict]]] = {}
    for f in sorted(runs_dir.glob("*/metrics.json")):
        run = load_metrics(f, SCHEMA)
        grids.setdefault(run["config"]["method"], []).append((f.parent.name, {"lr": run["config"]["lr"]}, run))
    runs = {lab: run for points in grids.values() for lab, _, run in points}
    lines = [f"| method | client lr | test accuracy (%) by round 1 ... n | test, mean of the last rounds | validation, same "
             f"rounds | reaches FENS's {100 * fens_final:.2f}% at round (client MB then) | client MB, all rounds | s/round |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for method in sorted(grids, key=lambda m: list(NAMES).index(m) if m in NAMES else len(NAMES)):
        for p in sorted(grid_picks({method: grids[method]}), key=lambda p: p["overrides"]["lr"]):
            rows = runs[p["label"]]["rounds"]
            cross = next((r for r in rows[1:] if r["accuracy"] >= fens_final), None)
            b = "**" if p["picked"] else ""
            val = "n/r" if p["val"] is None else f"{b}{p['val']:.1f}{b}"
            reach = "not in these rounds" if cross is None else f"{cross['round']} ({client_mb(cross):,.0f})"
            accs = " ".join(f"{100 * r['accuracy']:.1f}" for r in rows[1:])
            lines.append(f"| {NAMES.get(method, method)} | {b}{p['overrides']['lr']:g}{b} | {accs} | {b}{p['test']:.1f}{b} | {val} | "
                         f"{reach} | {client_mb(rows[-1]):,.0f} | {runs[p['label']]['summary']['mean_round_s']:.1f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", type=Path, help="directory of the grid runs")
    ap.add_argument("--fens", type=Path, required=True, help="the FENS run's metrics.json (its final accuracy)")
    a = ap.parse_args(argv)
    print("\n".join(table(a.runs, load_metrics(a.fens, SCHEMA)["summary"]["final_accuracy"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
