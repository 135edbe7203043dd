"""End-to-end runs of the real trainer on the built-in tiny model (a few steps each)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from bench.launch.cli import EXIT, execute
from bench.run.store import RunDir
from bench.methods.base import Method, MethodConfig
from bench.registry import METHODS, Entry
from tests.helpers import cli, make_cfg, strip_times

pytestmark = pytest.mark.slow

STEP_KEYS = [
    "step", "reward/mean", "reward/std", "reward/accuracy", "reward/response_length",
    "train/loss", "train/grad_norm", "train/clipfrac", "train/entropy", "train/ppo_kl", "train/lr",
    "mismatch/kl_k1", "mismatch/kl_k3", "mismatch/ratio_max", "mismatch/ratio_min", "mismatch/logp_diff_mean",
    "mismatch/is_ess", "mismatch/frac_nonfinite_logprob",
    "time/rollout_s", "time/sync_s", "time/train_s", "time/rollout_tokens_per_s",
]


def test_run_writes_a_complete_run_directory(tmp_path):
    cfg = make_cfg(tmp_path, "method=naive")
    assert execute(cfg) == "completed"
    run = RunDir.of(cfg)
    assert run.path == tmp_path / "default" / "naive@fp8_e4m3" / "arithmetic" / "tiny" / "seed0"
    info = run.info()
    assert info["status"] == "completed" and info["reason"] is None
    assert info["host"] and info["versions"]["torch"] == torch.__version__ and "git_sha" in info
    assert "rollout:" in (run.path / "config.yaml").read_text() and "fp8_e4m3" in (run.path / "config.yaml").read_text()
    rows = run.metrics()
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows:
        assert set(STEP_KEYS) <= set(r), set(STEP_KEYS) - set(r)
        assert all(math.isfinite(v) for v in r.values()), r
        assert r["mismatch/kl_k3"] > 0  # fp8 rollout differs from the bf16 trainer
        assert any(k.startswith("quant/quant_error/") for k in r)
    assert [e["step"] for e in run.evals()] == [0, 2, 3]
    assert not run.ckpt_file.exists()  # dropped after completion (train.keep_checkpoint=false)


def test_a_warm_up_raises_the_learning_rate_linearly_from_0(tmp_path):
    """train.lr_warmup_steps=W: step s < W trains at lr x s / W, step 0 at 0 (verl's constant schedule with warm-up,
    which qurl_table2 follows as verl's DAPO recipe sets it), then lr; the default 0 trains at lr from step 0."""
    from bench.train import scheduled_lr
    from bench.train_config import TrainConfig

    cfg = make_cfg(tmp_path, "method=bf16", "train.lr_warmup_steps=2", "train.lr=1e-4")
    assert execute(cfg) == "completed"
    assert [r["train/lr"] for r in RunDir.of(cfg).metrics()] == pytest.approx([0.0, 5e-5, 1e-4], rel=1e-12)
    assert [scheduled_lr(TrainConfig(lr=2e-6, lr_warmup_steps=10), s) for s in (0, 5, 9, 10, 200)] == \
        pytest.approx([0.0, 1e-6, 1.8e-6, 2e-6, 2e-6], rel=1e-12)
    assert {scheduled_lr(TrainConfig(lr=3e-5), s) for s in range(5)} == {3e-5}


def test_same_config_and_seed_give_identical_metrics(tmp_path):
    a, b = make_cfg(tmp_path / "a", "method=tis"), make_cfg(tmp_path / "b", "method=tis")
    assert execute(a) == execute(b) == "completed"
    ra, rb = RunDir.of(a), RunDir.of(b)
    assert strip_times(ra.metrics()) == strip_times(rb.metrics())
    assert ra.evals() == rb.evals()
    c = make_cfg(tmp_path / "c", "method=tis", "seed=1")
    assert execute(c) == "completed"
    assert strip_times(RunDir.of(c).metrics()) != strip_times(ra.metrics())


def test_completed_run_is_skipped_and_locked_run_is_not_touched(tmp_path):
    cfg = make_cfg(tmp_path)
    run = RunDir.of(cfg)
    with run.lock():
        assert execute(cfg) == "locked"
    assert not run.metrics_file.exists()
    assert execute(cfg) == "completed"
    before = run.metrics_file.read_text()
    assert execute(cfg) == "skipped"
    assert run.metrics_file.read_text() == before


class _NaNAfterFirstStep(Method):
    """Test instrument: a real method whose loss turns NaN at the second optimizer step."""

    calls = 0

    def loss(self, logp, batch, stats):
        type(self).calls += 1
        scale = float("nan") if type(self).calls > 1 else 1.0
        return (logp * batch.mask).sum() / batch.n_tokens * scale, {"clipfrac": 0.0, "ppo_kl": 0.0}


def test_nan_loss_marks_run_diverged_and_keeps_metrics(tmp_path, monkeypatch):
    METHODS.discover()
    monkeypatch.setitem(METHODS._entries, "nan_test", Entry("nan_test", _NaNAfterFirstStep, MethodConfig, {}))
    cfg = make_cfg(tmp_path, "method=bf16")
    cfg.method._get_node("name")._set_flag("readonly", None)  # a name is read-only once composed: a test arm
    cfg.method.name = "nan_test"
    outcome = execute(cfg)
    assert outcome == "diverged" and EXIT[outcome] != 0
    run = RunDir.of(cfg)
    info = run.info()
    assert info["status"] == "diverged" and "step 1" in info["reason"] and "non-finite loss" in info["reason"]
    assert info["diverged_step"] == 1  # analysis keeps a divergence after step 0 as a result (issue 32 F3)
    assert [r["step"] for r in run.metrics()] == [0]  # step 0's metrics survive
    from analysis.load import load_run

    kept = load_run(run.path)
    assert kept.status == "diverged" and kept.final_step == 0 and kept.final_accuracy is not None


@pytest.mark.parametrize(
    "override, needle",
    [
        ("train.group_size=1", "train.group_size=1"),
        ("train.lr=0", "train.lr=0"),
        ("train.lr=-0.1", "train.lr=-0.1"),
        ("train.batch_size=10", "train.batch_size=10"),
        ("rollout.precision=fp4", "rollout.precision='fp4'"),
        ("model.path=/nonexistent/model", "/nonexistent/model"),
        ("algo.clip_eps_low=1.5", "algo.clip_eps_low=1.5 is out of range; allowed: [0, 1)"),
    ],
)
def test_bad_input_fails_before_any_work(tmp_path, override, needle):
    proc = cli(f"out_root={tmp_path}", "tracking=disabled", override)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert needle in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []  # not even an empty run directory (Hydra makes one; it is removed)


def test_unknown_key_and_choice_are_named(tmp_path):
    proc = cli(f"out_root={tmp_path}", "train.bogus_key=1")
    assert proc.returncode != 0 and "bogus_key" in proc.stderr
    proc = cli(f"out_root={tmp_path}", "method=nope")
    assert proc.returncode == 2 and "method=nope" in proc.stderr and "tis" in proc.stderr and "ais" in proc.stderr
    proc = cli(f"out_root={tmp_path}", "train.steps=abc")
    assert proc.returncode != 0 and "abc" in proc.stderr and "steps" in proc.stderr
