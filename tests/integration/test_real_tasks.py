"""A real task and a model preset end to end: a Qwen2.5-shaped chat model saved locally (tests/chat_models.py) under
the `qwen2.5-0.5b-instruct` preset, GSM8K from its hub-schema fixture, eval sets in pass@k mode with top-p."""

from __future__ import annotations

import math
import os

import pytest

from bench.launch.cli import execute
from bench.run.store import RunDir
from tests.chat_models import save_chat_model
from tests.helpers import make_cfg

pytestmark = pytest.mark.slow

FIXTURES = os.path.normpath(os.path.join(os.path.dirname(__file__), os.pardir, "fixtures", "data"))
SHORT = ["train.steps=2", "train.batch_size=8", "train.group_size=4", "train.eval_every=1", "train.checkpoint_every=2",
         "tracking=disabled", "train.threads=1", "train.lr=1e-5"]


def test_preset_model_on_gsm8k_with_benchmark_eval_sets(tmp_path):
    local = save_chat_model("qwen2", tmp_path / "Qwen2.5-0.5B-Instruct", max_positions=256)
    cfg = make_cfg(tmp_path, *SHORT, "model=qwen2.5-0.5b-instruct", f"model.path={local}", "model.max_length=512",
                   "model.max_position_embeddings=512",  # past the saved 256 positions (issue 33 N1)
                   "task=gsm8k", f"task.source={FIXTURES}/gsm8k", "task.max_new_tokens=12",
                   "eval.sets=[gsm8k,math500]", f"+eval.overrides.math500.source={FIXTURES}/math500",
                   "eval.mode=pass@k", "eval.k=2", "eval.n=3", "eval.top_p=0.9", "eval.max_new_tokens=8",
                   "train.micro_batch_tokens=64", fast=False)
    assert execute(cfg) == "completed"
    run = RunDir.of(cfg)
    assert run.path.parts[-2:] == ("qwen2.5-0.5b-instruct", "seed0")
    rows = run.metrics()
    assert [r["step"] for r in rows] == [0, 1]
    for r in rows:
        assert r["reward/scorer_timeouts"] == 0.0 and r["reward/scorer_errors"] == 0.0
        assert 1 <= r["reward/response_length"] <= 12
        assert all(math.isfinite(v) for v in r.values()), r
    evals = run.evals()
    assert [e["step"] for e in evals] == [0, 1, 2]
    for e in evals:
        for name in ("gsm8k", "math500"):
            assert {f"eval/{name}/pass@1", f"eval/{name}/pass@2", f"eval/{name}/reward_mean",
                    f"eval/{name}/response_length", f"eval/{name}/scorer_timeouts"} <= set(e)
            assert 0.0 <= e[f"eval/{name}/pass@1"] <= e[f"eval/{name}/pass@2"] <= 1.0
            assert e[f"eval/{name}/response_length"] <= 8
        assert 0.0 <= e["eval/accuracy"] <= 1.0 and e["eval/response_length"] <= 12
    assert run.info()["final/eval_accuracy"] == evals[-1]["eval/accuracy"]
    runtime = run.info()["runtime"]  # the context the run had, and what its config.json was given
    assert runtime["max_position_embeddings"] == 512 and runtime["config_overrides"] == {"max_position_embeddings": 512}
