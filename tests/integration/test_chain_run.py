"""task=chain end to end: composes from conf/ with model=tiny_long, trains two GRPO steps on long answers.

Uses a throw-away warm start (5 SFT steps, 1 layer) so that the test takes seconds: the point is that the
config group, the 512-position preset and the long generation budget work together, not the accuracy.
"""

from __future__ import annotations

import pytest

from bench.launch.cli import execute
from bench.run.store import RunDir
from tests.helpers import make_cfg

pytestmark = pytest.mark.slow

QUICK_MODEL = ["model.num_layers=1", "model.warmstart_steps=5", "model.warmstart_target_acc=null"]


def test_chain_run_generates_long_answers(tmp_path):
    cfg = make_cfg(tmp_path, "task=chain", "model=tiny_long", "method=naive", "task.n_train=64", "train.steps=2",
                   f"model.cache_dir={tmp_path / 'cache'}", *QUICK_MODEL)
    assert cfg.model.max_position_embeddings == 512 and cfg.task.max_new_tokens == 120
    assert execute(cfg) == "completed"
    rows = RunDir.of(cfg).metrics()
    assert [r["step"] for r in rows] == [0, 1]
    # an untrained model rarely stops early: responses are far longer than the ~3 tokens of arithmetic
    assert all(r["reward/response_length"] > 20 for r in rows)
    # chi2 is the plain estimator mean(rho^2) - 1: unbiased, and legitimately negative on a finite batch when the
    # true chi2 is below the batch's sampling noise (bench/mismatch.py); rho^2 >= 0 bounds it below by -1
    assert all(-1.0 <= r["mismatch/chi2_seq"] < float("inf") and r["mismatch/kl_k3"] > 0 for r in rows)
