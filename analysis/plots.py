"""Figures: learning curves, mismatch, method diagnostics, throughput, weight update vs quantization error.

One function per figure; each returns the files it wrote (PNG for the report, PDF for a paper) or nothing
when the sweep has no data for it, so a sweep without quant metrics simply has no quant figure. Sizes and
fonts are for a two-column paper's full text width (7 in), so a figure can go into a paper as it is.
Colours come from `arms.method_color` (declared by each arm): an arm has one colour in every figure.

Curves are the mean over seeds with a 95 % Student-t band of that mean (stats.mean_band; no band where fewer
than 2 seeds have a value), optionally after a centred moving average over steps (`smooth`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import matplotlib

matplotlib.use("Agg")  # no display on cluster nodes; must precede pyplot
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from bench.run.identity import Arm, method_metric  # noqa: E402

from .arms import (BASELINE, method_color, method_diagnostics, arm_labels, arm_linestyle, is_emulated,  # noqa: E402
                   method_sort_key, precision_label, sorted_arms)
from .load import Sweep  # noqa: E402
from .stats import mean_band, rolling_mean  # noqa: E402
from .tables import PART_LABELS, TIME_PARTS, throughput_summary  # noqa: E402

FULL_WIDTH = 7.0  # inches: text width of a two-column paper
PANEL_HEIGHT = 2.0
FORMATS = ("png", "pdf")
PAPER_STYLE = {
    "font.size": 8,
    "axes.titlesize": 8.5,
    "axes.labelsize": 8,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "legend.fontsize": 7.5,
    "lines.linewidth": 1.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.25,
    "grid.linewidth": 0.5,
    "savefig.dpi": 200,
    "pdf.fonttype": 42,  # embed TrueType: editable text, accepted by paper submission systems
}


@dataclass
class FigureFile:
    """A written figure: what the report needs to embed and describe it."""

    name: str
    section: str
    title: str
    caption: str
    paths: dict[str, Path] = field(default_factory=dict)


def safe_name(*parts: str) -> str:
    """A file-name stem from task/model names (which may contain '/', as in hub ids)."""
    return "_".join(re.sub(r"[^A-Za-z0-9_.-]+", "-", p).strip("-") for p in parts)


def _save(fig: plt.Figure, out_dir: Path, name: str, formats: Sequence[str]) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for fmt in formats:
        path = out_dir / f"{name}.{fmt}"
        # No timestamps in the files: regenerating a report from the same runs gives the same bytes.
        meta = {"CreationDate": None} if fmt == "pdf" else {"Software": None} if fmt == "png" else {}
        fig.savefig(path, metadata=meta, bbox_inches="tight")
        paths[fmt] = path
    plt.close(fig)
    return paths


def _runs_matrix(df: pd.DataFrame, value: str = "value") -> tuple[np.ndarray, np.ndarray, list[str]]:
    """[runs, steps] matrix (NaN where a run has no value at a step), its steps and run ids."""
    wide = df.pivot_table(index="run_id", columns="step", values=value, aggfunc="last")
    return wide.columns.to_numpy(dtype=float), wide.to_numpy(dtype=float), list(wide.index)


def _band(ax: plt.Axes, steps: np.ndarray, matrix: np.ndarray, color: str, ls: str, smooth: int, marker: str | None = None,
          bounds: tuple[float, float] = (-np.inf, np.inf), alpha: float = 0.15) -> None:
    """The mean over seeds and its 95 % t-band, the band clipped to `bounds` (`band_bounds`): with 2-3 seeds a
    t-band is wide and would otherwise show an accuracy below 0 %, a negative KL or, on a log axis, a stripe down
    to the bottom of the panel."""
    mean, lo, hi = mean_band(rolling_mean(matrix, smooth))
    ok = np.isfinite(mean)
    ax.plot(steps[ok], mean[ok], color=color, ls=ls, marker=marker, ms=3 if marker else None)
    band = ok & np.isfinite(lo) & np.isfinite(hi)  # no band where fewer than 2 seeds have a value
    if band.any():
        ax.fill_between(steps[band], np.clip(lo[band], *bounds), np.clip(hi[band], *bounds), color=color, alpha=alpha, lw=0)


def band_alpha(n_arms: int) -> float:
    """Fainter bands where many arms share a panel: at 2-3 seeds six overlapping bands hide every line."""
    return 0.15 if n_arms <= 3 else 0.06


#: the range a metric's values take (so the mean over seeds and its band too); others: the range observed
VALID_RANGE = {"eval/accuracy": (0.0, 100.0), "mismatch/kl_k3": (0.0, np.inf), "mismatch/kl_k2": (0.0, np.inf),
               "mismatch/ratio_max": (0.0, np.inf), "mismatch/ratio_min": (0.0, np.inf),
               "mismatch/logp_diff_mean": (0.0, np.inf), "mismatch/is_ess": (0.0, 1.0),
               "mismatch/max_prob_diff": (0.0, 1.0)}


def band_bounds(metric: str, values: np.ndarray, log: bool = False) -> tuple[float, float]:
    """Where a panel's bands are clipped: the metric's valid range (VALID_RANGE; otherwise the range of the values
    the runs logged in the panel, e.g. a task's rewards), and on a log axis not below its smallest value."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    lo, hi = VALID_RANGE.get(metric, (float(v.min()), float(v.max())) if v.size else (-np.inf, np.inf))
    if log and v.size and (v > 0).any():
        lo = max(lo, float(v[v > 0].min()))
    return lo, hi


def _is_log(values: np.ndarray, decades: float = 2.0) -> bool:
    """A log y-axis when positive values span more than `decades` decades (mismatch of bf16 vs fp8 arms
    differs by orders of magnitude; on a linear axis the small one is a flat line at zero)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    return bool(v.size and (v > 0).all() and np.log10(v.max() / v.min()) > decades)


def _legend(fig: plt.Figure, arms: list[Arm], extra: list[tuple[Line2D, str]] = ()) -> None:
    """One legend for the whole figure, above the panels, in the canonical arm order."""
    labels = arm_labels(arms)
    handles = [Line2D([], [], color=method_color(a[0]), ls=arm_linestyle(a, arms), lw=1.8) for a in arms]
    names = [labels[a] for a in arms]
    for h, n in extra:
        handles.append(h)
        names.append(n)
    fig.legend(handles, names, loc="outside upper center", ncol=min(len(names), 8), frameon=False,
               handlelength=1.8, columnspacing=1.2)


def _grid(n_panels: int, ncols: int, height: float = PANEL_HEIGHT, xlabel: str = "training step",
          sharey: bool = False) -> tuple[plt.Figure, list[plt.Axes]]:
    """Panels in a grid, integer step ticks, the x label only under the lowest panel of each column
    (repeating it on every row costs a paper figure a line of height per row and says nothing new)."""
    ncols = max(1, min(ncols, n_panels))
    nrows = int(np.ceil(n_panels / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(FULL_WIDTH, height * nrows + 0.45), layout="constrained",
                             squeeze=False, sharey=sharey)
    flat = list(axes.flat)
    for i, ax in enumerate(flat):
        if i >= n_panels:
            ax.set_visible(False)
            continue
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
        if i + ncols >= n_panels:
            ax.set_xlabel(xlabel)
        if sharey and i % ncols:
            ax.tick_params(labelleft=True)
    return fig, flat[:n_panels]


# Panels where 1 is the no-mismatch value: a dotted reference line makes the distance to it readable.
REFERENCE_ONE = {"mismatch/ratio_max", "mismatch/ratio_min", "mismatch/ratio_mean", "mismatch/is_ess"}


def _metric_panels(
    long: pd.DataFrame,
    panels: list[tuple[str, str, Callable[[pd.Series], pd.Series] | None]],
    arms: list[Arm],
    smooth: int,
    ncols: int,
    xlabel: str = "training step",
) -> plt.Figure | None:
    """A grid with one panel per (metric, title, transform) that has data; None if no panel has any."""
    present = [p for p in panels if (long["metric"] == p[0]).any()]
    if not present:
        return None
    fig, axes = _grid(len(present), ncols, xlabel=xlabel)
    for ax, (metric, title, transform) in zip(axes, present):
        d = long[long["metric"] == metric]
        if transform is not None:
            d = d.assign(value=transform(d["value"]))
        log = _is_log(d["value"].to_numpy())
        bounds = band_bounds(metric, d["value"].to_numpy(), log)
        for arm in arms:
            a = d[(d["method"] == arm[0]) & (d["precision"] == arm[1])]
            if a.empty:
                continue
            steps, m, _ = _runs_matrix(a)
            _band(ax, steps, m, method_color(arm[0]), arm_linestyle(arm, arms), smooth, bounds=bounds,
                  alpha=band_alpha(len(arms)))
        if log:
            ax.set_yscale("log")
        if metric in REFERENCE_ONE:
            ax.axhline(1.0, color="0.5", lw=0.7, ls=":", zorder=0)
        ax.set_title(title)
    return fig


def _subset(sweep: Sweep, task: str, model: str) -> tuple[pd.DataFrame, list[Arm]]:
    long = sweep.metrics
    long = long[(long["task"] == task) & (long["model"] == model)]
    return long, sorted_arms(zip(long["method"], long["precision"]))


def _seed_note(sweep: Sweep, task: str, model: str) -> str:
    counts: dict[str, int] = {}
    for r in sweep.runs:
        if r.task == task and r.model == model:
            counts[r.method] = counts.get(r.method, 0) + 1
    ns = sorted(set(counts.values()))
    return f"{ns[0]} seeds per arm" if len(ns) == 1 else "seeds per arm: " + ", ".join(f"{k} {v}" for k, v in counts.items())


def _smooth_note(smooth: int) -> str:
    return f" Per-step values smoothed with a centred {smooth}-step moving average." if smooth > 1 else ""


# --------------------------------------------------------------------------------------------- figures
def plot_curves(sweep: Sweep, task: str, model: str, out_dir: Path, smooth: int = 1, formats: Sequence[str] = FORMATS) -> FigureFile | None:
    """Training reward per step and eval accuracy per evaluation, one line per arm."""
    long, arms = _subset(sweep, task, model)
    ev = sweep.evals
    ev = ev[(ev["task"] == task) & (ev["model"] == model)] if not ev.empty else ev
    has_eval = not ev.empty and "eval/accuracy" in ev and ev["eval/accuracy"].notna().any()
    has_reward = (long["metric"] == "reward/mean").any()
    if not (has_eval or has_reward):
        return None
    arms = sorted_arms(arms + list(zip(ev["method"], ev["precision"]))) if has_eval else arms
    fig, axes = _grid(int(has_reward) + int(has_eval), 2, height=2.3)
    axes = list(axes)
    diverged = {r.run_id for r in sweep.runs if r.status == "diverged"}
    if has_reward:
        ax = axes.pop(0)
        d = long[long["metric"] == "reward/mean"]
        bounds = band_bounds("reward/mean", d["value"].to_numpy())
        for arm in arms:
            a = d[(d["method"] == arm[0]) & (d["precision"] == arm[1])]
            if a.empty:
                continue
            steps, m, ids = _runs_matrix(a)
            color = method_color(arm[0])
            _band(ax, steps, m, color, arm_linestyle(arm, arms), smooth, bounds=bounds, alpha=band_alpha(len(arms)))
            # Mark where a diverged seed stopped: otherwise the band just thins out without explanation.
            # (At the seed's smoothed value, so the marker sits on the same scale as the curves.)
            sm = rolling_mean(m, smooth)
            for i, rid in enumerate(ids):
                if rid in diverged:
                    last = np.flatnonzero(np.isfinite(sm[i]))[-1]
                    ax.plot(steps[last], sm[i, last], marker="x", color=color, ms=6, mew=1.5, ls="none")
        ax.set_title("training reward (reward/mean)")
        ax.set_ylabel("mean reward")
    if has_eval:
        ax = axes.pop(0)
        e = ev.dropna(subset=["eval/accuracy"]).assign(value=lambda x: 100 * x["eval/accuracy"])
        for arm in arms:
            a = e[(e["method"] == arm[0]) & (e["precision"] == arm[1])]
            if a.empty:
                continue
            steps, m, _ = _runs_matrix(a)
            _band(ax, steps, m, method_color(arm[0]), arm_linestyle(arm, arms), 1, marker="o",
                  bounds=VALID_RANGE["eval/accuracy"], alpha=band_alpha(len(arms)))
        ax.set_title("eval accuracy (eval/accuracy)")
        ax.set_ylabel("accuracy (%)")
    extra = []
    stopped = diverged & set(long["run_id"])
    if stopped:
        extra.append((Line2D([], [], marker="x", color="0.3", ls="none", ms=6, mew=1.5), "diverged seed stops"))
    _legend(fig, arms, extra)
    name = safe_name("curves", task, model)
    caption = (
        f"{task} / {model}: training reward per step (left) and eval accuracy (right), mean over seeds with a 95 % "
        f"t-interval band of the mean ({_seed_note(sweep, task, model)}), clipped to the valid range (accuracy "
        f"0-100 %, reward: the range the runs' rewards take).{_smooth_note(smooth)}"
    )
    if stopped:
        caption += (" × marks where a diverged seed stopped; later points average the remaining seeds, whereas the "
                    "tables count the diverged seed's last eval as its final result.")
    return FigureFile(name, "curves", f"Learning curves — {task} / {model}", caption, _save(fig, out_dir, name, formats))


def plot_mismatch(sweep: Sweep, task: str, model: str, out_dir: Path, smooth: int = 1, formats: Sequence[str] = FORMATS) -> FigureFile | None:
    """Rollout-training mismatch over training: KL(μ‖π_old), π_old/μ extremes, |Δ log p|, IS ESS, max prob gap."""
    long, arms = _subset(sweep, task, model)
    # k3 is the non-negative, low-variance KL estimator (docs/arms.md §7); k1 is the fallback for runs without it.
    kl = "mismatch/kl_k3" if (long["metric"] == "mismatch/kl_k3").any() else "mismatch/kl_k1"
    panels = [
        (kl, f"KL(μ‖π_old) per token ({kl.rsplit('_', 1)[-1]}, nats)", None),
        ("mismatch/ratio_max", "max π_old/μ (ratio)", None),
        ("mismatch/ratio_min", "min π_old/μ (ratio)", None),
        ("mismatch/logp_diff_mean", "mean |Δ log p| per token (nats)", None),
        ("mismatch/is_ess", "IS effective sample size (fraction)", None),
        ("mismatch/max_prob_diff", "max |π_old − μ| (probability)", None),
    ]
    fig = _metric_panels(long, panels, arms, smooth, ncols=3)
    if fig is None:
        return None
    _legend(fig, arms)
    name = safe_name("mismatch", task, model)
    caption = (
        f"{task} / {model}: rollout–training mismatch per step (`mismatch/*`, docs/arms.md §7), mean over seeds "
        f"with a 95 % t-interval band ({_seed_note(sweep, task, model)}), clipped to the metric's valid range. Axes "
        f"spanning several decades are logarithmic.{_smooth_note(smooth)}"
    )
    return FigureFile(name, "mismatch", f"Mismatch — {task} / {model}", caption, _save(fig, out_dir, name, formats))


# (methods the diagnostic belongs to, key under method/<name>/, panel title)
def diagnostics_of(methods: Iterable[str]) -> list[tuple[tuple[str, ...], str, str]]:
    """(methods, key, title) per panel: the diagnostics each arm declares, methods sharing a panel when they
    declare the same key and title (acr, acr_uaq)."""
    panels: dict[tuple[str, str], list[str]] = {}
    for m in sorted(set(methods), key=method_sort_key):
        for key, title in method_diagnostics(m).items():
            panels.setdefault((key, title), []).append(m)
    return [(tuple(ms), key, title) for (key, title), ms in panels.items()]


def plot_diagnostics(sweep: Sweep, task: str, model: str, out_dir: Path, smooth: int = 1, formats: Sequence[str] = FORMATS) -> FigureFile | None:
    """Each arm's own control signal, one panel per diagnostic, only the arms that log it."""
    long, arms = _subset(sweep, task, model)
    present = []
    for methods, key, title in diagnostics_of(long["method"].unique()):
        sub = long[long["method"].isin(methods) & (long["metric"] == long["method"].map(lambda m: method_metric(m, key)))]
        if not sub.empty:
            present.append((sub, title))
    if not present:
        return None
    fig, axes = _grid(len(present), 4 if len(present) >= 4 else len(present), height=2.0)
    shown: list[Arm] = []
    for ax, (sub, title) in zip(axes, present):
        sub_arms = sorted_arms(zip(sub["method"], sub["precision"]))
        log = _is_log(sub["value"].to_numpy())
        bounds = band_bounds("", sub["value"].to_numpy(), log)  # a diagnostic's own range: the values observed
        for arm in sub_arms:
            a = sub[(sub["method"] == arm[0]) & (sub["precision"] == arm[1])]
            steps, m, _ = _runs_matrix(a)
            _band(ax, steps, m, method_color(arm[0]), arm_linestyle(arm, arms), smooth, bounds=bounds)
        shown += sub_arms
        if log:
            ax.set_yscale("log")
        ax.set_title(title)
    _legend(fig, sorted_arms(shown))
    name = safe_name("diagnostics", task, model)
    caption = (
        f"{task} / {model}: each arm's own diagnostic (`method/<arm>/*`, declared by the arm): "
        f"{', '.join(title for _, title in present)}; mean over seeds with a 95 % t-interval band.{_smooth_note(smooth)}"
    )
    return FigureFile(name, "diagnostics", f"Method diagnostics — {task} / {model}", caption, _save(fig, out_dir, name, formats))


PART_COLORS = {"rollout_s": "#4C72B0", "sync_s": "#DD8452", "recompute_s": "#8172B3", "train_s": "#55A868", "other_s": "#BBBBBB"}


def plot_throughput(sweep: Sweep, model: str, out_dir: Path, baseline: str = BASELINE, warmup: int = 1,
                    formats: Sequence[str] = FORMATS) -> FigureFile | None:
    """Rollout tokens/s per arm (with speed-up vs baseline) and where a training step's time goes: generation,
    weight sync + re-quantization, recompute, optimizer steps; one row per arm, engine and device."""
    data = throughput_frame(sweep, model, baseline, warmup)
    if data is None:
        return None
    arms = list(zip(data["method"], data["precision"]))
    tasks = list(data["task"])
    y = np.arange(len(arms))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(FULL_WIDTH, 0.28 * len(arms) + 1.1), layout="constrained")
    _draw_rollout_speed(ax1, data, y, arms, baseline)
    _draw_step_split(fig, ax2, data, y)
    ylabels = _throughput_labels(data)
    for ax in (ax1, ax2):
        for yi in range(1, len(tasks)):
            if tasks[yi] != tasks[yi - 1]:  # a rule between two tasks' blocks
                ax.axhline(yi - 0.5, color="0.6", lw=0.6)
        ax.set_yticks(y, ylabels)
        ax.grid(axis="y", visible=False)
        for tick, arm in zip(ax.get_yticklabels(), arms):
            tick.set_color(method_color(arm[0]))
    ax2.set_yticklabels([])
    fig.suptitle(f"throughput — {model}", fontsize=9)
    name = safe_name("throughput", model)
    caption = (
        f"{model}: rollout tokens/s per task, arm and rollout precision (mean ± std over seeds; label = speed-up vs "
        f"{baseline} on the same task, engine and device: compare a bar only with those of its own task, whose "
        f"responses have the same length scale) and the mean time split of a training step (generation, weight sync + "
        f"re-quantization, recompute, train), in seconds; steps < {warmup} excluded as warm-up. 'emulated': a "
        "quantized precision on a CPU (fake quantization, fp32 arithmetic), whose speed says nothing about hardware."
    )
    return FigureFile(name, "throughput", f"Throughput — {model}", caption, _save(fig, out_dir, name, formats))


def throughput_frame(sweep: Sweep, model: str, baseline: str, warmup: int) -> pd.DataFrame | None:
    """The throughput figure's rows, top to bottom; None when the model logged no throughput."""
    data = throughput_summary(sweep, baseline, warmup)
    data = data[data["model"] == model]
    if data.empty or data[["tokens_per_s_mean", "step_s"]].isna().all().all():
        return None
    # rows as throughput_summary orders them (engine/device, task, then canonical arm order), top to bottom: one
    # row per task and arm, so that a bar is compared with the bars of its own task only (like with like)
    return data.iloc[::-1].reset_index(drop=True)


def _throughput_labels(data: pd.DataFrame) -> list[str]:
    """"method (PRECISION)" always: this figure is per arm *and* precision, so the precision is never redundant;
    the task where the figure has several, the engine/device only where it mixes several."""
    arms = list(zip(data["method"], data["precision"]))
    runtimes = list(zip(data["engine"], data["device"]))
    mixed = len(set(runtimes)) > 1
    tasks = list(data["task"])
    multi_task = len(set(tasks)) > 1
    return [(f"{t} · " if multi_task else "") + f"{m} ({precision_label(p)}{', emulated' if is_emulated(p, d) else ''})"
            + (f" · {e}/{d}" if mixed else "") for t, (m, p), (e, d) in zip(tasks, arms, runtimes)]


def _draw_rollout_speed(ax1: Any, data: pd.DataFrame, y: np.ndarray, arms: list[tuple[str, str]], baseline: str) -> None:
    """The throughput figure's left panel: rollout tokens/s per row, labelled with the speed-up vs the baseline."""
    tps = data["tokens_per_s_mean"].to_numpy()
    err = np.nan_to_num(data["tokens_per_s_std"].to_numpy())
    ax1.barh(y, tps, color=[method_color(a[0]) for a in arms], height=0.65)
    spread = err > 0  # a zero-width error bar draws as a stray tick at the bar's end
    if spread.any():
        ax1.errorbar(tps[spread], y[spread], xerr=err[spread], fmt="none", ecolor="0.2", elinewidth=0.8, capsize=2)
    for yi, (v, e, s) in enumerate(zip(tps, err, data["rollout_speedup"].to_numpy())):
        if np.isfinite(v) and np.isfinite(s):
            ax1.text(v + e, yi, f" {s:.2f}×", va="center", ha="left", fontsize=7)
    ax1.set_xlim(0, np.nanmax(tps + err) * 1.25 if np.isfinite(tps).any() else 1)
    ax1.set_title(f"rollout tokens/s (× vs {baseline})")
    ax1.set_xlabel("rollout tokens / s")


def _draw_step_split(fig: Any, ax2: Any, data: pd.DataFrame, y: np.ndarray) -> None:
    """The throughput figure's right panel: a training step's time, stacked by part, with its legend."""
    left = np.zeros(len(y))
    for part in [*TIME_PARTS, "other_s"]:
        vals = np.nan_to_num(data[part].to_numpy())
        if not vals.any():
            continue
        ax2.barh(y, vals, left=left, color=PART_COLORS[part], height=0.65, label=PART_LABELS[part])
        left += vals
    for yi, total in enumerate(left):
        if total > 0:
            ax2.text(total, yi, f" {total:.2f} s", va="center", ha="left", fontsize=7)
    ax2.set_xlim(0, left.max() * 1.2 if left.max() > 0 else 1)
    ax2.set_title("time per training step")
    ax2.set_xlabel("seconds")
    if left.max() > 0:
        # Below the whole figure: a legend inside the axes covers bars, one anchored to the axes collides
        # with the x label when there are few arms (short axes).
        fig.legend(*ax2.get_legend_handles_labels(), loc="outside lower center", frameon=False, ncol=5, handlelength=1.2)
    else:
        ax2.text(0.5, 0.5, "no time/* split logged", transform=ax2.transAxes, ha="center", va="center", color="0.4")


def plot_quant(sweep: Sweep, task: str, model: str, out_dir: Path, smooth: int = 1, formats: Sequence[str] = FORMATS) -> FigureFile | None:
    """QuRL Eq. 13–14 per layer type: normalized weight update (solid) vs normalized quantization error (dashed).

    When the update is orders of magnitude below the quantization error, the quantized rollout model barely
    follows training; that gap is what UAQ is meant to close.
    """
    long, _ = _subset(sweep, task, model)
    q = long[long["metric"].str.startswith("quant/")]
    if q.empty:
        return None
    q = q.assign(kind=q["metric"].str.split("/").str[1], layer=q["metric"].str.split("/").str[2])
    order = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    layers = sorted(q["layer"].dropna().unique(), key=lambda x: (order.index(x) if x in order else len(order), x))
    arms = sorted_arms(zip(q["method"], q["precision"]))
    # Shared y: the point of the figure is the gap between update and error, compared across layer types.
    fig, axes = _grid(len(layers), 4, height=1.75, sharey=True)
    for ax, layer in zip(axes, layers):
        d = q[q["layer"] == layer]
        vals = d["value"].to_numpy()
        log = bool((vals[np.isfinite(vals)] > 0).all())
        bounds = band_bounds("", vals, log)  # both ratios are >= 0: the observed range, above 0 on the log axis
        for arm in arms:
            for kind, ls in (("weight_update", "-"), ("quant_error", "--")):
                a = d[(d["method"] == arm[0]) & (d["precision"] == arm[1]) & (d["kind"] == kind)]
                if not a.empty:
                    steps, m, _ = _runs_matrix(a)
                    _band(ax, steps, m, method_color(arm[0]), ls, smooth, bounds=bounds)
        if log:
            ax.set_yscale("log")
        ax.set_title(layer)
    extra = [(Line2D([], [], color="0.3", ls="-"), "weight update (Eq. 13)"),
             (Line2D([], [], color="0.3", ls="--"), "quant. error (Eq. 14)")]
    _legend(fig, arms, extra)
    name = safe_name("quant", task, model)
    caption = (
        f"{task} / {model}: normalized weight update ‖θ_(t+1) − θ_t‖²/‖θ_t‖² (solid, QuRL Eq. 13) vs normalized "
        "quantization error ‖Q(θ_t) − θ_t‖²/‖θ_t‖² (dashed, Eq. 14) per layer type, for the runs that log them "
        f"(`quant/*`); mean over seeds.{_smooth_note(smooth)}"
    )
    return FigureFile(name, "quant", f"Weight update vs quantization error — {task} / {model}", caption,
                      _save(fig, out_dir, name, formats))


def make_figures(sweep: Sweep, out_dir: Path, smooth: int = 1, baseline: str = BASELINE, warmup: int = 1,
                 formats: Sequence[str] = FORMATS, log: Callable[[str], None] = lambda _: None) -> list[FigureFile]:
    """Every figure the sweep has data for, in report order (curves, mismatch, diagnostics, throughput, quant)."""
    out: list[FigureFile] = []
    with plt.rc_context(PAPER_STYLE):
        pairs = sorted({(r.task, r.model) for r in sweep.runs})
        for fn in (plot_curves, plot_mismatch, plot_diagnostics):
            for task, model in pairs:
                f = fn(sweep, task, model, out_dir, smooth=smooth, formats=formats)
                if f is not None:
                    out.append(f)
                    log(f"figure {f.name}")
        for model in sweep.models:
            f = plot_throughput(sweep, model, out_dir, baseline=baseline, warmup=warmup, formats=formats)
            if f is not None:
                out.append(f)
                log(f"figure {f.name}")
        for task, model in pairs:
            f = plot_quant(sweep, task, model, out_dir, smooth=smooth, formats=formats)
            if f is not None:
                out.append(f)
                log(f"figure {f.name}")
    return out
