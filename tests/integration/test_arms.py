"""Every arm runs end to end on the embedded default (a few steps) with complete, finite metrics."""

from __future__ import annotations

import math

import pytest

from bench.launch.cli import execute
from bench.run.store import RunDir
from bench.mismatch import MISMATCH_KEYS
from tests.helpers import make_cfg

pytestmark = pytest.mark.slow

OWN_KEYS = {
    "bf16": ["clipfrac", "ppo_kl"],
    "naive": ["clipfrac", "ppo_kl"],
    "naive_ppo_is": ["clipfrac", "ppo_kl"],
    "tis": ["is_mean", "is_max", "is_frac_high", "is_ess", "clipfrac"],
    "acr": ["frac_acr_active", "acr_upper_mean", "clipfrac_pos", "clipfrac_neg", "rho_max"],
    "acr_uaq": ["frac_acr_active", "acr_upper_mean", "clipfrac_pos", "clipfrac_neg", "rho_max"],
    "ess": ["ess_factor", "kl_behavioral", "approx_kl", "pi_loss", "clipfrac"],
    "ais": ["alpha", "R", "B", "V", "c_mean", "c_var", "n"],
    "icepop": ["masked_frac", "is_mean", "is_ess", "clipfrac"],
    "seq_is_rs": ["is_mean", "is_frac_high", "is_frac_low", "is_ess", "seq_mean", "clipfrac"],
    "geo_rs": ["seq_masked_frac", "geo_mean", "geo_min", "geo_max", "clipfrac"],
    "opsm": ["seq_masked_frac", "seq_log_ratio_mean", "clipfrac"],
    "fp16": ["clipfrac", "ppo_kl"],
}


@pytest.mark.parametrize("arm", list(OWN_KEYS))
def test_arm_runs_with_complete_finite_metrics(tmp_path, arm):
    cfg = make_cfg(tmp_path, f"method={arm}")
    assert execute(cfg) == "completed"
    run = RunDir.of(cfg)
    rows = run.metrics()
    assert len(rows) == 3
    for row in rows:
        assert all(math.isfinite(v) for v in row.values()), row
        assert set(MISMATCH_KEYS) <= set(row)  # shared mismatch metrics: the same names for every arm
        own = {k.split("/", 2)[2] for k in row if k.startswith(f"method/{arm}/")}
        assert set(OWN_KEYS[arm]) <= own, set(OWN_KEYS[arm]) - own
        assert not any(k.startswith("method/") and not k.startswith(f"method/{arm}/") for k in row)
    if arm == "acr_uaq":
        assert run.info()["setup"]["uaq_scale"] == 1.5  # invariant scaling applied once, before training
    if arm == "ais":
        assert all(0.0 <= r["method/ais/alpha"] <= 1.0 for r in rows)
    assert run.path.parent.parent.parent.name == f"{arm}@{cfg.rollout.precision}"  # the arm's spelling in the path
    assert f"precision: {cfg.rollout.precision}" in (run.path / "config.yaml").read_text()
    if arm == "fp16":  # the arm trains in fp16 too (its yaml sets train.dtype)
        assert cfg.rollout.precision == "fp16" and cfg.train.dtype == "fp16"
        assert all(r["train/grad_scale"] == 2.0**16 and r["train/skipped_steps"] == 0 for r in rows)  # no overflow


def test_precision_of_an_arm_is_overridable(tmp_path):
    assert make_cfg(tmp_path, "method=tis").rollout.precision == "fp8_e4m3"  # the arms' default low precision
    cfg = make_cfg(tmp_path, "method=tis", "rollout.precision=int8")
    assert "precision" not in cfg.method and cfg.rollout.precision == "int8"  # one place, nothing to disagree
    assert execute(cfg) == "completed"
    assert "precision: int8" in (RunDir.of(cfg).path / "config.yaml").read_text()
