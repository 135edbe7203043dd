"""The trainer's evaluation through vLLM (eval.engine=auto with rollout=vllm; bench.rollout.vllm_engine.VLLMEvalEngine):
2 training steps with fp8 rollouts and evaluations at steps 0 and 2.

Checks that the evaluation runs in an unquantized vLLM engine (fp32 on this CPU) and gives the embedded fp32
engine's greedy accuracy on the same weights; that it moves neither the run's sampling generator nor torch's
global stream; and that the rollout engine is fp8 again afterwards (vLLM's fp8 weights with the fresh scales of
the policy), never left holding the evaluation's weights.
"""

from __future__ import annotations

import gc

import pytest
import torch
from omegaconf import OmegaConf

from bench.evaluation import evaluate_policy
from bench.models.tokenizer import engine_ids
from bench.rollout import build_engine
from bench.rollout.embedded import EmbeddedRolloutConfig
from bench.run.store import RunDir
from bench.train import build, evaluate, train
from tests.helpers import make_cfg
from tests.vllm.helpers import fp8_channel_scale

pytestmark = pytest.mark.vllm

RUN = ["rollout=vllm", "method=naive", "train.steps=2", "train.eval_every=2", "model.warmstart_steps=40",
       "model.warmstart_target_acc=null"]


def qkv_weight(engine):
    return engine.apply_model(lambda m: m.model.layers[0].self_attn.qkv_proj.weight.detach().clone())


def test_training_evaluates_through_an_unquantized_vllm_engine_and_rolls_out_fp8_after(tmp_path):
    cfg = make_cfg(tmp_path, *RUN)
    parts = build(cfg)
    try:
        engine, ev_engine = parts.engine, parts.eval_engine
        assert type(ev_engine).__name__ == "VLLMEvalEngine" and ev_engine.template is engine
        assert engine.precision == "fp8_e4m3" and ev_engine.precision == "fp32"  # this CPU's evaluation precision
        run = RunDir.of(cfg)
        with run.lock():
            assert train(parts, run, OmegaConf.to_yaml(cfg, resolve=True), RunDir.name_of(cfg)) == "completed"
        evals, rows = run.evals(), run.metrics()
        assert [e["step"] for e in evals] == [0, 2]
        # step 0's rollout came after step 0's evaluation: fp8, with its quantization error measured
        assert any(k.startswith("quant/quant_error/") for k in rows[0]) and rows[0]["mismatch/kl_k3"] > 0
        assert ev_engine.active is None and engine.llm is None  # the final evaluation closed both engines

        # the same weights in the embedded fp32 engine: the same greedy accuracy (fp32 argmax on both sides;
        # one flipped near-tie per 32 problems allowed)
        embedded = build_engine(EmbeddedRolloutConfig(precision="fp32"), **engine_ids(parts.tokenizer, parts.policy),
                                max_len=engine.max_len)
        want = evaluate_policy(embedded, parts.policy, parts.tokenizer, parts.task, {}, cfg.eval,
                               parts.prompt_format, cfg.seed, 2)
        print(f"eval/accuracy at step 2: vLLM {evals[-1]['eval/accuracy']}, embedded fp32 {want['eval/accuracy']}")
        assert evals[-1]["eval/accuracy"] == pytest.approx(want["eval/accuracy"], abs=1 / 32 + 1e-9)

        # evaluating moves neither the run's generator nor torch's global stream, and is repeatable
        gen, glob = parts.generator.get_state(), torch.get_rng_state()
        again = evaluate(parts, 2)
        assert torch.equal(parts.generator.get_state(), gen) and torch.equal(torch.get_rng_state(), glob)
        assert again["eval/accuracy"] == evals[-1]["eval/accuracy"]

        # the next sync rebuilds the rollout engine at fp8 from the current policy: fp8 weights, fresh scales
        engine.load_weights(parts.policy)
        assert qkv_weight(engine).dtype == torch.float8_e4m3fn
        at = parts.policy.model.layers[0].self_attn
        qkv = torch.cat([at.q_proj.weight, at.k_proj.weight, at.v_proj.weight]).detach()
        scales = engine.apply_model(lambda m: m.model.layers[0].self_attn.qkv_proj.weight_scale.detach().clone())
        assert torch.equal(scales.flatten(), fp8_channel_scale(qkv).flatten())
        assert engine.quant_metrics()
    finally:
        parts.eval_engine.release()
        parts.engine.close()
        del parts
        gc.collect()
