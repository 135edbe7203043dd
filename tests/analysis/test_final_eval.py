"""Issue 19 R3: a completed run whose final eval row is missing or unreadable never gives a "final" number.

The repro: a 2-arm x 2-seed sweep in which one naive run's last eval.jsonl line is torn. Its last readable
evaluation (step 8) is higher than its real final one, so reading it as final moved the arm's mean and flipped the
sign of its gap to bf16. The run must be left out with its reason, in every table and in the report's summary.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import yaml
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
    # and its gap is seed 1's own difference, 27.0 - 29.0 (the one seed both arms ran), not 27.0 - bf16's mean
    assert acc.loc["fp8", "gap_to_bf16"] == pytest.approx(-2.0)
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


# ------------------------------------------------------------------ issue 32 F3: a final row without a finite number
def _set_final(path: Path, key: str, value: str) -> None:
    """Rewrite the last eval.jsonl row's `key` to the JSON text `value` (null, a string, NaN, Infinity)."""
    lines = path.read_text().splitlines()
    row = json.loads(lines[-1])
    row[key] = "@@"
    lines[-1] = json.dumps(row).replace('"@@"', value)
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("value", ["null", '"0.25"', "NaN", "Infinity"])
def test_a_final_row_whose_accuracy_is_no_finite_number_leaves_the_run_out_everywhere(tmp_path, value):
    """The repro: the final row parses but its accuracy is null (or a string, NaN, inf); the step-8 row's 40.0 was
    reported as final. Now the run is left out with its reason, in every table and the summary."""
    root = make(tmp_path / "sweep", None)
    _set_final(root / "fp8" / "arithmetic" / "tiny" / "seed0" / "eval.jsonl", "eval/accuracy", value)
    sweep = load_sweeps([root])
    assert ("fp8", 0) not in [(r.method, r.seed) for r in sweep.runs] and len(sweep.runs) == 3
    (skipped,) = sweep.skipped
    assert skipped.reason == (f"incomplete: eval.jsonl's final evaluation (step {STEPS}) has eval/accuracy={value}, "
                              "not a finite number; an earlier step's accuracy is not reported as final")

    rc, _, err = analyze(str(root), "--out", str(tmp_path / "rep"), "--formats", "png")
    assert rc == 0, err
    tables = tmp_path / "rep" / "tables"
    acc = pd.read_csv(tables / "accuracy.csv").pivot_table(index="method", columns="metric", values="value")
    assert acc.loc["fp8", "n_seeds"] == 1 and acc.loc["fp8", "acc_mean"] == pytest.approx(27.0)
    for table in tables.glob("*.md"):
        assert "40.0" not in table.read_text() and "33.5" not in table.read_text(), table.name
    report = (tmp_path / "rep" / "report.md").read_text()
    assert "**Runs used**: 3 — left out: 1" in report
    assert "has eval/accuracy=" in report[report.index("## Runs left out"):]


def test_a_benchmark_without_a_finite_final_value_is_left_out_for_that_run_only(tmp_path):
    """Another eval/* key of the final row that is null is dropped with a warning (the run's accuracy stands); the
    benchmarks table never reads it from an earlier row."""
    root = make(tmp_path / "sweep", None)
    path = root / "fp8" / "arithmetic" / "tiny" / "seed0" / "eval.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for i, row in enumerate(rows):
        row["eval/aime24/accuracy"] = 0.9 if i < len(rows) - 1 else None  # earlier rows: a number not to take
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    sweep = load_sweeps([root])
    run = next(r for r in sweep.runs if (r.method, r.seed) == ("fp8", 0))
    assert run.final_accuracy == pytest.approx(0.25) and "eval/aime24/accuracy" not in run.final
    assert any("no finite value for eval/aime24/accuracy" in w for w in run.warnings)
    from analysis.benchmarks import final_benchmarks

    assert final_benchmarks(sweep).empty


def _diverged(root: Path, config_edit: dict | None = None, **info) -> Path:
    run = write_run(root, "fp8", "arithmetic", 1, status="diverged", reason=info.pop("reason", "non-finite loss"),
                    steps_logged=info.pop("steps_logged", 4), eval_values=EVALS[("fp8", 1)])
    if config_edit:
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        for dotted, value in config_edit.items():
            section, key = dotted.split(".")
            cfg.setdefault(section, {})[key] = value
        (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    if info:
        doc = json.loads((run / "run.json").read_text())
        (run / "run.json").write_text(json.dumps(doc | info))
    return run


def test_a_divergence_in_training_is_a_result(tmp_path):
    """Diverged at step 4 (after training had run): kept, its last eval (step 4) counted as final."""
    _diverged(tmp_path / "sweep", diverged_step=4, reason="step 4: non-finite loss (nan)")
    (run,) = load_sweeps([tmp_path / "sweep"]).runs
    assert run.status == "diverged" and run.final_step == 4 and run.final_accuracy == pytest.approx(0.30)


@pytest.mark.parametrize("how", ["diverged_step", "reason"])
def test_a_divergence_at_step_0_is_no_result(tmp_path, how):
    """Diverged on the untrained policy's first batch: the setup's fault, and its last eval is its start."""
    info = {"diverged_step": 0} if how == "diverged_step" else {"reason": "step 0: non-finite loss (nan)"}
    _diverged(tmp_path / "sweep", steps_logged=0, **info)
    sweep = load_sweeps([tmp_path / "sweep"])
    (skipped,) = sweep.skipped
    assert sweep.runs == [] and skipped.status == "diverged"
    assert skipped.reason.startswith("diverged at step 0, on the untrained policy's first batch")


@pytest.mark.parametrize("status", ["diverged", "completed"])
def test_a_nan_setting_is_a_configuration_error_not_a_result(tmp_path, status):
    """algo.adv_eps=nan (issue 32 F4) was recorded as the arm diverging: left out, naming the setting, whatever step
    it stopped at; a completed run with a NaN setting is no result either."""
    root = tmp_path / "sweep"
    if status == "diverged":
        _diverged(root, {"algo.adv_eps": float("nan")}, diverged_step=4, reason="step 4: non-finite loss (nan)")
    else:
        run = write_run(root, "fp8", "arithmetic", 1, eval_values=EVALS[("fp8", 1)])
        cfg = yaml.safe_load((run / "config.yaml").read_text()) | {"algo": {"adv_eps": float("nan")}}
        (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    assert "adv_eps: .nan" in (next(root.rglob("config.yaml"))).read_text()  # how OmegaConf writes it, too
    sweep = load_sweeps([root])
    (skipped,) = sweep.skipped
    assert sweep.runs == [] and skipped.reason == ("configuration error: algo.adv_eps=nan (NaN is no setting's "
                                                   "value); not a result")
