"""The trainer's device/precision settings end to end on the CPU: fp16 with loss scaling, micro-batches and gradient
checkpointing in a real run, and a checkpoint round trip that carries the loss scale (tests/unit/test_gpu_kernels.py
repeats the round trip from a GPU to a CPU where a GPU is present)."""

from __future__ import annotations

import math

import pytest
import torch

from bench.launch.cli import execute
from bench.run.store import RunDir
from bench.checkpoint import restore, save
from bench.train import build, train_step
from tests.helpers import make_cfg, strip_times

pytestmark = pytest.mark.slow
KNOBS = ("method=tis", "train.dtype=fp16", "train.micro_batch_size=3", "train.gradient_checkpointing=true")


def test_fp16_micro_batched_checkpointed_run_completes_and_records_its_runtime(tmp_path):
    cfg = make_cfg(tmp_path, *KNOBS)
    assert execute(cfg) == "completed"
    run = RunDir.of(cfg)
    runtime = run.info()["runtime"]
    assert runtime == {"engine": "embedded", "device": "cpu", "device_name": runtime["device_name"],
                       "cpu_model": runtime["cpu_model"], "trainer_dtype": "fp16",
                       "max_position_embeddings": 128, "config_overrides": {}}  # the tiny model's own context, unchanged
    assert runtime["device_name"].startswith("cpu (") and runtime["cpu_model"]  # the ISA and the CPU, for the report
    for row in run.metrics():
        assert row["train/grad_scale"] == 2.0**16 and row["train/skipped_steps"] == 0.0  # fp32 grads on CPU: no overflow
        assert all(math.isfinite(v) for v in row.values())
        parts = sum(row[f"time/{k}"] for k in ("rollout_s", "sync_s", "recompute_s", "train_s"))
        assert math.isclose(parts, row["time/step_s"], rel_tol=1e-9)
        assert not any(k.startswith("method/tis/grad_") or k.startswith("method/tis/skipped") for k in row)


def test_checkpoint_round_trip_continues_identically(tmp_path):
    """Step 1 after restoring the checkpoint written after step 0 equals step 1 of the uninterrupted run: weights,
    AdamW states, RNGs and the fp16 loss scale all come back (the checkpoint is read onto the CPU first)."""
    p = build(make_cfg(tmp_path / "a", *KNOBS))
    train_step(p, 0)
    run = RunDir(tmp_path / "ckpt")
    save(p, run, 1)
    p.compute.scaler.update(new_scale=1024.0)  # not 2^16: the restore below must bring the saved scale back
    ckpt = run.load_checkpoint()
    assert ckpt["grad_scaler"]["scale"] == 2.0**16 and ckpt["generator_device"] == "cpu"
    p.compute.scaler.update(new_scale=2.0**16)
    straight = train_step(p, 1)

    q = build(make_cfg(tmp_path / "b", *KNOBS))
    assert restore(q, ckpt) == 1
    assert q.compute.scaler.get_scale() == 2.0**16
    resumed = train_step(q, 1)
    assert strip_times([resumed]) == strip_times([straight])
    for a, b in zip(p.policy.parameters(), q.policy.parameters()):
        assert torch.equal(a, b)
