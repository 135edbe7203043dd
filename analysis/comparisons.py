"""Every paired comparison a report states, with its interval, raw p and Holm-adjusted p, in named families.

Families (each Holm-corrected on its own, per endpoint; analysis/inference.py):

    vs <baseline>   every arm at every severity against the baseline (bf16) of its task and model
    vs <naive>      every other arm against the naive arm at the same severity (the control's row is the mismatch
                    cost, analysis/decomposition.py); two-sided; none where the naive arm is the baseline
                    (`--baseline naive`): those comparisons are the baseline family's, counted once
    primary         the pre-registered arms (`--primary`), each > naive, one-sided, final accuracy and AUC together:
                    the pre-registered family (docs/preregistration.md). These rows are marked and left out of the
                    exploratory "vs naive" family

Endpoints: `final` (the last evaluation's accuracy, %) and `auc` (time-averaged eval accuracy, %), per run, paired by
seed on the seeds both arms ran (analysis.stats.gap). The table's `sd_diff` (SD of the per-seed differences) is
what `--dry-run`'s seed calculator reads back (bench/launch/power.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from .arms import method_sort_key
from .inference import ALPHA, diff_test, fmt_p, holm
from .load import Sweep
from .runs import SeverityOptions, baseline_group, run_rows, severity_labels

ENDPOINTS = {"final": "final_acc", "auc": "auc"}
PRIMARY = "primary"
COLUMNS = ["model", "task", "severity", "severity_label", "precision", "family", "endpoint", "a", "b", "comparison", "alternative",
           "primary", "gap", "gap_lo", "gap_hi", "gap_n", "gap_ci", "sd_diff", "p_raw", "p_holm"]


def family_name(kind: str, opts: SeverityOptions) -> str:
    return {"base": f"vs {opts.baseline}", "naive": f"vs {opts.naive}", PRIMARY: PRIMARY}[kind]


def _row(cell: dict[str, Any], family: str, endpoint: str, a: str, b: str, ga: pd.DataFrame, gb: pd.DataFrame,
         alternative: str = "two-sided", primary: bool = False) -> dict[str, Any]:
    col = ENDPOINTS[endpoint]
    t = diff_test(ga[col], gb[col], list(ga["seed"]), list(gb["seed"]), alternative)
    iv = t.interval
    return {**cell, "family": family, "endpoint": endpoint, "a": a, "b": b, "comparison": f"{a} − {b}",
            "gap": iv.value, "gap_lo": iv.lo, "gap_hi": iv.hi, "gap_n": iv.n, "gap_ci": iv.method, "sd_diff": t.sd_diff,
            "alternative": alternative, "p_raw": t.p, "primary": primary}


def paired_comparisons(sweep: Sweep, opts: SeverityOptions = SeverityOptions()) -> pd.DataFrame:
    """One row per comparison x endpoint (module docstring), with p_holm within its family and endpoint (the
    primary family: over both endpoints together)."""
    runs = run_rows(sweep, opts.collapse_k)
    labels = severity_labels(sweep.runs)
    rows: list[dict[str, Any]] = []
    for (model, task), g in runs.groupby(["model", "task"], sort=True):
        for severity in g.groupby("severity")["kl"].mean().sort_values(kind="stable").index:
            cell = {"model": model, "task": task, "severity": severity, "severity_label": labels.get(severity, severity),
                    "precision": str(severity).split(";", 1)[0]}
            here = g[g["severity"] == severity]
            base, _ = baseline_group(g, severity, opts.baseline)
            naive = here[here["method"] == opts.naive]
            common = primary_seeds(here, base, opts)
            for method in sorted(here["method"].unique(), key=method_sort_key):
                a = here[here["method"] == method]
                is_base = method == opts.baseline and not base.empty and severity in set(base["severity"])
                for endpoint in ENDPOINTS:
                    if not is_base and not base.empty:
                        rows.append(_row(cell, family_name("base", opts), endpoint, method, opts.baseline, a, base))
                    if method in (opts.naive, opts.baseline) or naive.empty:
                        continue
                    if opts.naive == opts.baseline and method not in opts.primary:
                        continue  # "vs naive" would be "vs baseline" again: one family, each comparison once
                    if method in opts.primary:
                        rows.append(_row(cell, PRIMARY, endpoint, method, opts.naive, a[a["seed"].isin(common)],
                                         naive[naive["seed"].isin(common)], "greater", True))
                    else:
                        rows.append(_row(cell, family_name("naive", opts), endpoint, method, opts.naive, a, naive))
    df = pd.DataFrame(rows, columns=[c for c in COLUMNS if c != "p_holm"])
    df["p_holm"] = np.nan
    df["primary"] = df["primary"].astype(str)  # an identity column of the long CSV, not a number
    for (family, endpoint), idx in df.groupby(["family", "endpoint"]).groups.items():
        if family != PRIMARY:
            df.loc[idx, "p_holm"] = holm(df.loc[idx, "p_raw"].to_numpy())
    prim = df.index[df["family"] == PRIMARY]
    if len(prim):
        df.loc[prim, "p_holm"] = holm(df.loc[prim, "p_raw"].to_numpy())
    return df[COLUMNS]


def primary_seeds(here: pd.DataFrame, base: pd.DataFrame, opts: SeverityOptions) -> set:
    """The seeds of the pre-registered family at one rollout setting: a seed missing in any of its arms (naive, the
    primary ones, and the baseline, docs/preregistration.md's five) is dropped from all of its tests, never compared
    unpaired against the arms that ran more seeds."""
    arms = [here[here["method"] == m]["seed"] for m in (opts.naive, *opts.primary)] + [base["seed"]]
    arms = [set(s) for s in arms if len(s)]
    return set.intersection(*arms) if arms else set()


def p_columns(cmp: pd.DataFrame, family: str, endpoint: str, key: tuple[str, ...]) -> dict[tuple, str]:
    """'p / Holm' text of one family and endpoint's comparisons, keyed by the columns `key` (and `a`, the arm): what
    the other tables print beside their paired intervals."""
    d = cmp[(cmp["family"] == family) & (cmp["endpoint"] == endpoint)]
    return {tuple(getattr(r, k) for k in key) + (r.a,): f"{fmt_p(r.p_raw)} / {fmt_p(r.p_holm)}"
            for r in d.itertuples(index=False)}


def differs(row: Any) -> bool:
    """A comparison whose Holm-adjusted p is <= ALPHA (in its family)."""
    return bool(np.isfinite(row.p_holm) and row.p_holm <= ALPHA)


def is_primary(row: Any) -> bool:
    return str(row.primary) == "True"


__all__ = ["ENDPOINTS", "PRIMARY", "differs", "family_name", "is_primary", "p_columns", "paired_comparisons",
           "primary_seeds"]
