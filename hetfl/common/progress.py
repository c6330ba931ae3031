"""Progress lines: ``[round k/N]`` with elapsed and estimated time left, and a heartbeat for long phases.

The round loop logs one line per round (:func:`round_line`); a phase that blocks for long (local
training of a round, evaluation, FENS's one-shot phase 1 and ensemble download) runs inside
:func:`heartbeat`, which logs a "still running" line every ``progress-interval`` seconds and how long
it took if it took longer than that. docs/tracking.md
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator

log = logging.getLogger("hetfl")


def duration(seconds: float | None) -> str:
    """12.3s, 1m02s, 2h05m."""
    if seconds is None or seconds != seconds:
        return "?"
    s = max(0.0, float(seconds))
    if s < 60:
        return f"{s:.1f}s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"


def round_line(rnd: int, last: int | None, accuracy: float, loss: float, mb_down: float, mb_up: float,
               per_round: float | None, elapsed: float) -> str:
    """``[round k/N] acc 0.8123 loss 0.5200 | 1.20 MB down, 1.20 MB up | 12.3 s/round, elapsed 1m02s, left ~3m05s``.

    `per_round` is the mean seconds of the trained rounds so far; time left = per_round x rounds left.
    """
    head = (f"[round {rnd}/{last if last else '?'}] acc {accuracy:.4f} loss {loss:.4f} | "
            f"{mb_down:.2f} MB down, {mb_up:.2f} MB up | ")
    if rnd == 0 or per_round is None:
        return head + f"initial model, elapsed {duration(elapsed)}"
    left = f", left ~{duration(per_round * max(0, last - rnd))}" if last else ""
    return head + f"{per_round:.1f} s/round, elapsed {duration(elapsed)}{left}"


@contextlib.contextmanager
def heartbeat(what: str, every: float = 10.0) -> Iterator[None]:
    """Log ``<what>: still running, 40s so far`` every `every` seconds while the block runs, then its duration
    (only if it outlasted `every`: short phases stay silent)."""
    done = threading.Event()
    t0 = time.perf_counter()

    def beat() -> None:
        while not done.wait(every):
            log.info("%s: still running, %s so far", what, duration(time.perf_counter() - t0))

    thread = threading.Thread(target=beat, name="hetfl-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        took = time.perf_counter() - t0
        if took >= every:
            log.info("%s: done in %s", what, duration(took))
