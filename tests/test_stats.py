"""hetfl.stats on hand-worked cases (t quantiles from tables: t(0.975; 2) = 4.302653, t(0.975; 4) = 2.776445,
t(0.95; 4) = 2.131847) and on published power tables (G*Power's paired t test, alpha 0.05 two-sided, power 0.8:
dz = 1 needs 10 pairs, dz = 0.5 needs 34)."""

from __future__ import annotations

import math

import pytest

from hetfl.stats import (Interval, StatsError, claim_p, direction_label, holm, label, paired_differences, paired_interval,
                         paired_p_value, seeds_needed, tost, tost_power, tost_seeds_needed, verdict)

SPREAD = [0.1, -0.1, 0.2, 0.0, -0.2]  # mean 0, SD sqrt(0.025) = 0.158114, SE 0.0707107


def test_paired_interval_by_hand():
    iv = paired_interval([1.0, 2.0, 3.0])  # mean 2, SD 1, half-width 4.302653 / sqrt(3) = 2.484138
    assert (iv.n, iv.mean, iv.sd) == (3, 2.0, 1.0)
    assert iv.low == pytest.approx(2 - 2.484138, abs=1e-5) and iv.high == pytest.approx(2 + 2.484138, abs=1e-5)
    iv = paired_interval(SPREAD)  # half-width 2.776445 x 0.0707107 = 0.196324
    assert iv.mean == pytest.approx(0.0, abs=1e-12) and iv.sd == pytest.approx(0.158114, abs=1e-6)
    assert iv.high == pytest.approx(0.196324, abs=1e-5) and iv.low == pytest.approx(-0.196324, abs=1e-5)
    one = paired_interval([0.7])
    assert one.n == 1 and one.mean == 0.7 and math.isnan(one.low) and math.isnan(one.sd)


def test_paired_differences_pair_by_seed_and_refuse_unpaired_input():
    assert paired_differences([86.0, 85.5], [85.0, 86.0]) == [1.0, -0.5]
    with pytest.raises(StatsError, match="same seeds"):
        paired_differences([1.0, 2.0], [1.0])
    with pytest.raises(StatsError, match="at least one"):
        paired_differences([], [])


def test_p_value_by_hand():
    assert paired_p_value([1.0, 2.0, 3.0]) == pytest.approx(0.07418, abs=2e-4)  # t = 2 sqrt(3) = 3.4641, df 2
    assert paired_p_value([1.0, 1.0]) == 0.0 and paired_p_value([0.0, 0.0]) == 1.0
    assert math.isnan(paired_p_value([1.0]))


def test_label_follows_the_rule_in_its_order():
    assert label(paired_interval([2.0, 3.0, 4.0]), 1.0) == "held"  # [0.52, 5.48]: above 0, reaches 1
    assert label(paired_interval([2.0, 3.0, 4.0]), 6.0) == "held, smaller than claimed"  # below the margin 6
    assert label(paired_interval([-2.0, -3.0, -4.0]), 1.0) == "not held (reversed)"
    assert label(paired_interval(SPREAD), 1.0) == "not held (the claimed margin is excluded)"  # [-0.20, 0.20]
    inconclusive = label(paired_interval([1.0, 2.0, 3.0]), 2.0)  # [-0.48, 4.48] holds both 0 and the margin
    assert inconclusive.startswith("inconclusive at 3 seeds") and f"{seeds_needed(2.0, 1.0)} needed" in inconclusive
    assert label(paired_interval([5.0]), 1.0).startswith("inconclusive at 1 seed")
    with pytest.raises(StatsError, match="margin"):
        label(paired_interval([1.0, 2.0]), 0.0)


def test_direction_label_without_a_claimed_margin():
    assert direction_label(paired_interval([2.0, 3.0, 4.0])) == "held"  # [0.52, 5.48]
    assert direction_label(paired_interval([-2.0, -3.0, -4.0])) == "not held (reversed)"
    assert direction_label(paired_interval([1.0, 2.0, 3.0])) == "inconclusive at 3 seeds (no margin claimed)"
    assert direction_label(paired_interval([5.0])).startswith("inconclusive at 1 seed")


def test_seeds_needed_matches_published_power_tables():
    assert seeds_needed(1.0, 1.0) == 10  # G*Power: dz = 1, actual power 0.803
    assert seeds_needed(0.5, 1.0) == 34  # dz = 0.5, actual power 0.808
    assert seeds_needed(2.0, 4.0) == 34  # only the ratio margin / SD counts
    assert seeds_needed(1.0, 0.0) == 2 and seeds_needed(1.0, math.nan) is None
    assert seeds_needed(0.01, 10.0) is None  # far inside the noise: beyond the search


def test_tost_by_hand():
    eq = tost(SPREAD, 0.5)  # 90% interval 0 +- 2.131847 x 0.0707107 = +-0.150745, inside +-0.5
    assert eq.equivalent and eq.low == pytest.approx(-0.150745, abs=1e-5)
    assert eq.p == pytest.approx(0.00106, abs=5e-5)  # t = 0.5 / 0.0707107 = 7.071, df 4, one-sided
    assert not tost(SPREAD, 0.1).equivalent  # the interval reaches past +-0.1
    assert not tost([3.0, 3.2, 2.8], 1.0).equivalent  # a clear difference is not parity
    with pytest.raises(StatsError, match="at least 2"):
        tost([0.1], 1.0)


def test_holm_by_hand():
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])  # 3 x 0.01; 2 x 0.03; max(1 x 0.04, 0.06)
    assert holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])  # capped at 1
    out = holm([0.02, math.nan])
    assert out[0] == pytest.approx(0.02) and math.isnan(out[1])  # nan is not a test


def test_interval_prints_n_and_its_ends():
    assert str(Interval(3, 0.5, 1.0, -1.98, 2.98)) == "+0.50 [-1.98, +2.98] (n = 3)"


def test_an_undecided_interval_never_asks_for_the_seeds_it_already_has():
    """[0, 0.55, 0.25] against a 0.94-point margin: [-0.44, 1.04] holds 0 and the margin; at its SD (0.276) the
    power calculation alone asks for 3 pairs, which ran and did not decide, so the label asks for at least 4."""
    iv = paired_interval([0.0, 0.55, 0.25])
    assert seeds_needed(0.94, iv.sd) <= 3
    assert label(iv, 0.94).startswith("inconclusive at 3 seeds (4 needed for a 0.94-point margin")


def test_tost_power_matches_a_seeded_simulation_and_gives_the_seeds_a_parity_claim_needs():
    """Exact TOST power (true difference 0) against 200,000 seeded simulated studies, then the seeds it asks for."""
    import numpy as np
    from scipy import stats

    rng = np.random.default_rng(0)
    for n, sd in [(6, 0.5), (10, 1.0), (14, 1.21)]:
        x = rng.normal(0.0, sd, (200_000, n))
        m, se = x.mean(1), x.std(1, ddof=1) / math.sqrt(n)
        shown = np.maximum(stats.t.sf((m + 1) / se, n - 1), stats.t.cdf((m - 1) / se, n - 1)) < 0.05
        assert tost_power(n, 1.0, sd) == pytest.approx(shown.mean(), abs=0.005)
    assert tost_power(10, 1.0, 1.0) < 0.8 < tost_power(11, 1.0, 1.0)  # 0.795 and 0.849
    assert tost_seeds_needed(1.0, 1.0) == 11 and tost_seeds_needed(1.0, 0.0) == 2
    assert tost_seeds_needed(1.0, math.nan) is None
    with pytest.raises(StatsError, match="equivalence margin"):
        tost_seeds_needed(0.0, 1.0)
    # a parity claim not shown names the seeds it would need (here at SD 1.20: 14)
    out = verdict([-2.44, -0.61, -0.17], "parity", 1.0)
    assert out["seeds_needed"] == tost_seeds_needed(1.0, out["sd"]) == 14
    assert out["label"] == "not shown: parity within +-1 (TOST p = 0.537; 14 seeds needed at SD 1.20)"


def test_a_parity_claim_whose_interval_lies_beyond_the_margin_is_not_held():
    """Worked by hand: diffs -9, -10, -11: mean -10, SD 1, 95% interval -10 +- 4.303 / sqrt(3) = [-12.48, -7.52],
    wholly below -2: the data exclude parity, so no number of seeds is named (one at 0 would be the wrong question)."""
    out = verdict([-9.0, -10.0, -11.0], "parity", 2.0)
    assert (round(out["low"], 2), round(out["high"], 2)) == (-12.48, -7.52)
    assert out["label"] == "not held (the interval lies beyond the margin): parity within +-2 (TOST p = 0.997)"
    assert "seeds_needed" not in out
    assert verdict([9.0, 10.0, 11.0], "parity", 2.0)["label"].startswith("not held (the interval lies beyond")
    # an interval that reaches into the margin is not decided either way: TOST's seeds at the observed SD
    out = verdict([-1.0, -3.0, -5.0], "parity", 2.0)  # [-7.97, +1.97]
    assert out["label"] == "not shown: parity within +-2 (TOST p = 0.761; 11 seeds needed at SD 2.00)"


def test_claim_p_is_the_test_the_claim_rests_on():
    diffs = [-0.05, -0.06, -0.07]  # tightly around 0: a difference by t, parity by TOST
    assert claim_p(diffs, "parity", 1.0) == tost(diffs, 1.0).p < 0.01
    assert claim_p(diffs, "superiority", 1.0) == paired_p_value(diffs) < 0.01
    assert claim_p([2.0, -1.0, 0.5], "parity", 0.5) == tost([2.0, -1.0, 0.5], 0.5).p >= 0.5  # mean 0.5: on the margin


def test_p_text_prints_three_decimals_or_an_upper_bound():
    from hetfl.stats import p_text

    assert p_text(0.0742) == "= 0.074" and p_text(0.0005) == "= 0.001" and p_text(0.00049) == "< 0.001"
