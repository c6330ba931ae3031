"""Number formats shared by the scripts' tables."""

from __future__ import annotations

import statistics


def mean_std(xs: list[float]) -> str:
    """"mean ± std" (sample std) of the values given; one value alone, without a std it does not have."""
    xs = [x for x in xs if x is not None]
    if not xs:
        return "n/a"
    if len(xs) == 1:
        return f"{xs[0]:.2f}"
    return f"{statistics.mean(xs):.2f} ± {statistics.stdev(xs):.2f}"


def write_between(page, begin: str, end: str, text: str) -> None:
    """Replace what stands between the markers `begin` and `end` of the file `page` (a generated table) by `text`."""
    from pathlib import Path

    old = Path(page).read_text()
    a = old.index(begin) + len(begin)
    b = old.index(end, a)  # the end marker after this begin (a page may hold several generated tables)
    Path(page).write_text(old[:a] + "\n" + text + "\n" + old[b:])
