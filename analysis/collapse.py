"""What "collapsed" means, defined once for every table, figure and sentence of the report.

A run collapses when its evaluation accuracy falls below its start (the step-0 evaluation, before any update) by more
than the evaluation's own binomial noise, at k consecutive evaluations after step 0 (`--collapse-k`, 3 by default);
its collapse step (the time to collapse) is the first of them.

The noise is that of a difference between two evaluations on n_test problems at the start's accuracy p0: a drop is
counted when

    p0 - p_t  >  z * sqrt(2 p0 (1 - p0) / n_test),     z = 1.96

(two binomial evaluations treated as independent, which is conservative for evaluations on the same problems). At
200 test problems and p0 = 0.395 the margin is 9.6 pp, at 1,000 it is 4.3 pp; at p0 = 0 or 1 it is 0 (any drop from
a perfect start counts, and nothing falls below 0). Without n_test (an evaluation that does not record it) the
margin is 0: any drop below the start counts, the rule before this definition. A run ending 1 pp under its start is
therefore not collapsed; one that falls below it by more than its evaluation can explain, and stays there, is.
"""

from __future__ import annotations

import math
from typing import Sequence

Z = 1.96  # two-sided 95 % normal quantile


def collapse_margin(p0: float, n_test: float | None, z: float = Z) -> float:
    """The drop below a start accuracy p0 (a fraction) that the evaluation's noise cannot explain: z x the binomial SE
    of a difference of two evaluations on n_test problems; 0 when n_test is unknown."""
    if n_test is None or not (isinstance(n_test, (int, float)) and math.isfinite(n_test) and n_test > 0):
        return 0.0
    p = min(max(float(p0), 0.0), 1.0)
    return z * math.sqrt(2.0 * p * (1.0 - p) / float(n_test))


def collapse_step(steps: Sequence[float], values: Sequence[float], k: int, n_test: float | None = None) -> int | None:
    """The first step of the first k consecutive evaluations after step 0 whose accuracy (a fraction) is below the
    step-0 value by more than `collapse_margin`; None when there is none or no step-0 evaluation to compare with."""
    s, v = list(steps), list(values)
    if not s or s[0] != 0 or k < 1:
        return None
    threshold = v[0] - collapse_margin(v[0], n_test)
    run, start = 0, 0
    for i in range(1, len(s)):
        if v[i] < threshold:
            start = i if run == 0 else start
            run += 1
            if run >= k:
                return int(s[start])
        else:
            run = 0
    return None


COLLAPSE_SENTENCE = ("Collapsed: seeds whose eval accuracy stays below its step-0 value p0 by more than the evaluation's "
                     "binomial noise, 1.96·sqrt(2·p0·(1 − p0)/n_test), for {k} consecutive evals (first such step).")

__all__ = ["COLLAPSE_SENTENCE", "Z", "collapse_margin", "collapse_step"]
