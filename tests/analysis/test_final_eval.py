"""Issue 19 R3: a completed run whose final eval row is missing or unreadable never gives a "final" number.

The repro: a 2-arm x 2-seed sweep in which one naive run's last eval.jsonl line is torn. Its last readable
evaluation (step 8) is higher than its real final one, so reading it as final moved the arm's mean and flipped the
sign of its gap to bf16. The run must be left out with its reason, in every table and in the report's summary.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from analysis.load import load_sweeps

from .synth import STEPS, write_run
from .test_paper import analyze

# eval accuracy at steps 0, 4, 8, 12 (12 = train.steps: the final evaluation)
EVALS = {
    ("bf16", 0): [0.20, 0.25, 0.28, 0.30],
    ("bf16", 1): [0.20, 0.25, 0.28, 0.29],  # bf16 mean 29.5
    ("fp8", 0): [0.20, 0.30, 0.40, 0.25],  # the torn one: 40.0 at step 8, 25.0 final
    ("fp8", 1): [0.20, 0.30, 0.30, 0.27],
}


def make(root: Path, tear: str | None) -> Path:
    for (method, seed), values in EVALS.items():
        write_run(root, method, "arithmetic", seed, eval_values=values)
    path = root / "fp8" / "arithmetic" / "tiny" / "seed0" / "eval.jsonl"
    lines = path.read_text().splitlines()
    if tear == "torn":  # a killed writer's half line
        lines[-1] = lines[-1][:20]
    elif tear == "missing":
        lines = lines[:-1]
    path.write_text("\n".join(lines) + ("\n" if tear != "torn" else ""))
    return root


@pytest.mark.parametrize("tear", ["torn", "missing"])
def test_a_run_without_its_final_eval_row_is_left_out_of_every_table_and_the_summary(tmp_path, tear):
    root = make(tmp_path / "sweep", tear)
    sweep = load_sweeps([root])
    assert [(r.method, r.seed) for r in sweep.runs].count(("fp8", 0)) == 0
    (skipped,) = sweep.skipped
    why = "its last line is unreadable" if tear == "torn" else "there is no row for that step"
    assert skipped.reason.startswith(f"incomplete: eval.jsonl lacks the final evaluation (step {STEPS}): {why}")

    rc, _, err = analyze(str(root), "--out", str(tmp_path / "rep"), "--formats", "png")
    assert rc == 0, err
    tables = tmp_path / "rep" / "tables"
    acc = pd.read_csv(tables / "accuracy.csv").pivot_table(index="method", columns="metric", values="value")
    # the naive arm is its one complete seed (27.0), not the mean with step 8's 40.0 (33.5, a +4.0 pp "gain")
    assert acc.loc["fp8", "n_seeds"] == 1 and acc.loc["fp8", "acc_mean"] == pytest.approx(27.0)
    assert acc.loc["fp8", "gap_to_bf16"] == pytest.approx(-2.5)
    assert acc.loc["bf16", "acc_mean"] == pytest.approx(29.5) and acc.loc["bf16", "n_seeds"] == 2
    results = pd.read_csv(tables / "results.csv")  # long: method, task, metric, value
    results = results[results.metric == "mean"].pivot_table(index="method", columns="task", values="value")
    naive = [m for m in results.index if "fp8" in m and "step 0" not in m]
    assert len(naive) == 1 and results.loc[naive[0], "arithmetic"] == pytest.approx(27.0)
    for table in tables.glob("*.md"):
        assert "40.0" not in table.read_text() and "33.5" not in table.read_text(), table.name

    report = (tmp_path / "rep" / "report.md").read_text()
    assert "**Runs used**: 3 — left out: 1" in report
    left_out = report[report.index("## Runs left out"):]
    assert "fp8/arithmetic/tiny/seed0" in left_out and "lacks the final evaluation (step 12)" in left_out
    doc = json.loads((tmp_path / "rep" / "results.json").read_text())
    assert [s["reason"].split(":")[0] for s in doc["skipped"]] == ["incomplete"] and doc["n_runs"] == 3


def test_the_intact_sweep_uses_every_final_row(tmp_path):
    """The same sweep without the tear: the true naive mean (26.0) and a -3.5 pp gap."""
    sweep = load_sweeps([make(tmp_path / "sweep", None)])
    assert sweep.skipped == [] and len(sweep.runs) == 4
    from analysis.tables import accuracy_summary

    acc = accuracy_summary(sweep).set_index("method")
    assert acc.loc["fp8", "acc_mean"] == pytest.approx(26.0) and acc.loc["fp8", "gap_to_bf16"] == pytest.approx(-3.5)
