"""Tests behind the report's "differs" sentences: a gap's p-value beside its interval, and Holm's correction over the
family of gaps a sentence speaks for.

A report states many gaps at once (every arm against bf16, every correction against naive, per cell); at 95 % each,
some "differ" by chance alone. Every such sentence therefore names its family and counts a gap as differing only when
its Holm-adjusted p is <= 0.05 (Holm's step-down: sort the m raw p ascending, p_(i) -> max over j <= i of
min(1, (m - j + 1) p_(j)); it controls the family-wise error at 0.05 under any dependence). The interval printed beside
it stays the plain 95 % one, with the raw and adjusted p beside it. A pre-registered comparison is tested within its
own pre-registered family (docs/preregistration.md) and marked so.

The p-value matches the interval (one computation, analysis.stats.gap): paired t over the per-seed differences on the
seeds both arms ran, Welch's t where they share fewer than 2; the exact permutation p where the differences have no
spread; one-sided ("greater") for a directional pre-registered hypothesis.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
from scipy.stats import t as student_t

from .stats import Interval, gap

ALPHA = 0.05
ALTERNATIVES = ("two-sided", "greater")


@dataclass(frozen=True)
class Test:
    """A gap's interval (analysis.stats), its p-value, and the SD of the per-seed differences (paired; NaN otherwise)."""

    interval: Interval
    p: float
    sd_diff: float = float("nan")
    alternative: str = "two-sided"


def _p_from_t(tstat: float, df: float, alternative: str) -> float:
    if not (np.isfinite(tstat) and np.isfinite(df) and df >= 1):
        return float("nan")
    return float(student_t.sf(tstat, df) if alternative == "greater" else 2 * student_t.sf(abs(tstat), df))


def diff_test(a: Iterable[float], b: Iterable[float], seeds_a: Sequence | None = None, seeds_b: Sequence | None = None,
              alternative: str = "two-sided") -> Test:
    """mean(a) - mean(b): its 95 % interval and the p-value of H0: no difference (two-sided) or H0: a <= b
    ("greater"), from one computation (analysis.stats.gap): the paired t-test on the seeds both ran, Welch's where
    they do not pair; a zero spread, the exact permutation p; fewer than 2 values, NaN."""
    if alternative not in ALTERNATIVES:
        raise ValueError(f"alternative {alternative!r}: choose one of {', '.join(ALTERNATIVES)}")
    g = gap(a, b, seeds_a, seeds_b)
    if g.exact_p is not None:
        p = g.exact_p[1] if alternative == "greater" else g.exact_p[0]
    else:
        p = _p_from_t(g.interval.value / g.se, g.df, alternative) if g.se > 0 else float("nan")
    return Test(g.interval, p, g.sd_diff, alternative)


def holm(pvalues: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjusted p-values, in the input's order; NaN stays NaN and is not counted in the family."""
    p = np.asarray(pvalues, dtype=float)
    out = np.full_like(p, np.nan)
    ok = np.flatnonzero(np.isfinite(p))
    m = ok.size
    if m == 0:
        return out
    order = ok[np.argsort(p[ok], kind="stable")]
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out


def fmt_p(p: float) -> str:
    """'0.031', '<0.001', '–' (undefined)."""
    if not np.isfinite(p):
        return "–"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


__all__ = ["ALPHA", "ALTERNATIVES", "Test", "diff_test", "fmt_p", "holm"]
