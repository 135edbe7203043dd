"""The report's opening paragraph: what the sweep found, in 3-5 sentences generated from its numbers.

A reader opening report.md should learn the answer before the tables: which arms differ from the baseline (bf16)
and from the uncorrected arm (naive) beyond their 95 % intervals, at which setting (task and rollout precision),
how much of the naive arm's gap each correction recovers, and on how many seeds all of that rests. Every number
comes from the same definitions as the tables (analysis.stats, analysis.severity): a gap is "beyond its
interval" when its 95 % t-interval (paired over seeds where possible) excludes 0.

    sentence 1  the scope: runs, arms, tasks, seeds (n) and steps
    sentence 2  arms vs the baseline: those whose gap excludes 0 (at most three, the largest first), else the
                largest gap and its interval; a sweep without a baseline run says so (no comparison, no finding)
    sentence 3  corrections vs naive at the same precision and task, the same way
    sentence 4  the recovered share of the naive gap of every arm where it is defined, highest first (all of them: the
                three best alone flattered the corrections, dropping a -241 % without a word), and how many
                cells have none and why; else why not
    sentence 5  (n < 5 seeds) what the intervals' width means
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import t as student_t

from .arms import arm_labels
from .load import Sweep, get
from .severity import SeverityOptions, run_rows, severity_summary
from .stats import Interval, diff_interval

MAX_LISTED = 3


def _pp(value: float, lo: float, hi: float, n: int) -> str:
    """'−5.2 pp [−9.1, −1.3], n=3' (a gap), or '−5.2 pp (no interval)'."""
    head = f"{value:+.1f} pp"
    if np.isfinite(lo) and np.isfinite(hi):
        return f"{head} [{lo:+.1f}, {hi:+.1f}], n={n}"
    return f"{head} (no interval, n={n})"


def _resolved(lo: float, hi: float) -> bool:
    return bool(np.isfinite(lo) and np.isfinite(hi) and (lo > 0 or hi < 0))


def _seeds_phrase(counts: list[int]) -> str:
    ns = sorted(set(counts))
    return f"n = {ns[0]} seed{'s' if ns[0] != 1 else ''} per arm" if len(ns) == 1 else \
        f"n = {ns[0]}-{ns[-1]} seeds per arm"


def gaps(sweep: Sweep, opts: SeverityOptions) -> pd.DataFrame:
    """Per (model, task, method, precision): the final-accuracy gap (pp) to the baseline and to the naive arm at
    the same precision, each with its 95 % interval and n (NaN where that comparison does not exist)."""
    runs = run_rows(sweep, opts.collapse_k)
    rows: list[dict[str, Any]] = []
    for (model, task), g in runs.groupby(["model", "task"], sort=True):
        base = g[g["method"] == opts.baseline]
        base_precisions = set(base["precision"])
        for (method, precision), a in g.groupby(["method", "precision"], sort=False):
            row: dict[str, Any] = {"model": model, "task": task, "method": method, "precision": precision,
                                   "n_seeds": len(a)}
            is_base = method == opts.baseline and precision in base_precisions
            for name, ref in (("base", None if is_base or base.empty else base),
                              ("naive", g[(g["method"] == opts.naive) & (g["precision"] == precision)])):
                if ref is None or ref.empty or method in (opts.naive, opts.baseline) and name == "naive":
                    iv = Interval(float("nan"))
                else:
                    iv = diff_interval(a["final_acc"], ref["final_acc"], list(a["seed"]), list(ref["seed"]))
                row |= {f"{name}_gap": iv.value, f"{name}_lo": iv.lo, f"{name}_hi": iv.hi, f"{name}_n": iv.n}
            rows.append(row)
    return pd.DataFrame(rows)


def _where(r: Any, multi_task: bool, labels: dict) -> str:
    arm = labels.get((r.method, r.precision), r.method)
    at = f"{arm} at {r.precision}" if r.precision not in arm else arm
    return f"{at} on {r.task}" if multi_task else at


def verdict(sweep: Sweep, opts: SeverityOptions = SeverityOptions()) -> list[str]:
    """The sentences of the report's opening paragraph (empty when no run has an evaluation)."""
    g = gaps(sweep, opts)
    if g.empty:
        return []
    labels = arm_labels(zip(g["method"], g["precision"]))
    multi_task = g["task"].nunique() > 1
    steps = sorted({int(s) for s in (get(r.config, "train.steps") for r in sweep.runs) if isinstance(s, int)})
    arms = g[["method", "precision"]].drop_duplicates()
    tasks = sorted(g["task"].unique())
    out = [f"{len(sweep.runs)} runs: {len(arms)} arms × {len(tasks)} task{'s' if len(tasks) > 1 else ''} "
           f"({', '.join(tasks)}), {_seeds_phrase(list(g['n_seeds']))}"
           + (f", {'/'.join(map(str, steps))} training steps each" if steps else "")
           + "; gaps are in final eval accuracy with 95 % intervals over seeds."]

    if (g["method"] == opts.baseline).any():
        out.append(_comparison(g, "base", opts.baseline, f"differ from {opts.baseline}", multi_task, labels,
                               none=f"No arm differs from {opts.baseline} beyond its 95 % interval"))
    else:  # nothing was compared: "no arm differs" would read as a finding
        out.append(f"No arm is compared with a baseline: the sweep has no {opts.baseline} run "
                   "(`qrl-analyze --baseline <method>` names another).")
    corrections = g[~g["method"].isin([opts.baseline, opts.naive])]
    if corrections["naive_gap"].notna().any():
        out.append(_comparison(corrections, "naive", opts.naive, f"differ from {opts.naive} at the same precision",
                               multi_task, labels,
                               none=f"No correction differs from {opts.naive} at the same precision beyond its "
                                    "95 % interval"))
    out.append(_recovered(sweep, opts, multi_task, labels))
    ts = ", ".join(f"{student_t.ppf(0.975, n - 1):.1f} at {n} seeds" for n in sorted({int(n) for n in g["n_seeds"]})
                   if n >= 2)
    if g["n_seeds"].max() < 5 and ts:
        out.append(f"With {_seeds_phrase(list(g['n_seeds']))} an interval is wide (t = {ts}; 2.0 at 60): a difference "
                   "inside it is no evidence either way; more seeds narrow it.")
    return out


def _comparison(g: pd.DataFrame, ref: str, ref_name: str, verb: str, multi_task: bool, labels: dict,
                none: str) -> str:
    d = g[g[f"{ref}_gap"].notna()].copy()
    d["size"] = d[f"{ref}_gap"].abs()
    d = d.sort_values("size", ascending=False)
    hits = d[[_resolved(lo, hi) for lo, hi in zip(d[f"{ref}_lo"], d[f"{ref}_hi"])]]
    if hits.empty:
        if d.empty:
            return f"{none}."
        r = d.iloc[0]
        return (f"{none} (largest gap: {_where(r, multi_task, labels)}, "
                f"{_pp(r[f'{ref}_gap'], r[f'{ref}_lo'], r[f'{ref}_hi'], int(r[f'{ref}_n']))}).")
    listed = [f"{_where(r, multi_task, labels)} ({_pp(getattr(r, f'{ref}_gap'), getattr(r, f'{ref}_lo'), getattr(r, f'{ref}_hi'), int(getattr(r, f'{ref}_n')))})"
              for r in hits.head(MAX_LISTED).itertuples(index=False)]
    more = f" and {len(hits) - MAX_LISTED} more" if len(hits) > MAX_LISTED else ""
    verb = verb if len(hits) > 1 else verb.replace("differ ", "differs ", 1)
    return f"Beyond its 95 % interval, {len(hits)} of {len(d)} arm-task cells {verb}: {'; '.join(listed)}{more}."


def _recovered(sweep: Sweep, opts: SeverityOptions, multi_task: bool, labels: dict) -> str:
    s = severity_summary(sweep, opts)
    if s.empty:
        return "No recovered share: no evaluation to compare."
    cells = s[~s["method"].isin([opts.baseline, opts.naive])]
    defined = cells[np.isfinite(cells["recovered"].astype(float))]
    notes = sorted({str(n) for n in cells["recovered_note"] if n})
    if not defined.empty:
        parts = []
        for r in defined.sort_values("recovered", ascending=False).itertuples(index=False):
            iv = (f" [{100 * r.recovered_lo:.0f}, {100 * r.recovered_hi:.0f}] %" if np.isfinite(r.recovered_lo)
                  else " (interval unbounded)")
            where = f" on {r.task}" if multi_task else ""
            parts.append(f"{r.method} {100 * r.recovered:.0f} %{iv} at {r.severity_label}{where}")
        undefined = len(cells) - len(defined)
        rest = (f" (none in the other {undefined} arm-severity cell{'s' if undefined > 1 else ''}: {'; '.join(notes)}; "
                "the severity table says which)" if undefined else "")
        return f"Share of the {opts.naive} arm's gap to {opts.baseline} recovered: " + "; ".join(parts) + rest + "."
    if not notes:
        return f"No recovered share: no correction ran beside {opts.naive} and {opts.baseline}."
    return (f"No recovered share of the {opts.naive} gap is reported ({'; '.join(notes)}): a share of a gap that "
            "the data cannot tell from 0 would be noise.")


__all__ = ["gaps", "verdict"]
