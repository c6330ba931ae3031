"""Sweep FENS aggregators on one saved ensemble without training phase 1 again.

    python scripts/fens_sweep.py results/<fens-run> [--aggregators nn per-class linear] [--set fens-agg-server-lr=0.01]

Every trainable aggregator is trained by a whole FENS run with ``fens-reuse`` pointing at the
ensemble that ``<fens-run>`` saved (its ``ensemble.json``): the same ServerApp and ClientApp code,
on the in-process grid (:mod:`hetfl.inprocess`: no Simulation Engine, real serialization and byte
counts). The static aggregators (averaging, weighted averaging, polychotomous voting) and one-shot
FedAvg come out of every run. Prints one table and writes it to ``<fens-run>/sweep/table[-<overrides>].md``
(docs/readings.md#fens-artifacts).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hetfl.common.config import ConfigError  # noqa: E402

from hetfl.common.results import load_metrics  # noqa: E402
from hetfl.methods import SCHEMA, validate  # noqa: E402
from hetfl.fens_app.aggregators import AGGREGATORS, STATIC, STATIC_LABELS  # noqa: E402

TRAINABLE = tuple(a for a in AGGREGATORS if a not in STATIC)


def sweep(run_dir: Path, aggregators: list[str], overrides: dict, nodes: int | None = None) -> list[dict]:
    """Run each aggregator on the ensemble saved in `run_dir`; return one row per aggregator (and static ones)."""
    from hetfl.inprocess import run_in_process, stored_config

    metrics = load_metrics(run_dir / "metrics.json", SCHEMA)
    base = {k: v for k, v in stored_config(metrics["config"]).items()
            if k not in ("run-name", "results-dir", "resume", "stop-after-round")}
    nodes = nodes or int(metrics["phases"]["clients_ready"])
    rows, static = [], None
    out = run_dir / "sweep"
    for agg in aggregators:
        cfg = {**base, **overrides, "fens-aggregator": agg, "fens-reuse": str(run_dir.resolve()), "resume": False}
        validate(cfg)  # one clear line for a bad override, before anything runs
        name = "-".join([agg] + [f"{k}{v}" for k, v in overrides.items()])
        m = run_in_process(cfg, nodes, out, name)
        s = m["summary"]
        trained = [r for r in m["rounds"] if r["round"] > 0]
        rows.append({"aggregator": agg, "final": s["final_accuracy"], "best": s["best_accuracy"],
                     "best_val_round": max(trained, key=lambda r: r["val_accuracy"] or 0)["round"] if trained and trained[0].get("val_accuracy") is not None else None,
                     "rounds": s["rounds_completed"], "agg_mb": sum(r["bytes_down"] + r["bytes_up"] for r in trained) / 1e6})
        static = m["static_aggregators_test_accuracy"]
    for name, acc in (static or {}).items():
        rows.append({"aggregator": STATIC_LABELS.get(name, name), "final": acc, "best": acc, "rounds": 0, "agg_mb": 0.0})
    return rows


def table(rows: list[dict], title: str) -> str:
    lines = [f"Aggregators on one ensemble: {title}", "",
             "| aggregator | final test acc. (%) | best test acc. (%) | rounds | aggregator traffic (MB, up + down) |",
             "| --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['aggregator']} | {100 * r['final']:.2f} | {100 * r['best']:.2f} | {r['rounds']} | {r['agg_mb']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from hetfl import launch

    p = argparse.ArgumentParser(prog="python scripts/fens_sweep.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", type=Path, help="a finished FENS run directory (holds metrics.json and ensemble.json)")
    p.add_argument("--aggregators", nargs="+", default=list(TRAINABLE), choices=TRAINABLE)
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="phase-2 overrides, e.g. fens-agg-server-lr=0.01")
    p.add_argument("--nodes", type=int, default=None, help="number of clients (default: as in the run)")
    a = p.parse_args(argv)
    if not (a.run_dir / "ensemble.json").is_file() or not (a.run_dir / "metrics.json").is_file():
        print(f"error: {a.run_dir} is not a FENS run directory with ensemble.json and metrics.json", file=sys.stderr)
        return 2
    try:
        rows = sweep(a.run_dir, a.aggregators, launch.parse_set(a.set), a.nodes)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    overrides = launch.parse_set(a.set)
    text = table(rows, str(a.run_dir) + "".join(f", {k} = {v}" for k, v in overrides.items()))
    stem = "table" + "".join(f"-{k}{v}" for k, v in overrides.items())  # one table per phase-2 setting
    (a.run_dir / "sweep").mkdir(exist_ok=True)
    (a.run_dir / "sweep" / f"{stem}.md").write_text(text)
    (a.run_dir / "sweep" / f"{stem}.json").write_text(json.dumps(rows, indent=2))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
