"""stats: the numbers behind every table cell and figure band."""

from __future__ import annotations

import math

import numpy as np

import pytest
from scipy import stats as sps

from analysis.stats import (
    binomial_se,
    diff_interval,
    gap_binomial_se,
    geometric_mean,
    mean_band,
    mean_interval,
    ratio_interval,
    rolling_mean,
    summarize,
)


def test_summarize_is_mean_and_sample_std():
    s = summarize([0.40, 0.50, 0.60])
    assert math.isclose(s.mean, 0.50)
    assert math.isclose(s.std, math.sqrt((0.1**2 + 0 + 0.1**2) / 2))  # ddof=1
    assert s.n == 3


def test_summarize_ignores_missing_and_has_no_std_for_one_seed():
    s = summarize([0.3, float("nan")])
    assert (s.mean, s.n) == (0.3, 1) and math.isnan(s.std)
    assert summarize([]).n == 0 and math.isnan(summarize([]).mean)


def test_band_is_the_t_interval_of_each_column():
    rng = np.random.default_rng(1)
    m = rng.normal(size=(5, 20))
    mean, lo, hi = mean_band(m)
    np.testing.assert_allclose(mean, m.mean(axis=0))
    half = sps.t.ppf(0.975, 4) * m.std(axis=0, ddof=1) / math.sqrt(5)
    np.testing.assert_allclose(lo, mean - half)
    np.testing.assert_allclose(hi, mean + half)


def test_band_degenerate_cases():
    const = np.full((3, 4), 2.0)
    mean, lo, hi = mean_band(const)
    np.testing.assert_allclose([mean, lo, hi], 2.0)
    mean, lo, hi = mean_band(np.array([[1.0, 2.0, 3.0]]))  # one seed: a curve, no band
    np.testing.assert_array_equal(mean, [1, 2, 3])
    assert np.isnan(lo).all() and np.isnan(hi).all()


def test_band_uses_the_runs_present_at_each_step():
    # Run 2 stopped (diverged) after step 1: later steps average the remaining run only, without a band.
    m = np.array([[1.0, 1.0, 1.0], [3.0, 3.0, np.nan]])
    mean, lo, hi = mean_band(m)
    np.testing.assert_allclose(mean, [2.0, 2.0, 1.0])
    half = sps.t.ppf(0.975, 1) * math.sqrt(2.0) / math.sqrt(2)  # sd of (1, 3) = sqrt(2)
    np.testing.assert_allclose(hi[:2] - mean[:2], half)
    assert np.isnan(lo[2]) and np.isnan(hi[2])


# ---- intervals against scipy's own implementations, and their coverage ------------------------------------


def test_intervals_match_scipy():
    a, b = [52.0, 53.0, 49.0], [40.0, 36.0, 41.0]
    iv = mean_interval(a)
    ref = sps.ttest_1samp(a, 0.0).confidence_interval(0.95)
    assert (iv.n, iv.method) == (3, "t") and iv.lo == pytest.approx(ref.low) and iv.hi == pytest.approx(ref.high)
    # the same seeds: paired
    iv = diff_interval(a, b, [0, 1, 2], [0, 1, 2])
    ref = sps.ttest_rel(a, b).confidence_interval(0.95)
    assert (iv.n, iv.method) == (3, "paired t") and iv.value == pytest.approx(np.mean(a) - np.mean(b))
    assert (iv.lo, iv.hi) == pytest.approx((ref.low, ref.high))
    # pairing follows the seed, not the order
    assert diff_interval(a, b[::-1], [0, 1, 2], [2, 1, 0]) == iv
    # a seed only one arm ran (another still running, failed): paired on the seeds both ran, never Welch over
    # different seed sets (which mixed their means: seeds 0-2 against 0, 1, 3)
    iv = diff_interval(a, b, [0, 1, 2], [0, 1, 3])
    ref = sps.ttest_rel(a[:2], b[:2]).confidence_interval(0.95)
    assert (iv.n, iv.method) == (2, "paired t") and iv.value == pytest.approx(np.mean(a[:2]) - np.mean(b[:2]))
    assert (iv.lo, iv.hi) == pytest.approx((ref.low, ref.high))
    # one seed in common: that seed's difference, no interval (a Welch interval over different seed sets read as
    # paired in every table)
    one_pair = diff_interval(a, b, [0, 1, 2], [2, 3, 4])
    assert (one_pair.n, one_pair.note) == (1, "1 seed") and one_pair.value == pytest.approx(a[2] - b[0])
    assert not one_pair.defined
    # no seed in common, or none given: Welch
    for seeds_b in ([3, 4, 5], None):
        iv = diff_interval(a, b, [0, 1, 2], seeds_b)
        ref = sps.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
        assert iv.method == "Welch" and (iv.lo, iv.hi) == pytest.approx((ref.low, ref.high))
    assert diff_interval(a, b, [0, 0, 1], [0, 0, 1]).method == "Welch"  # a repeated seed does not pair
    # one seed: the point value, no interval, said so
    one = diff_interval([0.5], [0.1, 0.2])
    assert one.value == pytest.approx(0.35) and not one.defined and one.note == "1 seed" and one.contains(0.0)
    assert not mean_interval([3.0]).defined and mean_interval([3.0]).note == "1 seed"
    # seeds that all give the same value (accuracies move in steps of 1/n_test): no zero-width interval
    same = mean_interval([31.25, 31.25])
    assert not same.defined and (same.value, same.n, same.note) == (31.25, 2, "no spread")
    assert math.isnan(diff_interval([], [1.0, 2.0]).value)


def test_fieller_on_hand_cases():
    # no spread: the interval is the point
    r = ratio_interval([0.5, 0.5], [0.2, 0.2], [0.8, 0.8], ([0, 1],) * 3)
    assert (r.value, r.lo, r.hi) == pytest.approx((0.5, 0.5, 0.5)) and r.method == "Fieller (paired)"
    assert math.isnan(ratio_interval([0.5, 0.5], [0.3, 0.3], [0.3, 0.3]).value)  # no naive gap at all
    # paired: the interval solves (m1 - R m2)^2 = t^2 var(m1 - R m2) at both ends
    arm, naive, base = [45.0, 49.0, 46.0], [30.0, 34.0, 33.0], [60.0, 66.0, 61.0]
    r = ratio_interval(arm, naive, base, ([0, 1, 2],) * 3)
    num, den = np.subtract(arm, naive), np.subtract(base, naive)
    t2 = sps.t.ppf(0.975, 2) ** 2
    for end in (r.lo, r.hi):
        lin = num - end * den
        assert lin.mean() ** 2 == pytest.approx(t2 * lin.var(ddof=1) / 3)
    assert r.value == pytest.approx(num.mean() / den.mean()) and r.lo < r.value < r.hi
    # a denominator not resolved from 0: no interval, said so
    r = ratio_interval([45.0, 47.0], [30.0, 50.0], [60.0, 40.0], ([0, 1],) * 3)
    assert not r.defined and r.note == "unbounded"


COVERAGE_N = (2, 3, 5, 10)


@pytest.mark.parametrize("n", COVERAGE_N)
def test_coverage_is_nominal_at_small_n(n):
    """Normal data with a known mean, 2000 replicates per n (fixed RNG): the level's t-interval, the paired gap
    and the paired Fieller ratio each cover the truth 93-97 % of the time (a percentile bootstrap over 2 seeds,
    [min, max], covers 50 %). Seeds share an effect (sd 5) far larger than the noise (sd 1-1.5), as arms run with
    the same seed do."""
    rng = np.random.default_rng(n)
    reps, seeds = 2000, list(range(n))
    level = rng.normal(5.0, 2.0, (reps, n))
    shared = rng.normal(0.0, 5.0, (reps, n))
    a = 40.0 + shared + rng.normal(0.0, 1.0, (reps, n))
    b = 45.0 + shared + rng.normal(0.0, 1.5, (reps, n))
    naive = 30.0 + shared + rng.normal(0.0, 1.0, (reps, n))
    base = 60.0 + shared + rng.normal(0.0, 1.0, (reps, n))
    arm = 45.0 + shared + rng.normal(0.0, 1.0, (reps, n))
    covered = {
        "level": np.mean([mean_interval(x).contains(5.0) for x in level]),
        "paired gap": np.mean([diff_interval(a[i], b[i], seeds, seeds).contains(-5.0) for i in range(reps)]),
        "ratio": np.mean([ratio_interval(arm[i], naive[i], base[i], (seeds,) * 3).contains(0.5) for i in range(reps)]),
    }
    print(f"n={n}: " + ", ".join(f"{k} {v:.3f}" for k, v in covered.items()))
    assert all(0.93 <= v <= 0.97 for v in covered.values()), covered


def test_welch_is_conservative_not_liberal_at_2_seeds():
    """Unpaired arms: Welch's df make the interval a little wide at n = 2 (measured 97.4 %), never narrow."""
    rng = np.random.default_rng(2)
    a, b = rng.normal(40.0, 1.0, (2000, 2)), rng.normal(45.0, 1.5, (2000, 2))
    cover = np.mean([diff_interval(a[i], b[i]).contains(-5.0) for i in range(2000)])
    assert 0.93 <= cover <= 0.99, cover


def test_binomial_se_of_a_gap():
    # 200 test problems, p = 0.5 in both arms, 1 seed each: sqrt(2 * 0.25 / 200) = 0.05
    assert gap_binomial_se(0.5, 1, 0.5, 1, 200) == pytest.approx(0.05)
    assert binomial_se(0.5, 200, 4) == pytest.approx(math.sqrt(0.25 / 800))
    assert math.isnan(binomial_se(0.5, float("nan")))


def test_rolling_mean_is_centred_and_keeps_edges():
    out = rolling_mean(np.array([[0.0, 3.0, 6.0, 9.0]]), 3)
    np.testing.assert_allclose(out, [[1.5, 3.0, 6.0, 7.5]])
    x = np.array([[1.0, 5.0]])
    np.testing.assert_array_equal(rolling_mean(x, 1), x)


def test_geometric_mean_of_speedups():
    assert math.isclose(geometric_mean([1.5, 2.0]), math.sqrt(3.0))
    assert math.isnan(geometric_mean([]))
