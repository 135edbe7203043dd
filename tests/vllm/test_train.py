"""(c) 5-step GRPO runs through the real trainer with rollout=vllm: bf16 and the fp8 arm (fp8_per_channel).

The trainer times `engine.load_weights` as time/sync_s; for the vLLM engine that call is the in-place push,
vLLM's re-quantization of every layer and the prefix-cache reset, all synchronous in this process. The test
checks the rows are complete and finite, that the engine started before step 0's evaluation, and (fp8) that the
engine's scales after a sync are the fresh scales of the policy it was given.
"""

from __future__ import annotations

import gc
import math

import pytest
import torch
from omegaconf import OmegaConf

from bench.run.store import RunDir
from bench.train import build, train
from tests.helpers import make_cfg
from tests.vllm.helpers import fp8_channel_scale

pytestmark = pytest.mark.vllm

STEP_KEYS = [
    "step", "reward/mean", "reward/std", "reward/accuracy", "reward/response_length",
    "train/loss", "train/grad_norm", "train/clipfrac", "train/entropy", "train/ppo_kl", "train/lr",
    "mismatch/kl_k1", "mismatch/kl_k3", "mismatch/ratio_max", "mismatch/ratio_min", "mismatch/logp_diff_mean",
    "mismatch/is_ess", "mismatch/frac_nonfinite_logprob",
    "time/rollout_s", "time/sync_s", "time/train_s", "time/step_s", "time/rollout_tokens_per_s",
]
# a short SFT warm start of its own (cached like any other): the runs need a policy, not a good one
# eval.engine=embedded: these runs test the rollouts; evaluation through vLLM is test_eval_vllm.py's
RUN = ["rollout=vllm", "train.steps=5", "model.warmstart_steps=40", "model.warmstart_target_acc=null",
       "eval.engine=embedded"]


@pytest.mark.parametrize("method, precision", [("bf16", "bf16"), ("naive", "fp8_e4m3")])
def test_grpo_run_with_vllm_rollouts(tmp_path, method, precision):
    cfg = make_cfg(tmp_path, *RUN, f"method={method}")
    parts = build(cfg)
    try:
        engine = parts.engine
        assert type(engine).__name__ == "VLLMEngine" and engine.precision == precision
        run = RunDir.of(cfg)
        with run.lock():
            assert train(parts, run, OmegaConf.to_yaml(cfg, resolve=True), RunDir.name_of(cfg)) == "completed"
        rows = run.metrics()
        assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
        for r in rows:
            assert set(STEP_KEYS) <= set(r), set(STEP_KEYS) - set(r)
            assert all(math.isfinite(v) for v in r.values()), r
            assert r["reward/response_length"] > 0 and r["time/sync_s"] > 0
            assert r["mismatch/kl_k3"] > 0  # a bf16/fp8 vLLM rollout is not the trainer's exact policy
        assert [e["step"] for e in run.evals()] == [0, 2, 4, 5]
        # the engine started before step 0's evaluation (which is embedded here: it does not share it), so a
        # vLLM that cannot start fails before an evaluation; step 0's sync was then an in-place push
        assert engine.num_syncs == 6 and engine.build_s > 0
        assert rows[-1]["time/sync_s"] >= engine.last_sync_s > 0  # later ones: in-place push + re-quantization
        if precision == "fp8_e4m3":
            assert any(k.startswith("quant/quant_error/") for k in rows[0])
            engine.load_weights(parts.policy)
            at = parts.policy.model.layers[0].self_attn
            qkv = torch.cat([at.q_proj.weight, at.k_proj.weight, at.v_proj.weight]).detach()
            scales = engine.apply_model(lambda m: m.model.layers[0].self_attn.qkv_proj.weight_scale.detach().clone())
            assert torch.equal(scales.flatten(), fp8_channel_scale(qkv).flatten())  # fresh from the trained policy
    finally:
        assert type(parts.eval_engine).__name__ == "EmbeddedEngine"  # eval.engine=embedded
        parts.engine.close()
        del parts
        gc.collect()
