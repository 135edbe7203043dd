"""FP16 everywhere: trainer and rollout engine both in IEEE float16, uncorrected loss (Qi, Liu, Zhou et al.,
"Defeating the Training-Inference Mismatch via FP16" (Precision-RL), arXiv 2510.26788).

L = agg( psi(r, A) ) [+ beta_ref * agg(k3_ref)],   r = exp(LR(ltheta - lold)),   lmu unused   (the B0/B1(a) loss)

The arm changes precisions, not the loss: the paper's claim is that BF16's 8-bit significand, not the algorithm,
is the source of the training-inference mismatch, and that reverting both sides to FP16 (10-bit significand,
8x finer rounding, with loss scaling for its narrower range) removes most of it, so that even uncorrected
policy gradient trains stably. Here:
* rollout: `precision: fp16` (bench/quant/plain.py): fp16 weights, activations, KV cache and lm_head, fp32
  accumulation in the GEMMs;
* trainer: `train.dtype: fp16`, set by the arm's yaml (conf/method/fp16.yaml is in Hydra's global package for
  that; `train.dtype=...` on the command line still wins): fp32 master weights, fp16 autocast on CUDA,
  fp16-rounded weights over fp32 arithmetic on CPU, dynamic loss scaling with skipped overflow steps
  (bench/compute.py; logged as train/grad_scale and train/skipped_steps).
Compare it with the bf16 arm (the same loss with BF16 on both sides) and the naive arm (the same loss at a low
rollout precision).

verl 0.9.1 preset: none (it is a precision setting, not a rollout_correction): verl's FP16 support (PR #4036, after
the Precision-RL patch) runs it as `actor_rollout_ref.actor.fsdp_config.dtype=float16
actor_rollout_ref.ref.fsdp_config.dtype=float16 actor_rollout_ref.rollout.dtype=float16` (Precision-RL's own patch:
`actor.dtype`), with `ShardedGradScaler(growth_interval=400)` for the actor, the growth interval used here too
(bench/compute.py GROWTH_INTERVAL).
"""

from __future__ import annotations

from bench.methods.base import MethodConfig
from bench.registry import METHODS
from bench.methods.naive import Naive


@METHODS.register("fp16", schema=MethodConfig, precision="fp16", color="#332288", order=5)
class FP16(Naive):
    """The uncorrected recompute loss with an fp16 trainer and an fp16 rollout engine."""


__all__ = ["FP16"]
