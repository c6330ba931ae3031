"""Numbers of every method's determinism setting, to hold a refactor against: same code, same numbers.

Runs each setting of tests/test_determinism.py once (seed 3, the in-process engine) and writes the compared columns
(round, accuracy, loss, bytes down and up, sampled clients) per method to a JSON file; with --compare, runs again and
lists every method whose numbers moved. Floating-point results are bit-exact on one machine, not across CPUs: take
the snapshot and the comparison on the same machine.

    python scripts/determinism_snapshot.py --out /tmp/before.json          # before the change
    python scripts/determinism_snapshot.py --compare /tmp/before.json      # after it
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.test_determinism import COMPARED, NAMES, setting  # noqa: E402



def snapshot(names: list[str]) -> dict[str, list[list]]:
    from hetfl.inprocess import run_in_process, task_identity

    out = {}
    with tempfile.TemporaryDirectory() as tmp, task_identity():
        for name in names:
            cfg, nodes = setting(name)
            m = run_in_process({**cfg, "seed": 3}, nodes, Path(tmp), name)
            out[name] = [[r.get(k) for k in COMPARED] for r in m["rounds"]]
            print(f"{name}: {out[name][-1]}", flush=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(prog="python scripts/determinism_snapshot.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="write the snapshot here")
    p.add_argument("--compare", help="a snapshot to hold this code's numbers against")
    p.add_argument("--only", nargs="+", choices=NAMES, help="a subset of the methods")
    a = p.parse_args()
    names = a.only or NAMES
    now = snapshot(names)
    if a.out:
        Path(a.out).write_text(json.dumps(now, indent=1))
    if a.compare:
        before = json.loads(Path(a.compare).read_text())
        moved = [n for n in names if json.loads(json.dumps(now[n])) != before.get(n)]
        for n in moved:
            print(f"MOVED {n}:\n  before {before.get(n)}\n  now    {now[n]}")
        print(f"{len(names) - len(moved)} of {len(names)} methods give the same numbers")
        return 1 if moved else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
