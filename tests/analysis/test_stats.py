"""stats: the numbers behind every table cell and figure band."""

from __future__ import annotations

import math

import numpy as np

from analysis.stats import bootstrap_mean_ci, geometric_mean, rolling_mean, summarize


def test_summarize_is_mean_and_sample_std():
    s = summarize([0.40, 0.50, 0.60])
    assert math.isclose(s.mean, 0.50)
    assert math.isclose(s.std, math.sqrt((0.1**2 + 0 + 0.1**2) / 2))  # ddof=1
    assert s.n == 3


def test_summarize_ignores_missing_and_has_no_std_for_one_seed():
    s = summarize([0.3, float("nan")])
    assert (s.mean, s.n) == (0.3, 1) and math.isnan(s.std)
    assert summarize([]).n == 0 and math.isnan(summarize([]).mean)


def test_bootstrap_band_brackets_the_mean_and_is_reproducible():
    rng = np.random.default_rng(1)
    m = rng.normal(size=(5, 20))
    mean, lo, hi = bootstrap_mean_ci(m)
    np.testing.assert_allclose(mean, m.mean(axis=0))
    assert (lo <= mean + 1e-12).all() and (mean <= hi + 1e-12).all()
    assert (lo >= m.min(axis=0) - 1e-12).all() and (hi <= m.max(axis=0) + 1e-12).all()
    assert (hi - lo > 0).all()
    _, lo2, hi2 = bootstrap_mean_ci(m)
    np.testing.assert_array_equal(lo, lo2)  # fixed RNG seed: same figure every time
    np.testing.assert_array_equal(hi, hi2)


def test_bootstrap_degenerate_cases():
    const = np.full((3, 4), 2.0)
    mean, lo, hi = bootstrap_mean_ci(const)
    np.testing.assert_allclose([mean, lo, hi], 2.0)
    one = np.array([[1.0, 2.0, 3.0]])
    mean, lo, hi = bootstrap_mean_ci(one)
    np.testing.assert_array_equal(mean, [1, 2, 3])
    np.testing.assert_array_equal(lo, hi)


def test_bootstrap_mean_uses_the_runs_present_at_each_step():
    # Run 2 stopped (diverged) after step 1: later steps average the remaining runs only.
    m = np.array([[1.0, 1.0, 1.0], [3.0, 3.0, np.nan]])
    mean, lo, hi = bootstrap_mean_ci(m)
    np.testing.assert_allclose(mean, [2.0, 2.0, 1.0])
    assert lo[2] == hi[2] == 1.0


def test_rolling_mean_is_centred_and_keeps_edges():
    out = rolling_mean(np.array([[0.0, 3.0, 6.0, 9.0]]), 3)
    np.testing.assert_allclose(out, [[1.5, 3.0, 6.0, 7.5]])
    x = np.array([[1.0, 5.0]])
    np.testing.assert_array_equal(rolling_mean(x, 1), x)


def test_geometric_mean_of_speedups():
    assert math.isclose(geometric_mean([1.5, 2.0]), math.sqrt(3.0))
    assert math.isnan(geometric_mean([]))
