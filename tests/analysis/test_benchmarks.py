"""Per-benchmark tables (analysis/benchmarks.py): cells are the hand-computed means/stds of each run's final
eval/<set>/<metric>, one block per metric, and the report shows them."""

from __future__ import annotations

import io
import json
import math
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pandas as pd
import pytest

from analysis.benchmarks import benchmark_summary, benchmark_table, final_benchmarks
from analysis.cli import main
from analysis.load import load_sweeps

from .synth import write_run

# final eval values (fractions) per method, benchmark/metric, seed 0..2
FINAL = {
    "bf16": {"aime24/avg@32": [0.30, 0.40, 0.50], "math500/avg@32": [0.70, 0.80, 0.90],
             "aime24/pass@16": [0.60, 0.60, 0.60], "math500/pass@16": [0.90, 0.95, 1.00]},
    "tis": {"aime24/avg@32": [0.20, 0.30, 0.40], "math500/avg@32": [0.60, 0.60, 0.60],
            "aime24/pass@16": [0.50, 0.70, 0.90]},  # no math500 pass@16: its cell is missing, and so is Avg.
}


def _add_benchmarks(run_dir: Path, values: dict[str, float]) -> None:
    """Give the run's eval rows eval/<set>/<metric> keys: the final row the FINAL values, earlier rows other
    numbers (which must not be taken), plus keys that are not tabulated."""
    rows = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
    for i, row in enumerate(rows):
        last = i == len(rows) - 1
        for key, v in values.items():
            row[f"eval/{key}"] = v if last else 0.01
        row["eval/aime24/response_length"] = 900.0
        row["eval/aime24/scorer_timeouts"] = 1.0
    (run_dir / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def bench_sweep(tmp_path: Path) -> Path:
    root = tmp_path / "sweep"
    for method, by_key in FINAL.items():
        for seed in range(3):
            d = write_run(root, method, "arithmetic", seed)
            _add_benchmarks(d, {k: v[seed] for k, v in by_key.items()})
    write_run(root, "bf16", "countdown", 0)  # a run without eval sets adds nothing
    return root


def _row(df: pd.DataFrame, **where) -> pd.Series:
    sel = df
    for k, v in where.items():
        sel = sel[sel[k] == v]
    assert len(sel) == 1, where
    return sel.iloc[0]


def test_final_values_are_the_last_evaluation(bench_sweep: Path):
    fb = final_benchmarks(load_sweeps([bench_sweep]))
    assert set(fb["metric"]) == {"avg@32", "pass@16"}  # lengths and scorer counts are not tabulated
    r = _row(fb, method="tis", seed=1, benchmark="aime24", metric="avg@32")
    assert r.value == 0.30 and r.step == 12


def test_cells_are_hand_computed_means_and_stds(bench_sweep: Path):
    data = benchmark_summary(load_sweeps([bench_sweep]))
    c = _row(data, method="bf16", benchmark="aime24", metric="avg@32")
    assert math.isclose(c["mean"], 40.0) and math.isclose(c["std"], 10.0) and c.n_seeds == 3 and c.seeds == "0 1 2"
    c = _row(data, method="tis", benchmark="math500", metric="avg@32")
    assert math.isclose(c["mean"], 60.0) and c["std"] == 0.0
    c = _row(data, method="tis", benchmark="aime24", metric="pass@16")
    assert math.isclose(c["mean"], 70.0) and math.isclose(c["std"], 20.0)


def test_table_layout_averages_and_bold(bench_sweep: Path):
    t = benchmark_table(load_sweeps([bench_sweep]))
    assert list(t.display.columns) == ["Metric", "Method", "Bitwidth", "aime24", "math500", "Avg."]
    assert t.display["Metric"].tolist() == ["avg@32", "", "pass@16", ""]
    assert t.display["Method"].tolist() == ["bf16", "tis", "bf16", "tis"]
    bf16 = t.display.iloc[0]
    assert (bf16["aime24"], bf16["math500"], bf16["Avg."]) == ("40.0 ± 10.0", "80.0 ± 10.0", "60.0")
    tis = t.display.iloc[1]
    assert (tis["aime24"], tis["math500"], tis["Avg."]) == ("30.0 ± 10.0", "60.0 ± 0.0", "45.0")
    tis_pass = t.display.iloc[3]
    assert (tis_pass["aime24"], tis_pass["math500"], tis_pass["Avg."]) == ("70.0 ± 20.0", "–", "–")
    assert math.isclose(_row(t.data, method="bf16", metric="pass@16")["avg"], (60.0 + 95.0) / 2)
    # bold: bf16 wins every avg@32 column; in pass@16 tis wins aime24, and math500/Avg. have one contender
    bold = {(t.display.iloc[i]["Method"], t.display.iloc[i]["Metric"] or "…", c)
            for i, row in t.bold.iterrows() for c, v in row.items() if v}
    assert bold == {("bf16", "avg@32", "aime24"), ("bf16", "avg@32", "math500"), ("bf16", "avg@32", "Avg."),
                    ("tis", "…", "aime24")}


def test_no_eval_sets_no_table(tmp_path: Path):
    root = tmp_path / "s"
    write_run(root, "bf16", "arithmetic", 0)
    t = benchmark_table(load_sweeps([root]))
    assert t.display.empty and t.data.empty


def test_report_shows_the_benchmark_table(bench_sweep: Path, tmp_path: Path):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main([str(bench_sweep), "--out", str(tmp_path / "report"), "--formats", "png"])
    assert rc == 0, err.getvalue()
    report = (tmp_path / "report" / "report.md").read_text()
    assert "## Benchmarks (eval sets: accuracy, avg@k, pass@k)" in report
    assert "| avg@32 | bf16 | BF16 | **40.0 ± 10.0** | **80.0 ± 10.0** | **60.0** |" in report
    csv = pd.read_csv(tmp_path / "report" / "tables" / "benchmarks.csv")
    assert set(csv["metric"]) == {"avg@32", "pass@16"}
