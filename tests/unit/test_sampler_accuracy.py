"""The sampler-accuracy command's arithmetic (bench/benchmarks/sampler_accuracy.py): the paired gap over problems
and its table; the measurement itself is a command (it decodes a whole test split)."""

import pytest
import scipy.stats as sps
import torch

from bench.benchmarks.sampler_accuracy import markdown, paired_gap


def test_paired_gap_is_the_t_interval_of_per_problem_differences():
    a = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    b = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    g, lo, hi = paired_gap(a, b)
    d = (a - b).numpy() * 100
    half = sps.t.ppf(0.975, 5) * d.std(ddof=1) / 6**0.5
    assert (g, lo, hi) == pytest.approx((d.mean(), d.mean() - half, d.mean() + half))


def test_table_rows():
    ref = {"precision": "bf16", "n": 4, "sampled": torch.tensor([1.0, 0.0, 1.0, 1.0])}
    low = {"precision": "fp8_e5m2", "n": 4, "sampled": torch.tensor([1.0, 0.0, 0.0, 1.0])}
    rows = [ref | {"sampled_gap": paired_gap(ref["sampled"], ref["sampled"])},
            low | {"sampled_gap": paired_gap(low["sampled"], ref["sampled"])}]
    text = markdown(rows)
    assert "| bf16 | 75.0 | – | 4 |" in text and "| fp8_e5m2 | 50.0 | -25.0 [" in text
