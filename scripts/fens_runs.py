"""Which committed runs are FENS at its best and its tuned iterative baselines (docs/results/fens-fair/): the lookups
that docs/results/fens-fair.md, the README's headline (scripts/headline.py) and the FENS summary table
(scripts/summaries.py) share, kept apart from the study script that made the runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs/results/fens-fair"
SEEDS = (0, 1, 2)
ITER_ROUNDS = 50  # the iterative baselines' rounds under the protocol


def complete_runs(d: Path, seed: int = 0) -> list[Path]:
    """The members-to-completion runs of one seed under `d` (``complete-e<N>``, or ``complete-e<N>-s<seed>``), not
    ``complete-e50-acc`` (the accuracy-only criterion)."""
    pattern = re.compile(r"complete-e\d+" + ("" if seed == 0 else f"-s{seed}"))
    return sorted(f for f in d.glob("complete-e*/metrics.json") if pattern.fullmatch(f.parent.name))


def tuned_iterative_run(alpha: str, method: str) -> tuple[str, Path, bool] | None:
    """(lr, metrics.json, from this page's study) of `method`'s ITER_ROUNDS-round run at the lr chosen on the
    validation half: this page's protocol run (``iter-<method>/chosen-r50``), else the seven-baseline study's run
    (Dir(0.1), ``fens-iterative-fmnist-dir<alpha>/runs``, which holds only the chosen lr's run); None where neither
    is committed."""
    tuned = DOCS / f"dir{alpha}" / f"iter-{method}" / f"chosen-r{ITER_ROUNDS}" / "metrics.json"
    if tuned.exists():
        lr = json.loads((tuned.parent.parent / "summary.json").read_text())["best"]["values"]["lr"]
        return f"{lr:g}", tuned, True
    earlier = sorted((ROOT / "docs/results" / f"fens-iterative-fmnist-dir{alpha}/runs")
                     .glob(f"{method}-fmnist-dir{alpha}-lr*-s0/metrics.json"))
    if len(earlier) > 1:
        raise ValueError(f"{method} at Dir({alpha}): {len(earlier)} runs in the study, expected the chosen lr's only")
    if earlier:
        return earlier[0].parent.name.split("-lr")[1].removesuffix("-s0"), earlier[0], False
    return None
