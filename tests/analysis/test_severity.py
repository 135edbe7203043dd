"""The severity analysis on a synthetic ladder (synth.SEVERITY_RUNS) whose cells are computed by hand."""

from __future__ import annotations

import io
import math
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.cli import main
from analysis.collapse import collapse_step
from analysis.load import load_sweeps, merge
from analysis.runs import SeverityOptions, eval_auc, has_severity_axis, run_rows, severity_labels
from analysis.severity import (
    NAIVE_BETTER,
    NO_NAIVE_GAP,
    kl_lower,
    RECOVERED_RANGE,
    _arm_style,
    _recovered_bars,
    plot_recovered,
    plot_tkl,
    recovered_drawn,
    severity_figures,
    severity_summary,
    severity_table,
)
from scipy import stats as sps

from .synth import make_severity_sweep, write_run


@pytest.fixture
def sev_sweep(tmp_path: Path):
    return load_sweeps([make_severity_sweep(tmp_path / "ladder")])


def cell(summary, severity_prefix: str, method: str):
    rows = summary[summary["severity"].str.startswith(severity_prefix + ";") & (summary["method"] == method)]
    assert len(rows) == 1, (severity_prefix, method)
    return rows.iloc[0]


# --------------------------------------------------------------------------------------------- per run
def test_auc_is_the_time_averaged_curve():
    # steps 0, 4, 8, 12 and 0.40, 0.35, 0.30, 0.34: 4 * (0.375 + 0.325 + 0.32) / 12 = 0.34
    assert math.isclose(eval_auc([0, 4, 8, 12], [0.40, 0.35, 0.30, 0.34]), 0.34)
    assert math.isclose(eval_auc([0, 10], [0.2, 0.6]), 0.4)
    assert eval_auc([5], [0.7]) == 0.7 and math.isnan(eval_auc([], []))


def test_collapse_needs_k_consecutive_evals_below_step_0():
    steps = [0, 4, 8, 12, 16]
    assert collapse_step(steps, [0.40, 0.35, 0.30, 0.34, 0.5], 3) == 4
    assert collapse_step(steps, [0.40, 0.42, 0.35, 0.32, 0.5], 3) is None  # only 2 in a row
    assert collapse_step(steps, [0.40, 0.42, 0.35, 0.32, 0.5], 2) == 8
    assert collapse_step(steps, [0.40, 0.35, 0.41, 0.35, 0.30], 2) == 12  # a recovery restarts the count
    assert collapse_step(steps, [0.40, 0.40, 0.40, 0.40, 0.40], 1) is None  # equal is not below
    assert collapse_step([4, 8, 12, 16], [0.4, 0.3, 0.2, 0.1], 2) is None  # no step-0 value to compare with


def test_run_rows_hold_hand_values(sev_sweep):
    rows = run_rows(sev_sweep, k=3)
    r = rows[(rows["method"] == "naive") & (rows["precision"] == "int4") & (rows["seed"] == 2)].iloc[0]
    assert math.isclose(r["auc"], 34.0) and math.isclose(r["final_acc"], 34.0)
    assert r["collapsed"] and r["collapse_step"] == 4
    assert math.isclose(r["kl"], 0.1 * 1.1)  # kl_k3 logged constant at every step
    assert math.isclose(r["seq_kl"], 5.0 * 0.1 * 1.1)  # x the response length, 5 tokens at every step
    run = next(x for x in sev_sweep.runs if x.run_id == r["run_id"])
    assert math.isclose(r["sampler_acc0"], 100 * float(run.metrics.loc[run.metrics["step"] == 0, "reward/accuracy"].iloc[0]))
    assert not rows[(rows["method"] == "naive") & (rows["precision"] == "int4") & (rows["seed"] == 1)].iloc[0]["collapsed"]


# --------------------------------------------------------------------------------------------- severities
def test_severity_identity_and_labels(sev_sweep, tmp_path):
    assert len(sev_sweep.runs) == 19 and not sev_sweep.skipped
    assert has_severity_axis(sev_sweep)
    labels = set(severity_labels(sev_sweep.runs).values())
    assert labels == {"bf16 (a=per_token)", "fp8_e4m3 (a=per_token)", "int4 (a=none)", "fp16 (a=per_token)",
                      "int8 (w=per_tensor, a=per_token, kv=fp8_e4m3)"}
    # the same method, task and seed at two severities that differ only by an option are two runs, not duplicates
    write_run(tmp_path / "kv", "tis", "arithmetic", 0, precision="int8", rollout={"weight_granularity": "per_tensor"})
    sweep = load_sweeps([tmp_path / "ladder", tmp_path / "kv"])
    assert len(sweep.runs) == 20 and not sweep.skipped
    labels = severity_labels(sweep.runs)
    int8 = sorted(v for v in labels.values() if v.startswith("int8"))
    assert int8 == ["int8 (w=per_tensor, a=per_token)", "int8 (w=per_tensor, a=per_token, kv=fp8_e4m3)"]


def test_one_severity_is_no_severity_axis(tmp_path):
    for seed in (0, 1):
        write_run(tmp_path / "one", "naive", "arithmetic", seed)
        write_run(tmp_path / "one", "tis", "arithmetic", seed)
    assert not has_severity_axis(load_sweeps([tmp_path / "one"]))


# --------------------------------------------------------------------------------------------- summary cells
def test_summary_means_gaps_and_order(sev_sweep):
    s = severity_summary(sev_sweep)
    # severities in order of measured mismatch (mean KL of their runs)
    assert [k.split(";")[0] for k in s.drop_duplicates("severity")["severity"]] == ["fp16", "bf16", "fp8_e4m3", "int8", "int4"]
    for sev, method, acc, gap, kl in [("bf16", "bf16", 62.0, np.nan, 1e-5), ("fp8_e4m3", "naive", 61.0, -1.0, 1e-3),
                                      ("fp8_e4m3", "tis", 62.0, 0.0, 1.1e-3), ("int4", "naive", 32.0, -30.0, 0.1),
                                      ("int4", "tis", 47.0, -15.0, 0.09), ("fp16", "fp16", 62.0, 0.0, 2e-6 * 0.95)]:
        c = cell(s, sev, method)
        assert math.isclose(c["acc"], acc), (sev, method)
        assert (math.isnan(gap) and math.isnan(c["gap_to_bf16"])) or math.isclose(c["gap_to_bf16"], gap, abs_tol=1e-9)
        assert math.isclose(c["kl"], kl, rel_tol=1e-9), (sev, method, c["kl"])
    # fp16 ran 2 seeds: KL = 2e-6 * (0.9 + 1.0) / 2
    # tis at int4 against bf16, the same seeds 0-2: paired differences 47-60, 45-64, 49-62 = -13, -19, -13
    c = cell(s, "int4", "tis")
    bf16 = cell(s, "bf16", "bf16")
    assert math.isclose(c["auc_gap_to_bf16"], c["auc"] - bf16["auc"]) and math.isnan(bf16["auc_gap_to_bf16"])
    ref = sps.ttest_rel([47, 45, 49], [60, 64, 62]).confidence_interval(0.95)
    assert (c["gap_to_bf16_lo"], c["gap_to_bf16_hi"]) == pytest.approx((ref.low, ref.high))
    assert (c["gap_to_bf16_n"], c["gap_to_bf16_ci"]) == (3, "paired t")
    # accuracy of a 3-seed cell (45, 47, 49): 47 ± t(0.975, 2) * 2 / sqrt(3)
    half = sps.t.ppf(0.975, 2) * 2 / math.sqrt(3)
    assert (c["acc_lo"], c["acc_hi"], c["acc_n"]) == pytest.approx((47 - half, 47 + half, 3))
    # fp16 (seeds 0, 1) against bf16 (0, 1, 2): paired on the two seeds both ran (bf16's seed 2 is left out)
    fp16 = cell(s, "fp16", "fp16")
    assert (fp16["gap_to_bf16"], fp16["gap_to_bf16_n"], fp16["gap_to_bf16_ci"]) == pytest.approx((0.0, 2, "paired t"))


def test_recovered_share_of_the_naive_gap(sev_sweep):
    s = severity_summary(sev_sweep)
    # int4: naive gap 62 - 32 = 30 pp, per seed 30, 32, 28 (resolved); tis recovers (47-32)/30 = 0.5 (17, 13, 15
    # pp per seed): Fieller's interval solves mean(num - R den)^2 = t^2 var(num - R den) / 3 at both ends
    c = cell(s, "int4", "tis")
    assert math.isclose(c["naive_gap"], 30.0) and 0 < c["naive_gap_lo"] < 30.0
    assert math.isclose(c["recovered"], 0.5)
    num, den, t2 = np.array([17.0, 13.0, 15.0]), np.array([30.0, 32.0, 28.0]), sps.t.ppf(0.975, 2) ** 2
    for end in (c["recovered_lo"], c["recovered_hi"]):
        lin = num - end * den
        assert lin.mean() ** 2 == pytest.approx(t2 * lin.var(ddof=1) / 3)
    assert c["recovered_lo"] < 0.5 < c["recovered_hi"] and c["recovered_n"] == 3 and c["recovered_note"] == ""
    # fp8_e4m3: naive gap per seed 0, 1, 2 pp: 1 ± t(0.975, 2) / sqrt(3) = [-1.5, 3.5] contains 0 -> not reported
    c = cell(s, "fp8_e4m3", "tis")
    assert c["naive_gap_lo"] <= 0 <= c["naive_gap_hi"]
    assert math.isnan(c["recovered"]) and c["recovered_note"] == NO_NAIVE_GAP
    assert math.isnan(cell(s, "int8", "tis")["recovered"]) and cell(s, "int8", "tis")["recovered_note"] == "fewer than 2 seeds"
    assert math.isnan(cell(s, "int8", "tis")["acc_lo"])  # one seed: no CI
    assert cell(s, "fp16", "fp16")["recovered_note"] == "no naive run at this severity"
    # the naive and the baseline rows carry no recovered share (0 and 1 by definition)
    assert math.isnan(cell(s, "int4", "naive")["recovered"]) and cell(s, "int4", "naive")["recovered_note"] == ""
    # the naive method is configurable: with tis as "naive" at int4, fp8 recovers (32-47)/(62-47) = -1
    s2 = severity_summary(sev_sweep, SeverityOptions(naive="tis"))
    assert math.isclose(cell(s2, "int4", "naive")["recovered"], -1.0)


def test_no_recovered_share_when_the_naive_arm_is_better(tmp_path):
    root = make_severity_sweep(tmp_path / "ladder")
    for seed, acc in ((0, 0.40), (1, 0.42)):
        write_run(root / "sev_int4", "icepop", "arithmetic", seed, precision="int4", rollout={"act_granularity": "none"},
                  kl=0.09, final_acc=acc)
    sweep = load_sweeps([root])
    # default: icepop at int4 (seeds 0, 1) recovers, on the seeds all three ran, (41 - 31) / (62 - 31) = 10/31
    assert math.isclose(cell(severity_summary(sweep), "int4", "icepop")["recovered"], 10 / 31)
    # with naive as the baseline and tis as "naive", naive is 13-17 pp *better* at every seed: nothing to recover
    c = cell(severity_summary(sweep, SeverityOptions(naive="tis", baseline="naive")), "int4", "icepop")
    assert c["naive_gap_hi"] < 0 and math.isnan(c["recovered"]) and c["recovered_note"] == NAIVE_BETTER


def test_collapse_counts_follow_k(sev_sweep):
    c = cell(severity_summary(sev_sweep), "int4", "naive")
    assert c["n_collapsed"] == 1 and c["collapse_steps"] == "4"
    c = cell(severity_summary(sev_sweep, SeverityOptions(collapse_k=2)), "int4", "naive")
    assert c["n_collapsed"] == 2 and c["collapse_steps"] == "4 8"


def test_baseline_missing_at_several_severities_is_named(sev_sweep, tmp_path):
    for seed in (0, 1):  # the int4 rung's severity includes its act_granularity=none
        write_run(tmp_path / "extra", "bf16", "arithmetic", seed, precision="int4", rollout={"act_granularity": "none"},
                  final_acc=0.5)
    sweep = load_sweeps([tmp_path / "ladder", tmp_path / "extra"])
    s = severity_summary(sweep)
    # at int4 the baseline method itself ran (seeds 0, 1): it is the baseline there (gap of tis on the seeds both
    # ran = (47 + 45) / 2 - 50)
    assert math.isclose(cell(s, "int4", "tis")["gap_to_bf16"], -4.0)
    # at fp8_e4m3 it did not, and it ran at two severities: no gap, the reason is given
    c = cell(s, "fp8_e4m3", "tis")
    assert math.isnan(c["gap_to_bf16"]) and "several severities" in c["recovered_note"]


# --------------------------------------------------------------------------------------------- table, CLI
def test_table_cells(sev_sweep):
    t = severity_table(sev_sweep)
    d = t.display
    tis_int4 = d[(d["Method"] == "tis")].iloc[-1]
    assert tis_int4["Accuracy (%)"].startswith("47.0 [") and tis_int4["Δ vs bf16 (pp)"].startswith("-15.0 [")
    ref = sps.ttest_rel([47, 45, 49], [60, 64, 62]).confidence_interval(0.95)
    assert tis_int4["Δ vs bf16 (pp)"] == f"-15.0 [{ref.low:.1f}, {ref.high:+.1f}] n=3"
    assert tis_int4["Accuracy (%)"].endswith("] n=3")
    c = cell(severity_summary(sev_sweep), "int4", "tis")
    assert tis_int4["Recovered (naive gap)"] == f"50 % [{100 * c['recovered_lo']:.0f}, {100 * c['recovered_hi']:.0f}] n=3"
    # eval SE of the gap: 200 test problems, 3 seeds per arm, p = 0.47 and 0.62
    assert tis_int4["eval SE (pp)"] == f"±{100 * math.sqrt((0.47 * 0.53 + 0.62 * 0.38) / 600):.1f}"
    assert "paired per-seed differences" in t.caption and "Fieller" in t.caption
    int8 = d[(d["Method"] == "tis")].iloc[-2]  # one seed: the value, no interval, said so
    assert int8["Accuracy (%)"] == "55.0 (1 seed)"
    naive_int4 = d[(d["Method"] == "naive")].iloc[-1]
    assert naive_int4["Collapsed"] == "1/3 (step 4)" and naive_int4["Recovered (naive gap)"] == "–"
    assert (d["Recovered (naive gap)"] == f"n/a ({NO_NAIVE_GAP})").sum() == 1
    assert d[d["Method"] == "bf16"].iloc[0]["Δ vs bf16 (pp)"] == "–"


def test_cli_report_has_the_severity_section(tmp_path):
    root = make_severity_sweep(tmp_path / "ladder")
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main([str(root), "--naive", "naive", "--baseline", "bf16", "--collapse-k", "2", "--formats", "png"])
    assert rc == 0, err.getvalue()
    report = (root / "report" / "report.md").read_text()
    assert "## Severity ladder: gap to bf16 and the recovered share of the naive gap" in report
    # the headline figure: right after the verdict, before the tables (issue 25 item 4)
    headline = "![Accuracy against mismatch — arithmetic / tiny](figures/severity_arithmetic_tiny.png)"
    assert report.index(headline) < report.index("## Severity ladder")
    assert report.split("\n\n")[2:4] == ["## Accuracy against mismatch — arithmetic / tiny", headline]
    assert "naive=naive, collapse_k=2" in report
    assert "| 2/3 (step 4 8) |" in report  # k = 2 reached the table
    # the recovered share against T·KL follows (int4 has a resolved naive gap; fp8_e4m3 does not)
    recovered = "![Recovered share against T·KL — arithmetic / tiny](figures/recovered_arithmetic_tiny.png)"
    # under its own heading: "Accuracy against mismatch across severities" used to sit over it (no other severity
    # figure here, so that heading is not written at all)
    assert report.split(recovered)[0].rstrip().endswith("## Recovered share of the naive gap against T·KL")
    assert "## Accuracy against mismatch across severities" not in report
    assert (root / "report" / "figures" / "recovered_arithmetic_tiny.png").stat().st_size > 10_000
    csv = pd.read_csv(root / "report" / "tables" / "severity.csv")  # long: one row per method x severity x metric
    acc = csv[csv.metric == "acc"]
    assert len(acc) == 8 and (acc["lo"].isna() | (acc["lo"] <= acc["value"])).all() and set(acc["n"]) <= {1, 2, 3}


def test_a_kl_interval_below_zero_stops_inside_the_log_axis():
    """A t-interval over 3 seeds can reach below 0; drawn to 0 it ran to the left edge of the log axis."""
    kl = np.array([2e-5, 3e-3, 0.3])
    lo = kl_lower(pd.Series([-1e-5, 1e-3, -0.1]), kl)
    assert list(lo) == [1e-5, 1e-3, 1e-5]  # half the smallest KL shown; an interval inside stays as it is
    assert list(kl_lower(pd.Series([-1.0]), np.array([0.0]))) == [0.0]  # no positive KL: a linear axis, 0


def test_no_recovered_figure_without_a_resolved_naive_gap(sev_sweep, tmp_path):
    """Only int4 resolves the naive gap in the synthetic ladder; with the baseline renamed away nothing does."""
    assert plot_recovered(sev_sweep, "arithmetic", "tiny", tmp_path, formats=("png",)) is not None
    assert plot_recovered(sev_sweep, "arithmetic", "tiny", tmp_path, SeverityOptions(baseline="nope"),
                          formats=("png",)) is None


def test_the_headline_puts_every_task_and_model_on_one_t_kl_axis(sev_sweep, tmp_path):
    """The length axis: a second task whose naive gap is within noise joins the ladder on one T·KL axis. Cells are
    numbered by the naive arm's T·KL (5 tokens x its KL); the caption names the cells without a recovered share;
    one task and model alone keeps its own figures as the headline."""
    cd = tmp_path / "countdown"
    for method, precision, finals in (("bf16", "bf16", [0.50, 0.55, 0.45]), ("naive", "int4", [0.49, 0.56, 0.44]),
                                      ("tis", "int4", [0.50, 0.55, 0.46])):
        for seed, final in enumerate(finals):
            write_run(cd, method, "countdown", seed, precision=precision, kl=0.2 if precision == "int4" else 1e-5,
                      final_acc=final, rollout={"act_granularity": "none"} if precision == "int4" else None)
    both = merge([sev_sweep, load_sweeps([cd])])
    figure = plot_tkl(both, tmp_path / "fig", formats=("png",))
    assert figure is not None and (tmp_path / "fig" / "tkl.png").stat().st_size > 10_000
    # naive T·KL: fp8 5e-3 (#1), int8+kv 5e-2 (#2, one seed), int4 0.5 (#3, resolved), countdown int4 1.0 (#4)
    assert "(not in cells #1, #2, #4)" in figure.caption, figure.caption
    assert [f.name for f in severity_figures(both, tmp_path / "fig", formats=("png",))][0] == "tkl"
    assert plot_tkl(sev_sweep, tmp_path / "fig", formats=("png",)) is None


@pytest.mark.parametrize("kl, scale", [([2e-5, 3e-3, 0.3], "log"), ([5.4, 5.8, 6.0], "linear"),
                                       ([0.0, 1e-3, 0.2], "symlog")])
def test_the_kl_axis_is_log_only_across_a_decade(kl, scale):
    """Under a decade a log axis labels only its crowded minor ticks (seen on the separation report's figure)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from analysis.severity import _kl_axis

    fig, ax = plt.subplots()
    _kl_axis(ax, np.array(kl))
    assert ax.get_xscale() == scale
    plt.close(fig)


def test_cells_at_almost_the_same_t_kl_share_one_tick():
    """Seen on the separation report: len60 and len34 at T·KL 1.9 and 2.0 printed '#1' over '#2'."""
    from analysis.severity import _merge_close

    ticks = _merge_close(np.array([1.90, 1.95, 5.7]), ["#1", "#2", "#3"])
    assert [label for _, label in ticks] == ["#1,#2", "#3"] and math.isclose(ticks[0][0], 1.925)
    assert [label for _, label in _merge_close(np.array([1.0, 3.0]), ["#1", "#2"])] == ["#1", "#2"]


def test_recovered_shares_beyond_the_axis_range_are_marked_at_its_edge():
    """smoke_short's ess: -241 % [-883, -112] was drawn as a point at -241 with a bar up to -100 (the interval's
    clipped ends), as if the interval ended there; nothing said an end was cut."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = pd.DataFrame({"seq_kl": [1.0, 2.0, 3.0, 4.0], "recovered": [0.5, 0.16, -2.41, 2.5],
                      "recovered_lo": [0.1, -1.35, -8.83, 1.5], "recovered_hi": [0.9, 0.67, -1.12, 4.0]})
    p = recovered_drawn(d)
    assert RECOVERED_RANGE == (-100.0, 200.0)
    assert p["value"].round(6).tolist() == [50.0, 16.0, -241.0, 250.0]
    assert p["y"].round(6).tolist() == [50.0, 16.0, -100.0, 200.0]  # off-scale points sit at the edge
    assert p["off"].tolist() == [0, 0, -1, 1]
    assert p["lo"].round(6).tolist() == [10.0, -100.0, -100.0, 150.0]
    assert p["hi"].round(6).tolist() == [90.0, 67.0, -100.0, 200.0]
    assert p["lo_cut"].tolist() == [False, True, True, False] and p["hi_cut"].tolist() == [False, False, False, True]

    fig, ax = plt.subplots()
    _recovered_bars(ax, d, _arm_style("ess", "o"))
    line = ax.lines[0]  # the errorbar's data line: every point within the range, markers only where in range
    assert list(line.get_ydata()) == pytest.approx([50.0, 16.0, -100.0, 200.0])
    assert list(line.get_markevery()) == [True, True, False, False]
    bars = ax.collections[0].get_segments()  # the interval bars, clipped to the range
    assert [tuple(np.round(s[:, 1], 6)) for s in bars] == [(10.0, 90.0), (-100.0, 67.0), (-100.0, -100.0), (150.0, 200.0)]
    arrows = {(a.xy, a.get_text()) for a in ax.texts if a.arrow_patch is not None}
    # each off-scale point: an arrow to its edge under its value; the cut end of an in-range point's interval:
    # an arrowhead (the cut ends of the off-scale points' intervals are at their arrows already)
    assert arrows == {((3.0, -100.0), "-241 %"), ((4.0, 200.0), "+250 %"), ((2.0, -100.0), "")}
    ys = [t.xy[1] for t in ax.texts] + list(line.get_ydata())
    assert min(ys) >= -100 and max(ys) <= 200
    plt.close(fig)


def test_arms_at_one_severity_are_drawn_apart_in_the_severity_figure(tmp_path, monkeypatch):
    """Issue 32 F10: the five mxfp4 arms sat on one x and hid each other. Three arms with the very same mismatch and
    accuracy at one severity are drawn at three distinct x (DODGE_PT apart, in display points), the baseline alone
    at its own; the caption says so."""
    import analysis.plots as plots
    from analysis.severity import DODGE_PT, dodge_offsets, plot_severity

    root = tmp_path / "sweep"
    for method, precision in (("bf16", "bf16"), ("naive", "int4"), ("tis", "int4"), ("ais", "int4")):
        for seed in range(2):
            write_run(root, method, "arithmetic", seed, precision=precision, kl=1e-5 if method == "bf16" else 0.1,
                      final_acc=0.5)
    drawn = {}

    def keep(fig, out_dir, name, formats):  # instead of writing files: where each arm's points land, in pixels
        fig.canvas.draw()
        drawn["px_per_pt"] = fig.dpi / 72
        for line in fig.axes[0].lines:  # each errorbar's line through its points (rings: colour 0.15)
            if line.get_color() != "0.15":
                xy = line.get_transform().transform(line.get_xydata())
                drawn.setdefault(line.get_color(), set()).update(float(x) for x in xy[:, 0])
        plots.plt.close(fig)
        return {}

    monkeypatch.setattr(plots, "_save", keep)
    figure = plot_severity(load_sweeps([root]), "arithmetic", "tiny", tmp_path)
    assert figure is not None and f"drawn {DODGE_PT:.0f} pt apart" in figure.caption
    from analysis.arms import method_color

    (naive, tis, ais) = (drawn[method_color(m)] for m in ("naive", "tis", "ais"))
    assert len(naive) == len(tis) == len(ais) == 1  # one severity each
    xs = [naive.pop(), tis.pop(), ais.pop()]
    assert np.diff(xs) == pytest.approx([DODGE_PT * drawn["px_per_pt"]] * 2, rel=0.01)  # in the legend's order
    assert dodge_offsets([["bf16"], ["naive", "tis", "ais"]], ["bf16", "naive", "tis", "ais"]) == {
        "bf16": 0.0, "naive": -DODGE_PT, "tis": 0.0, "ais": DODGE_PT}


def test_one_arm_on_two_engines_is_two_rollout_settings_named_by_the_engine(tmp_path):
    """naive@fp8_e4m3 on the embedded engine and on vLLM: two rollout policies. The rows differed only by
    'lm_head=False;embed=False' against 'lm_head=None;embed=None'; the engine is named, and the embedded runs keep
    the severity key they had before the option."""
    write_run(tmp_path / "emb", "naive", "arithmetic", 0, precision="fp8_e4m3",
              rollout={"engine": "embedded", "quantize_lm_head": False})
    write_run(tmp_path / "vl", "naive", "arithmetic", 0, precision="fp8_e4m3", rollout={"engine": "vllm"})
    sweep = load_sweeps([tmp_path / "emb", tmp_path / "vl"])
    assert len(sweep.runs) == 2 and not sweep.skipped
    keys = {r.severity for r in sweep.runs}
    assert not any("engine=" in k for k in keys if "vllm" not in k) and any(k.endswith(";engine=vllm") for k in keys)
    assert sorted(severity_labels(sweep.runs).values()) == ["fp8_e4m3 (a=per_token)", "fp8_e4m3 (a=per_token, engine=vllm)"]
