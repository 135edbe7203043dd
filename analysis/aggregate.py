"""rliable's aggregates ("Deep RL at the Edge of the Statistical Precipice", Agarwal et al., NeurIPS 2021): the
probability of improvement and the interquartile mean, with stratified-bootstrap intervals.

probability of improvement  P(X > Y) = mean over cells c of P(X_c > Y_c), where P(X_c > Y_c) = (1 / (N M)) sum_i sum_j
                            S(x_i, y_j), S = 1 if x_i > y_j, 1/2 if equal, 0 else (the Mann-Whitney U statistic over
                            the two arms' runs in cell c). 0.5: neither is better; 1: every run of X beats every run
                            of Y. Reported for every arm against the naive arm (same cell) and the baseline (bf16 of
                            the cell's task and model), on the final accuracy.
IQM                         the mean of the middle 50 % of an arm's final accuracies pooled over its cells (scipy's
                            trim_mean at 25 %), only where the arm ran in 3 cells or more.
intervals                   95 % percentile intervals of the stratified bootstrap: every replicate resamples each arm's
                            runs with replacement within each cell (2,000 replicates, a fixed generator: the report is
                            deterministic). At 2-4 seeds per cell a bootstrap is degenerate (few distinct resamples), so
                            n is printed beside it; the t-based gaps of analysis.stats stay the report's inference.

The definitions follow rliable 1.2.0 (`metrics.probability_of_improvement`, `metrics.aggregate_iqm`,
`library.get_interval_estimates` with arch's StratifiedBootstrap). rliable itself is not a dependency: it installs,
but its arch 7.2.0 does not import under the locked pandas 3.1; with pandas < 3 it gives the same estimates on the same
scores (docs/analysis.md, the cross-check).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import trim_mean

from .arms import method_sort_key
from .load import Sweep
from .runs import SeverityOptions, baseline_group, run_rows
from .tables import MISSING, Table, fmt_ci

REPS = 2000
SEED = 0
MIN_IQM_CELLS = 3


def poi_cell(x: np.ndarray, y: np.ndarray) -> float:
    """P(X > Y) in one cell: the Mann-Whitney U statistic over the runs of X and Y, divided by N M (ties count 1/2)."""
    x, y = np.asarray(x, float)[:, None], np.asarray(y, float)[None, :]
    return float(((x > y) + 0.5 * (x == y)).mean())


def probability_of_improvement(pairs: list[tuple[np.ndarray, np.ndarray]]) -> float:
    """P(X > Y) averaged over the cells (`pairs`: X's and Y's runs in each cell)."""
    return float(np.mean([poi_cell(x, y) for x, y in pairs])) if pairs else float("nan")


def iqm(cells: list[np.ndarray]) -> float:
    """Interquartile mean of the scores pooled over cells (25 % trimmed from each end)."""
    pooled = np.concatenate([np.asarray(c, float) for c in cells]) if cells else np.array([])
    return float(trim_mean(pooled, 0.25)) if pooled.size else float("nan")


def stratified_interval(stat, groups: list[Any], reps: int = REPS, seed: int = SEED) -> tuple[float, float]:
    """95 % percentile interval of stat(groups) over `reps` replicates that resample every array in `groups` (nested
    lists/tuples of arrays: one per arm and cell) with replacement, each within itself."""
    rng = np.random.default_rng(seed)

    def resample(g):
        if isinstance(g, (list, tuple)):
            return type(g)(resample(x) for x in g)
        g = np.asarray(g, float)
        return g[rng.integers(0, g.size, g.size)]

    values = np.array([stat(resample(groups)) for _ in range(reps)])
    values = values[np.isfinite(values)]
    if values.size == 0:
        return float("nan"), float("nan")
    return float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))


def aggregates(sweep: Sweep, opts: SeverityOptions = SeverityOptions(), reps: int = REPS) -> pd.DataFrame:
    """Per method: P(method > naive) and P(method > baseline) over the cells where both ran, and the IQM of its final
    accuracy over its cells (>= MIN_IQM_CELLS), each with its stratified-bootstrap interval, cell and run counts."""
    runs = run_rows(sweep, opts.collapse_k)
    vs: dict[str, dict[str, list]] = {}
    own: dict[str, list[np.ndarray]] = {}
    for (model, task), g in runs.groupby(["model", "task"], sort=True):
        for severity, here in g.groupby("severity", sort=True):
            base, note = baseline_group(g, severity, opts.baseline)
            naive = here[here["method"] == opts.naive]
            for method, a in here.groupby("method", sort=False):
                x = a["final_acc"].to_numpy(float)
                own.setdefault(method, []).append(x)
                refs = {"naive": None if method == opts.naive or naive.empty else naive,
                        "base": None if note or base.empty or (method == opts.baseline) else base}
                for key, ref in refs.items():
                    if ref is not None:
                        vs.setdefault(method, {}).setdefault(key, []).append((x, ref["final_acc"].to_numpy(float)))
    rows = []
    for method in sorted(own, key=method_sort_key):
        row: dict[str, Any] = {"method": method, "n_cells": len(own[method]),
                               "n_runs": int(sum(c.size for c in own[method]))}
        for key in ("naive", "base"):
            pairs = vs.get(method, {}).get(key, [])
            lo, hi = stratified_interval(probability_of_improvement, pairs, reps) if pairs else (np.nan, np.nan)
            row |= {f"poi_{key}": probability_of_improvement(pairs), f"poi_{key}_lo": lo, f"poi_{key}_hi": hi,
                    f"poi_{key}_n": len(pairs)}
        if len(own[method]) >= MIN_IQM_CELLS:
            lo, hi = stratified_interval(iqm, own[method], reps)
            row |= {"iqm": iqm(own[method]), "iqm_lo": lo, "iqm_hi": hi, "iqm_n": len(own[method])}
        else:
            row |= {"iqm": np.nan, "iqm_lo": np.nan, "iqm_hi": np.nan, "iqm_n": len(own[method])}
        rows.append(row)
    return pd.DataFrame(rows)


def aggregate_table(sweep: Sweep, opts: SeverityOptions = SeverityOptions()) -> Table:
    data = aggregates(sweep, opts)
    rows = []
    for r in data.itertuples(index=False):
        def poi(key: str) -> str:
            v, lo, hi, n = (getattr(r, f"poi_{key}{s}") for s in ("", "_lo", "_hi", "_n"))
            return MISSING if not np.isfinite(v) else f"{fmt_ci(v, lo, hi, digits=2)} ({n} cell{'s' if n != 1 else ''})"
        rows.append({"Method": r.method, "Cells": str(r.n_cells), "Runs": str(r.n_runs),
                     f"P(> {opts.naive})": poi("naive"), f"P(> {opts.baseline})": poi("base"),
                     "IQM final accuracy (%)": (fmt_ci(r.iqm, r.iqm_lo, r.iqm_hi, n=r.n_runs) if np.isfinite(r.iqm) else
                                                f"– (needs ≥ {MIN_IQM_CELLS} cells)")})
    caption = (
        f"rliable's aggregates over the cells (task, model, rollout severity) each method ran in, final eval accuracy: "
        f"probability of improvement P(X > Y), the chance that a run of the method beats a run of {opts.naive} (same "
        f"cell) or of {opts.baseline} (the cell's task and model), averaged over cells (0.5: no difference); the "
        f"interquartile mean over the method's runs pooled over its cells (≥ {MIN_IQM_CELLS} cells). 95 % "
        f"stratified-bootstrap percentile intervals ({REPS} replicates resampling each method's runs within each cell)."
    )
    display = pd.DataFrame(rows) if rows else pd.DataFrame(columns=["Method"])
    return Table("aggregates", data, display, caption)


__all__ = ["MIN_IQM_CELLS", "aggregate_table", "aggregates", "iqm", "poi_cell", "probability_of_improvement",
           "stratified_interval"]
