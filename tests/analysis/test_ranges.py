"""Healthy ranges of the mismatch metrics (analysis/ranges.py): per precision, median and 95th percentile at step 0
(one value per seed: every arm shares its first batch) and at the end (one per run)."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.load import load_sweeps
from analysis.ranges import mismatch_ranges, ranges_table

from .synth import write_run


def test_ranges_per_precision_with_step0_counted_once_per_seed(tmp_path):
    # kl_k3 constant over a run's steps: step 0 and the end read the same value
    for method, seed, kl in [("naive", 0, 0.01), ("tis", 0, 0.01), ("naive", 1, 0.03), ("tis", 1, 0.05)]:
        write_run(tmp_path, method, "arithmetic", seed, precision="int4", kl=kl)
    write_run(tmp_path, "bf16", "arithmetic", 0, kl=1e-4)
    data = mismatch_ranges(load_sweeps([tmp_path])).set_index(["precision", "metric"])
    int4 = data.loc[("int4", "kl_k3")]
    # step 0: the first run of each seed (0.01 for seed 0, 0.03 for seed 1); the end: every run
    assert int4.n_step0 == 2 and int4.n_end == 4
    assert int4.step0_median == pytest.approx(0.02) and int4.step0_p95 == pytest.approx(0.01 + 0.95 * 0.02)
    assert int4.end_median == pytest.approx(0.02) and int4.end_p95 == pytest.approx(np.percentile([0.01, 0.01, 0.03, 0.05], 95))
    assert data.loc[("bf16", "kl_k3")].end_median == pytest.approx(1e-4)
    t = ranges_table(load_sweeps([tmp_path]))
    assert {"Precision", "Metric", "Step 0: median", "End: p95", "n (end)"} <= set(t.display.columns)


def test_values_near_one_keep_their_deviation_from_one():
    """token_mult_prob_error 1.0004 must not print as a bare 1 (NeMo-RL's alarm is at 1.05)."""
    from analysis.ranges import _fmt
    assert _fmt(1.00042) == "1.0004" and _fmt(0.99813) == "0.9981"
    assert _fmt(0.0598123) == "0.0598" and _fmt(12.61) == "12.6" and _fmt(float("nan")) == "–"
