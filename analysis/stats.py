"""Statistics over seeds: mean ± std, small-sample confidence intervals, smoothing.

Kept separate from plotting and tables so that the numbers in a figure band and in a table cell come from
one definition each, and so the tests can check them against hand-computed values.

The interval method (one for every table and figure; `METHOD_SENTENCE` is what the reports print):
- A benchmark has 2-10 seeds per arm. A percentile bootstrap over that few seeds is [min, max] at 2 seeds and
  the range at 3: far below its nominal 95 %. Student-t intervals keep their coverage at any n >= 2 when the
  per-seed values are roughly normal (a final accuracy is a mean over hundreds of test problems), so:
- one arm's level: mean ± t(0.975, n-1) · s / sqrt(n)   (`mean_interval`, figure bands `mean_band`);
- a gap between two arms (same task and model): **paired** on the seeds both arms ran (a seed fixes the warm
  start and the prompt order, so per-seed differences are far steadier than the levels): the t-interval of the
  per-seed differences, n = the number of pairs; a seed only one arm ran (another still running, failed or not
  launched) is left out of that gap, never compared unpaired against the rest (one shared seed: that seed's
  difference, no interval). Only arms that share no seed are compared unpaired: Welch's t-interval with the
  Welch-Satterthwaite degrees of freedom (`gap`), marked "Welch" wherever it is printed;
- a zero spread (every per-seed difference equal: accuracies move in steps of 1/n_test) gives no interval and the
  exact permutation p (`gap`), not the t-test's p = 0;
- the recovered share of a gap, (arm - naive) / (base - naive): **Fieller's** interval for a ratio of two means,
  from the per-seed numerator and denominator (paired) or the three groups (unpaired) (`ratio_interval`). Fieller
  propagates the noise of both and is exact under the same normal model as the t-intervals; a bootstrap of the
  ratio at 2-3 seeds has only a handful of distinct resamples (the same degeneracy as above). When the
  denominator is not resolved from 0 the Fieller set is unbounded: no interval, said so.
- 1 seed: no interval (NaN), shown as the point value alone and said so; n is given with every interval.
rliable (IQM, probability of improvement, stratified bootstrap) aggregates many tasks x runs; its bootstrap has
the same degeneracy at 2-3 seeds per cell, so it is not used here.

std is the *sample* standard deviation over seeds (ddof=1); with a single seed it is NaN, shown as "–".
"""

from __future__ import annotations

from dataclasses import dataclass
from math import comb
from typing import Iterable, Sequence

import numpy as np
from scipy.special import stdtrit

CI_LEVEL = 0.95
METHOD_SENTENCE = (
    "Intervals are 95 % Student-t intervals over seeds (n = seeds, or seed pairs): gaps between arms from the "
    "paired per-seed differences on the seeds both arms ran (a seed only one ran is left out; Welch, marked so, "
    "where they share none), recovered shares by Fieller's method on the seeds all three arms ran; 1 seed, or values (or per-seed "
    "differences) with no spread, give no interval."
)


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


def t_quantile(df: float | np.ndarray, level: float = CI_LEVEL) -> np.ndarray | float:
    """The two-sided Student-t critical value t((1 + level) / 2, df); NaN where df < 1."""
    df = np.asarray(df, dtype=float)
    with np.errstate(invalid="ignore"):
        q = np.where(df >= 1, stdtrit(np.maximum(df, 1.0), 0.5 + level / 2.0), np.nan)
    return float(q) if q.ndim == 0 else q


def mean_band(matrix: np.ndarray, level: float = CI_LEVEL) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean over rows and its t-interval, column by column (a figure's band).

    `matrix` is [runs, steps] with NaN where a run has no value (e.g. a run that diverged early); each column uses
    the runs present there. Returns (mean, lo, hi), each of length `steps`; lo/hi are NaN where fewer than 2 runs
    have a value (no band is drawn: one seed says nothing about spread).
    """
    m = np.atleast_2d(np.asarray(matrix, dtype=float))
    valid = np.isfinite(m)
    n = valid.sum(axis=0)
    filled = np.where(valid, m, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = filled.sum(axis=0) / n
        var = np.where(valid, (m - mean) ** 2, 0.0).sum(axis=0) / (n - 1)
        half = t_quantile(n - 1, level) * np.sqrt(var / n)
    half = np.where(n >= 2, half, np.nan)
    return mean, mean - half, mean + half


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


#: the `method` of a gap between arms that share no seed (unpaired), which every printed gap says
WELCH = "Welch"


def method_mark(method: str) -> str:
    """What a printed gap adds after its n: ', Welch' for an unpaired gap, where the same text would read as paired;
    nothing for the others (the report's method sentence names them)."""
    return f", {WELCH}" if method == WELCH else ""


@dataclass(frozen=True)
class Interval:
    """A point estimate, its 95 % interval (lo/hi NaN when undefined) and the n it rests on.

    `method` names how it was computed ("t", "paired t", "Welch", "Fieller", "" when there is no interval);
    `note` says why there is none (e.g. "1 seed", "unbounded").
    """

    value: float
    lo: float = float("nan")
    hi: float = float("nan")
    n: int = 0
    method: str = ""
    note: str = ""

    @property
    def defined(self) -> bool:
        return bool(np.isfinite(self.lo) and np.isfinite(self.hi))

    def contains(self, x: float) -> bool:
        """True when x lies in [lo, hi]; an undefined interval contains everything (nothing is resolved)."""
        return not self.defined or self.lo <= x <= self.hi


NAN_INTERVAL = Interval(float("nan"))


def mean_interval(values: Iterable[float], level: float = CI_LEVEL) -> Interval:
    """The mean of the finite values with its t-interval, n = their number (no interval with fewer than 2, nor
    where every value is equal: [31.2, 31.2] from 2 seeds would claim certainty, as a gap with no spread would)."""
    x = _finite(values)
    if x.size == 0:
        return NAN_INTERVAL
    if x.size < 2:
        return Interval(float(x.mean()), n=1, note="1 seed")
    if np.all(x == x[0]):
        return Interval(float(x[0]), n=int(x.size), method="t", note="no spread")
    half = t_quantile(x.size - 1, level) * x.std(ddof=1) / np.sqrt(x.size)
    return Interval(float(x.mean()), float(x.mean() - half), float(x.mean() + half), int(x.size), "t")


def aligned(groups: Sequence[tuple[Sequence[float], Sequence | None]]) -> list[np.ndarray] | None:
    """Each group's finite values on the seeds every group ran, in one seed order, so that position i is one seed
    in all of them; None when they do not pair: a group without seeds, a seed twice in one group (e.g. two sweeps
    loaded together), or no seed in common (then the groups are compared unpaired). A seed that only some groups
    ran is left out of the pairs (n counts the pairs): one common seed is one pair, a point value with no interval,
    not a Welch interval over different seed sets that would read as paired."""
    if any(seeds is None for _, seeds in groups):
        return None
    maps = []
    for values, seeds in groups:
        finite = [(s, float(v)) for s, v in zip(seeds, values) if np.isfinite(v)]
        one = dict(finite)
        if not one or len(one) != len(finite):
            return None
        maps.append(one)
    common = set.intersection(*(set(m) for m in maps))
    if not common:
        return None
    keys = sorted(common, key=str)
    return [np.array([m[k] for k in keys]) for m in maps]


@dataclass(frozen=True)
class Gap:
    """mean(a) - mean(b) with what its interval and test rest on: the standard error and df of the t statistic
    (NaN where fewer than 2 values), the SD of the per-seed differences (paired; NaN unpaired), and for a zero
    spread the exact permutation p of the observed difference (`exact_p`: the t statistic is undefined there)."""

    interval: Interval
    se: float = float("nan")
    df: float = float("nan")
    sd_diff: float = float("nan")
    exact_p: tuple[float, float] | None = None  # (two-sided, one-sided "greater")


def gap(a: Iterable[float], b: Iterable[float], seeds_a: Sequence | None = None, seeds_b: Sequence | None = None,
        level: float = CI_LEVEL) -> Gap:
    """The one computation behind every gap between two arms: paired t over the per-seed differences on the seeds
    both ran (`aligned`), Welch's t otherwise (module docstring).

    A zero spread (every per-seed difference equal, or both groups constant) gives no interval: a t-interval of
    width 0 would claim certainty from as few as 2 seeds. Its p is the exact permutation test's instead: paired,
    only the two all-same-sign flips of n equal differences reach |d|, p = 2 / 2^n (2 seeds: 0.5); unpaired with
    both groups constant, only the observed split (and its mirror with equal groups) of the C(n_a + n_b, n_a)."""
    a, b = list(a), list(b)
    paired = aligned([(a, seeds_a), (b, seeds_b)])
    if paired is not None:
        d = paired[0] - paired[1]
        value = float(d.mean())
        if d.size < 2:
            return Gap(Interval(value, n=int(d.size), note="1 seed"))
        sd = float(d.std(ddof=1))
        se, df = sd / np.sqrt(d.size), float(d.size - 1)
        if se == 0:
            flips = 2.0 ** -d.size
            exact = (1.0, 1.0) if value == 0 else (2 * flips, flips if value > 0 else 1.0)
            return Gap(Interval(value, n=int(d.size), method="paired t", note="no spread"), se, df, sd, exact)
        half = t_quantile(df, level) * se
        return Gap(Interval(value, value - half, value + half, int(d.size), "paired t"), se, df, sd)
    xa, xb = _finite(a), _finite(b)
    if xa.size == 0 or xb.size == 0:
        return Gap(NAN_INTERVAL)
    value, n = float(xa.mean() - xb.mean()), int(min(xa.size, xb.size))
    if xa.size < 2 or xb.size < 2:
        return Gap(Interval(value, n=n, note="1 seed"))
    va, vb = xa.var(ddof=1) / xa.size, xb.var(ddof=1) / xb.size
    se = float(np.sqrt(va + vb))
    if se == 0:
        splits = 1.0 / comb(xa.size + xb.size, xa.size)
        two = splits * (2 if xa.size == xb.size else 1)
        exact = (1.0, 1.0) if value == 0 else (min(1.0, two), splits if value > 0 else 1.0)
        return Gap(Interval(value, n=n, method=WELCH, note="no spread"), se, 1.0, exact_p=exact)
    df = float((va + vb) ** 2 / (va**2 / (xa.size - 1) + vb**2 / (xb.size - 1)))
    half = t_quantile(df, level) * se
    return Gap(Interval(value, value - half, value + half, n, WELCH), se, df)


def diff_interval(a: Iterable[float], b: Iterable[float], seeds_a: Sequence | None = None,
                  seeds_b: Sequence | None = None, level: float = CI_LEVEL) -> Interval:
    """mean(a) - mean(b) with its interval (`gap`): paired t over the per-seed differences on the seeds both groups
    ran (`seeds_a`/`seeds_b` name each value's seed), Welch's t-interval where they do not pair.

    Paired: a seed shares the warm start and the prompt order between arms, so a_i - b_i removes that common part
    of the spread; n = the number of pairs. Welch: unequal variances, Welch-Satterthwaite df; n = the smaller
    group. Fewer than 2 values in a group (or 2 pairs): the point value only. An empty group: NaN throughout.
    """
    return gap(a, b, seeds_a, seeds_b, level).interval


def fieller(m1: float, m2: float, v11: float, v22: float, v12: float, df: float,
            level: float = CI_LEVEL) -> tuple[float, float]:
    """Fieller's interval for m1 / m2 given the variances/covariance of the two estimated means and the df.

    The set {R : (m1 - R m2)^2 <= t^2 (v11 - 2 R v12 + R^2 v22)}; (NaN, NaN) when it is not a bounded interval
    (the denominator is not resolved from 0 at this level: the ratio could be anything).
    """
    t2 = t_quantile(df, level) ** 2
    qa = m2 * m2 - t2 * v22
    qb = -2.0 * (m1 * m2 - t2 * v12)
    qc = m1 * m1 - t2 * v11
    disc = qb * qb - 4.0 * qa * qc
    if not (qa > 0 and disc >= 0):
        return float("nan"), float("nan")
    root = np.sqrt(disc)
    return float((-qb - root) / (2 * qa)), float((-qb + root) / (2 * qa))


def ratio_interval(arm: Iterable[float], naive: Iterable[float], base: Iterable[float],
                   seeds: tuple[Sequence, Sequence, Sequence] | None = None, level: float = CI_LEVEL) -> Interval:
    """(mean(arm) - mean(naive)) / (mean(base) - mean(naive)), the share of the naive arm's gap to the baseline
    that `arm` recovers (1 = all, 0 = none, < 0 = worse than naive), with Fieller's interval.

    Paired on the seeds all three groups ran (`aligned`; `seeds` = each group's seeds, in order): per seed,
    num_i = arm_i - naive_i and den_i = base_i - naive_i, their sample covariance over n seeds, df = n - 1.
    Unpaired: independent groups, var(num) = s_a^2/n_a + s_n^2/n_n, var(den) = s_b^2/n_b + s_n^2/n_n,
    cov = s_n^2/n_n, df = Welch-Satterthwaite for num - R den = a - R b - (1 - R) naive at the point estimate R. A zero denominator gives NaN; fewer than 2
    seeds in a group, the point value only; an unbounded Fieller set, the point value with note "unbounded".
    """
    arm, naive, base = list(arm), list(naive), list(base)
    xa, xn, xb = _finite(arm), _finite(naive), _finite(base)
    if min(xa.size, xn.size, xb.size) == 0:
        return NAN_INTERVAL
    three = aligned([(arm, seeds[0]), (naive, seeds[1]), (base, seeds[2])]) if seeds is not None else None
    if three is not None:
        num, den = three[0] - three[1], three[2] - three[1]
        n = int(num.size)
        m1, m2 = float(num.mean()), float(den.mean())
        value = m1 / m2 if m2 != 0 else float("nan")
        if n < 2:
            return Interval(value, n=n, note="1 seed")
        c = np.cov(num, den, ddof=1) / n
        lo, hi = fieller(m1, m2, c[0, 0], c[1, 1], c[0, 1], n - 1, level)
        method = "Fieller (paired)"
    else:
        m1, m2 = float(xa.mean() - xn.mean()), float(xb.mean() - xn.mean())
        value = m1 / m2 if m2 != 0 else float("nan")
        n = int(min(xa.size, xn.size, xb.size))
        if n < 2:
            return Interval(value, n=n, note="1 seed")
        sa, sn, sb = (x.var(ddof=1) / x.size for x in (xa, xn, xb))
        terms = [(sa, xa.size), (value**2 * sb, xb.size), ((1 - value) ** 2 * sn, xn.size)] if np.isfinite(value) else []
        total = sum(v for v, _ in terms)
        df = total**2 / sum(v * v / (k - 1) for v, k in terms) if total > 0 else n - 1
        lo, hi = fieller(m1, m2, sa + sn, sb + sn, sn, df, level)
        method = "Fieller"
    if not np.isfinite(value):
        return Interval(value, n=n)
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return Interval(value, n=n, method=method, note="unbounded")
    return Interval(value, lo, hi, n, method)


def binomial_se(p: float, n_test: float, n_seeds: int = 1) -> float:
    """The evaluation's own standard error of a mean accuracy p (a fraction) over `n_seeds` evaluations of
    n_test problems each: sqrt(p (1 - p) / (n_test n_seeds)). NaN when n_test is unknown."""
    if not (np.isfinite(p) and np.isfinite(n_test) and n_test > 0 and n_seeds > 0):
        return float("nan")
    return float(np.sqrt(p * (1.0 - p) / (n_test * n_seeds)))


def gap_binomial_se(p_a: float, n_a: int, p_b: float, n_b: int, n_test: float) -> float:
    """The binomial SE of a gap mean(a) - mean(b) between two arms' accuracies (fractions) from evaluation noise
    alone, the two evaluations taken as independent: sqrt(se_a^2 + se_b^2). Beside a gap it tells how much of
    the gap's uncertainty the finite test set explains."""
    return float(np.hypot(binomial_se(p_a, n_test, n_a), binomial_se(p_b, n_test, n_b)))
