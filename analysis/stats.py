"""Statistics over seeds: mean ± std, percentile-bootstrap confidence bands, smoothing.

Kept separate from plotting and tables so that the numbers in a figure band and in a table cell come from
one definition each, and so the tests can check them against hand-computed values.

Conventions (stated in the report, so a reader can reproduce any cell):
- std is the *sample* standard deviation over seeds (ddof=1, the convention of papers reporting
  "mean ± std over seeds"); with a single seed it is NaN, shown as "–", never 0 (which would claim no spread).
- bootstrap bands resample seeds (runs) with replacement, with a fixed RNG seed so figures are
  reproducible byte for byte across invocations.
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
