"""How pytest's workers shared a suite run: read the timeline that ``HETFL_TEST_TIMELINE=<file>`` makes the tests
write (tests/conftest.py: one "worker start end cpu nodeid" line per test) and print each worker's busy time, when the
last tests finished, the CPU seconds the tests used against what the cores could give in that wall time, the longest
tests with their CPU, and what the same durations would take if the longest tests were handed out first (LPT: a
greedy list schedule, an estimate only, since a test's duration depends on what runs beside it).

A test's CPU is that of every process that ran in its own cpuacct cgroup (tests/conftest.py, as root where cgroup
v1's cpuacct is writable: the worker and everything it started, reaped or not; a line ending in "leaked" had a
process still running after the test), else its worker's and that of the processes the worker started and reaped
(processes that leave their parent, such as Ray's daemons, are then not counted).

    HETFL_TEST_TIMELINE=/tmp/tl.txt python -m pytest -q -p no:cacheprovider -n 3 --dist worksteal
    python scripts/test_timeline.py /tmp/tl.txt --workers 3
"""

from __future__ import annotations

import argparse
import heapq
import os
from collections import defaultdict
from pathlib import Path


def read(path: str) -> list[tuple[str, float, float, float, str]]:
    """(worker, start, end, cpu, nodeid) of every test; cpu is nan in timelines written before it was recorded, and
    lines of an xdist controller (worker "main" beside gwN lines) are left out."""
    rows = []
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        w, a, b, rest = line.split(" ", 3)
        head, _, tail = rest.partition(" ")
        try:
            cpu, nodeid = float(head), tail
        except ValueError:
            cpu, nodeid = float("nan"), rest
        rows.append((w, float(a), float(b), cpu, nodeid))
    if any(r[0] != "main" for r in rows):
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
    ap.add_argument("--cores", type=int, default=os.cpu_count())
    args = ap.parse_args(argv)
    rows = read(args.timeline)
    t0, t1 = min(r[1] for r in rows), max(r[2] for r in rows)
    busy, last = defaultdict(float), {}
    for w, a, b, _, n in rows:
        busy[w] += b - a
        if w not in last or b > last[w][1]:
            last[w] = (a, b, n)
    print(f"{len(rows)} tests, wall {t1 - t0:.0f} s, sum of durations {sum(busy.values()):.0f} s")
    cpu = [r[3] for r in rows if r[3] == r[3]]
    if cpu:
        print(f"CPU used by the tests {sum(cpu):.0f} s, of {args.cores} cores x {t1 - t0:.0f} s = "
              f"{args.cores * (t1 - t0):.0f} s ({sum(cpu) / (args.cores * (t1 - t0)):.0%})")
    for w in sorted(busy):
        a, b, n = last[w]
        print(f"  {w}: busy {busy[w]:.0f} s, done at {b - t0:.0f} s; its last test {n} ran {a - t0:.0f}-{b - t0:.0f} s")
    print(f"longest {args.top} (wall, CPU, when, worker):")
    for w, a, b, c, n in sorted(rows, key=lambda r: r[1] - r[2])[:args.top]:
        print(f"  {b - a:6.0f} s {c:6.0f} s CPU  {a - t0:5.0f}-{b - t0:5.0f} s  {w}  {n}")
    d = [r[2] - r[1] for r in rows]
    print(f"longest first on {args.workers} workers (same durations): {lpt(d, args.workers):.0f} s; "
          f"the bound sum/workers: {sum(d) / args.workers:.0f} s")


if __name__ == "__main__":
    main()
