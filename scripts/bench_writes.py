"""What a round costs to write: a round loop's per-round writes alone, over N rows.

Records N rows shaped like those of a FENS aggregator trial (the committed
docs/results/studies/fens-iterative-dir0.01/fens/tune/trials/t000/metrics.json, cycled) through a RunRecorder
(metrics.json, metrics.csv, TensorBoard) and saves a checkpoint of a 40 kB model after each, as the round loop
does; no training. Prints the total and the mean of the last 100 rows. To compare with an older commit, run the
same file against that commit's package (docs/tracking.md, "What a round costs to write"):

    git worktree add /tmp/old <commit>
    farm-bench -n 3 --warmup 0 --timeout 1200 \\
        --vs "env PYTHONPATH=/tmp/old .venv/bin/python scripts/bench_writes.py 500" -- .venv/bin/python scripts/bench_writes.py 500
"""

from __future__ import annotations

import inspect
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord

import hetfl.common.results as results
from hetfl.common.rounds import save_checkpoint

TEMPLATE = (Path(__file__).resolve().parents[1] / "docs/results/studies/fens-iterative-dir0.01/fens/tune/trials/t000"
            / "metrics.json")
OWN = ("round", "accuracy", "loss", "bytes_down", "bytes_up", "cum_bytes_down", "cum_bytes_up", "round_s", "elapsed_s")


class _Stateless:
    def state_dict(self) -> None:
        return None


def main(n: int) -> None:
    src = json.loads(TEMPLATE.read_text())
    rec = results.RunRecorder({**src["config"], "results-dir": tempfile.mkdtemp(), "run-name": "bench"}, threshold=0.7)
    rec.extra.update({k: v for k, v in src.items() if k not in ("config", "rounds", "summary")})
    rows = src["rounds"][1:]
    arrays = ArrayRecord({"w": Array(np.zeros(10_000, np.float32))})
    incremental = "rows" in inspect.signature(save_checkpoint).parameters  # the row log (2026-12-06)
    log, times = None, []
    start = time.perf_counter()
    for i in range(n):
        t0 = time.perf_counter()
        r = rows[i % len(rows)]
        rec.record(i, r["accuracy"], r["loss"], r["bytes_down"], r["bytes_up"], **{k: v for k, v in r.items() if k not in OWN})
        path = rec.run_dir / "checkpoint.json"
        if incremental:
            log = save_checkpoint(path, i, arrays, _Stateless(), rec, log)
        else:
            save_checkpoint(path, i, arrays, _Stateless(), rec)
        times.append(time.perf_counter() - t0)
    if hasattr(rec, "flush"):
        rec.flush()
    print(f"{results.__file__}: {n} rows in {time.perf_counter() - start:.2f} s; the last 100 "
          f"{1000 * sum(times[-100:]) / len(times[-100:]):.1f} ms a row", file=sys.stderr)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 500)
