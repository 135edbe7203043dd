"""Issue 19 R10: a diverged arm is never bold as "best" (the Results table and the benchmarks table).

The repro: an arm whose diverged seed's last eval before diverging is high (there: its step-0 accuracy) had the
highest mean of its column and was bold, "**36.5 (1 div.)**". A mean over a seed that diverged is no result of
training: it is marked "div." and never bold, neither in its column nor in Avg.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from analysis.benchmarks import benchmark_table
from analysis.load import load_sweeps
from analysis.tables import render, results_table

from .synth import write_run
from .test_benchmarks import _add_benchmarks


def bold_cells(table) -> list[tuple[str, str]]:
    return sorted((table.display.iloc[i]["Method"], table.display.columns[j])
                  for i, j in zip(*np.nonzero(table.bold.to_numpy())))


def sweep_with_a_high_diverged_seed(root: Path, arms: tuple[str, ...] = ("bf16", "fp8", "tis")) -> Path:
    """arithmetic: bf16 30/30, tis 31/31, fp8 32 + a seed that diverged at step 4 with 45 (mean 38.5, the
    highest); countdown: bf16 20/20, tis 21/21, fp8 10/10 (no divergence)."""
    finals = {"bf16": {"arithmetic": [0.30, 0.30], "countdown": [0.20, 0.20]},
              "tis": {"arithmetic": [0.31, 0.31], "countdown": [0.21, 0.21]},
              "fp8": {"arithmetic": [0.32, 0.45], "countdown": [0.10, 0.10]}}
    for method in arms:
        for task, values in finals[method].items():
            for seed, final in enumerate(values):
                diverged = (method, task, seed) == ("fp8", "arithmetic", 1)
                d = write_run(root, method, task, seed, final_acc=final, status="diverged" if diverged else "completed",
                              reason="non-finite loss" if diverged else None, steps_logged=4 if diverged else None)
                if task == "arithmetic":
                    _add_benchmarks(d, {"math500/accuracy": final, "aime24/accuracy": final / 2})
    return root


def test_results_table_never_bolds_a_diverged_arm(tmp_path):
    t = results_table(load_sweeps([sweep_with_a_high_diverged_seed(tmp_path / "sweep")]))
    fp8 = t.display[t.display.Method == "fp8"].iloc[0]
    assert fp8["arithmetic"] == "38.5 ± 9.2 (1 div.)"  # the highest mean of its column ...
    # ... yet tis (31.0) is the best arithmetic cell; Avg.: tis 26.0 > bf16 25.0 (fp8 is no contender there either)
    assert bold_cells(t) == [("tis", "Avg."), ("tis", "arithmetic"), ("tis", "countdown")]
    md = render(t.display, "md", bold=t.bold)
    assert "**38.5" not in md and "**31.0 ± 0.0**" in md
    assert "never bold" in t.caption


def test_a_diverged_arm_is_no_contender_so_one_other_arm_is_no_contest(tmp_path):
    t = results_table(load_sweeps([sweep_with_a_high_diverged_seed(tmp_path / "sweep", ("bf16", "fp8"))]))
    # arithmetic: bf16 is the only contender -> nothing bold; countdown: bf16 20.0 beats fp8 10.0
    assert bold_cells(t) == [("bf16", "countdown")]


def test_benchmarks_table_never_bolds_a_diverged_arm(tmp_path):
    t = benchmark_table(load_sweeps([sweep_with_a_high_diverged_seed(tmp_path / "sweep")]))
    fp8 = t.display[t.display.Method == "fp8"].iloc[0]
    assert fp8["math500"] == "38.5 ± 9.2 (1 div.)"
    assert bold_cells(t) == [("tis", "Avg."), ("tis", "aime24"), ("tis", "math500")]
