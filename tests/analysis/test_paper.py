"""`qrl-analyze RESULTS --paper NAME` on synthetic run directories with hand-computed cells.

Our cells are the last evaluation in percent, mean ± sample std over the matching runs; Δ = ours - paper.
"""

from __future__ import annotations

import io
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pandas as pd
import pytest

from analysis.cli import main
from analysis.paper import load_reference, paper_table
from tests.hang import HANG_S

from .synth import write_paper_run

REPO = Path(__file__).resolve().parents[2]


def analyze(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(list(args))
    return rc, out.getvalue(), err.getvalue()


def md_rows(md: str) -> dict[str, list[str]]:
    """Markdown table rows keyed by 'Bitwidth | Method'."""
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in md.splitlines() if line.startswith("| ")]
    header, body = rows[0], rows[1:]
    return {"header": header} | {f"{r[0]} | {r[1]}": r for r in body}


def test_qurl_table1_cells_by_hand(tmp_path):
    res = tmp_path / "qurl_table1"
    acc = {"eval/accuracy": 0.0}
    for seed, final in ((0, 0.50), (1, 0.54)):  # bf16: mean 52.00, sample std 2.83; Δ vs 55.35 = -3.35
        write_paper_run(res, "bf16", "bf16", "gsm8k", seed, {0: acc, 2: {"eval/accuracy": final}})
    write_paper_run(res, "tis", "int8", "gsm8k", 0, {0: acc, 2: {"eval/accuracy": 0.49}})  # 49.00 vs 51.40: -2.40
    write_paper_run(res, "acr", "fp8_e4m3", "gsm8k", 0, {0: acc, 2: {"eval/accuracy": 0.5528}},  # 55.28 vs 54.28: +1.00
                    config={"rollout": {"engine": "vllm"}})  # eval.engine=auto: evaluated on vLLM in bf16
    write_paper_run(res, "acr", "int8", "gsm8k", 0, {0: acc, 1: {"eval/accuracy": 0.9}}, status="running")  # left out
    rc, out, err = analyze(str(res), "--paper", "qurl_table1", "--out", str(tmp_path / "rep"))
    assert rc == 0, err
    rows = md_rows(out)
    assert rows["header"] == ["Bitwidth", "Method", "GSM8K ours", "GSM8K paper", "GSM8K Δ", "Runs"]
    assert rows["BF16 | RL [bf16]"][2:] == ["52.00 ± 2.83", "55.35", "-3.35", "2"]
    assert rows["INT8 W8A8 | FlashRL (Liu et al. 2025) [tis]"][2:] == ["49.00", "51.40", "-2.40", "1"]
    assert rows["FP8 W8A8 | QuRL (Ours) [acr]"][2:] == ["55.28", "54.28", "+1.00", "1"]
    assert rows["INT8 W8A8 | QuRL (Ours) [acr]"][2:] == ["–", "53.55", "–", "0"]  # the running run is not used
    assert len(rows) == 1 + 7  # the paper's seven rows, in its order
    # the caption names each row's rollout engine and evaluation, from the runs that fill it (issue 34), and says
    # when rows were evaluated differently (eval.engine=auto follows the rollout engine)
    assert ("Rollout engine and evaluation of each row's runs: RL [bf16] BF16: embedded, evaluated on embedded fp32; "
            in out)
    assert "QuRL (Ours) [acr] FP8 W8A8: vllm, evaluated on vllm bf16" in out
    assert "QuRL (Ours) [acr] INT8 W8A8: no run" in out
    assert ("evaluated with different engines or precisions (embedded fp32, vllm bf16): a difference between two of "
            "them is partly the evaluation's") in out
    tables = tmp_path / "rep" / "tables"
    data = pd.read_csv(tables / "paper_qurl_table1.csv")
    # long format (issue 25 item 4): one row per arm x statistic; the table's own metric stays a column
    bf16 = data[data.method == "bf16"].set_index("statistic")["value"]
    assert bf16["ours_mean"] == pytest.approx(52.0) and bf16["paper"] == pytest.approx(55.35)
    assert bf16["delta"] == pytest.approx(-3.35) and bf16["n_runs"] == 2
    assert set(data[data.method == "bf16"]["metric"]) == {"eval/accuracy"}
    tex = (tables / "paper_qurl_table1.tex").read_text()
    assert "\\begin{tabular}" in tex and "52.00 $\\pm$ 2.83" in tex and "$\\Delta$" in tex
    assert (tables / "paper_qurl_table1.md").read_text().strip() == out.strip()
    assert "left out" in err and "status=running" in err



def test_a_mini_variant_fills_its_recipes_layout_with_its_own_runs_and_no_delta(tmp_path):
    """`--paper qurl_table1_mini`: the recipe's rows, matched on the mini's model (mini_qwen2, its yaml's override), so
    the mini's pipeline ends in the paper's table; Δ stays empty (a random-init tiny model is no comparison)."""
    res = tmp_path / "qurl_table1_mini"
    for seed, final in ((0, 0.0), (1, 0.5)):
        write_paper_run(res, "bf16", "bf16", "gsm8k", seed, {0: {"eval/accuracy": 0.0}, 2: {"eval/accuracy": final}},
                        model="mini_qwen2")
    rc, out, err = analyze(str(res), "--paper", "qurl_table1_mini", "--out", str(tmp_path / "rep"))
    assert rc == 0, err
    rows = md_rows(out)
    assert rows["BF16 | RL [bf16]"][2:] == ["25.00 ± 35.36", "55.35", "–", "2"]
    assert len(rows) == 1 + 7 and "pipeline check of qurl_table1 on a random-init mini_qwen2" in out
    # the recipe's own name does not take the mini's runs (another model), and says so with exit 1
    assert analyze(str(res), "--paper", "qurl_table1", "--out", str(tmp_path / "rep2"))[0] == 1

def test_qurl_table3_base_row_and_average_column(tmp_path):
    """Base = the bf16 run at step 0; Avg = the mean of the row's five columns."""
    sets = ("aime24", "amc23", "math500", "minerva", "olympiadbench")
    start = {f"eval/{s}/avg@32": v for s, v in zip(sets, (0.30, 0.60, 0.80, 0.20, 0.40))}  # avg 46.00
    final = {f"eval/{s}/avg@32": v for s, v in zip(sets, (0.40, 0.70, 0.90, 0.30, 0.50))}  # avg 56.00
    write_paper_run(tmp_path, "bf16", "bf16", "deepscaler", 0, {0: start, 8: final}, model="r1-distill-qwen-1.5b")
    rc, out, _ = analyze(str(tmp_path), "--paper", "qurl_table3", "--out", str(tmp_path / "rep"))
    assert rc == 0
    rows = md_rows(out)
    col = rows["header"].index
    base, rl = rows["BF16 | Base [base]"], rows["BF16 | RL [bf16]"]
    assert base[col("AIME24 ours")] == "30.00" and base[col("AIME24 Δ")] == "+1.46"  # 30.00 - 28.54
    assert base[col("Avg (5 tasks) ours")] == "46.00" and base[col("Avg (5 tasks) Δ")] == "-2.80"  # 46.00 - 48.80
    assert rl[col("MATH-500 ours")] == "90.00" and rl[col("MATH-500 Δ")] == "+2.29"  # 90.00 - 87.71
    assert rl[col("Avg (5 tasks) ours")] == "56.00" and rl[col("Avg (5 tasks) Δ")] == "-0.40"  # 56.00 - 56.40
    assert rows["INT8 W8A8 | RL [naive]"][col("Avg (5 tasks) ours")] == "–"
    assert "evaluated on embedded fp32" in out and "different engines or precisions" not in out  # one evaluation


def test_qurl_table4_rows_differ_by_config(tmp_path):
    """Same arm (acr, INT8), three learning rates; acr_uaq at two UAQ scales: each lands in its own row. As the recipe's
    sweep writes them: rows of one arm that differ in a setting are its variants (`acr[train.lr=2e-6]` in analysis)."""
    key = "eval/aime24/avg@32"
    for lr, v in ((1e-6, 0.30), (1.5e-6, 0.29), (2e-6, 0.27)):
        write_paper_run(tmp_path, "acr", "int8", "dapo_math", 0, {200: {key: v}}, model="qwen2.5-math-7b",
                        config={"train": {"lr": lr}, "method": {"uaq_scale": 1.0}}, variant=f"train.lr={lr}")
    for s, v in ((1.5, 0.32), (2.0, 0.28)):
        write_paper_run(tmp_path, "acr_uaq", "int8", "dapo_math", 0, {200: {key: v}}, model="qwen2.5-math-7b",
                        config={"train": {"lr": 1e-6}, "method": {"uaq_scale": s}}, variant=f"method.uaq_scale={s}")
    rc, out, _ = analyze(str(tmp_path), "--paper", "qurl_table4", "--out", str(tmp_path / "rep"))
    assert rc == 0
    got = {k: r[2:5] for k, r in md_rows(out).items() if k != "header"}
    assert got == {
        "INT8 W8A8 | s = 1; lr = 1e-6 [acr]": ["30.00", "30.63", "-0.63"],
        "INT8 W8A8 | s = 1.5; lr = 1e-6 [acr_uaq]": ["32.00", "31.25", "+0.75"],
        "INT8 W8A8 | s = 2; lr = 1e-6 [acr_uaq]": ["28.00", "29.15", "-1.15"],
        "INT8 W8A8 | s = 1; lr = 1.5e-6 [acr]": ["29.00", "29.06", "-0.06"],
        "INT8 W8A8 | s = 1; lr = 2e-6 [acr]": ["27.00", "26.66", "+0.34"],
    }


def test_a_figure_only_paper_shows_our_numbers_without_a_difference(tmp_path):
    write_paper_run(tmp_path, "tis", "fp8_e4m3", "gsm8k", 0, {435: {"eval/accuracy": 0.5}},
                    config={"rollout": {"weight_granularity": "per_tensor"}})
    rc, out, _ = analyze(str(tmp_path), "--paper", "flashrl_gsm8k", "--out", str(tmp_path / "rep"))
    assert rc == 0
    assert md_rows(out)["FP8 W8A8 | FP8 + TIS [tis]"][2:] == ["50.00", "–", "–", "1"]


def test_no_matching_run_and_unknown_paper(tmp_path):
    write_paper_run(tmp_path, "bf16", "bf16", "gsm8k", 0, {2: {"eval/accuracy": 0.5}})
    assert analyze(str(tmp_path), "--paper", "p3o_fp8", "--out", str(tmp_path / "rep"))[0] == 1  # no row matched
    rc, _, err = analyze(str(tmp_path), "--paper", "no_such_paper", "--out", str(tmp_path / "rep"))
    assert rc == 2 and "known: ais_table3" in err


def test_a_run_of_another_task_or_model_is_no_comparison(tmp_path):
    """A tiny model's chain run filled QuRL's Qwen2.5-0.5B GSM8K row (the CSV's task was empty, which matched any)."""
    write_paper_run(tmp_path, "bf16", "bf16", "chain", 0, {2: {"eval/accuracy": 0.5}}, model="tiny")
    write_paper_run(tmp_path, "bf16", "bf16", "gsm8k", 1, {2: {"eval/accuracy": 0.5}}, model="mini_qwen2")
    write_paper_run(tmp_path, "tis", "int8", "chain", 0, {2: {"eval/accuracy": 0.5}})  # the paper's model, not its task
    rc, out, err = analyze(str(tmp_path), "--paper", "qurl_table1", "--out", str(tmp_path / "rep"))
    assert rc == 1  # docs/exit-codes.md: with --paper, no run matched any row of the table
    assert md_rows(out)["BF16 | RL [bf16]"][2:] == ["–", "55.35", "–", "0"]
    assert "nothing to compare" in err and "its rows are for gsm8k / qwen2.5-0.5b-instruct" in err
    assert "the runs read are of chain / qwen2.5-0.5b-instruct, chain / tiny, gsm8k / mini_qwen2" in err


def test_a_reference_line_without_its_task_or_model_is_refused(tmp_path):
    write_paper_run(tmp_path / "res", "bf16", "bf16", "gsm8k", 0, {2: {"eval/accuracy": 0.5}})
    ref = pd.read_csv(REPO / "conf/experiment/paper/qurl_table1.reference.csv", dtype=str, keep_default_na=False)
    for col in ("task", "model"):
        bad = ref.copy()
        bad.loc[1, col] = ""
        bad.to_csv(tmp_path / "bad.csv", index=False)
        rc, _, err = analyze(str(tmp_path / "res"), "--paper", str(tmp_path / "bad.csv"), "--out", str(tmp_path / "rep"))
        assert rc == 2 and f"empty {col} on line(s) 3" in err, err
    rc, _, err = analyze(str(tmp_path / "res"), "--paper", str(tmp_path / "bad.csv").replace("bad", "none"),
                         "--out", str(tmp_path / "rep"))
    assert rc == 2 and "does not exist" in err


def test_every_reference_line_names_a_task_and_model_of_ours():
    """Each paper recipe's CSV names, in every line, a task of conf/task/ and a model of conf/model/ (the recipe's:
    tests/integration/test_paper_recipes.py composes each recipe and compares)."""
    tasks = {p.stem for p in (REPO / "conf/task").glob("*.yaml")}
    models = {p.stem for p in (REPO / "conf/model").glob("*.yaml")}
    paths = sorted((REPO / "conf/experiment/paper").glob("*.reference.csv"))
    assert len(paths) == 7
    for path in paths:
        ref = load_reference(path)
        assert set(ref["task"]) <= tasks and set(ref["model"]) <= models, path.name


def test_the_paper_table_never_imports_torch(tmp_path):
    write_paper_run(tmp_path, "bf16", "bf16", "gsm8k", 0, {2: {"eval/accuracy": 0.5}})
    code = ("import sys; from analysis.cli import main; rc = main([%r, '--paper', 'qurl_table1', '--out', %r]); "
            "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)") % (str(tmp_path), str(tmp_path / "rep"))
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| BF16 | RL [bf16] | 50.00 | 55.35 | -5.35 | 1 |" in proc.stdout


def test_a_mini_that_measures_fewer_samples_says_so_in_its_column():
    """qurl_table4_mini evaluates avg@2 where the paper's column is avg@32: our column says which it holds (it read
    'AIME24 avg@32 ours' over avg@2 numbers); the recipe itself keeps the paper's header."""
    assert [c for c in paper_table("qurl_table4_mini", []).display.columns if "ours" in c] == ["AIME24 avg@32 ours (avg@2)"]
    assert [c for c in paper_table("qurl_table4", []).display.columns if "ours" in c] == ["AIME24 avg@32 ours"]
