"""The statistics a verdict rests on: paired differences over seeds, a t interval, one labelling rule, equivalence
(TOST), Holm's correction and the seeds a margin needs (docs/verdicts.md).

Every function is pure: it takes the per-seed statistics of two methods (the same partition and client-sampling seed
for both, so that each seed is one pair) or their differences, and returns numbers; nothing here reads a run.
Differences are always taken in the paper's direction (the method the paper favours minus the one it beats), in
points of accuracy, so that a positive mean is the paper's side and the claimed margin is a positive number.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

CONFIDENCE = 0.95
POWER = 0.8  # the power the seeds-needed calculation asks for (two-sided test at 1 - CONFIDENCE)
MAX_SEEDS = 1000  # where the seeds-needed search stops (the margin is then far inside the noise)


class StatsError(ValueError):
    """Input the statistics cannot use: one line naming what is wrong."""


@dataclass(frozen=True)
class Interval:
    """A paired t interval of the mean difference: n pairs, their mean and SD, and the interval at `confidence`."""

    n: int
    mean: float
    sd: float  # sample SD of the differences (ddof 1); nan at n = 1
    low: float  # nan at n = 1
    high: float
    confidence: float = CONFIDENCE

    def __str__(self) -> str:
        if self.n < 2:
            return f"{self.mean:+.2f} (n = 1, no interval)"
        return f"{self.mean:+.2f} [{self.low:+.2f}, {self.high:+.2f}] (n = {self.n})"


def p_text(p: float) -> str:
    """A p-value as the pages print it: ``= 0.074``, or ``< 0.001`` where three decimals would read 0."""
    return "< 0.001" if p < 0.0005 else f"= {p:.3f}"


def paired_differences(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """Per-seed differences a_i - b_i of two methods' statistics at the same seeds, in the same order."""
    if len(a) != len(b):
        raise StatsError(f"paired differences need the same seeds for both methods; got {len(a)} and {len(b)} values")
    if not a:
        raise StatsError("paired differences need at least one seed; got none")
    out = [float(x) - float(y) for x, y in zip(a, b)]
    if not all(math.isfinite(d) for d in out):
        raise StatsError(f"paired differences need finite statistics; got {out}")
    return out


def paired_interval(diffs: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """Student's t interval of the mean of `diffs` (a paired t interval): mean +- t_{(1+c)/2, n-1} * sd / sqrt(n).
    No bootstrap: below 10 pairs a percentile bootstrap's interval is too narrow."""
    from scipy import stats

    n = len(diffs)
    if n == 0:
        raise StatsError("an interval needs at least one paired difference; got none")
    if not 0 < confidence < 1:
        raise StatsError(f"confidence {confidence} is not allowed; expected a number in (0, 1)")
    mean = sum(diffs) / n
    if n == 1:
        return Interval(1, mean, math.nan, math.nan, math.nan, confidence)
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    half = stats.t.ppf((1 + confidence) / 2, n - 1) * sd / math.sqrt(n)
    return Interval(n, mean, sd, mean - half, mean + half, confidence)


def paired_p_value(diffs: Sequence[float]) -> float:
    """Two-sided p of the paired t test of mean difference 0 (1.0 where the SD is 0 and the mean 0; 0.0 where only
    the SD is 0); nan below 2 pairs."""
    from scipy import stats

    n = len(diffs)
    if n < 2:
        return math.nan
    iv = paired_interval(diffs)
    if iv.sd == 0:
        return 1.0 if iv.mean == 0 else 0.0
    t = iv.mean / (iv.sd / math.sqrt(n))
    return float(2 * stats.t.sf(abs(t), n - 1))


def seeds_needed(margin: float, sd: float, confidence: float = CONFIDENCE, power: float = POWER) -> int | None:
    """The smallest number of pairs at which a two-sided paired t test at 1 - `confidence` detects a true mean
    difference of `margin` with probability `power`, for differences of SD `sd` (exact, by the noncentral t);
    None where no n up to MAX_SEEDS does (or sd is not known)."""
    from scipy import stats

    if margin <= 0:
        raise StatsError(f"margin {margin} is not allowed; expected the claimed margin, a positive number of points")
    alpha = 1 - confidence

    def achieved(n: int) -> float:
        crit, nc = stats.t.ppf(1 - alpha / 2, n - 1), margin / (sd / math.sqrt(n))
        return stats.nct.sf(crit, n - 1, nc) + stats.nct.cdf(-crit, n - 1, nc)

    return _fewest_pairs(achieved, sd, power)


def _fewest_pairs(achieved: Callable[[int], float], sd: float, power: float) -> int | None:
    """The smallest n in 2..MAX_SEEDS whose `achieved(n)` power reaches `power`; 2 where the differences have SD 0,
    None where the SD is unknown or no n up to MAX_SEEDS does."""
    if not math.isfinite(sd) or sd < 0:
        return None
    if sd == 0:
        return 2
    return next((n for n in range(2, MAX_SEEDS + 1) if achieved(n) >= power), None)


def _beyond(need: int | None, n: int) -> int | None:
    """The seeds to ask for when `n` ran and did not decide: a power calculation asking for n or fewer asks for more."""
    return None if need is None else max(need, n + 1)


def label(iv: Interval, margin: float, unit: str = "point") -> str:
    """The verdict by one rule, in this order (`margin` > 0: the paper's claimed margin, in the paper's direction; its
    `unit` is "point" of accuracy, or "round" for a convergence claim):

    (a) the interval lies wholly above 0: "held" if it reaches the margin (its upper end >= margin), else "held,
        smaller than claimed";
    (b) wholly below 0: "not held (reversed)";
    (c) it contains 0 and lies wholly below the margin: "not held (the claimed margin is excluded)";
    (d) otherwise "inconclusive at n seeds", with the n a power calculation asks for at the observed SD.
    """
    if margin <= 0:
        raise StatsError(f"margin {margin} is not allowed; expected the claimed margin, a positive number of points")
    if iv.n < 2:
        return "inconclusive at 1 seed (an interval needs at least 2)"
    if iv.low > 0:
        return "held" if iv.high >= margin else "held, smaller than claimed"
    if iv.high < 0:
        return "not held (reversed)"
    if iv.high < margin:
        return "not held (the claimed margin is excluded)"
    need = _beyond(seeds_needed(margin, iv.sd, iv.confidence), iv.n)
    return f"inconclusive at {iv.n} seeds ({f'{need} needed' if need else f'over {MAX_SEEDS} needed'} for a " \
           f"{margin:g}-{unit} margin at SD {iv.sd:.2f})"


def tost_power(n: int, margin: float, sd: float, alpha: float = 1 - CONFIDENCE) -> float:
    """The probability that :func:`tost` within +-`margin` shows parity from `n` pairs when the true mean difference is
    0 and the differences have SD `sd`: exact, by integrating over the sample SD (the test holds iff
    ``|mean| + t(1 - alpha; n-1) s / sqrt(n) < margin``; the mean is normal and independent of s, whose square is
    ``sd**2 chi2(n-1) / (n-1)``)."""
    from scipy import integrate, stats

    df, crit = n - 1, stats.t.ppf(1 - alpha, n - 1)
    w_max = df * (margin * math.sqrt(n) / (crit * sd)) ** 2  # beyond it the interval is wider than the margin

    def at(w: float) -> float:
        return (2 * stats.norm.cdf(math.sqrt(n) * margin / sd - crit * math.sqrt(w / df)) - 1) * stats.chi2.pdf(w, df)

    return float(integrate.quad(at, 0, w_max, limit=200)[0])


def tost_seeds_needed(margin: float, sd: float, alpha: float = 1 - CONFIDENCE, power: float = POWER) -> int | None:
    """The smallest number of pairs at which :func:`tost` within +-`margin` shows parity with probability `power`
    when the true mean difference is 0, for differences of SD `sd` (exact: :func:`tost_power`); None where no n up to
    MAX_SEEDS does."""
    if margin <= 0:
        raise StatsError(f"equivalence margin {margin} is not allowed; expected a positive number of points")
    return _fewest_pairs(lambda n: tost_power(n, margin, sd, alpha), sd, power)


def claim_p(diffs: Sequence[float], kind: str, margin: float | None = None) -> float:
    """The p-value of the test a claim of this kind rests on, for Holm's correction of a family of cells: TOST's
    within +-`margin` for a parity claim (small: parity shown), else the two-sided paired t p (small: a difference)."""
    if kind == "parity" and margin is not None:
        return tost(diffs, margin).p
    return paired_p_value(diffs)


def direction_label(iv: Interval) -> str:
    """The verdict on a claim with no claimed margin (a reading of ours, not a paper's number): "held" where the
    interval lies wholly above 0, "not held (reversed)" wholly below it, else "inconclusive at n seeds" (no margin, so
    no power calculation)."""
    if iv.n < 2:
        return "inconclusive at 1 seed (an interval needs at least 2)"
    if iv.low > 0:
        return "held"
    if iv.high < 0:
        return "not held (reversed)"
    return f"inconclusive at {iv.n} seeds (no margin claimed)"


def verdict(diffs: Sequence[float], kind: str, margin: float | None = None, unit: str = "point") -> dict:
    """The verdict on paired differences in the paper's direction: n, mean, SD, the 95% interval, the paired t p
    (n >= 2) and the label: by :func:`label` against the claimed `margin` ("superiority"), by :func:`tost` within it
    ("parity": "not held" where the 95% interval lies wholly beyond +-margin), or by :func:`direction_label`
    ("direction", or no margin)."""
    iv = paired_interval(diffs)
    out = {"n": iv.n, "mean": iv.mean, "low": iv.low, "high": iv.high, "sd": iv.sd}
    if iv.n >= 2:
        out["p"] = paired_p_value(diffs)
    if kind == "direction" or margin is None:
        out["label"] = direction_label(iv)
    elif kind == "parity":
        if iv.n < 2:
            out["label"] = "inconclusive at 1 seed (an interval needs at least 2)"
        else:
            eq = tost(diffs, margin)
            out["tost_p"] = eq.p
            outside = iv.high < -margin or iv.low > margin  # the data exclude parity: more seeds would not show it
            word = "held" if eq.equivalent else "not held (the interval lies beyond the margin)" if outside else "not shown"
            out["label"] = f"{word}: parity within +-{margin:g} (TOST p {p_text(eq.p)}"
            if not eq.equivalent and not outside:
                need = _beyond(tost_seeds_needed(margin, iv.sd), iv.n)
                out["seeds_needed"] = need
                out["label"] += f"; {need if need else f'over {MAX_SEEDS}'} seeds needed at SD {iv.sd:.2f}"
            out["label"] += ")"
    elif kind == "superiority":
        out["label"] = label(iv, margin, unit)
    else:
        raise StatsError(f"kind {kind!r} is not allowed; expected 'superiority', 'parity' or 'direction'")
    return out


@dataclass(frozen=True)
class Equivalence:
    """Two one-sided tests of ``|mean difference| < margin``: p is the larger one-sided p; equivalent when p < alpha
    (the same as the 1 - 2 alpha interval lying inside (-margin, margin))."""

    n: int
    mean: float
    margin: float
    p: float
    low: float  # the 1 - 2 alpha interval
    high: float
    equivalent: bool


def tost(diffs: Sequence[float], margin: float, alpha: float = 1 - CONFIDENCE) -> Equivalence:
    """Schuirmann's two one-sided tests for a parity claim ("nears", "matches") within +-`margin` points."""
    from scipy import stats

    if margin <= 0:
        raise StatsError(f"equivalence margin {margin} is not allowed; expected a positive number of points")
    n = len(diffs)
    if n < 2:
        raise StatsError(f"an equivalence test needs at least 2 paired differences; got {n}")
    iv = paired_interval(diffs, 1 - 2 * alpha)
    se = iv.sd / math.sqrt(n)
    if se == 0:
        p = 0.0 if abs(iv.mean) < margin else 1.0
    else:
        p_low = stats.t.sf((iv.mean + margin) / se, n - 1)  # H0: mean <= -margin
        p_high = stats.t.cdf((iv.mean - margin) / se, n - 1)  # H0: mean >= margin
        p = float(max(p_low, p_high))
    return Equivalence(n, iv.mean, margin, p, iv.low, iv.high, p < alpha)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input's order: the k-th smallest times (m - k + 1), made
    monotone, capped at 1 (nan stays nan and is not counted)."""
    idx = [i for i, p in enumerate(p_values) if not math.isnan(p)]
    m = len(idx)
    out = [math.nan] * len(p_values)
    running = 0.0
    for rank, i in enumerate(sorted(idx, key=lambda j: p_values[j])):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        out[i] = running
    return out
