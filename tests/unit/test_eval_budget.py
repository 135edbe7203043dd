"""The dry run's evaluation-time estimate per engine (bench/launch/budget.py `eval_estimate`) on hand-computed
cases: the embedded eager decoder against vLLM."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from bench.eval_config import EvalConfig
from bench.launch.budget import (BudgetConfig, EAGER_LAYER_S, HBM_BYTES_PER_S, eager_tokens_per_s, eval_estimate,
                                  eval_passes, problem_count)
from bench.launch.memory import Shape
from bench.train_config import TrainConfig

# Qwen2.5-Math-7B (bench/launch/memory.py SHAPES)
MATH_7B = Shape(3584, 28, 28, 4, 128, 18944, 152064, False)


def test_problem_counts_from_the_task_config():
    assert problem_count({"n_test": 32}) == 32  # a generated task
    assert problem_count({"source": "HuggingFaceH4/aime_2024", "test_split": "train"}) == 30  # the card's rows
    assert problem_count({"source": "HuggingFaceH4/MATH-500", "test_split": "test", "max_test": 100}) == 100
    assert problem_count({"source": "x/y", "test_split": None, "test_size": 500}) == 500  # held out of train
    assert problem_count({"source": "/data/mine.jsonl", "test_split": "test"}) is None  # unknown: no estimate
    assert problem_count({"source": "/data/mine.jsonl", "test_split": "test", "max_test": 7}) == 7


def qurl_table2_like():
    """QuRL Table 2's evaluation: 500 held-out DAPO problems greedy at 8,192 tokens, AIME24 avg@32 at 8,192."""
    return OmegaConf.create({
        "budget": OmegaConf.structured(BudgetConfig(params_b=7.62, prompt_tokens=200)),
        "train": OmegaConf.structured(TrainConfig(steps=200, eval_every=50)),
        "eval": OmegaConf.structured(EvalConfig(sets=["aime24"], mode="avg@k", k=32, max_new_tokens=8192,
                                                batch_size=8)),
        "task": {"name": "dapo_math", "source": "BytedTsinghua-SIA/DAPO-Math-17k", "test_split": None,
                 "test_size": 500, "max_new_tokens": 8192},
        "model": {"path": "Qwen/Qwen2.5-Math-7B"},
    })


def test_eager_decode_rate_by_hand():
    """8 sequences of 200 + 8,192 tokens (the 2^18-position chunk holds 31: the batch size limits), fp32:
    weights 4 x 7,615,283,200 = 30.46 GB; KV cache 8 x (200 + 4,096) x 2 x 28 x 4 x 128 x 4 B = 3.94 GB;
    (34.40e9 / 3.35e12) s + 28 x 0.35 ms = 10.27 + 9.80 ms = 20.07 ms per step -> 398.6 tokens/s."""
    assert MATH_7B.params == 7_615_283_200 and MATH_7B.kv_bytes(4) == 114_688
    read = 4 * MATH_7B.params + 8 * 4296 * 114_688
    assert eager_tokens_per_s(MATH_7B, 8, 200, 8192) == pytest.approx(8 / (read / HBM_BYTES_PER_S + 28 * EAGER_LAYER_S))
    assert eager_tokens_per_s(MATH_7B, 8, 200, 8192) == pytest.approx(398.6, abs=0.5)
    # at 32k tokens the chunk bounds the batch: 2^18 // 32,968 = 7 sequences, whatever eval.batch_size says
    assert eager_tokens_per_s(MATH_7B, 64, 200, 32768) == pytest.approx(eager_tokens_per_s(MATH_7B, 7, 200, 32768))


def test_eval_time_per_engine_by_hand():
    """Per evaluation: 500 x 1 x 8,192 + 30 x 32 x 8,192 = 11,960,320 tokens; 5 evaluations (0, 50, 100, 150, 200).
    vLLM at the FLOPs rate 0.1 x 989e12 / (2 x 7.62e9) = 6,489.5 tokens/s: 1,843 s each -> 2.56 h.
    Embedded at 398.6 tokens/s: 30,005 s each -> 41.7 h: the eager decoder is ~16x slower here."""
    cfg = qurl_table2_like()
    assert eval_passes(cfg) == [(500, 1, 8192), (30, 32, 8192)]
    e = eval_estimate(cfg)
    assert (e.tokens_per_eval, e.evals) == (11_960_320, 5)
    assert e.vllm_hours == pytest.approx(5 * 11_960_320 / 6489.5 / 3600, rel=1e-3)
    assert e.vllm_hours == pytest.approx(2.56, abs=0.01)
    assert e.embedded_hours == pytest.approx(5 * 11_960_320 / eager_tokens_per_s(MATH_7B, 8, 200, 8192) / 3600)
    assert e.embedded_hours == pytest.approx(41.7, abs=0.1)
    assert e.line() == ("eval <= ~41.7 h embedded / ~2.6 h vLLM on 1 GPU (5 x <= 11,960,320 tokens, every response "
                        "at its max)")


def test_no_estimate_without_a_size_a_shape_or_a_throughput():
    cfg = qurl_table2_like()
    cfg.task.source, cfg.task.test_split = "/data/dapo.parquet", "test"
    assert eval_estimate(cfg) is None  # the training task's test size is unknown
    cfg = qurl_table2_like()
    cfg.model.path = "/nonexistent/model"
    assert eval_estimate(cfg) is None  # no shape
    cfg = qurl_table2_like()
    cfg.budget.params_b = None
    assert eval_estimate(cfg) is None  # no throughput


def test_the_embedded_evaluation_is_never_priced_below_vllm():
    """A fast-looking eager decoder (a stated vLLM rate far below the memory model's) is shown and priced at vLLM's
    rate, as the rollout is: the model is a lower bound on the eager decoder's time, not a claim that it wins."""
    cfg = qurl_table2_like()
    cfg.budget.gen_tokens_per_s = 10.0  # a vLLM far slower than the eager decoder's 398.6 tokens/s
    cfg.budget.train_tokens_per_s = 10.0
    cfg.budget.forward_tokens_per_s = 10.0
    e = eval_estimate(cfg)
    assert e.embedded_s_per_eval == e.vllm_s_per_eval == pytest.approx(11_960_320 / 10.0)
