"""The severity analysis: accuracy against the measured mismatch, the gap to the baseline at each rollout severity,
and the fraction of the naive arm's gap each correction recovers (issue 12, item 5).

A severity sweep runs the arms at several rollout precisions (a ladder bf16 -> fp8 -> int8 -> 4-bit formats).
This module turns it into the headline figure (one line per method, final accuracy and AUC against the measured
KL(mu || pi_old)) and the gap table. Every number is one of these definitions, computed from metrics.jsonl,
eval.jsonl, config.yaml and run.json, so a reader can reproduce any cell:

severity        a run's rollout precision plus the rollout options that change its numerics (weight / activation
                granularity, activation dtype, KV-cache dtype, quantized lm_head / embeddings):
                `analysis.load.severity_key`. Labelled by the precision and the options set explicitly in the
                config or varying between runs of that precision; ordered by the mean mismatch of its runs.
mismatch        per run: the mean over its training steps of `mismatch/kl_k3`, the k3 estimate of the per-token
                KL(mu || pi_old) (`mismatch/kl_k1` for a run without k3).
T·KL            per run: the mean over its training steps of reward/response_length x the per-token KL above, the
                sequence-level mismatch in nats (the quantity token-level corrections' bias grows with).
sampler acc.    per run: the step-0 training batch's reward/accuracy in %: how often the rollout policy mu itself
                answers right before any update. The naive arm's against bf16's tells a worse sampler apart from
                a biased gradient.
final accuracy  per run: its last eval/accuracy, in %.
AUC             per run: the trapezoid area under its eval/accuracy curve divided by the step span, i.e. the
                time-averaged accuracy in % (it credits learning early and charges a late collapse).
AUC gap         the same difference for AUC: less noisy than the final accuracy (it averages every evaluation).
gap             mean final accuracy of a method at severity s minus that of the baseline method (`--baseline`,
                default bf16) at s, or at the baseline's only severity when it ran at one (the usual case: the
                bf16 arm rolls out in bf16), in percentage points.
recovered       (acc_arm - acc_naive) / (acc_base - acc_naive), the naive method (`--naive`, default naive) at the
                same severity s: 1 = the arm closes the naive gap, 0 = no better than naive, < 0 = worse. Not
                reported, with the reason, when the naive gap's CI contains 0 ("naive gap within noise"), when the
                naive arm is better than the baseline beyond its CI ("naive better than baseline": no gap to
                recover), when a group has fewer than 2 seeds, or when no naive or baseline run exists at s.
collapse        analysis/collapse.py, the one definition: eval accuracy below its step-0 value by more than the
                evaluation's binomial noise at its test-set size, at k consecutive evaluations after step 0
                (`--collapse-k`, default 3); its collapse step (the time to collapse) is the first of them. A run
                without a step-0 evaluation cannot be judged and is not counted.
CIs             95 % Student-t intervals over seeds (analysis.stats): a level (accuracy, AUC, KL) by the t-interval
                of its seeds; a gap by the paired t-interval of the per-seed differences on the seeds both methods
                ran (Welch, marked, where they share none); the recovered share by Fieller's interval on the seeds all
                three ran. Each shows its n (seeds or pairs); 1 seed, or differences with no spread, give none.
eval SE         beside a gap: the binomial standard error the finite test set alone puts on it,
                sqrt(p_a(1-p_a)/(k_a n_test) + p_b(1-p_b)/(k_b n_test)) with k seeds per method, in pp.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import pandas as pd

from .arms import method_color, method_sort_key
from .collapse import COLLAPSE_SENTENCE
from .comparisons import family_name, p_columns, paired_comparisons
from .load import Sweep
from .runs import SeverityOptions, baseline_group, run_rows, severity_labels
from .stats import METHOD_SENTENCE, NAN_INTERVAL, Interval, diff_interval, mean_interval, ratio_interval
from .tables import MISSING, Table, fmt_ci, fmt_se, fmt_share, gap_eval_se

#: one marker per method in the severity figure: methods at one severity often measure the same mismatch and
#: similar accuracies, and colour alone does not tell overlapping points apart
METHOD_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "p", "h", "*")
NO_NAIVE_GAP = "naive gap within noise"
#: the recovered-share figures' y range (%): beyond it a share or an interval end is marked at the edge
RECOVERED_RANGE = (-100.0, 200.0)
#: how the figures mark it, in their captions
OFF_SCALE = (f"drawn within [{RECOVERED_RANGE[0]:.0f}, {RECOVERED_RANGE[1]:.0f}] %".replace("-", "−")
             + ": a share beyond it is an arrow at the edge under its value, an interval end beyond it an arrowhead")
NAIVE_BETTER = "naive better than baseline"


# --------------------------------------------------------------------------------------------- summary
def _interval_columns(prefix: str, iv: Interval) -> dict[str, Any]:
    return {prefix: iv.value, f"{prefix}_lo": iv.lo, f"{prefix}_hi": iv.hi, f"{prefix}_n": iv.n,
            f"{prefix}_ci": iv.method}


def _gap(a: pd.DataFrame, b: pd.DataFrame, col: str) -> Interval:
    """mean(a[col]) - mean(b[col]), paired on the seeds both ran (analysis.stats.gap)."""
    return diff_interval(a[col], b[col], list(a["seed"]), list(b["seed"]))


def _eval_se(a: pd.DataFrame, b: pd.DataFrame) -> float:
    """The binomial SE (pp) that the test set alone puts on the final-accuracy gap between a and b."""
    return gap_eval_se(a["final_acc"], b["final_acc"], pd.concat([a["n_test"], b["n_test"]]))


def severity_summary(sweep: Sweep, opts: SeverityOptions = SeverityOptions()) -> pd.DataFrame:
    """Per (model, task, severity, method): seeds, mismatch, final accuracy and AUC with CIs, the gap to the
    baseline and the recovered fraction of the naive gap with CIs (and why not, where undefined), collapses."""
    runs = run_rows(sweep, opts.collapse_k)
    labels = severity_labels(sweep.runs)
    rows: list[dict[str, Any]] = []
    for (model, task), g in runs.groupby(["model", "task"], sort=True):
        order = g.groupby("severity")["kl"].mean().sort_values(kind="stable")
        for severity in order.index:
            cell = g[g["severity"] == severity]
            base, base_note = baseline_group(g, severity, opts.baseline)
            naive = cell[cell["method"] == opts.naive]
            naive_gap = _gap(base, naive, "final_acc")
            for method in sorted(cell["method"].unique(), key=method_sort_key):
                a = cell[cell["method"] == method]
                is_base = method == opts.baseline and a["severity"].iloc[0] in set(base["severity"])
                gap = NAN_INTERVAL if is_base else _gap(a, base, "final_acc")
                auc_gap = NAN_INTERVAL if is_base else _gap(a, base, "auc")
                rec, note = _recovered(a, naive, base, naive_gap, method, is_base, base_note, opts)
                steps = sorted(int(s) for s in a["collapse_step"].dropna())
                rows.append({
                    "model": model, "task": task, "severity": severity, "severity_label": labels.get(severity, severity),
                    "precision": a["precision"].iloc[0], "method": method, "n_seeds": len(a),
                    "seeds": " ".join(str(s) for s in sorted(a["seed"])),
                    **_interval_columns("kl", mean_interval(a["kl"])),
                    **_interval_columns("seq_kl", mean_interval(a["seq_kl"])),
                    **_interval_columns("sampler_acc0", mean_interval(a["sampler_acc0"])),
                    **_interval_columns("acc", mean_interval(a["final_acc"])),
                    **_interval_columns("auc", mean_interval(a["auc"])),
                    **_interval_columns(f"gap_to_{opts.baseline}", gap),
                    f"gap_to_{opts.baseline}_eval_se": np.nan if is_base or base.empty else _eval_se(a, base),
                    **_interval_columns(f"auc_gap_to_{opts.baseline}", auc_gap),
                    **_interval_columns("recovered", rec), "recovered_note": note,
                    **_interval_columns("naive_gap", naive_gap),
                    "n_collapsed": int(a["collapsed"].sum()), "collapse_steps": " ".join(map(str, steps)),
                })
    return pd.DataFrame(rows)


def _recovered(a: pd.DataFrame, naive: pd.DataFrame, base: pd.DataFrame, naive_gap: Interval, method: str,
               is_base: bool, base_note: str | None, opts: SeverityOptions) -> tuple[Interval, str]:
    """The recovered fraction for one cell, or NaN with the reason it is not defined."""
    nan = NAN_INTERVAL
    if is_base or method == opts.naive:
        return nan, ""  # 1 and 0 by definition
    if base_note:
        return nan, base_note
    if naive.empty:
        return nan, f"no {opts.naive} run at this severity"
    if min(len(a), len(naive), len(base)) < 2:
        return nan, "fewer than 2 seeds"
    if naive_gap.contains(0.0):
        return nan, NO_NAIVE_GAP
    if naive_gap.hi < 0:
        return nan, NAIVE_BETTER  # there is no gap to recover: the ratio would read backwards
    rec = ratio_interval(a["final_acc"], naive["final_acc"], base["final_acc"],
                         (list(a["seed"]), list(naive["seed"]), list(base["seed"])))
    return rec, ("interval unbounded" if rec.note == "unbounded" else "")


# --------------------------------------------------------------------------------------------- table
def severity_table(sweep: Sweep, opts: SeverityOptions = SeverityOptions()) -> Table:
    """The gap-to-baseline table across severities, with the recovered fraction of the naive gap and collapses."""
    data = severity_summary(sweep, opts)
    multi_model = data["model"].nunique() > 1 if not data.empty else False
    gap = f"gap_to_{opts.baseline}"
    cmp = paired_comparisons(sweep, opts)
    where = ("model", "task", "severity")
    p_final, p_auc = (p_columns(cmp, family_name("base", opts), e, where) for e in ("final", "auc"))
    rows, prev = [], None
    for r in data.itertuples(index=False):
        d = r._asdict()
        key = (r.model, r.task, r.severity)
        if r.method == opts.naive or (r.method == opts.baseline and not np.isfinite(d[gap])):
            recovered = MISSING
        else:
            recovered = fmt_share(r.recovered, r.recovered_lo, r.recovered_hi, r.recovered_n, r.recovered_note)
        collapsed = f"{r.n_collapsed}/{r.n_seeds}" + (f" (step {r.collapse_steps})" if r.n_collapsed else "")
        new_block = prev is None or key[:2] != prev[:2]
        row = {
            "Task": r.task if new_block else "",
            "Model": r.model if new_block else "",
            "Severity": r.severity_label if key != prev else "",
            "Method": r.method,
            "μ acc. @ step 0 (%)": fmt_ci(r.sampler_acc0, r.sampler_acc0_lo, r.sampler_acc0_hi, n=r.sampler_acc0_n),
            "KL(μ‖π_old)": f"{r.kl:.2e}" if np.isfinite(r.kl) else MISSING,
            "Accuracy (%)": fmt_ci(r.acc, r.acc_lo, r.acc_hi, n=r.acc_n),
            "AUC (%)": fmt_ci(r.auc, r.auc_lo, r.auc_hi, n=r.auc_n),
            f"Δ vs {opts.baseline} (pp)": fmt_ci(d[gap], d[f"{gap}_lo"], d[f"{gap}_hi"], signed=True, n=d[f"{gap}_n"],
                                                  method=d[f"{gap}_ci"]),
            "p / Holm": p_final.get(key + (r.method,), MISSING),
            "eval SE (pp)": fmt_se(d[f"{gap}_eval_se"]),
            f"AUC Δ vs {opts.baseline} (pp)": fmt_ci(d[f"auc_{gap}"], d[f"auc_{gap}_lo"], d[f"auc_{gap}_hi"], signed=True,
                                                      n=d[f"auc_{gap}_n"], method=d[f"auc_{gap}_ci"]),
            "AUC p / Holm": p_auc.get(key + (r.method,), MISSING),
            f"Recovered ({opts.naive} gap)": recovered,
            "Collapsed": collapsed,
            "Seeds": str(r.n_seeds),
        }
        if not multi_model:
            row.pop("Model")
        rows.append(row)
        prev = key
    caption = (
        f"Per severity (rollout precision and options, ordered by measured mismatch): μ's own accuracy on the step-0 "
        f"training batch (the rollout policy sampling, before any update: a worse sampler is a floor no correction "
        f"removes), mean KL(μ‖π_old) per token (k3, "
        f"mean over steps and seeds), final eval accuracy and AUC (time-averaged eval accuracy), their gaps to "
        f"{opts.baseline} and the fraction of the {opts.naive} arm's gap to {opts.baseline} each method recovers "
        f"((acc − acc_{opts.naive}) / (acc_{opts.baseline} − acc_{opts.naive})). {METHOD_SENTENCE} "
        f"p / Holm: the gap's paired t-test p and its Holm-adjusted p over every gap to {opts.baseline} of the report "
        f"(per endpoint; the paired comparisons table). "
        f"eval SE: the binomial standard error the test set alone puts on the Δ (pp); "
        f"'n/a ({NO_NAIVE_GAP})' where the {opts.naive} gap's CI contains 0 ('{NAIVE_BETTER}' where it lies below 0). "
        + COLLAPSE_SENTENCE.format(k=opts.collapse_k)
    )
    return Table("severity", data, pd.DataFrame(rows), caption)


# --------------------------------------------------------------------------------------------- figure
#: Horizontal distance (points) between arms drawn at one severity: their markers (4 pt) and caps stay apart.
DODGE_PT = 6.0
DODGE_NOTE = (f"arms at one severity are drawn {DODGE_PT:.0f} pt apart, in the legend's order, so each stays "
              "visible (a shift for drawing only; the tables give each arm's measured value)")


def dodge_offsets(groups: Iterable[Iterable[str]], order: Sequence[str]) -> dict[str, float]:
    """Horizontal offsets (points) that keep arms sharing an x apart: each method that shares one of `groups` (the
    methods drawn at one severity or cell) with another gets its own slot, slots in `order`, centred on 0; a
    method alone wherever it is drawn (the baseline) stays at 0. One offset per method, so its line stays whole."""
    crowded = {m for g in map(set, groups) if len(g) > 1 for m in g}
    slots = [m for m in order if m in crowded]
    return {m: (slots.index(m) - (len(slots) - 1) / 2) * DODGE_PT if m in crowded else 0.0 for m in order}


def artists(container: Any) -> list[Any]:
    """The artists of an errorbar container: its line through the points, its caps and its bars."""
    line, caps, bars = container.lines
    return [a for a in (line, *caps, *bars) if a is not None]


def shift_apart(drawn: dict[tuple[Any, str], list[Any]], offsets: dict[str, float]) -> None:
    """Move each (axis, method)'s artists `offsets[method]` points to the right, once everything is drawn: each axis
    first keeps the limits its data gave it (an artist drawn in shifted coordinates from the start is left out of
    autoscaling, which cut points off). A shift in points is the same on a linear, log or symlog axis."""
    from matplotlib.text import Annotation
    from matplotlib.transforms import offset_copy

    for ax in {ax for ax, _ in drawn}:
        ax.autoscale_view()
        ax.set_xlim(ax.get_xlim())
        ax.set_ylim(ax.get_ylim())
    for (ax, method), items in drawn.items():
        if offsets.get(method):
            shift = offset_copy(ax.transData, fig=ax.figure, x=offsets[method], y=0.0, units="points")
            for a in items:
                if isinstance(a, Annotation):
                    a.xycoords = shift
                else:
                    a.set_transform(shift)


def plot_severity(sweep: Sweep, task: str, model: str, out_dir: Path, opts: SeverityOptions = SeverityOptions(),
                  formats: Sequence[str] = ("png", "pdf")):
    """The headline figure: final accuracy and AUC against the measured mismatch, one line per method across the
    severities it ran, 95 % t-intervals on both axes; the baseline as a horizontal band; collapses marked."""
    from matplotlib.lines import Line2D

    from .plots import FULL_WIDTH, FigureFile, _save, plt, safe_name

    data = cell_summary(sweep, task, model, opts)
    if data.empty or data["severity"].nunique() < 2 or not np.isfinite(data["kl"]).any():
        return None
    fig, axes = plt.subplots(1, 2, figsize=(FULL_WIDTH, 3.1), layout="constrained")
    methods = sorted(data["method"].unique(), key=method_sort_key)
    markers = {m: METHOD_MARKERS[i % len(METHOD_MARKERS)] for i, m in enumerate(methods)}
    offsets = dodge_offsets(data.groupby("severity")["method"].apply(list), methods)
    options = _draw_severity(axes, data, methods, markers, offsets, opts)
    handles = [Line2D([], [], color=method_color(m), marker=markers[m], ms=4, lw=1.2, mec="white", mew=0.4) for m in methods]
    names = list(methods)
    if (data["n_collapsed"] > 0).any():
        handles.append(Line2D([], [], ls="none", marker="o", mfc="none", mec="0.15", ms=9, mew=0.9))
        names.append(f"≥1 seed collapsed (k={opts.collapse_k})")
    fig.legend(handles, names, loc="outside upper center", ncol=min(len(names), 7), frameon=False)
    if options:  # what the top axis's short names leave out
        text = "severities: " + "; ".join(f"{k} = {v}" for k, v in options.items())
        fig.supxlabel(textwrap.fill(text, 190), fontsize=6, color="0.3")
    name = safe_name("severity", task, model)
    caption = (
        f"{task} / {model}: final eval accuracy (left) and AUC (right) against the measured rollout–training mismatch "
        f"(mean over steps of the per-token KL(μ‖π_old), k3), one line per method across the severities it ran "
        f"(labelled on the top axis, at each severity's mean mismatch); 95 % t-intervals over seeds on both axes, "
        f"clipped to 0-100 %; dashed line and band: {opts.baseline}. A ring marks a severity where at least one "
        f"seed collapsed" + (f"; {DODGE_NOTE}." if any(offsets.values()) else ".")
    )
    return FigureFile(name, "severity", f"Accuracy against mismatch — {task} / {model}", caption,
                      _save(fig, out_dir, name, formats))


def cell_summary(sweep: Sweep, task: str, model: str, opts: SeverityOptions) -> pd.DataFrame:
    """The severity summary of one task and model: the frame of its severity and recovered figures."""
    data = severity_summary(sweep, opts)
    return data[(data["task"] == task) & (data["model"] == model)] if not data.empty else data


def _draw_severity(axes: Any, data: pd.DataFrame, methods: list[str], markers: dict[str, str],
                   offsets: dict[str, float], opts: SeverityOptions) -> dict[str, str]:
    """The severity figure's two panels (accuracy, AUC) against KL; returns what the severity labels leave out."""
    drawn: dict[tuple[Any, str], list[Any]] = {}
    kl = data["kl"].to_numpy(dtype=float)
    options: dict[str, str] = {}
    for ax, (col, title) in zip(axes, (("acc", "final eval accuracy"), ("auc", "AUC (time-averaged eval accuracy)"))):
        for method in methods:
            d = data[data["method"] == method].sort_values("kl")
            color = method_color(method)
            x, y = d["kl"].to_numpy(float), d[col].to_numpy(float)
            xerr = _err(x, kl_lower(d["kl_lo"], kl), d["kl_hi"])
            yerr = _err(y, d[f"{col}_lo"].clip(0, 100), d[f"{col}_hi"].clip(0, 100))  # an accuracy is in [0, 100]
            eb = ax.errorbar(x, y, xerr=xerr, yerr=yerr, color=color, marker=markers[method], ms=4, lw=1.2,
                             elinewidth=0.7, capsize=2, mfc=color, mec="white", mew=0.4)
            drawn[(ax, method)] = artists(eb)
            hit = d["n_collapsed"].to_numpy() > 0
            if hit.any():  # a ring around the point: the arm's own marker stays visible inside it
                drawn[(ax, method)] += ax.plot(x[hit], y[hit], ls="none", marker="o", mfc="none", mec="0.15", ms=9,
                                               mew=0.9, zorder=5)
            if method == opts.baseline and d["severity"].nunique() == 1:
                ax.axhline(y[0], color=color, lw=0.8, ls="--", zorder=0)
                lo, hi = d[f"{col}_lo"].iloc[0], d[f"{col}_hi"].iloc[0]
                if np.isfinite(lo) and np.isfinite(hi):
                    ax.axhspan(max(lo, 0.0), min(hi, 100.0), color=color, alpha=0.08, lw=0, zorder=0)
        _kl_axis(ax, kl)
        ax.margins(x=0.08, y=0.12)
        options = _label_severities(ax, data)
        ax.set_title(f"{title} vs mismatch", pad=4)
        ax.set_xlabel("mean KL(μ‖π_old) per token (k3, nats)")
        ax.set_ylabel(f"{'accuracy' if col == 'acc' else 'AUC'} (%)")
    shift_apart(drawn, offsets)
    return options


def plot_recovered(sweep: Sweep, task: str, model: str, out_dir: Path, opts: SeverityOptions = SeverityOptions(),
                   formats: Sequence[str] = ("png", "pdf")):
    """Where correction stops working: each correction's recovered share of the naive gap against the sequence-level
    mismatch T·KL (left), and mu's own step-0 accuracy against bf16's (right: a worse sampler, which no reweighting
    repairs, versus a biased gradient). None when no severity has a recovered share."""
    from matplotlib.lines import Line2D

    from .plots import FULL_WIDTH, FigureFile, _save, plt, safe_name

    data = cell_summary(sweep, task, model, opts)
    if data.empty or not np.isfinite(data["recovered"]).any() or not np.isfinite(data["seq_kl"]).any():
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(FULL_WIDTH, 3.1), layout="constrained", sharex=True,
                                      gridspec_kw={"width_ratios": [3, 2]})
    arms = [m for m in sorted(data["method"].unique(), key=method_sort_key) if m not in (opts.naive, opts.baseline)]
    markers = {m: METHOD_MARKERS[i % len(METHOD_MARKERS)] for i, m in enumerate(arms)}
    plotted = np.isfinite(data["recovered"]) | (data["method"] == opts.naive)
    seq_kl = data.loc[plotted, "seq_kl"].to_numpy(float)  # the x values drawn: the axis is chosen for them
    defined = data[data["method"].isin(arms) & np.isfinite(data["recovered"])]
    offsets = dodge_offsets(defined.groupby("severity")["method"].apply(list), arms)
    drawn, shown = _draw_recovered_left(left, defined, arms, markers, seq_kl, opts)
    _draw_sampler_right(right, data, seq_kl, opts)
    shift_apart(drawn, offsets)
    handles = [Line2D([], [], color=method_color(m), marker=markers[m], ms=4, lw=1.0) for m in shown]
    handles += [Line2D([], [], color=method_color(opts.naive), marker="o", ms=4, lw=1.0),
                Line2D([], [], color=method_color(opts.baseline), lw=0.9, ls="--")]
    names = shown + [f"{opts.naive} (right)", f"{opts.baseline} (right)"]
    fig.legend(handles, names, loc="outside upper center", ncol=min(len(names), 7), frameon=False)
    name = safe_name("recovered", task, model)
    caption = (
        f"{task} / {model}. Left: the share of the {opts.naive} arm's final-accuracy gap to {opts.baseline} that each "
        f"correction recovers ((acc − acc_{opts.naive}) / (acc_{opts.baseline} − acc_{opts.naive}); 100 % closes it, 0 % "
        f"is no better than {opts.naive}) against the sequence-level mismatch T·KL (mean over steps of response length "
        f"× per-token KL(μ‖π_old), nats, of that arm's runs), with Fieller 95 % intervals over paired seeds "
        f"{OFF_SCALE}; severities where the {opts.naive} gap is within noise have no point (the severity "
        f"table says why). Right: the step-0 training batch accuracy of the {opts.naive} arm's rollout policy μ at each "
        f"severity against {opts.baseline}'s (dashed, band: 95 % t-interval over seeds): a μ that answers worse is a "
        f"worse sampler, a floor no reweighting of its samples removes" + (f"; left: {DODGE_NOTE}." if any(offsets.values()) else ".")
    )
    return FigureFile(name, "recovered", f"Recovered share against T·KL — {task} / {model}", caption,
                      _save(fig, out_dir, name, formats))


def _draw_recovered_left(left: Any, defined: pd.DataFrame, arms: list[str], markers: dict[str, str],
                         seq_kl: np.ndarray, opts: SeverityOptions) -> tuple[dict[tuple[Any, str], list[Any]], list[str]]:
    """The recovered figure's left panel: each correction's recovered share against T·KL; returns the artists
    drawn per arm (to dodge) and the arms shown."""
    shown = []
    drawn: dict[tuple[Any, str], list[Any]] = {}
    for method in arms:
        d = defined[defined["method"] == method].sort_values("seq_kl")
        if d.empty:
            continue
        drawn[(left, method)] = _recovered_bars(left, d, _arm_style(method, markers[method]))
        shown.append(method)
    _recovered_levels(left)
    _kl_axis(left, seq_kl)
    left.set_xlabel("T·KL: response length x KL(μ‖π_old) per token (nats)")
    left.set_ylabel(f"recovered share of the {opts.naive} gap (%)")
    left.set_title("correction vs sequence-level mismatch", pad=4)
    return drawn, shown


def _draw_sampler_right(right: Any, data: pd.DataFrame, seq_kl: np.ndarray, opts: SeverityOptions) -> None:
    """The recovered figure's right panel: the naive arm's step-0 sampler accuracy per severity, the baseline's band."""
    naive = data[data["method"] == opts.naive].sort_values("seq_kl")
    base = data[data["method"] == opts.baseline]
    if not naive.empty:
        x, y = naive["seq_kl"].to_numpy(float), naive["sampler_acc0"].to_numpy(float)
        right.errorbar(x, y, yerr=_err(y, naive["sampler_acc0_lo"].clip(0, 100), naive["sampler_acc0_hi"].clip(0, 100)),
                       color=method_color(opts.naive), marker="o", ms=4, lw=1.0, elinewidth=0.7, capsize=2)
    if not base.empty and np.isfinite(base["sampler_acc0"]).any():
        b = base.iloc[0]
        right.axhline(b["sampler_acc0"], color=method_color(opts.baseline), lw=0.9, ls="--")
        if np.isfinite(b["sampler_acc0_lo"]) and np.isfinite(b["sampler_acc0_hi"]):
            right.axhspan(max(b["sampler_acc0_lo"], 0), min(b["sampler_acc0_hi"], 100), color=method_color(opts.baseline),
                          alpha=0.1, lw=0)
    _kl_axis(right, seq_kl)
    right.set_xlabel("T·KL (nats)")
    right.set_ylabel("step-0 batch accuracy (%)")
    right.set_title("μ's own accuracy (sampler quality)", pad=4)


def plot_tkl(sweep: Sweep, out_dir: Path, opts: SeverityOptions = SeverityOptions(),
             formats: Sequence[str] = ("png", "pdf")):
    """The headline of a sweep along response length (or any sweep with several task/model cells): every
    low-precision cell of every task and model on one T·KL axis. Left, each arm's final-accuracy gap to the baseline
    (paired intervals; defined wherever both ran, so a cell where naive does not separate still shows); middle, the
    recovered share of the naive gap where that gap is resolved; right, mu's own step-0 accuracy beside the
    baseline's in the same cell (a worse sampler versus a biased gradient). None unless the naive arm ran in two
    task/model cells or more."""
    from matplotlib.lines import Line2D

    from .plots import FULL_WIDTH, FigureFile, _save, plt

    frame = tkl_frame(sweep, opts)
    if frame is None:
        return None
    data, low, cells, number = frame
    fig, (gap_ax, rec_ax, mu_ax) = plt.subplots(1, 3, figsize=(FULL_WIDTH, 3.2), layout="constrained", sharex=True,
                                                gridspec_kw={"width_ratios": [3, 3, 2]})
    arms = sorted(low["method"].unique(), key=method_sort_key)
    markers = {m: METHOD_MARKERS[i % len(METHOD_MARKERS)] for i, m in enumerate(arms)}
    offsets = dodge_offsets(low.groupby("cell")["method"].apply(list), arms)
    _draw_tkl(gap_ax, rec_ax, mu_ax, frame, arms, markers, offsets, opts)
    handles = [Line2D([], [], color=method_color(m), marker=markers[m], ms=4, lw=1.0) for m in arms]
    handles.append(Line2D([], [], color=method_color(opts.baseline), marker="s", ms=4, lw=1.0, ls="--"))
    names = list(arms) + [f"{opts.baseline} (right: its own sampler)"]
    fig.legend(handles, names, loc="outside upper center", ncol=min(len(names), 7), frameon=False)
    labels = severity_labels(sweep.runs)
    key = "; ".join(f"#{number[c]} = {c[0]} / {c[1]} @ {labels.get(c[2], c[2])}" for c in cells["cell"])
    fig.supxlabel(textwrap.fill("cells: " + key, 190), fontsize=6, color="0.3")
    # naive_gap = bf16 - naive: a gap to recover is one whose interval lies above 0
    unresolved = [f"#{number[c]}" for c, lo in zip(cells["cell"], cells["naive_gap_lo"]) if not lo > 0]
    caption = (
        f"Every low-precision cell (task, model, rollout severity; numbered on the top axes by the {opts.naive} arm's "
        f"T·KL) on one axis of sequence-level mismatch T·KL (mean over steps of response length × per-token "
        f"KL(μ‖π_old), nats, of each arm's runs). Left: each arm's final-accuracy gap to {opts.baseline} (paired 95 % "
        f"t-intervals over seeds). Middle: the share of the {opts.naive} gap each correction recovers (Fieller 95 % "
        f"intervals, {OFF_SCALE}), only where the {opts.naive} gap is resolved"
        + (f" (not in cell{'s' if len(unresolved) > 1 else ''} {', '.join(unresolved)})" if unresolved else "")
        + f". Right: the step-0 training batch accuracy of the {opts.naive} arm's rollout policy μ and of "
        f"{opts.baseline}'s in the same cell: where μ answers worse, part of the gap is the sampler, which no "
        f"reweighting of its samples removes" + (f"; left and middle: {DODGE_NOTE.replace('severity', 'cell')}."
                                                 if any(offsets.values()) else ".")
    )
    return FigureFile("tkl", "recovered", "Correction against sequence-level mismatch — every cell", caption,
                      _save(fig, out_dir, "tkl", formats))


def tkl_frame(sweep: Sweep, opts: SeverityOptions) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame,
                                                             dict[tuple[str, str, str], int]] | None:
    """The T·KL figure's frame: (the severity summary, its low-precision rows with their `cell` = (task, model,
    severity), the naive arm's cells sorted by T·KL, each cell's number); None when the naive arm ran in fewer than
    two task/model cells."""
    data = severity_summary(sweep, opts)
    if data.empty:
        return None
    low = data[data["method"] != opts.baseline].copy()
    low["cell"] = list(zip(low["task"], low["model"], low["severity"]))
    cells = low[low["method"] == opts.naive].sort_values("seq_kl")
    cells = cells[np.isfinite(cells["seq_kl"])]
    if cells[["task", "model"]].drop_duplicates().shape[0] < 2:
        return None  # one task and model: its own severity and recovered figures say it all
    number = {c: i + 1 for i, c in enumerate(cells["cell"])}  # cells numbered by the naive arm's T·KL
    return data, low[low["cell"].isin(number)], cells, number


def _draw_tkl(gap_ax: Any, rec_ax: Any, mu_ax: Any, frame: tuple, arms: list[str], markers: dict[str, str],
              offsets: dict[str, float], opts: SeverityOptions) -> None:
    """The T·KL figure's three panels (gap to the baseline, recovered share, sampler accuracy) from `tkl_frame`."""
    data, low, cells, number = frame
    gap = f"gap_to_{opts.baseline}"
    drawn: dict[tuple[Any, str], list[Any]] = {}
    for method in arms:
        d = low[low["method"] == method].sort_values("seq_kl")
        style = _arm_style(method, markers[method])
        x, y = d["seq_kl"].to_numpy(float), d[gap].to_numpy(float)
        drawn[(gap_ax, method)] = artists(gap_ax.errorbar(x, y, yerr=_err(y, d[f"{gap}_lo"], d[f"{gap}_hi"]), **style))
        r = d[np.isfinite(d["recovered"])]
        if not r.empty:
            drawn[(rec_ax, method)] = _recovered_bars(rec_ax, r, style)
    gap_ax.axhline(0, color=method_color(opts.baseline), lw=0.9, ls="--", zorder=0)
    _recovered_levels(rec_ax)
    x = cells["seq_kl"].to_numpy(float)
    mu_ax.errorbar(x, cells["sampler_acc0"].to_numpy(float), yerr=_err(
        cells["sampler_acc0"].to_numpy(float), cells["sampler_acc0_lo"].clip(0, 100), cells["sampler_acc0_hi"].clip(0, 100)),
        color=method_color(opts.naive), marker="o", ms=4, lw=1.0, elinewidth=0.7, capsize=2, label=f"μ ({opts.naive})")
    base = data[data["method"] == opts.baseline].drop_duplicates(["task", "model"]).set_index(["task", "model"])
    b = base.reindex([(t, m) for t, m, _ in cells["cell"]])  # the baseline of each cell's task and model
    yb = b["sampler_acc0"].to_numpy(float)
    mu_ax.errorbar(x, yb, yerr=_err(yb, b["sampler_acc0_lo"].clip(0, 100), b["sampler_acc0_hi"].clip(0, 100)),
                   color=method_color(opts.baseline), marker="s", ms=4, lw=1.0, ls="--", elinewidth=0.7, capsize=2)
    ticks = _merge_close(x, [f"#{number[c]}" for c in cells["cell"]])
    for ax in (gap_ax, rec_ax, mu_ax):
        _kl_axis(ax, low["seq_kl"].to_numpy(float))
        _top_ticks(ax, [t for t, _ in ticks], [label for _, label in ticks])
    gap_ax.set_ylabel(f"final accuracy − {opts.baseline} (pp)")
    gap_ax.set_title(f"gap to {opts.baseline}", pad=4)
    rec_ax.set_ylabel(f"recovered share of the {opts.naive} gap (%)")
    rec_ax.set_title("recovered share", pad=4)
    mu_ax.set_ylabel("step-0 batch accuracy (%)")
    mu_ax.set_title("sampler quality", pad=4)
    shift_apart(drawn, offsets)
    rec_ax.set_xlabel("T·KL: response length × KL(μ‖π_old) per token (nats)")


def _arm_style(method: str, marker: str) -> dict[str, Any]:
    """An arm's errorbar style in the recovered-share figures: its colour and marker, a white-edged point."""
    color = method_color(method)
    return dict(color=color, marker=marker, ms=4, lw=1.0, elinewidth=0.7, capsize=2, mfc=color, mec="white", mew=0.4)


def recovered_drawn(d: pd.DataFrame) -> pd.DataFrame:
    """What the recovered-share figures draw for each row of `d` (severity_summary rows), in %: x (T·KL), the share
    (`value`), the point drawn (`y`: the value, or the edge of RECOVERED_RANGE it lies beyond: `off` -1 below, +1
    above, 0 within) and the interval's ends drawn (`lo`, `hi`: clipped to the range; `lo_cut` / `hi_cut` where the
    end lies beyond it). A Fieller interval at a small naive gap runs to thousands of percent; clipping its ends alone
    drew a -241 % point with a bar from -241 to -100, as if its interval ended at -100."""
    low, high = RECOVERED_RANGE
    value = 100 * d["recovered"].to_numpy(float)
    lo, hi = 100 * d["recovered_lo"].to_numpy(float), 100 * d["recovered_hi"].to_numpy(float)
    y = value.clip(low, high)
    return pd.DataFrame({"x": d["seq_kl"].to_numpy(float), "value": value, "y": y,
                         "off": np.sign(value - y).astype(int), "lo": lo.clip(low, high), "hi": hi.clip(low, high),
                         "lo_cut": lo < low, "hi_cut": hi > high})


def _recovered_bars(ax, d: pd.DataFrame, style: dict[str, Any]) -> list[Any]:
    """Recovered shares (%) against T·KL with their Fieller intervals, drawn within RECOVERED_RANGE
    (`recovered_drawn`): a share beyond it is an arrow at the edge pointing off the scale under its value, written
    out; an interval end beyond it ends its bar in an arrowhead. Arrows, not triangle markers: the arms' own markers
    include triangles."""
    p = recovered_drawn(d)
    in_range = (p["off"] == 0).tolist()
    out = artists(ax.errorbar(p["x"], p["y"], yerr=_err(p["y"].to_numpy(), p["lo"], p["hi"]), markevery=in_range,
                              **style))
    color = style["color"]
    for r in p[p["off"] != 0].itertuples(index=False):  # the arrow points from the label to the edge it lies beyond
        out.append(ax.annotate(
            f"{r.value:+.0f} %", (r.x, r.y), xytext=(0, -14 * r.off), textcoords="offset points", ha="center",
            va="top" if r.off > 0 else "bottom", fontsize=6, color=color, zorder=5,
            arrowprops=dict(arrowstyle="-|>", color=color, lw=1.0, mutation_scale=8, shrinkA=1, shrinkB=0)))
    cut = [(r.x, r.lo, -1) for r in p.itertuples(index=False) if r.lo_cut and r.off >= 0]  # off < 0: arrow drawn
    cut += [(r.x, r.hi, 1) for r in p.itertuples(index=False) if r.hi_cut and r.off <= 0]
    for x, y, direction in cut:
        out.append(ax.annotate(
            "", (x, y), xytext=(0, -6 * direction), textcoords="offset points", zorder=5,
            arrowprops=dict(arrowstyle="-|>", color=color, lw=0.7, mutation_scale=6, shrinkA=0, shrinkB=0)))
    return out  # every artist, for shift_apart


def _recovered_levels(ax) -> None:
    """0 % (no better than naive) and 100 % (the naive gap closed)."""
    for level in (0, 100):
        ax.axhline(level, color="0.5", lw=0.7, ls="--" if level else "-", zorder=0)


def _top_ticks(ax, positions, labels, **text: Any) -> None:
    """Labels on a secondary top x axis, small and grey, without minor ticks (on a log axis they crowd it)."""
    from matplotlib.ticker import NullLocator

    top = ax.secondary_xaxis("top")
    top.set_xticks(positions, labels, fontsize=6, color="0.3", **text)
    top.tick_params(axis="x", length=2, pad=1)
    top.xaxis.set_minor_locator(NullLocator())


def _merge_close(x: np.ndarray, labels: list[str], within: float = 0.04) -> list[tuple[float, str]]:
    """Tick positions and labels, where cells closer than `within` of the span share one tick ("#1,#2" at their
    mean): two cells at almost the same T·KL otherwise print their labels over each other. x must be sorted."""
    span = float(np.nanmax(x) - np.nanmin(x)) or 1.0
    groups: list[list[int]] = []
    for i, v in enumerate(x):
        if groups and v - x[groups[-1][0]] < within * span:
            groups[-1].append(i)
        else:
            groups.append([i])
    return [(float(np.mean(x[g])), ",".join(labels[i] for i in g)) for g in groups]


def _label_severities(ax, data: pd.DataFrame) -> dict[str, str]:
    """Name each severity once, on a top axis at its mean mismatch (the mean over its methods' KL), instead of
    beside a point: a label over the data hides points and, where two severities measure close mismatch
    (fp8_e4m3 and int8 per-tensor), labels land on each other. The tick says the precision (numbered where a
    precision has several severities); returns tick -> full label for those whose options it leaves out."""
    at = data.groupby("severity_label")["kl"].mean().dropna().sort_values()
    if at.empty:
        return {}
    precisions = [str(s).split(" (", 1)[0] for s in at.index]
    ticks, full = [], {}
    for i, (label, precision) in enumerate(zip(at.index, precisions)):
        tick = precision if precisions.count(precision) == 1 else f"{precision} #{i + 1}"
        ticks.append(tick)
        if tick != label:
            full[tick] = str(label)
    _top_ticks(ax, at.to_numpy(), ticks, rotation=30, ha="left", rotation_mode="anchor")
    for x in at.to_numpy():
        ax.axvline(x, color="0.85", lw=0.6, zorder=0)
    return full


def kl_lower(lo: pd.Series, kl: np.ndarray) -> pd.Series:
    """The KL intervals' lower ends as drawn: one below 0 (a t-interval over few seeds) stops at half the smallest
    positive KL of the figure, not at 0, which on the log axis is at -infinity (the bar ran to the left edge)."""
    positive = kl[np.isfinite(kl) & (kl > 0)]
    return lo.clip(lower=0.5 * positive.min() if positive.size else 0.0)


def _err(center: np.ndarray, lo: pd.Series, hi: pd.Series) -> np.ndarray | None:
    """Asymmetric error bars [2, n] from CI bounds (0 where undefined); None when no CI is defined."""
    lo_, hi_ = lo.to_numpy(float), hi.to_numpy(float)
    if not (np.isfinite(lo_) | np.isfinite(hi_)).any():
        return None
    return np.vstack([np.nan_to_num(center - lo_, nan=0.0).clip(min=0), np.nan_to_num(hi_ - center, nan=0.0).clip(min=0)])


def _kl_axis(ax, kl: np.ndarray) -> None:
    """Log x when every mismatch is positive and they span a decade or more (bf16 ~1e-5, 4-bit ~1e-1); linear when
    they span less (a log axis would label only its crowded minor ticks); symlog around 0 when some are <= 0."""
    v = kl[np.isfinite(kl)]
    if v.size and (v > 0).all():
        if v.max() >= 10 * v.min():
            ax.set_xscale("log")
    elif v.size and (v > 0).any():
        ax.set_xscale("symlog", linthresh=float(v[v > 0].min()))


def severity_figures(sweep: Sweep, out_dir: Path, opts: SeverityOptions = SeverityOptions(),
                     formats: Sequence[str] = ("png", "pdf"), log: Callable[[str], None] = lambda _: None) -> list:
    """The T·KL figure of every cell (when there are several), then the severity and recovered-share figures of every
    (task, model) whose runs span two severities or more; each logged as it is written, as make_figures does."""
    from .plots import PAPER_STYLE, plt

    out = []

    def keep(f) -> None:
        if f is not None:
            out.append(f)
            log(f"figure {f.name}")

    with plt.rc_context(PAPER_STYLE):
        keep(plot_tkl(sweep, out_dir, opts, formats))
        for task, model in sorted({(r.task, r.model) for r in sweep.runs}):
            keep(plot_severity(sweep, task, model, out_dir, opts, formats))
            keep(plot_recovered(sweep, task, model, out_dir, opts, formats))
    return out


__all__ = ["plot_recovered", "plot_severity", "plot_tkl", "severity_figures", "severity_summary", "severity_table"]
