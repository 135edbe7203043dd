"""One run on two processes (FSDP2 over gloo, CPU) trains the same numbers as on one, for every arm.

Both world sizes sample with `train.sampling_shards=2` (two prompt blocks with their own streams, bench/
distributed.py), and the one-process run cuts its minibatch into the same two micro-batches each rank computes
(`train.micro_batch_size` = half the batch), so the forwards have the same shapes at both world sizes. What
differs is only where the gradient of the two halves is summed (FSDP's reduce-scatter instead of accumulation:
a + b either way) and the order of the sums behind the gradient norm and the weight-update diagnostics
(per shard, then across ranks): those agree to ~1e-7, everything else is identical.

Every (arm, estimator) pair runs in the same two processes, one launch, to keep the test within a few minutes.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench.cli import execute
from bench.methods.base import METHODS
from bench.store import RunDir
from tests.helpers import make_cfg, strip_times

pytestmark = pytest.mark.slow

ESTIMATORS = ("grpo", "gae")
SMALL = ["train.steps=2", "train.batch_size=8", "train.group_size=4", "train.eval_every=2", "train.checkpoint_every=1",
         "train.grad_clip=1e6", "algo.critic_lr=1e-4",
         "task.n_test=8", "tracking=disabled", "train.threads=1", "train.sampling_shards=2", "train.micro_batch_size=4"]
RTOL = 1e-6


def cases() -> list[tuple[str, str]]:
    return [(arm, adv) for arm in METHODS.names() for adv in ESTIMATORS]


def case_cfg(out_root: Path, arm: str, adv: str):
    return make_cfg(out_root, *SMALL, f"method={arm}", f"algo.advantage={adv}", f"sweep={arm}-{adv}", fast=False)


def run_all(out_root: str) -> dict[str, str]:
    """Every case in this process (one rank of a group, or alone); returns {case: outcome}."""
    out = {}
    for arm, adv in cases():
        out[f"{arm}-{adv}"] = str(execute(case_cfg(Path(out_root), arm, adv)))
    return out


def close(a: float, b: float) -> bool:
    return a == b or (math.isfinite(a) and math.isfinite(b) and abs(a - b) <= RTOL * max(abs(a), abs(b)))


def test_two_processes_train_what_one_does(tmp_path):
    from bench.distributed import launch_local

    one = run_all(str(tmp_path / "one"))
    two = launch_local(2, run_all, str(tmp_path / "two"))
    assert set(one.values()) == {"completed"} and two == one
    for arm, adv in cases():
        runs = [RunDir.of(case_cfg(tmp_path / w, arm, adv)) for w in ("one", "two")]
        for kind in ("metrics", "evals"):
            rows_1, rows_2 = (strip_times(getattr(r, kind)()) for r in runs)
            assert len(rows_1) == len(rows_2) > 0, (arm, adv, kind)
            for r1, r2 in zip(rows_1, rows_2):
                assert r1.keys() == r2.keys(), (arm, adv, set(r1) ^ set(r2))
                bad = {k: (r1[k], r2[k]) for k in r1 if not close(r1[k], r2[k])}
                assert not bad, (arm, adv, r1["step"], bad)
        assert runs[0].info()["status"] == runs[1].info()["status"] == "completed"
