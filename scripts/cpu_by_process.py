"""CPU seconds a command and every process it starts spend, by kind of process (docs/results/README.md#test-suite-time).

Samples every process's own user + system CPU every 0.3 s while the command runs (a process that lives less than
that may be missed) and sums what each spent after the command started, grouped by its command line (``flwr-clientapp``, ``flower-superlink``, hetfl's warm SuperExec, ...).
Processes at nice > 10 are left out (a ``nice -n 19`` run beside it). Run it alone: it measures the machine.

    python scripts/cpu_by_process.py -- python -m pytest -p no:xdist tests/test_deploy.py
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections import defaultdict

import psutil

KINDS = [("flwr-clientapp", "flwr-clientapp"), ("hetfl.superexec", "hetfl.superexec (warm SuperExec, its ClientApps)"),
         ("flower-supernode", "flower-supernode"), ("hetfl.cluster supernode", "hetfl.cluster supernode"),
         ("flower-superlink", "flower-superlink"), ("flower-superexec", "flower-superexec"),
         ("flwr-serverapp", "flwr-serverapp"), ("bin/flwr ", "flwr (CLI)"), ("pytest", "pytest"), ("ray", "ray")]


def kind(cmd: str) -> str:
    return next((name for pattern, name in KINDS if pattern in cmd), cmd[:60])


def scan(seen: dict[tuple[int, float], list]) -> None:
    """Record every process's command line (once) and its CPU seconds now, keyed by pid and start time (a reused
    pid is another process)."""
    for p in psutil.process_iter(["cmdline", "nice", "cpu_times", "create_time"]):
        info = p.info
        if info["cpu_times"] is None or info["nice"] is None or info["nice"] > 10:  # gone, or a niced process
            continue
        cpu = info["cpu_times"].user + info["cpu_times"].system
        key = (p.pid, info["create_time"])
        if key not in seen:
            seen[key] = [" ".join(info["cmdline"] or []), cpu, cpu]
        seen[key][2] = cpu


def main(argv: list[str]) -> int:
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    before: dict[tuple[int, float], list] = {}
    scan(before)
    seen = {k: [v[0], v[2], v[2]] for k, v in before.items()}  # what ran before counts from now
    t0 = time.monotonic()
    proc = subprocess.Popen(argv)
    while proc.poll() is None:
        scan(seen)
        time.sleep(0.3)
    scan(seen)
    wall = time.monotonic() - t0
    total: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for key, (cmd, first, last) in seen.items():
        spent = last - (first if key in before else 0.0)
        if spent > 0:
            total[kind(cmd)] += spent
            count[kind(cmd)] += 1
    print(f"exit {proc.returncode}, wall {wall:.1f} s, CPU {sum(total.values()):.1f} s")
    for name, s in sorted(total.items(), key=lambda x: -x[1])[:15]:
        print(f"{s:8.1f} s  {count[name]:4d} processes  {name}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
