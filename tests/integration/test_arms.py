"""Every registered arm runs end to end on the embedded default (a few steps) with complete, finite metrics: the
keys it declares (`Method.metric_keys`, beside its diagnostics) under method/<arm>/, each shared metric once."""

from __future__ import annotations

import math

import pytest

from bench.launch.cli import execute
from bench.run.store import RunDir
from bench.registry import METHODS
from bench.mismatch import MISMATCH_KEYS
from bench.train import TRAIN_KEYS
from tests.helpers import make_cfg

pytestmark = pytest.mark.slow

def test_every_arm_declares_its_diagnostics_among_its_metric_keys():
    for method in METHODS.names():
        cls = METHODS.get(method)
        assert set(cls.diagnostics) <= set(cls.metric_keys), method
        assert not set(cls.metric_keys) & set(TRAIN_KEYS), method  # train/* holds those, once


@pytest.mark.parametrize("method", METHODS.names())
def test_arm_runs_with_complete_finite_metrics(tmp_path, method):
    cfg = make_cfg(tmp_path, f"method={method}")
    declared = METHODS.get(method).metric_keys
    assert execute(cfg) == "completed"
    run = RunDir.of(cfg)
    rows = run.metrics()
    assert len(rows) == 3
    for row in rows:
        assert all(math.isfinite(v) for v in row.values()), row
        assert set(MISMATCH_KEYS) <= set(row)  # shared mismatch metrics: the same names for every arm
        own = {k.split("/", 2)[2] for k in row if k.startswith(f"method/{method}/")}
        assert set(declared) <= own, set(declared) - own
        assert not own & set(TRAIN_KEYS)  # clipfrac, ppo_kl, ...: written once per row, as train/*
        assert {"train/clipfrac", "train/ppo_kl"} <= set(row)
        assert not any(k.startswith("method/") and not k.startswith(f"method/{method}/") for k in row)
    if method == "acr_uaq":
        assert run.info()["setup"]["uaq_scale"] == 1.5  # invariant scaling applied once, before training
    if method == "ais":
        assert all(0.0 <= r["method/ais/alpha"] <= 1.0 for r in rows)
    assert run.path.parent.parent.parent.name == f"{method}@{cfg.rollout.precision}"  # the method's spelling in the path
    assert f"precision: {cfg.rollout.precision}" in (run.path / "config.yaml").read_text()
    if method == "matched":  # the control: the trainer at the rollout's precision, so pi_old is mu (test_qat.py)
        assert cfg.rollout.precision == "fp8_e4m3" and cfg.train.dtype == "fp32"
        assert all(r["mismatch/kl_k3"] <= 1e-6 for r in rows), [r["mismatch/kl_k3"] for r in rows]
    if method == "fp16":  # the method trains in fp16 too (its yaml sets train.dtype)
        assert cfg.rollout.precision == "fp16" and cfg.train.dtype == "fp16"
        assert all(r["train/grad_scale"] == 2.0**16 and r["train/skipped_steps"] == 0 for r in rows)  # no overflow


def test_precision_of_an_arm_is_overridable(tmp_path):
    assert make_cfg(tmp_path, "method=tis").rollout.precision == "fp8_e4m3"  # the arms' default low precision
    cfg = make_cfg(tmp_path, "method=tis", "rollout.precision=int8")
    assert "precision" not in cfg.method and cfg.rollout.precision == "int8"  # one place, nothing to disagree
    assert execute(cfg) == "completed"
    assert "precision: int8" in (RunDir.of(cfg).path / "config.yaml").read_text()
