"""The naive gap split in two by the on-policy control (`--control`, default `matched`: the trainer at the rollout's
precision, so pi_old = mu; bench/methods/matched.py), in every cell where the baseline, naive and the control ran.

Per cell (task, model, rollout severity), paired by seed, in pp of final accuracy (and of AUC):

    total gap                   bf16 − naive      what the low-precision rollout costs uncorrected
    sampler-and-capacity cost   bf16 − control    what the quantized network costs as a sampler and a learner, with no
                                                  mismatch at all: no reweighting of mu's samples can recover it
    mismatch cost               control − naive   what the off-policy gradient costs: all a correction can recover

total = sampler + mismatch, seed by seed. A correction's recovered share is reported against both:

    share of the total gap      (arm − naive) / (bf16 − naive)       as the severity table does
    share of the mismatch cost  (arm − naive) / (control − naive)    100 % = as good as training on-policy

each with Fieller's interval over paired seeds (analysis.stats.ratio_interval), defined only where its denominator is
resolved above 0 (else "n/a" and why, as for the recovered share: analysis/severity.py). The costs' p-values and
Holm-adjusted p come from analysis/comparisons.py (the mismatch cost is the control's row of the "vs naive" family;
the sampler cost is the control's row of the "vs baseline" family, sign reversed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from .arms import method_color, method_sort_key
from .inference import diff_test
from .load import Sweep
from .runs import SeverityOptions, baseline_group, run_rows, severity_labels
from .severity import METHOD_MARKERS, NAIVE_BETTER, NO_NAIVE_GAP, OFF_SCALE, _err, _recovered_levels, recovered_drawn
from .stats import NAN_INTERVAL, Interval, ratio_interval
from .tables import Table, fmt_ci, fmt_share

NO_MISMATCH_COST = "mismatch cost within noise"
CONTROL_WORSE = "control worse than naive"
COSTS = ("total", "sampler", "mismatch")
COST_NAMES = {"total": "total gap", "sampler": "sampler-and-capacity cost", "mismatch": "mismatch cost"}


def _share(a: pd.DataFrame, naive: pd.DataFrame, ref: pd.DataFrame, denominator: Interval, col: str,
           worse: str, within: str) -> tuple[Interval, str]:
    """(arm − naive) / (ref − naive) with Fieller's interval, or NaN and why (the denominator is not resolved > 0)."""
    if min(len(a), len(naive), len(ref)) < 2:
        return NAN_INTERVAL, "fewer than 2 seeds"
    if denominator.contains(0.0):
        return NAN_INTERVAL, within
    if denominator.hi < 0:
        return NAN_INTERVAL, worse
    iv = ratio_interval(a[col], naive[col], ref[col], (list(a["seed"]), list(naive["seed"]), list(ref["seed"])))
    return iv, ("interval unbounded" if iv.note == "unbounded" else "")


def decomposition(sweep: Sweep, opts: SeverityOptions = SeverityOptions(), endpoint_col: str = "final_acc") -> pd.DataFrame:
    """One row per (cell, method at that cell other than the baseline): the cell's three costs (identical on every row
    of the cell) and the method's shares of the total gap and of the mismatch cost. Empty when no cell has all three
    of baseline, naive and control."""
    runs = run_rows(sweep, opts.collapse_k)
    labels = severity_labels(sweep.runs)
    rows: list[dict[str, Any]] = []
    for (model, task), g in runs.groupby(["model", "task"], sort=True):
        for severity in g.groupby("severity")["kl"].mean().sort_values(kind="stable").index:
            here = g[g["severity"] == severity]
            base, note = baseline_group(g, severity, opts.baseline)
            naive, control = (here[here["method"] == m] for m in (opts.naive, opts.control))
            if note or base.empty or naive.empty or control.empty:
                continue
            # the three costs on the seeds all three share, so that total = sampler + mismatch seed by seed (and n
            # is one number per cell); a seed one of them lacks would otherwise turn a test unpaired (Welch)
            common = set(base["seed"]) & set(naive["seed"]) & set(control["seed"])
            if len(common) < 2:
                continue
            base, naive, control = (x[x["seed"].isin(common)] for x in (base, naive, control))
            costs = {"total": (base, naive), "sampler": (base, control), "mismatch": (control, naive)}
            tests = {k: diff_test(x[endpoint_col], y[endpoint_col], list(x["seed"]), list(y["seed"]))
                     for k, (x, y) in costs.items()}
            cell: dict[str, Any] = {"model": model, "task": task, "severity": severity,
                                    "severity_label": labels.get(severity, severity)}
            for k, t in tests.items():
                iv = t.interval
                cell |= {f"{k}_cost": iv.value, f"{k}_cost_lo": iv.lo, f"{k}_cost_hi": iv.hi, f"{k}_cost_n": iv.n,
                         f"{k}_cost_ci": iv.method, f"{k}_cost_p": t.p}
            for method in sorted(here["method"].unique(), key=method_sort_key):
                if method == opts.baseline:
                    continue
                a = here[here["method"] == method]
                if method in (opts.naive, opts.control):
                    total = mismatch = NAN_INTERVAL
                    why_total = why_mismatch = ""
                else:
                    total, why_total = _share(a, naive, base, tests["total"].interval, endpoint_col, NAIVE_BETTER,
                                              NO_NAIVE_GAP)
                    mismatch, why_mismatch = _share(a, naive, control, tests["mismatch"].interval, endpoint_col,
                                                    CONTROL_WORSE, NO_MISMATCH_COST)
                rows.append(cell | {"method": method, "n_seeds": len(a),
                                    "share_total": total.value, "share_total_lo": total.lo,
                                    "share_total_hi": total.hi, "share_total_n": total.n, "share_total_note": why_total,
                                    "share_mismatch": mismatch.value, "share_mismatch_lo": mismatch.lo,
                                    "share_mismatch_hi": mismatch.hi, "share_mismatch_n": mismatch.n,
                                    "share_mismatch_note": why_mismatch})
    return pd.DataFrame(rows)


def decomposition_table(sweep: Sweep, opts: SeverityOptions = SeverityOptions()) -> Table:
    """The costs of each cell (first row of the cell) and each arm's recovered shares of the total gap and of the
    mismatch cost, final accuracy."""
    data = decomposition(sweep, opts)
    rows, prev = [], None
    for r in data.itertuples(index=False):
        d = r._asdict()
        key = (r.model, r.task, r.severity)
        first = key != prev
        row = {"Task / model": f"{r.task} / {r.model}" if first else "", "Severity": r.severity_label if first else ""}
        for k, title in (("total", f"total gap {opts.baseline} − {opts.naive}"),
                         ("sampler", f"sampler & capacity {opts.baseline} − {opts.control}"),
                         ("mismatch", f"mismatch {opts.control} − {opts.naive}")):
            row[f"{title} (pp)"] = fmt_ci(d[f"{k}_cost"], d[f"{k}_cost_lo"], d[f"{k}_cost_hi"], signed=True,
                                          n=d[f"{k}_cost_n"]) if first else ""
        row |= {"Method": r.method,
                "share of the total gap": fmt_share(r.share_total, r.share_total_lo, r.share_total_hi,
                                                      r.share_total_n, r.share_total_note),
                "share of the mismatch cost": fmt_share(r.share_mismatch, r.share_mismatch_lo, r.share_mismatch_hi,
                                                          r.share_mismatch_n, r.share_mismatch_note)}
        rows.append(row)
        prev = key
    caption = (
        f"The naive gap split by the on-policy control ({opts.control}: the trainer at the rollout's precision, so "
        f"π_old = μ), per cell, final eval accuracy, paired by seed (95 % paired t-intervals, n pairs): total gap "
        f"{opts.baseline} − {opts.naive} = sampler-and-capacity cost ({opts.baseline} − {opts.control}: the quantized "
        f"network as a sampler and learner, which no correction can recover) + mismatch cost ({opts.control} − "
        f"{opts.naive}: the off-policy gradient, all a correction can recover). Each correction's recovered share "
        f"(arm − {opts.naive}) / denominator of the total gap and of the mismatch cost, with Fieller 95 % intervals; "
        f"'n/a' where the denominator's interval is not above 0. p-values and their Holm correction: the paired "
        f"comparisons table."
    )
    display = pd.DataFrame(rows) if rows else pd.DataFrame(columns=["Method"])
    return Table("decomposition", data, display, caption)


def plot_decomposition(sweep: Sweep, out_dir: Path, opts: SeverityOptions = SeverityOptions(),
                       formats: Sequence[str] = ("png", "pdf")):
    """The headline figure where a control ran: left, each cell's total gap and its two parts (pp, paired 95 %
    intervals); right, each correction's recovered share of the total gap (filled) and of the mismatch cost (open),
    Fieller 95 % intervals. None without a cell where the baseline, naive and the control ran."""
    from .plots import FULL_WIDTH, FigureFile, _save, plt

    data = decomposition(sweep, opts)
    if data.empty:
        return None
    cells = data.drop_duplicates(["model", "task", "severity"]).reset_index(drop=True)
    multi = cells[["model", "task"]].drop_duplicates().shape[0] > 1
    names = [(f"{c.task}/{c.model} @ " if multi else "") + str(c.severity_label) for c in cells.itertuples()]
    fig, (left, right) = plt.subplots(1, 2, figsize=(FULL_WIDTH, 3.2), layout="constrained",
                                      gridspec_kw={"width_ratios": [2, 3]})
    _draw_costs(left, cells, names, opts)
    _draw_shares(right, data, cells, names, multi, opts)
    caption = (
        f"Left: per cell, the final-accuracy gap {opts.baseline} − {opts.naive} and its two parts, the sampler-and-"
        f"capacity cost {opts.baseline} − {opts.control} and the mismatch cost {opts.control} − {opts.naive} (the "
        f"on-policy control {opts.control} trains with π_old = μ), paired 95 % t-intervals over seeds. Right: each "
        f"correction's recovered share (arm − {opts.naive}) of the total gap (filled) and of the mismatch cost (open), "
        f"Fieller 95 % intervals, {OFF_SCALE}; no point where the denominator is not resolved above 0."
    )
    return FigureFile("decomposition", "decomposition", "The naive gap: sampler against mismatch", caption,
                      _save(fig, out_dir, "decomposition", formats))


def _draw_costs(left: Any, cells: pd.DataFrame, names: list[str], opts: SeverityOptions) -> None:
    """The decomposition figure's left panel: per cell, the total gap and its two costs as bars (paired intervals)."""
    width = 0.26
    colors = {"total": method_color(opts.naive), "sampler": "0.55", "mismatch": method_color(opts.control)}
    for j, k in enumerate(COSTS):
        x = np.arange(len(cells)) + (j - 1) * width
        y = cells[f"{k}_cost"].to_numpy(float)
        left.bar(x, y, width, color=colors[k], alpha=0.85, label=COST_NAMES[k])
        left.errorbar(x, y, yerr=_err(y, cells[f"{k}_cost_lo"], cells[f"{k}_cost_hi"]), fmt="none", ecolor="0.15",
                      elinewidth=0.8, capsize=2)
    left.axhline(0, color="0.4", lw=0.7)
    left.set_xticks(np.arange(len(cells)), names, rotation=20 if len(cells) > 2 else 0, ha="right" if len(cells) > 2 else "center")
    left.set_ylabel("final accuracy gap (pp)")
    left.set_title(f"{opts.baseline} − {opts.naive} = ({opts.baseline} − {opts.control}) + ({opts.control} − "
                   f"{opts.naive})", pad=4, fontsize=7)
    left.legend(frameon=False, fontsize=6, loc="best")


def _draw_shares(right: Any, data: pd.DataFrame, cells: pd.DataFrame, names: list[str], multi: bool,
                 opts: SeverityOptions) -> None:
    """The decomposition figure's right panel: each correction's recovered share of the total gap (filled) and of
    the mismatch cost (open), per cell."""
    from matplotlib.lines import Line2D

    arms = [m for m in sorted(data["method"].unique(), key=method_sort_key) if m not in (opts.naive, opts.control)]
    markers = {m: METHOD_MARKERS[i % len(METHOD_MARKERS)] for i, m in enumerate(arms)}
    slot = 0.8 / max(1, len(arms))
    for i, method in enumerate(arms):
        d = data[data["method"] == method].reset_index(drop=True)
        pos = np.array([names.index((f"{r.task}/{r.model} @ " if multi else "") + str(r.severity_label))
                        for r in d.itertuples()], dtype=float) - 0.4 + slot * (i + 0.5)
        for col, dx, fill in (("share_total", -slot / 5, True), ("share_mismatch", slot / 5, False)):
            ok = np.isfinite(d[col].to_numpy(float))
            if not ok.any():
                continue
            shown = recovered_drawn(d[ok].rename(columns={col: "recovered", f"{col}_lo": "recovered_lo",
                                                         f"{col}_hi": "recovered_hi"}).assign(seq_kl=pos[ok] + dx))
            color = method_color(method)
            right.errorbar(shown["x"], shown["y"], yerr=_err(shown["y"].to_numpy(), shown["lo"], shown["hi"]),
                           fmt=markers[method], color=color, mfc=color if fill else "white", mec=color, ms=4,
                           elinewidth=0.7, capsize=2)
            for r in shown[shown["off"] != 0].itertuples():
                right.annotate(f"{r.value:+.0f} %", (r.x, r.y), fontsize=5, color=color, ha="center",
                               va="top" if r.off > 0 else "bottom")
    _recovered_levels(right)
    right.set_xticks(np.arange(len(cells)), names)
    right.set_xlim(-0.6, len(cells) - 0.4)
    right.set_ylabel(f"recovered share (%)")
    right.set_title("share of the total gap (filled) and of the mismatch cost (open)", pad=4, fontsize=7)
    handles = [Line2D([], [], color=method_color(m), marker=markers[m], ls="none", ms=4) for m in arms]
    if handles:
        right.legend(handles, arms, frameon=False, fontsize=6, loc="best")


__all__ = ["COSTS", "COST_NAMES", "decomposition", "decomposition_table", "plot_decomposition"]
