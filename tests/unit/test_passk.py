"""pass@k (Chen et al. 2021 unbiased estimator) and avg@k on hand-computed cases."""

from __future__ import annotations

import itertools
import math

import pytest

from bench.passk import avg_at_k, mean_avg_at_k, mean_pass_at_k, pass_at_k


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (5, 2, 1, 0.4),  # c / n
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (5, 2, 3, 0.9),  # 1 - C(3,3)/C(5,3) = 1 - 1/10
        (5, 2, 4, 1.0),  # n - c = 3 < k: every 4-subset holds a correct sample
        (10, 0, 5, 0.0),  # nothing correct
        (10, 10, 10, 1.0),
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (1, 1, 1, 1.0),
        (1, 0, 1, 0.0),
    ],
)
def test_pass_at_k_hand_computed(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_equals_the_combinatorial_definition():
    for n in range(1, 12):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - math.comb(n - c, k) / math.comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12), (n, c, k)


def test_pass_at_k_is_the_mean_over_all_k_subsets():
    """Unbiasedness: the estimator is the average of 'any of these k passed' over every k-subset."""
    samples = [1, 0, 0, 1, 0, 0, 0]
    for k in range(1, len(samples) + 1):
        subsets = list(itertools.combinations(samples, k))
        brute = sum(any(s) for s in subsets) / len(subsets)
        assert pass_at_k(len(samples), sum(samples), k) == pytest.approx(brute, abs=1e-12)


def test_pass_at_k_is_stable_for_large_n():
    # C(1000, 500) overflows a float; the product form does not.
    value = pass_at_k(1000, 3, 500)
    assert value == pytest.approx(1 - (500 * 499 * 498) / (1000 * 999 * 998), abs=1e-12)
    assert 0.0 <= pass_at_k(100_000, 1, 1) == pytest.approx(1e-5)


@pytest.mark.parametrize(
    "n, c, k, match",
    [(3, 1, 5, "at least k=5 samples"), (5, 6, 1, r"\[0, n=5\]"), (5, -1, 1, r"\[0, n=5\]"), (5, 1, 0, "k >= 1"),
     (5, 1.5, 1, "integer")],
)
def test_pass_at_k_rejects_bad_arguments(n, c, k, match):
    with pytest.raises(ValueError, match=match):
        pass_at_k(n, c, k)


def test_mean_pass_at_k_averages_problems():
    assert mean_pass_at_k([(5, 2), (5, 0)], k=2) == pytest.approx(0.35)
    with pytest.raises(ValueError, match="empty"):
        mean_pass_at_k([], k=1)


def test_avg_at_k():
    assert avg_at_k([1, 0, 0, 1]) == 0.5
    assert avg_at_k([True, True, False]) == pytest.approx(2 / 3)
    assert mean_avg_at_k([[1, 1], [0, 0, 0, 1]]) == pytest.approx((1.0 + 0.25) / 2)
    with pytest.raises(ValueError, match="at least one sample"):
        avg_at_k([])
    with pytest.raises(ValueError, match="empty"):
        mean_avg_at_k([])


def test_avg_at_k_is_pass_at_1():
    samples = [1, 0, 1, 1, 0, 0, 0, 1]
    assert avg_at_k(samples) == pytest.approx(pass_at_k(len(samples), sum(samples), 1))
