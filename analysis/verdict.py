"""The report's opening paragraph: what the sweep found, in a few sentences generated from its numbers.

A reader opening report.md should learn the answer before the tables: which arms differ from the baseline (bf16)
and from the uncorrected arm (naive), at which setting (task and rollout precision), how much of the naive arm's gap
each correction recovers, and on how many seeds all of that rests. Every "differs" or "recovers" sentence carries a
multiplicity correction over the family it names (analysis/inference.py, analysis/comparisons.py): a gap differs when
its Holm-adjusted p over that family is <= 0.05; recovered shares carry Fieller intervals simultaneous over the shares
listed (Bonferroni level 1 - 0.05/m). Every number comes from the same definitions as the tables.

    sentence 1  the scope: runs, arms, tasks, seeds (n) and steps
    (primary)   the pre-registered test, when `--primary` names its arms: each hypothesis, its two endpoints with raw
                and Holm-adjusted p within the pre-registered family, supported or not
    sentence 2  arms vs the baseline: those that differ after Holm (at most three, the largest first), else the
                smallest adjusted p; a sweep without a baseline run says so (no comparison, no finding)
    sentence 3  corrections vs naive at the same precision and task, the same way
    (control)   where the on-policy control ran: the naive gap split into the sampler-and-capacity and mismatch costs
    sentence 4  the recovered share of the naive gap of every arm where it is defined, highest first, with simultaneous
                intervals, and how many cells have none and why; else why not
    sentence 5  (n < 5 seeds) what the intervals' width means
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import t as student_t

from .arms import arm_labels
from .comparisons import differs, family_name, is_primary, paired_comparisons, primary_seeds
from .decomposition import decomposition
from .inference import ALPHA, fmt_p
from .load import Sweep, get
from .runs import SeverityOptions, baseline_group, run_rows
from .severity import severity_summary
from .stats import method_mark, ratio_interval

MAX_LISTED = 3


def _pp(value: float, lo: float, hi: float, n: int, method: Any = "") -> str:
    """'−5.2 pp [−9.1, −1.3], n=3' (a gap), or '−5.2 pp (no interval, n=3)'; ', Welch' after n where the arms share
    no seed (analysis.stats.gap)."""
    head = f"{value:+.1f} pp"
    if np.isfinite(lo) and np.isfinite(hi):
        return f"{head} [{lo:+.1f}, {hi:+.1f}], n={n}{method_mark(method)}"
    return f"{head} (no interval, n={n}{method_mark(method)})"


def _ps(r: Any) -> str:
    """'p 0.012, Holm 0.048' beside a gap (raw and adjusted within its family)."""
    return f"p {fmt_p(r.p_raw)}, Holm {fmt_p(r.p_holm)}"


def _gap(r: Any) -> str:
    return f"{_pp(r.gap, r.gap_lo, r.gap_hi, int(r.gap_n), r.gap_ci)}; {_ps(r)}"


def _seeds_phrase(counts: list[int]) -> str:
    ns = sorted(set(counts))
    return f"n = {ns[0]} seed{'s' if ns[0] != 1 else ''} per arm" if len(ns) == 1 else \
        f"n = {ns[0]}-{ns[-1]} seeds per arm"


def _where(r: Any, multi_task: bool, labels: dict) -> str:
    """'tis at mxfp4' / 'naive@mxfp4' (the arm's label), '... on chain' when the report spans tasks."""
    arm = labels.get((r.a, r.precision), r.a)
    at = f"{arm} at {r.precision}" if r.precision not in arm else arm
    return f"{at} on {r.task}" if multi_task else at


def verdict(sweep: Sweep, opts: SeverityOptions = SeverityOptions()) -> list[str]:
    """The sentences of the report's opening paragraph (empty when no run has an evaluation)."""
    runs = run_rows(sweep, opts.collapse_k)
    if runs.empty:
        return []
    cmp = paired_comparisons(sweep, opts)
    final = cmp[cmp["endpoint"] == "final"]
    labels = arm_labels(zip(runs["method"], runs["precision"]))
    multi_task = runs["task"].nunique() > 1
    steps = sorted({int(s) for s in (get(r.config, "train.steps") for r in sweep.runs) if isinstance(s, int)})
    counts = runs.groupby(["model", "task", "method", "precision"]).size().tolist()
    arms = runs[["method", "precision"]].drop_duplicates()
    tasks = sorted(runs["task"].unique())
    out = [f"{len(sweep.runs)} runs: {len(arms)} arms × {len(tasks)} task{'s' if len(tasks) > 1 else ''} "
           f"({', '.join(tasks)}), {_seeds_phrase(counts)}"
           + (f", {'/'.join(map(str, steps))} training steps each" if steps else "")
           + "; gaps are in final eval accuracy with 95 % intervals over seeds, and a gap differs when its "
             f"Holm-adjusted p over the family named is ≤ {ALPHA}."]
    primary = cmp[[is_primary(r) for r in cmp.itertuples(index=False)]]
    if not primary.empty:
        out.append(_primary(primary, opts, multi_task, labels, runs))
    if (runs["method"] == opts.baseline).any():
        out.append(_comparison(final[final["family"] == family_name("base", opts)], f"differ from {opts.baseline}",
                               multi_task, labels, none=f"No arm differs from {opts.baseline}"))
    else:  # nothing was compared: "no arm differs" would read as a finding
        out.append(f"No arm is compared with a baseline: the sweep has no {opts.baseline} run "
                   "(`qrl-analyze --baseline <method>` names another).")
    vs_naive = final[final["family"] == family_name("naive", opts)]
    if not vs_naive.empty:
        out.append(_comparison(vs_naive, f"differ from {opts.naive} at the same precision", multi_task, labels,
                               none=f"No other arm differs from {opts.naive} at the same precision"))
    if (sentence := _decomposition(sweep, opts, final, multi_task)) is not None:
        out.append(sentence)
    out.append(_recovered(sweep, opts, multi_task, labels, final))
    ts = ", ".join(f"{student_t.ppf(0.975, n - 1):.1f} at {n} seeds" for n in sorted(set(counts)) if n >= 2)
    if max(counts) < 5 and ts:
        out.append(f"With {_seeds_phrase(counts)} an interval is wide (t = {ts}; 2.0 at 60): a difference "
                   "inside it is no evidence either way; more seeds narrow it.")
    return out


def _comparison(d: pd.DataFrame, verb: str, multi_task: bool, labels: dict, none: str) -> str:
    """Those of one family (final accuracy) that differ after Holm, largest first; else the smallest adjusted p."""
    d = d[np.isfinite(d["gap"].astype(float))].copy()  # an empty family has an object column
    if d.empty:
        return f"{none} (no comparison)."
    untested = int((~np.isfinite(d["p_holm"].astype(float))).sum())  # 1 seed: a gap, no test, not in the family
    d = d[np.isfinite(d["p_holm"].astype(float))].copy()
    without = f" ({untested} more with no test: fewer than 2 seeds)" if untested else ""
    if d.empty:
        return f"{none}: no comparison could be tested{without}."
    family = f"Holm over its {len(d)} comparison{'s' if len(d) != 1 else ''}{without}"
    d["size"] = d["gap"].abs()
    hits = d[[differs(r) for r in d.itertuples(index=False)]].sort_values("size", ascending=False)
    if hits.empty:
        r = d.sort_values(["p_holm", "size"], ascending=[True, False]).iloc[0]
        return (f"{none} after {family} (smallest adjusted p: {_where(r, multi_task, labels)}, {_gap(r)}).")
    listed = [f"{_where(r, multi_task, labels)} ({_gap(r)})" for r in hits.head(MAX_LISTED).itertuples(index=False)]
    more = f" and {len(hits) - MAX_LISTED} more" if len(hits) > MAX_LISTED else ""
    verb = verb if len(hits) > 1 else verb.replace("differ ", "differs ", 1)
    return f"After {family}, {len(hits)} of {len(d)} arm-task cells {verb}: {'; '.join(listed)}{more}."


def _primary(d: pd.DataFrame, opts: SeverityOptions, multi_task: bool, labels: dict, runs: pd.DataFrame) -> str:
    """The pre-registered test: each arm > naive on both endpoints, one-sided, Holm over the pre-registered family;
    the seeds a cell's tests dropped (missing in one of its arms) are named, as the protocol says."""
    parts = []  # one hypothesis per arm and cell (model, task, rollout setting): its two endpoints, its own decision
    for (model, task, severity), cell in d.groupby(["model", "task", "severity"], sort=False):
        g = runs[(runs["model"] == model) & (runs["task"] == task)]
        here, (base, _) = g[g["severity"] == severity], baseline_group(g, severity, opts.baseline)
        five = pd.concat([here[here["method"].isin([opts.naive, *opts.primary])], base])
        dropped = sorted(set(five["seed"]) - primary_seeds(here, base, opts))
        if dropped:
            parts.append(f"at {cell['severity_label'].iloc[0]}" + (f" on {task}" if multi_task else "")
                         + f" seed{'s' if len(dropped) > 1 else ''} {', '.join(map(str, dropped))} dropped from every "
                         "test (missing in one of the family's arms)")
    for (arm, *_), g in d.groupby(["a", "model", "task", "severity"], sort=False):
        ends = []
        for r in g.itertuples(index=False):
            name = "final" if r.endpoint == "final" else "AUC"
            ends.append(f"{name} {_pp(r.gap, r.gap_lo, r.gap_hi, int(r.gap_n), r.gap_ci)}, one-sided p "
                        f"{fmt_p(r.p_raw)}, Holm {fmt_p(r.p_holm)}")
        supported = any(differs(r) for r in g.itertuples(index=False))
        where = f" at {g['severity_label'].iloc[0]}" + (f" on {g['task'].iloc[0]}" if multi_task else "")
        parts.append(f"{arm} > {opts.naive}{where}: {'; '.join(ends)}: **{'supported' if supported else 'not supported'}**")
    return (f"Pre-registered test (one-sided paired t, Holm over its {len(d)} tests at α = {ALPHA}; "
            f"docs/preregistration.md): " + "; ".join(parts) + ".")


def _decomposition(sweep: Sweep, opts: SeverityOptions, final: pd.DataFrame, multi_task: bool) -> str | None:
    """The naive gap split by the control, per cell: both costs with intervals and Holm-adjusted p."""
    d = decomposition(sweep, opts)
    if d.empty:
        return None
    cells = d.drop_duplicates(["model", "task", "severity"])
    parts = []
    for c in cells.itertuples(index=False):
        here = final[(final["model"] == c.model) & (final["task"] == c.task) & (final["severity"] == c.severity)]
        ctrl_base = here[(here["a"] == opts.control) & (here["b"] == opts.baseline)]
        ctrl_naive = here[(here["a"] == opts.control) & (here["b"] == opts.naive)]
        p_sampler = _cost_p(ctrl_base, -c.sampler_cost, int(c.sampler_cost_n), c.sampler_cost_p)
        p_mismatch = _cost_p(ctrl_naive, c.mismatch_cost, int(c.mismatch_cost_n), c.mismatch_cost_p)
        where = f"{c.severity_label}" + (f" on {c.task}" if multi_task else "")
        parts.append(f"at {where} the total gap {opts.baseline} − {opts.naive} "
                     f"{_pp(c.total_cost, c.total_cost_lo, c.total_cost_hi, int(c.total_cost_n))} is a sampler-and-"
                     f"capacity cost {opts.baseline} − {opts.control} "
                     f"{_pp(c.sampler_cost, c.sampler_cost_lo, c.sampler_cost_hi, int(c.sampler_cost_n))}{p_sampler} "
                     f"plus a mismatch cost {opts.control} − {opts.naive} "
                     f"{_pp(c.mismatch_cost, c.mismatch_cost_lo, c.mismatch_cost_hi, int(c.mismatch_cost_n))}"
                     f"{p_mismatch}")
    return (f"The on-policy control ({opts.control}: the trainer at the rollout's precision, π_old = μ) splits the "
            f"naive gap: " + "; ".join(parts) + ".")


def _cost_p(row: pd.DataFrame, gap: float, n: int, p: float) -> str:
    """'; Holm 0.012' beside a cost of the decomposition when its family's test (the paired comparisons' row) rests on
    the same pairs; else the cost's own p, said so: the decomposition pairs on the seeds all three arms ran, the
    family's test on those its two arms ran, and a Holm p beside another test's interval would contradict it."""
    if not row.empty and int(row["gap_n"].iloc[0]) == n and np.isclose(float(row["gap"].iloc[0]), gap):
        return f"; Holm {fmt_p(row['p_holm'].iloc[0])}"
    return f"; p {fmt_p(p)}, not Holm-adjusted (on the seeds all three ran)" if np.isfinite(p) else ""


def _recovered(sweep: Sweep, opts: SeverityOptions, multi_task: bool, labels: dict, final: pd.DataFrame) -> str:
    """Every defined recovered share of the naive gap, highest first, with Fieller intervals simultaneous over them;
    a share whose naive gap does not differ from the baseline after Holm (the share is defined on its raw interval)
    says so, beside the sentence that found no arm differing."""
    s = severity_summary(sweep, opts)
    if s.empty:
        return "No recovered share: no evaluation to compare."
    cells = s[~s["method"].isin([opts.baseline, opts.naive])]
    defined = cells[np.isfinite(cells["recovered"].astype(float))]
    notes = sorted({str(n) for n in cells["recovered_note"] if n})
    if not defined.empty:
        m = len(defined)
        level = 1 - ALPHA / m
        runs = run_rows(sweep, opts.collapse_k)
        parts = []
        for r in defined.sort_values("recovered", ascending=False).itertuples(index=False):
            g = runs[(runs["model"] == r.model) & (runs["task"] == r.task)]
            here = g[g["severity"] == r.severity]
            a, naive = here[here["method"] == r.method], here[here["method"] == opts.naive]
            base, _ = baseline_group(g, r.severity, opts.baseline)
            iv = ratio_interval(a["final_acc"], naive["final_acc"], base["final_acc"],
                                (list(a["seed"]), list(naive["seed"]), list(base["seed"])), level=level)
            text = (f" [{100 * iv.lo:.0f}, {100 * iv.hi:.0f}] % (n={iv.n})" if iv.defined
                    else f" (interval unbounded, n={iv.n})")
            where = f" on {r.task}" if multi_task else ""
            gap = final[(final["family"] == family_name("base", opts)) & (final["a"] == opts.naive)
                        & (final["model"] == r.model) & (final["task"] == r.task) & (final["severity"] == r.severity)]
            unresolved = "" if gap.empty or differs(gap.iloc[0]) else \
                f", of a {opts.naive} gap that does not differ after Holm ({fmt_p(gap['p_holm'].iloc[0])})"
            parts.append(f"{r.method} {100 * r.recovered:.0f} %{text} at {r.severity_label}{where}{unresolved}")
        undefined = len(cells) - len(defined)
        rest = (f" (none in the other {undefined} arm-severity cell{'s' if undefined > 1 else ''}: {'; '.join(notes)}; "
                "the severity table says which)" if undefined else "")
        family = (f"Fieller intervals simultaneous over its {m} shares, each at {100 * level:.1f} %" if m > 1
                  else "Fieller 95 % interval")
        return (f"Share of the {opts.naive} arm's gap to {opts.baseline} recovered ({family}): " + "; ".join(parts)
                + rest + ".")
    if not notes:
        return f"No recovered share: no correction ran beside {opts.naive} and {opts.baseline}."
    return (f"No recovered share of the {opts.naive} gap is reported ({'; '.join(notes)}): a share of a gap that "
            "the data cannot tell from 0 would be noise.")


__all__ = ["verdict"]
