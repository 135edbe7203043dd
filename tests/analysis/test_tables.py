"""tables: cells equal hand-computed means/stds; Markdown and LaTeX come from the same frame."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.stats as sps

from analysis import arms
from analysis.load import Run, Sweep, load_sweeps
from analysis.tables import (
    accuracy_table,
    fmt_ci,
    fmt_share,
    latex_escape,
    render,
    results_table,
    throughput_table,
    write_table,
)

from .synth import write_run


@pytest.fixture
def sweep(broken_sweep: Path) -> Sweep:
    # Broken seed-3 runs are present on disk: any of them leaking into a cell would change it.
    return load_sweeps([broken_sweep])


def _cell(df: pd.DataFrame, **where) -> pd.Series:
    sel = df
    for k, v in where.items():
        sel = sel[sel[k] == v]
    assert len(sel) == 1, where
    return sel.iloc[0]


def test_accuracy_cells_are_hand_computed_means_and_stds(sweep: Sweep):
    data = accuracy_table(sweep).data
    tis = _cell(data, method="tis", task="arithmetic")  # 50, 40, 60 %
    assert math.isclose(tis.acc_mean, 50.0)
    assert math.isclose(tis.acc_std, 10.0)  # sqrt((10² + 0 + 10²) / 2)
    assert tis.n_seeds == 3 and tis.seeds == "0 1 2"
    assert math.isclose(tis.gap_to_bf16, 50.0 - 70.0)
    ais = _cell(data, method="ais", task="arithmetic")  # 45, 60, 75 %
    assert math.isclose(ais.acc_mean, 60.0) and math.isclose(ais.acc_std, 15.0)
    tis_cd = _cell(data, method="tis", task="countdown")  # 25, 30, 35 %
    assert math.isclose(tis_cd.acc_mean, 30.0) and math.isclose(tis_cd.acc_std, 5.0)
    assert math.isclose(tis_cd.gap_to_bf16, 30.0 - 40.0)
    fp8_cd = _cell(data, method="naive", task="countdown")  # 10, 10, 10 %
    assert math.isclose(fp8_cd.acc_mean, 10.0) and fp8_cd.acc_std == 0.0
    # The diverged seed is kept (its last eval is its result) and counted.
    fp8 = _cell(data, method="naive", task="arithmetic")
    assert (fp8.n_seeds, fp8.n_diverged) == (3, 1)
    assert math.isclose(fp8.acc_mean, 30.0)
    bf16 = _cell(data, method="bf16", task="countdown")
    assert bf16.n_seeds == 3 and math.isclose(bf16.acc_mean, 40.0)  # the incomplete seed 3 (99 %) is out
    assert math.isnan(bf16.gap_to_bf16) and math.isnan(bf16.gap_to_bf16_eval_se)  # no gap to itself in the CSV


def test_accuracy_display_shows_mean_std_and_gap(sweep: Sweep):
    disp = accuracy_table(sweep).display
    row = disp[(disp.Method == "tis")].iloc[0]
    assert row["Accuracy (%)"] == "50.0 ± 10.0"
    # tis (50, 40, 60) and bf16 (60, 80, 70) ran seeds 0-2: paired differences -10, -40, -10: -20 ± t(0.975, 2) *
    # sqrt(300) / sqrt(3) = -20 ± 43.0
    assert row["Δ vs bf16 (pp)"] == "-20.0 [-63.0, +23.0] n=3"
    # ais (45, 60, 75): differences -15, -20, +5: -10 ± t(0.975, 2) * sqrt(175) / sqrt(3) = -10 ± 32.9
    ais = disp[(disp.Method == "ais")].iloc[0]
    ref = sps.ttest_rel([45, 60, 75], [60, 80, 70]).confidence_interval(0.95)
    assert ais["Δ vs bf16 (pp)"] == f"-10.0 [{ref.low:.1f}, {ref.high:+.1f}] n=3" == "-10.0 [-42.9, +22.9] n=3"
    # beside it, the binomial SE of 200 test problems, 3 seeds per arm, p = 0.6 and 0.7
    assert ais["eval SE (pp)"] == f"±{100 * math.sqrt((0.6 * 0.4 + 0.7 * 0.3) / 600):.1f}" == "±2.7"
    assert "paired per-seed differences" in accuracy_table(sweep).caption
    assert "1 div." in disp[disp.Method == "naive"].iloc[0]["Seeds"]


def test_results_table_is_laid_out_like_the_papers(sweep: Sweep):
    t = results_table(sweep)
    assert list(t.display.columns) == ["Method", "Bitwidth", "arithmetic", "countdown", "Avg."]
    assert t.display["Method"].tolist() == ["bf16 @ step 0", "μ @ step 0", "μ @ step 0", "bf16", "naive",
                                            "tis", "acr_uaq", "ess", "ais"]
    # mu's own accuracy at each bitwidth: the step-0 training batch's reward/accuracy of the uncorrected sampler,
    # naive's runs (bf16's at bf16), one batch per seed; none at int8, where only acr_uaq ran (it rescales the policy
    # it quantizes: it was pooled in, and at fp8 every arm's copy of a seed's batch counted once per arm)
    mu = t.data[t.data.method == "μ @ step 0"].set_index("precision")
    assert set(mu.index) == {"bf16", "fp8_e4m3"}
    step0 = [100 * float(r.metrics.loc[r.metrics["step"] == 0, "reward/accuracy"].iloc[0]) for r in sweep.runs
             if r.method == "naive" and r.task == "arithmetic" and r.evals is not None and not r.evals.empty]
    assert len(step0) == 3 and math.isclose(mu.loc["fp8_e4m3", "arithmetic_mean"], float(np.mean(step0)))
    assert math.isclose(mu.loc["fp8_e4m3", "arithmetic_std"], float(np.std(step0, ddof=1)))
    tis = _cell(t.data, method="tis")
    assert math.isclose(tis.avg, (50.0 + 30.0) / 2)
    assert _cell(t.data, method="acr_uaq").bitwidth == "INT8 W8A8"
    start = _cell(t.data, method="bf16 @ step 0")
    assert math.isclose(start.arithmetic_mean, 20.0) and math.isclose(start.countdown_mean, 5.0)
    # bf16 is best everywhere in the synthetic sweep: exactly its three numeric cells are bold.
    bold_cells = [(t.display.iloc[i]["Method"], c) for i, c in zip(*np.nonzero(t.bold.to_numpy()))]
    assert sorted(bold_cells) == [("bf16", 2), ("bf16", 3), ("bf16", 4)]


def test_results_table_marks_a_diverged_seed(sweep: Sweep):
    # naive/arithmetic has one seed that diverged: its cell is a mean over a run that stopped early, and says so
    t = results_table(sweep)
    fp8 = t.display[t.display.Method == "naive"].iloc[0]
    assert fp8["arithmetic"].endswith("(1 div.)") and "div." not in fp8["countdown"]
    assert _cell(t.data, method="naive").arithmetic_n_diverged == 1
    assert "div." not in "".join(t.display[t.display.Method == "tis"].iloc[0].astype(str))
    assert "'div.' = seeds that diverged" in t.caption
    md = render(t.display, "md", bold=t.bold)
    assert "(1 div.)" in md and "---:" in md.splitlines()[2 - 1]  # still a right-aligned numeric column


def test_throughput_excludes_warmup_and_gives_speedup_vs_bf16(sweep: Sweep):
    data = throughput_table(sweep).data
    fp8 = _cell(data, method="naive", task="arithmetic")  # one row per task: like with like
    assert math.isclose(fp8.tokens_per_s_mean, 1600.0)  # step 0 (100 tok/s) is warm-up
    assert math.isclose(fp8.rollout_speedup, 1.6)
    assert math.isclose(_cell(data, method="acr_uaq", task="arithmetic").rollout_speedup, 1.8)
    assert math.isclose(fp8.step_speedup, (2.0 + 0.8) / (1.25 + 0.8))
    assert math.isclose(fp8.rollout_s + fp8.sync_s + fp8.recompute_s + fp8.train_s, fp8.step_s)
    with_warmup = _cell(throughput_table(sweep, warmup=0).data, method="tis", task="arithmetic")
    assert math.isclose(with_warmup.tokens_per_s_mean, (100.0 + 11 * 1600.0) / 12)


def test_throughput_rows_split_the_step_and_call_cpu_low_precision_emulated(sweep: Sweep):
    t = throughput_table(sweep)
    assert list(t.display.columns) == ["Task", "Method", "Rollout", "Engine", "Rollout tok/s", "Rollout speed-up",
                                       "generation s", "sync + requant s", "recompute s", "train s", "step s",
                                       "Step speed-up"]
    assert list(t.display["Task"]).count("arithmetic") == 1  # named once, at the top of its block
    first = t.display.iloc[: list(t.display["Task"]).index("countdown")]  # the arithmetic block
    fp8 = _cell(first, Method="naive")
    # synth: 2000 tokens at 1600 tok/s = 1.25 s of generation; sync 0.1, recompute 0.2, train 0.5 -> step 2.05 s
    assert (fp8["Rollout"], fp8["Engine"]) == ("FP8 (emulated)", "embedded (cpu)")
    assert [fp8[c] for c in ("generation s", "sync + requant s", "recompute s", "train s", "step s")] == [
        "1.250", "0.100", "0.200", "0.500", "2.050"]
    assert _cell(first, Method="acr_uaq")["Rollout"] == "INT8 (emulated)"
    assert _cell(first, Method="bf16")["Rollout"] == "BF16"  # not quantized: nothing to emulate
    data = t.data[t.data.task == "arithmetic"]
    assert bool(_cell(data, method="naive").emulated) and not bool(_cell(data, method="bf16").emulated)


def _timed_run(method, precision, engine, device, tps, parts, info_runtime=True, task="a") -> Run:
    """A run with constant time/* parts (after a slow step 0) on `engine`/`device`, declared as the trainer does."""
    rollout_s, sync_s, rec_s, train_s = parts
    steps = [0, 1, 2]
    metrics = pd.DataFrame({"step": steps, "time/rollout_tokens_per_s": [1.0, tps, tps],
                            "time/rollout_s": [9.0, rollout_s, rollout_s], "time/sync_s": [9.0, sync_s, sync_s],
                            "time/recompute_s": [9.0, rec_s, rec_s], "time/train_s": [9.0, train_s, train_s],
                            "time/step_s": [36.0] + [rollout_s + sync_s + rec_s + train_s] * 2})
    bits = {"bf16": 16, "fp8_e4m3": 8}[precision]
    info = {"precision": {"name": precision, "label": {"bf16": "BF16", "fp8_e4m3": "FP8"}[precision],
                          "weight_bits": bits, "act_bits": None if bits == 16 else 8}}
    if info_runtime:
        info["runtime"] = {"engine": engine, "device": device}
    arms.learn(method, info)
    config = {"rollout": {"engine": engine}}
    return Run(f"{method}-{engine}-{device}", Path("."), method, precision, task, "m", 0, "completed", None, config,
               info, metrics, pd.DataFrame(columns=["step"]))


def test_throughput_compares_arms_only_on_the_same_engine_and_device():
    sweep = Sweep([
        _timed_run("bf16", "bf16", "embedded", "cuda", 1000.0, (2.0, 0.1, 0.3, 0.6)),
        _timed_run("naive", "fp8_e4m3", "embedded", "cuda", 1600.0, (1.25, 0.15, 0.3, 0.6)),
        _timed_run("naive", "fp8_e4m3", "vllm", "cuda", 4000.0, (0.5, 0.05, 0.3, 0.6)),
        _timed_run("naive", "fp8_e4m3", "embedded", "cpu", 50.0, (40.0, 0.2, 1.0, 2.0)),
    ], [])
    t = throughput_table(sweep)
    gpu = _cell(t.data, method="naive", engine="embedded", device="cuda")
    assert math.isclose(gpu.rollout_speedup, 1600 / 1000)
    assert math.isclose(gpu.step_speedup, (2.0 + 0.1 + 0.3 + 0.6) / (1.25 + 0.15 + 0.3 + 0.6))
    assert not gpu.emulated and math.isclose(gpu.sync_s, 0.15) and math.isclose(gpu.other_s, 0.0)
    vllm = _cell(t.data, method="naive", engine="vllm")
    assert np.isnan(vllm.rollout_speedup) and np.isnan(vllm.step_speedup)  # no bf16 run on vllm: no speed-up
    cpu = _cell(t.data, method="naive", device="cpu")
    assert bool(cpu.emulated) and np.isnan(cpu.rollout_speedup)  # never against the GPU's bf16
    rows = t.display.set_index("Engine")
    assert rows.loc["vllm (cuda)", "Rollout"] == "FP8" and rows.loc["vllm (cuda)", "Rollout speed-up"] == "–"
    assert rows.loc["embedded (cpu)", "Rollout"] == "FP8 (emulated)"
    assert _cell(t.display, Engine="embedded (cuda)", Method="naive")["Rollout speed-up"] == "1.60×"


def test_throughput_reads_runs_of_older_trainers():
    """No run.json runtime: the config's engine and the CPU (the only device then). Their time/train_s included
    the recompute pass (step = sync + rollout + train): the train part is corrected to the optimizer steps."""
    old = _timed_run("bf16", "bf16", "embedded", "cpu", 100.0, (2.0, 0.1, 0.3, 0.9), info_runtime=False)
    old.metrics["time/step_s"] = old.metrics["time/rollout_s"] + old.metrics["time/sync_s"] + old.metrics["time/train_s"]
    row = _cell(throughput_table(Sweep([old], [])).data, method="bf16")
    assert (row.engine, row.device) == ("embedded", "cpu")
    assert math.isclose(row.train_s, 0.9 - 0.3) and math.isclose(row.recompute_s, 0.3)
    assert math.isclose(row.rollout_s + row.sync_s + row.recompute_s + row.train_s, row.step_s)


def _run(method: str, precision: str, task: str, tps: float, step_s: float) -> Run:
    metrics = pd.DataFrame({"step": [0, 1, 2], "time/rollout_tokens_per_s": [1.0, tps, tps], "time/step_s": [9.0, step_s, step_s]})
    return Run(f"{method}-{task}", Path("."), method, precision, task, "m", 0, "completed", None, {}, {}, metrics,
               pd.DataFrame(columns=["step"]))


def test_throughput_compares_like_with_like_per_task():
    """Issue 25 item 4: task b's responses are longer (higher tok/s); a bar pooled over tasks would weight an arm by
    the tasks it ran. Every row, and every speed-up, is one task's."""
    sweep = Sweep([_run("bf16", "bf16", "a", 1000, 2.0), _run("bf16", "bf16", "b", 2000, 4.0),
                   _run("naive", "fp8_e4m3", "a", 1500, 1.0), _run("naive", "fp8_e4m3", "b", 4000, 1.0)], [])
    data = throughput_table(sweep).data
    a, b = _cell(data, method="naive", task="a"), _cell(data, method="naive", task="b")
    assert (a.tokens_per_s_mean, b.tokens_per_s_mean) == (1500, 4000)
    assert math.isclose(a.rollout_speedup, 1.5) and math.isclose(b.rollout_speedup, 2.0)
    assert math.isclose(a.step_speedup, 2.0) and math.isclose(b.step_speedup, 4.0)


def test_markdown_and_latex_render_the_same_cells():
    df = pd.DataFrame({"Method": ["acr_uaq", "tis"], "Acc (%)": ["65.0 ± 10.0", "50.0 ± 10.0"], "Δ": ["-5.0", "–"]})
    bold = pd.DataFrame({"Method": [False, False], "Acc (%)": [True, False], "Δ": [False, False]})
    md = render(df, "md", bold=bold).splitlines()
    assert md[0] == "| Method | Acc (%) | Δ |"
    assert md[1] == "|:---|---:|---:|"  # text left, numbers right
    assert md[2] == "| acr_uaq | **65.0 ± 10.0** | -5.0 |"
    tex = render(df, "tex", caption="A caption_with 50%", label="tab:x", bold=bold)
    assert "\\begin{tabular}{lrr}" in tex and "\\toprule" in tex and "\\bottomrule" in tex
    assert "acr\\_uaq & \\textbf{65.0 $\\pm$ 10.0} & -5.0 \\\\" in tex
    assert "tis & 50.0 $\\pm$ 10.0 & -- \\\\" in tex
    assert "\\caption{A caption\\_with 50\\%}" in tex and "\\label{tab:x}" in tex
    assert tex.count("\\\\") == 1 + len(df)  # header + one line per row
    with pytest.raises(ValueError):
        render(df, "html")


def test_latex_escape_special_characters():
    assert latex_escape("a_b & 5% #1 {x} $") == "a\\_b \\& 5\\% \\#1 \\{x\\} \\$"


def test_write_table_writes_csv_markdown_and_latex(sweep: Sweep, tmp_path: Path):
    t = accuracy_table(sweep)
    paths = write_table(t, tmp_path)
    assert sorted(paths) == ["csv", "md", "tex"]
    back = pd.read_csv(paths["csv"])  # long: one row per arm x task x metric, rounded to 0.1 pp
    assert list(back.columns[:4]) == ["model", "task", "method", "precision"] and "metric" in back and "value" in back
    for metric in ("acc_mean", "acc_std"):
        got = back[back.metric == metric].set_index(["task", "method", "precision"])["value"]
        want = t.data.set_index(["task", "method", "precision"])[metric].round(1)
        pd.testing.assert_series_equal(got.sort_index(), want.sort_index(), check_names=False, check_dtype=False)
    gap = back[back.metric == "gap_to_bf16"].dropna(subset=["lo"]).iloc[0]
    assert gap["lo"] <= gap["value"] <= gap["hi"] and gap["n"] >= 2 and gap["interval"] in ("paired t", "Welch")
    assert paths["md"].read_text().count("\n| ") == 1 + len(t.display)  # header + one line per row
    assert "\\begin{table}" in paths["tex"].read_text()


def test_cells_keep_the_sign_and_the_n_of_what_they_show():
    # a lower end of -0.04 is "-0.0", as in the CSV and the verdict: "+0.0" read as an interval that excludes 0
    assert fmt_ci(2.4, -0.04, 4.9, signed=True, n=3) == "+2.4 [-0.0, +4.9] n=3"
    assert fmt_ci(0.0, -0.0, 0.0, n=2) == "0.0 [0.0, 0.0] n=2"  # an exact zero has no sign
    # no interval from n >= 2 (differences with no spread; an unbounded ratio): the n is still given, and why
    assert fmt_ci(-12.5, float("nan"), float("nan"), signed=True, n=2) == "-12.5 (no interval, n=2)"
    assert fmt_ci(0.5, float("nan"), float("nan"), n=1) == "0.5 (1 seed)"
    # arms that share no seed: Welch, said so (the same text read as a paired interval)
    assert fmt_ci(-7.8, -20.0, 4.4, signed=True, n=2, method="Welch") == "-7.8 [-20.0, +4.4] n=2, Welch"
    assert fmt_ci(-3.0, float("nan"), float("nan"), signed=True, n=2, note="no spread", method="Welch") == \
        "-3.0 (no spread, n=2, Welch)"
    assert fmt_ci(-3.0, -5.0, -1.0, signed=True, n=3, method="paired t") == "-3.0 [-5.0, -1.0] n=3"
    assert fmt_share(0.24, float("nan"), float("nan"), 3, "interval unbounded") == "24 % (interval unbounded, n=3)"
    assert fmt_share(0.5, 0.334, 0.713, 3, "") == "50 % [33, 71] n=3"
    assert fmt_share(float("nan"), float("nan"), float("nan"), 0, "naive gap within noise") == "n/a (naive gap within noise)"


def test_an_arm_at_two_settings_of_one_precision_is_two_rows(tmp_path):
    """naive at int8 per tensor and per channel: two rows, each with its own gap and p (they were one row pooling
    both, seeds "0 0 1 1 2 2", a Welch interval crossing 0 beside the per-tensor row's p < 0.001)."""
    for seed, acc in enumerate((0.50, 0.60, 0.70)):
        write_run(tmp_path / "bf", "bf16", "arithmetic", seed, final_acc=acc)
    for sub, granularity, finals in (("pt", "per_tensor", (0.30, 0.41, 0.49)), ("pc", "per_channel", (0.48, 0.585, 0.69))):
        for seed, acc in enumerate(finals):
            write_run(tmp_path / sub, "naive", "arithmetic", seed, final_acc=acc, precision="int8",
                      rollout={"weight_granularity": granularity})
    arms.forget()
    sweep = load_sweeps([tmp_path])
    disp = accuracy_table(sweep).display.set_index("Rollout")
    for granularity, finals in (("per_tensor", [30, 41, 49]), ("per_channel", [48, 58.5, 69])):
        row = disp.loc[next(r for r in disp.index if f"w={granularity}" in r)]
        ref = sps.ttest_rel(finals, [50, 60, 70])
        ci = ref.confidence_interval(0.95)
        assert row["Seeds"] == "3" and row["Δ vs bf16 (pp)"] == f"{np.mean(finals) - 60:+.1f} [{ci.low:+.1f}, {ci.high:+.1f}] n=3"
        assert row["p / Holm"].startswith(f"{ref.pvalue:.3f} /" if ref.pvalue >= 0.001 else "<0.001 /")
    assert disp.loc["bf16", "Seeds"] == "3"  # the baseline keeps its own row
    results = results_table(sweep).display["Method"].tolist()
    assert sum(m.startswith("naive, int8 (w=per_") for m in results) == 2, results


def test_the_results_table_gives_the_seeds_each_cell_rests_on(sweep: Sweep, tmp_path):
    """mean ± std with no n: the n is said once in the caption where every cell has the same, else in each cell."""
    t = results_table(sweep)  # 3 seeds in every cell
    assert "mean ± std over n = 3 seeds per cell" in t.caption
    assert not any(" n=" in str(v) for v in t.display["arithmetic"])
    for method, seeds in (("bf16", (0, 1)), ("naive", (0,))):
        for seed in seeds:
            write_run(tmp_path / "uneven", method, "arithmetic", seed)
    uneven = results_table(load_sweeps([tmp_path / "uneven"]))
    assert "seeds (n beside each cell)" in uneven.caption
    cells = dict(zip(uneven.display["Method"], uneven.display["arithmetic"]))
    assert cells["bf16"].endswith(" n=2") and cells["naive"].endswith(" n=1"), cells
