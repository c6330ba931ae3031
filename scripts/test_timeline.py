"""How pytest's workers shared a suite run: read the timeline that ``HETFL_TEST_TIMELINE=<file>`` makes the tests
write (tests/conftest.py: one "worker start end nodeid" line per test) and print each worker's busy time, when the
last tests started, and what the same durations would take if the longest tests were handed out first (LPT: a
greedy list schedule, an estimate only, since a test's duration depends on what runs beside it).

    HETFL_TEST_TIMELINE=/tmp/tl.txt python -m pytest -q -p no:cacheprovider -n 3 --dist worksteal
    python scripts/test_timeline.py /tmp/tl.txt --workers 3
"""

from __future__ import annotations

import argparse
import heapq
from collections import defaultdict


def read(path: str) -> list[tuple[str, float, float, str]]:
    """(worker, start, end, nodeid) of every test; the controller's relayed copies are left out under xdist."""
    rows = [line.split(" ", 3) for line in open(path).read().splitlines() if line.strip()]
    rows = [(w, float(a), float(b), n) for w, a, b, n in rows]
    if any(w != "main" for w, *_ in rows):
        rows = [r for r in rows if r[0] != "main"]
    return rows


def lpt(durations: list[float], workers: int) -> float:
    """Makespan of handing the tests out longest first, each to the worker that frees up first."""
    free = [0.0] * workers
    for d in sorted(durations, reverse=True):
        heapq.heappush(free, heapq.heappop(free) + d)
    return max(free)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("timeline")
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args(argv)
    rows = read(args.timeline)
    t0, t1 = min(r[1] for r in rows), max(r[2] for r in rows)
    busy, last = defaultdict(float), {}
    for w, a, b, n in rows:
        busy[w] += b - a
        if w not in last or b > last[w][1]:
            last[w] = (a, b, n)
    print(f"{len(rows)} tests, wall {t1 - t0:.0f} s, sum of durations {sum(busy.values()):.0f} s")
    for w in sorted(busy):
        a, b, n = last[w]
        print(f"  {w}: busy {busy[w]:.0f} s, done at {b - t0:.0f} s; its last test {n} ran {a - t0:.0f}-{b - t0:.0f} s")
    print(f"longest {args.top}:")
    for w, a, b, n in sorted(rows, key=lambda r: r[1] - r[2])[:args.top]:
        print(f"  {b - a:6.0f} s  {a - t0:5.0f}-{b - t0:5.0f} s  {w}  {n}")
    d = [b - a for _, a, b, _ in rows]
    print(f"longest first on {args.workers} workers (same durations): {lpt(d, args.workers):.0f} s; "
          f"the bound sum/workers: {sum(d) / args.workers:.0f} s")


if __name__ == "__main__":
    main()
