"""Healthy ranges of the mismatch metrics: per rollout precision, the median and the 95th percentile over a sweep's
runs of every `mismatch/*` metric at the run's first logged step (step 0: mu and pi_old share their weights, before
any update) and at its last, so that a value seen in a new run can be read against what this setting usually shows
(docs/runs.md, "Healthy ranges of the mismatch metrics").

At the last step each run counts once. At step 0 every arm of one seed saw the same first batch (same prompts,
same mu, same pi_old: the arm has not acted yet), so step 0 counts each (task, model, seed) once. A metric a run did
not log (an older run) is left out of that metric's numbers; `n_step0` and `n_end` say how many values each row
rests on. Percentiles are numpy's linear interpolation: with 4 values the 95th is close to the largest.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .load import Sweep
from .tables import MISSING, Table

POINTS = ("step0", "end")


def mismatch_ranges(sweep: Sweep) -> pd.DataFrame:
    """One row per (precision, metric): step0_median, step0_p95, n_step0, end_median, end_p95, n_end."""
    values: dict[tuple[str, str, str], dict[object, float]] = {}
    for r in sweep.runs:
        m = r.metrics
        if m.empty or "step" not in m:
            continue
        m = m.sort_values("step")
        for point, row, who in zip(POINTS, (m.iloc[0], m.iloc[-1]), ((r.task, r.model, r.seed), r.run_id)):
            for key in (c for c in m.columns if c.startswith("mismatch/")):
                v = float(row[key])
                if np.isfinite(v):
                    values.setdefault((r.precision, key.split("/", 1)[1], point), {}).setdefault(who, v)
    rows = []
    for precision, metric in sorted({(p, k) for p, k, _ in values}):
        row: dict[str, object] = {"precision": precision, "metric": metric}
        for point in POINTS:
            x = np.asarray(list(values.get((precision, metric, point), {}).values()), dtype=float)
            row[f"{point}_median"] = float(np.median(x)) if x.size else np.nan
            row[f"{point}_p95"] = float(np.percentile(x, 95)) if x.size else np.nan
            row[f"n_{point}"] = int(x.size)
        rows.append(row)
    return pd.DataFrame(rows, columns=["precision", "metric", "step0_median", "step0_p95", "n_step0", "end_median",
                                       "end_p95", "n_end"])


def _fmt(x: float) -> str:
    """3 significant digits; 4 decimals near 1 (token_mult_prob_error, is_ess), where 3 digits would print 1.00x
    as a bare 1, and NeMo-RL's alarm is at 1.05."""
    if not np.isfinite(x):
        return MISSING
    return f"{x:.4f}" if 0.9 <= abs(x) < 1.1 else f"{x:.3g}"


def ranges_table(sweep: Sweep) -> Table:
    data = mismatch_ranges(sweep)
    display = pd.DataFrame([{
        "Precision": r.precision, "Metric": r.metric,
        "Step 0: median": _fmt(r.step0_median), "Step 0: p95": _fmt(r.step0_p95),
        "n (step 0)": str(r.n_step0), "End: median": _fmt(r.end_median), "End: p95": _fmt(r.end_p95),
        "n (end)": str(r.n_end),
    } for r in data.itertuples(index=False)])
    caption = ("Healthy ranges of the mismatch metrics (docs/arms.md §7): per rollout precision, the median and 95th "
               "percentile of each mismatch/* metric at the first logged step (before any update; one value per "
               "seed, which every arm shares) and at the last (one per run, every arm); n = the values each rests on.")
    return Table("mismatch_ranges", data, display, caption)


__all__ = ["mismatch_ranges", "ranges_table"]
