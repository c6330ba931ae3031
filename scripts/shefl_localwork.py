"""SHEFL's local-work intervention (docs/results/shefl-localwork.md): SHEFL, Fed-Ensemble and FedAvg at 1, 2 and 5
local epochs, 20 rounds, FMNIST Dir(0.6), 100 clients.

    python scripts/shefl_localwork.py --train --seeds 0 1 --epochs 1 2 5   # the runs (hours; finished ones reused)
    python scripts/shefl_localwork.py --intervention --seeds 0 1           # SHEFL with the HPC share cut, 2 epochs
    python scripts/shefl_localwork.py                                       # the page's table from the committed runs

Runs go through ``scripts/reproduce.py`` (Simulation Engine, 100 SuperNodes) and are copied to
``docs/results/shefl-localwork-fmnist-dir0.6-r20/runs/`` as they finish.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hetfl.common.results import copy_files  # noqa: E402

NAME = "shefl-localwork-fmnist-dir0.6-r20"
RUNS = ROOT / "docs/results" / NAME / "runs"
PAGE = ROOT / "docs/results/shefl-localwork.md"
METHODS = {"shefl": "SHEFL", "fedensemble": "Fed-Ensemble", "fedavg": "FedAvg"}
BEGIN, END = "<!-- table: scripts/shefl_localwork.py -->", "<!-- end table -->"


def train(seeds: list[int], epochs: list[int]) -> None:
    for seed in seeds:
        for ep in epochs:
            presets = [f"configs/{m}/fmnist-dir0.6.toml@local-epochs={ep}" for m in ("fedavg", "shefl", "fedensemble")]
            subprocess.run([sys.executable, "scripts/reproduce.py", "--name", NAME, "--seeds", str(seed),
                            "--supernodes", "100", "--set", "num-server-rounds=20", "--presets", *presets,
                            "--reuse", str(RUNS)], cwd=ROOT, check=True)
            _keep()


INTERVENTION = ('shefl-coefficients="paper-icassp"', "-shefl-coefficientspaper-icassp", 2)
"""The direct test of "members too alike" (the page's section): SHEFL at 2 local epochs with Eq. 2's coefficients as
the ICASSP paper prints them, which cut the HPC mean's share of every member's update from 1/2 to 1/10 (the LPC
mean, member-specific, keeps 1/2). (override, run-name suffix, local epochs)"""


def intervene(seeds: list[int]) -> None:
    override, _, ep = INTERVENTION
    subprocess.run([sys.executable, "scripts/reproduce.py", "--name", NAME, "--seeds", *map(str, seeds),
                    "--engine", "inprocess", "--set", "num-server-rounds=20",
                    "--presets", f"configs/shefl/fmnist-dir0.6.toml@local-epochs={ep},{override}", "--reuse", str(RUNS)],
                   cwd=ROOT, check=True)
    _keep()


def _keep() -> None:
    src = ROOT / "results/reproduce" / NAME / "runs"
    copy_files([f for f in sorted(src.glob("*/metrics.json"))
                if json.loads(f.read_text())["summary"].get("rounds_completed") == 20], src, RUNS)


def _run(method: str, ep: int, seed: int, suffix: str = "") -> dict | None:
    p = RUNS / f"{method}-fmnist-dir0.6-local-epochs{ep}{suffix}-s{seed}" / "metrics.json"
    return json.loads(p.read_text()) if p.exists() else None


def _round_to(rows: list[dict], level: float) -> int | None:
    return next((r["round"] for r in rows if r["round"] >= 1 and r["accuracy"] >= level), None)


def table() -> str:
    out = ["| local epochs | method | seeds | final (%) | best (%) | round to 75% | round to 80% | "
           "member disagreement, rounds 1 / 5 / 10 / 20 |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    rows = [(ep, method, label, "") for ep in (1, 2, 5) for method, label in METHODS.items()]
    rows.insert(6, (INTERVENTION[2], "shefl", "SHEFL, HPC share 1/10 (ICASSP Eq. 2)", INTERVENTION[1]))
    for ep, method, label, suffix in rows:
        runs = [(s, m) for s in range(3) if (m := _run(method, ep, s, suffix))]
        if not runs:
            out.append(f"| {ep} | {label} | 0 | not run | | | | |")
            continue
        finals = [100 * m["summary"]["final_accuracy"] for _, m in runs]
        bests = [100 * m["summary"]["best_accuracy"] for _, m in runs]
        fmt = (lambda v: f"{statistics.mean(v):.2f} ± {statistics.stdev(v):.2f}" if len(v) > 1 else f"{v[0]:.2f}")
        to75 = [_round_to(m["rounds"], 0.75) for _, m in runs]
        to80 = [_round_to(m["rounds"], 0.80) for _, m in runs]
        d = []  # the mean over the seeds that recorded it
        for i in (1, 5, 10, 20):
            xs = [m["rounds"][i].get("disagreement") for _, m in runs if i < len(m["rounds"])]
            d.append(statistics.mean(xs) if xs and all(x is not None for x in xs) else None)
        dtext = " / ".join(f"{x:.3f}" for x in d) if all(x is not None for x in d) else "(one model)"
        out.append(f"| {ep} | {label} | {','.join(str(s) for s, _ in runs)} | {fmt(finals)} | {fmt(bests)} | "
                   f"{', '.join(str(x) if x else '>20' for x in to75)} | {', '.join(str(x) if x else '>20' for x in to80)} | "
                   f"{dtext} |")
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(prog="python scripts/shefl_localwork.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--train", action="store_true")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    p.add_argument("--epochs", nargs="+", type=int, default=[1, 2, 5])
    p.add_argument("--intervention", action="store_true", help="run SHEFL with the HPC share cut (INTERVENTION)")
    a = p.parse_args()
    if a.train:
        train(a.seeds, a.epochs)
    if a.intervention:
        intervene(a.seeds)
    from fmt import write_between

    write_between(PAGE, BEGIN, END, table())
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
