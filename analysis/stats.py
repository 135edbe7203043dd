"""Statistics over seeds: mean ± std, percentile-bootstrap confidence bands, smoothing.

Kept separate from plotting and tables so that the numbers in a figure band and in a table cell come from
one definition each, and so the tests can check them against hand-computed values.

Conventions (stated in the report, so a reader can reproduce any cell):
- std is the *sample* standard deviation over seeds (ddof=1, the convention of papers reporting
  "mean ± std over seeds"); with a single seed it is NaN, shown as "–", never 0 (which would claim no spread).
- bootstrap bands resample seeds (runs) with replacement, with a fixed RNG seed so figures are
  reproducible byte for byte across invocations.
- table intervals (`Interval`: the mean of a cell, a gap between two arms, the recovered share of a gap) are
  95 % percentile-bootstrap CIs over seeds, each group resampled independently; with fewer than 2 seeds in a
  group the CI is undefined (NaN) and a table shows the point value alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np

BOOTSTRAP_SAMPLES = 2000
BOOTSTRAP_SEED = 0
CI_LEVEL = 0.95


@dataclass(frozen=True)
class Summary:
    """mean, sample std (ddof=1) and number of finite values."""

    mean: float
    std: float
    n: int


def summarize(values: Iterable[float]) -> Summary:
    """Mean, sample std and count of the finite values; NaN/inf are ignored (a missing seed is not a zero)."""
    x = np.asarray(list(values), dtype=float)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return Summary(float("nan"), float("nan"), 0)
    std = float(np.std(x, ddof=1)) if x.size > 1 else float("nan")
    return Summary(float(np.mean(x)), std, int(x.size))


def bootstrap_mean_ci(
    matrix: np.ndarray,
    level: float = CI_LEVEL,
    n_boot: int = BOOTSTRAP_SAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean over rows and a percentile-bootstrap CI of that mean, column by column.

    `matrix` is [runs, steps] with NaN where a run has no value (e.g. a run that diverged early). Rows are
    resampled jointly for all columns (a seed is one unit), which keeps a band smooth along the x axis.
    Returns (mean, lo, hi), each of length `steps`. With one run the band collapses onto the mean.

    The resampled means are computed as count-weighted sums (multinomial counts @ values) instead of by
    materialising [n_boot, runs, steps], so long runs with many seeds stay cheap in memory.
    """
    m = np.atleast_2d(np.asarray(matrix, dtype=float))
    n_runs, _ = m.shape
    valid = np.isfinite(m)
    filled = np.where(valid, m, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = filled.sum(axis=0) / valid.sum(axis=0)
    if n_runs == 1:
        return mean, mean.copy(), mean.copy()
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(n_runs, np.full(n_runs, 1.0 / n_runs), size=n_boot).astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        boot = (counts @ filled) / (counts @ valid.astype(float))  # [n_boot, steps]; NaN if no valid run drawn
    alpha = (1.0 - level) / 2.0
    with np.errstate(invalid="ignore"):
        lo = np.nanquantile(boot, alpha, axis=0) if np.isfinite(boot).any() else np.full_like(mean, np.nan)
        hi = np.nanquantile(boot, 1.0 - alpha, axis=0) if np.isfinite(boot).any() else np.full_like(mean, np.nan)
    return mean, lo, hi


def rolling_mean(matrix: np.ndarray, window: int) -> np.ndarray:
    """Centred moving average along steps (axis 1), ignoring NaN; window <= 1 returns the input unchanged.

    Per-step RL metrics are noisy (one batch per step); a short window makes trends readable without
    shifting them in time, which a trailing window would.
    """
    m = np.atleast_2d(np.asarray(matrix, dtype=float))
    if window <= 1 or m.shape[1] == 0:
        return m
    valid = np.isfinite(m).astype(float)
    filled = np.where(valid > 0, m, 0.0)
    kernel = np.ones(int(window))
    out = np.empty_like(m)
    for i in range(m.shape[0]):
        s = np.convolve(filled[i], kernel, mode="same")
        c = np.convolve(valid[i], kernel, mode="same")
        with np.errstate(invalid="ignore", divide="ignore"):
            out[i] = np.where(valid[i] > 0, s / c, np.nan)
    return out


def geometric_mean(values: Iterable[float]) -> float:
    """Geometric mean of positive finite values (NaN if none): the right average of speed-up ratios."""
    x = np.asarray(list(values), dtype=float)
    x = x[np.isfinite(x) & (x > 0)]
    return float(np.exp(np.mean(np.log(x)))) if x.size else float("nan")


def _finite(values: Iterable[float]) -> np.ndarray:
    x = np.asarray(list(values), dtype=float)
    return x[np.isfinite(x)]


def _resampled_means(x: np.ndarray, rng: np.random.Generator, n_boot: int) -> np.ndarray:
    """[n_boot] means of `x` resampled with replacement (seeds are the unit)."""
    counts = rng.multinomial(x.size, np.full(x.size, 1.0 / x.size), size=n_boot)
    return counts @ x / x.size


def _percentiles(samples: np.ndarray, level: float) -> tuple[float, float]:
    alpha = (1.0 - level) / 2.0
    ok = samples[np.isfinite(samples)]
    if ok.size == 0:
        return float("nan"), float("nan")
    return float(np.quantile(ok, alpha)), float(np.quantile(ok, 1.0 - alpha))


@dataclass(frozen=True)
class Interval:
    """A point estimate and its percentile-bootstrap CI (lo/hi NaN when a group has fewer than 2 seeds)."""

    value: float
    lo: float
    hi: float

    def contains(self, x: float) -> bool:
        """True when x lies in [lo, hi]; an undefined CI contains everything (nothing is resolved)."""
        return not (np.isfinite(self.lo) and np.isfinite(self.hi)) or self.lo <= x <= self.hi


def bootstrap_diff_ci(
    a: Iterable[float], b: Iterable[float], level: float = CI_LEVEL, n_boot: int = BOOTSTRAP_SAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> Interval:
    """mean(a) - mean(b) with a percentile-bootstrap CI, each group's seeds resampled independently.

    Independent (unpaired) resampling: the groups are different arms whose seeds need not match, and it is the
    conservative choice where they do. With fewer than 2 finite values in either group the CI is undefined (NaN):
    one seed says nothing about spread. An empty group gives NaN throughout.
    """
    xa, xb = _finite(a), _finite(b)
    if xa.size == 0 or xb.size == 0:
        return Interval(float("nan"), float("nan"), float("nan"))
    value = float(xa.mean() - xb.mean())
    if xa.size < 2 or xb.size < 2:
        return Interval(value, float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    lo, hi = _percentiles(_resampled_means(xa, rng, n_boot) - _resampled_means(xb, rng, n_boot), level)
    return Interval(value, lo, hi)


def bootstrap_recovery_ci(
    arm: Iterable[float], naive: Iterable[float], base: Iterable[float], level: float = CI_LEVEL,
    n_boot: int = BOOTSTRAP_SAMPLES, seed: int = BOOTSTRAP_SEED,
) -> Interval:
    """(mean(arm) - mean(naive)) / (mean(base) - mean(naive)): the fraction of the naive arm's gap to the baseline
    that `arm` recovers (1 = all of it, 0 = none, < 0 = worse than naive), with a percentile-bootstrap CI.

    Each group's seeds are resampled independently and the ratio is taken per replicate (the same naive draw in
    numerator and denominator). Whether the ratio means anything is the caller's question (is the naive gap
    resolved? see `bootstrap_diff_ci`); a zero denominator gives NaN.
    """
    xa, xn, xb = _finite(arm), _finite(naive), _finite(base)
    if min(xa.size, xn.size, xb.size) == 0:
        return Interval(float("nan"), float("nan"), float("nan"))
    den = xb.mean() - xn.mean()
    value = float((xa.mean() - xn.mean()) / den) if den != 0 else float("nan")
    if min(xa.size, xn.size, xb.size) < 2:
        return Interval(value, float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    ma, mn, mb = (_resampled_means(x, rng, n_boot) for x in (xa, xn, xb))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = (ma - mn) / (mb - mn)
    lo, hi = _percentiles(np.where(np.isfinite(ratio), ratio, np.nan), level)
    return Interval(value, lo, hi)


def bootstrap_mean_interval(values: Iterable[float], level: float = CI_LEVEL, n_boot: int = BOOTSTRAP_SAMPLES,
                            seed: int = BOOTSTRAP_SEED) -> Interval:
    """The mean of the finite values with its percentile-bootstrap CI (NaN CI with fewer than 2 values)."""
    x = _finite(values)
    if x.size == 0:
        return Interval(float("nan"), float("nan"), float("nan"))
    if x.size < 2:
        return Interval(float(x.mean()), float("nan"), float("nan"))
    lo, hi = _percentiles(_resampled_means(x, np.random.default_rng(seed), n_boot), level)
    return Interval(float(x.mean()), lo, hi)
