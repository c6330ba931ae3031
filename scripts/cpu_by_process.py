"""CPU seconds a command and every process it starts spend, by kind of process (docs/results/README.md#test-suite-time).

Samples every process's own user + system CPU every 0.3 s while the command runs (a process that lives less than
that may be missed) and sums what each spent after the command started, grouped by its command line (``flwr-clientapp``, ``flower-superlink``, hetfl's warm SuperExec, ...).
Processes at nice > 10 are left out (a ``nice -n 19`` run beside it). Run it alone: it measures the machine.

    python scripts/cpu_by_process.py -- python -m pytest -p no:xdist tests/test_deploy.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import defaultdict

KINDS = [("flwr-clientapp", "flwr-clientapp"), ("hetfl.superexec", "hetfl.superexec (warm SuperExec, its ClientApps)"),
         ("flower-supernode", "flower-supernode"), ("hetfl.cluster supernode", "hetfl.cluster supernode"),
         ("flower-superlink", "flower-superlink"), ("flower-superexec", "flower-superexec"),
         ("flwr-serverapp", "flwr-serverapp"), ("bin/flwr ", "flwr (CLI)"), ("pytest", "pytest"), ("ray", "ray")]


def kind(cmd: str) -> str:
    return next((name for pattern, name in KINDS if pattern in cmd), cmd[:60])


def scan(seen: dict[tuple[str, str], list], tick: int) -> None:
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[16]) > 10:  # a niced process: not the command's
                continue
            cpu = (int(fields[11]) + int(fields[12])) / tick
            key = (p, fields[19])  # pid and start time: a reused pid is another process
            if key not in seen:
                with open(f"/proc/{p}/cmdline") as f:
                    seen[key] = [f.read().replace("\0", " "), cpu, cpu]
            seen[key][2] = cpu
        except (OSError, IndexError, ValueError):
            continue


def main(argv: list[str]) -> int:
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    tick = os.sysconf("SC_CLK_TCK")
    before: dict[tuple[str, str], list] = {}
    scan(before, tick)
    seen = {k: [v[0], v[2], v[2]] for k, v in before.items()}  # what ran before counts from now
    t0 = time.monotonic()
    proc = subprocess.Popen(argv)
    while proc.poll() is None:
        scan(seen, tick)
        time.sleep(0.3)
    scan(seen, tick)
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
