"""The headline results, computed from the committed runs: the one source of the numbers in README.md's "Expected
results" and docs/results/README.md's summary (both written between markers; a test fails when they drift).

    python scripts/headline.py           # rewrite both tables from docs/results/**/metrics.json (seconds)
    python scripts/headline.py --check   # exit 1 if a file's table differs from what the runs give
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # fens_runs.py

from fens_runs import SEEDS, complete_runs, tuned_iterative_run  # noqa: E402  (FENS at its best, committed)

ROOT = Path(__file__).resolve().parent.parent
RES = ROOT / "docs/results"
FILES = (ROOT / "README.md", RES / "README.md")
BEGIN, END = "<!-- headline: scripts/headline.py -->", "<!-- end headline -->"


def _m(path: Path) -> dict:
    return json.loads(path.read_text())


def _runs(page: str, prefix: str) -> list[dict]:
    runs = sorted((RES / page / "runs").glob(f"{prefix}-s[0-9]*/metrics.json"))
    if not runs:
        raise FileNotFoundError(f"no committed runs {RES / page / 'runs' / prefix}-s*/metrics.json")
    return [_m(p) for p in runs]


def _pm(xs: list[float]) -> str:
    """mean ± std in percent, with the number of seeds."""
    if len(xs) == 1:
        return f"{100 * xs[0]:.1f} (1 seed)"
    return f"{100 * statistics.mean(xs):.1f} ± {100 * statistics.stdev(xs):.1f}"


def _last5(m: dict) -> float:
    return statistics.mean(r["accuracy"] for r in m["rounds"][-5:])


def _conv(ms: list[dict]) -> str:
    rounds = [m["summary"]["convergence_round"] for m in ms]
    return f"{statistics.mean(rounds):.1f}" if all(r is not None for r in rounds) else "not in every seed"


def shefl_rows() -> list[list[str]]:
    rows = []
    for name, prefix in (("SHEFL", "shefl"), ("Fed-Ensemble", "fedensemble"), ("FedAvg", "fedavg")):
        ms = _runs("shefl-fmnist-dir0.6-r30", f"{prefix}-fmnist-dir0.6")
        rows.append([name, _pm([_last5(m) for m in ms]), _conv(ms), str(len(ms))])
    return rows


def fens_rows() -> list[list[str]]:
    rows = []
    for a in ("0.01", "0.05", "0.1"):
        ms = _runs(f"fens-fmnist-dir{a}", f"fens-fmnist-dir{a}")
        fair = RES / "fens-fair" / f"dir{a}"
        tuned = complete = "not run"
        if (fair / "tune-agg/summary.json").exists():
            tuned = f"{100 * _m(fair / 'tune-agg/summary.json')['chosen']['test_accuracy']:.1f}"
        seeds = [runs[-1] for seed in SEEDS if (runs := complete_runs(fair, seed))]  # seed 0 first
        if seeds:
            accs = [_m(f)["summary"]["final_accuracy"] for f in seeds]
            complete = f"{100 * accs[0]:.1f}" if len(accs) == 1 else _pm(accs) + f" ({len(accs)} seeds)"
        rows.append([f"Dir({a})", _pm([m["summary"]["final_accuracy"] for m in ms]), tuned, complete,
                     _iterative_tuned(a, "fedadam"), _iterative_tuned(a, "fedavg")])
    return rows


def _iterative_tuned(alpha: str, method: str) -> str:
    """`method` (FedAdam, FedAvg) after 50 rounds at the client lr the protocol chose on the validation half (seed 0),
    or 'not run'."""
    tuned = tuned_iterative_run(alpha, method)
    return "not run" if tuned is None else f"{100 * _m(tuned[1])['summary']['final_accuracy']:.1f}"


def adaptivefl_rows() -> list[list[str]]:
    rows = []
    for name, prefix in (("AdaptiveFL", "adaptivefl"), ("All-Large", "all-large"), ("HeteroFL", "heterofl")):
        ms = _runs("adaptivefl-fmnist-dir0.6-r30", f"{prefix}-fmnist-dir0.6")
        mb = statistics.mean((m["summary"]["total_bytes_down"] + m["summary"]["total_bytes_up"]) / 1e6 for m in ms)
        rows.append([name, _pm([m["summary"]["final_accuracy"] for m in ms]), f"{mb:,.0f}", str(len(ms))])
    return rows


def _table(head: list[str], rows: list[list[str]]) -> str:
    return "\n".join(["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows])


def headline() -> str:
    """The tables, as Markdown (no line over 200 characters)."""
    return "\n\n".join([
        "**SHEFL** vs Fed-Ensemble and FedAvg, FMNIST Dir(0.6), 100 clients, 30 rounds "
        "([shefl-fmnist-r30](docs/results/shefl-fmnist-r30.md)):",
        _table(["method", "accuracy, rounds 26-30 (%)", "round to 80%", "seeds"], shefl_rows()),
        "**FENS**, FMNIST, 20 clients, test accuracy (%) ([fens-fmnist](docs/results/fens-fmnist.md), "
        "[fens-fair](docs/results/fens-fair.md); tuned: seed 0; to completion: seed 0, or the mean ± std of the seeds named):",
        _table(["split", "5-epoch members, as preset (3 seeds)", "aggregator tuned", "+ members to completion",
                "FedAdam, lr tuned, 50 rounds", "FedAvg, lr tuned, 50 rounds"], fens_rows()),
        "**AdaptiveFL** vs All-Large and HeteroFL, FMNIST Dir(0.6), 100 clients, 30 rounds, full model "
        "([adaptivefl-fmnist-r30](docs/results/adaptivefl-fmnist-r30.md)):",
        _table(["method", "accuracy, round 30 (%)", "traffic (MB, 30 rounds)", "seeds"], adaptivefl_rows()),
    ])


def _for(path: Path, text: str) -> str:
    """docs/results/README.md links relative to docs/results/."""
    return text.replace("](docs/results/", "](") if path.parent == RES else text


def render(path: Path) -> str:
    old = path.read_text()
    a, b = old.index(BEGIN) + len(BEGIN), old.index(END)
    return old[:a] + "\n" + _for(path, headline()) + "\n" + old[b:]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python scripts/headline.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="only check that the files hold today's tables")
    a = p.parse_args(argv)
    stale = [f for f in FILES if render(f) != f.read_text()]
    if a.check:
        for f in stale:
            print(f"{f.relative_to(ROOT)}: its headline table differs from the committed runs; run python scripts/headline.py")
        return 1 if stale else 0
    for f in stale:
        f.write_text(render(f))
        print(f"wrote {f.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
