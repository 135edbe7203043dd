"""M9 The on-policy quantized control ("fix at source"): the trainer computes at the rollout engine's precision
(docs/arms.md §4.20).

L = agg( psi(r, A) ) [+ beta * agg(k3_ref)],   r = exp(LR(ltheta - lold)),   lmu unused   (the naive arm's loss)

The loss is naive's; what changes is the trainer's forward. Both the recompute of pi_old and the update's pi_theta run
through the engine's quantizer at `rollout.precision` (weights and activations as the engine quantizes them, its
activation dtype and attention, its KV-cache rounding), with straight-through gradients into the fp32 master weights
(bench/rollout/qat.py). So pi_old is mu up to float summation order (mismatch/kl_k3 <= 1e-6 per token, tests/unit/
test_qat.py), and a naive gap splits in two, per cell and paired by seed (analysis/decomposition.py):

    sampler-and-capacity cost  = bf16 - matched   what the quantized network costs as a sampler and a learner
    mismatch cost              = matched - naive  what the off-policy gradient costs: all a correction can recover

This is the field's unified-precision row: Jet-RL (arXiv 2601.14243) trains and rolls out in one FP8 precision,
verl's `actor_rollout_ref.actor.fsdp_config.qat` trains NVFP4 W4A16 through a fake quantizer
(`verl/utils/qat/quantizer.py`), miles trains INT4 QAT weights (`scale = max|w| / 7`). No verl rollout_correction
preset: it is a precision setting of the actor. The evaluation, as for every arm, greedily decodes the trainer's
fp32 master weights (eval.engine).
"""

from __future__ import annotations

from typing import Any

import torch

from bench.device import DTYPES
from bench.methods.base import MethodConfig
from bench.registry import METHODS
from bench.methods.naive import Naive
from bench.quant.fp8 import choose_fp8_kernel
from bench.rollout.qat import quantize_trainer, unsupported
from bench.rollout.base import rollout_quantizer

#: the trainer dtype this arm needs: its forward rounds as the engine does, so nothing may round before it
TRAINER_DTYPE = "fp32"


@METHODS.register("matched", schema=MethodConfig, color="#AA3377", order=12)
class Matched(Naive):
    """The naive loss with the trainer's forward at the rollout's precision (straight-through gradients)."""

    @classmethod
    def check_run(cls, cfg: Any) -> None:
        if cfg.rollout.engine != "embedded":
            raise ValueError(f"method=matched reproduces the embedded engine's arithmetic; rollout={cfg.rollout.engine} "
                             "is not supported (use rollout=embedded)")
        if cfg.train.dtype != TRAINER_DTYPE:
            raise ValueError(f"method=matched computes at the rollout's precision and needs train.dtype={TRAINER_DTYPE} "
                             f"(its yaml sets it), not train.dtype={cfg.train.dtype}")
        problem = unsupported(rollout_quantizer(cfg.rollout))
        if problem:
            raise ValueError(f"method=matched at rollout.precision={cfg.rollout.precision}: {problem}")

    def setup_trainer(self, model: torch.nn.Module, rollout: Any) -> None:
        device = next(model.parameters()).device
        quantizer = rollout_quantizer(rollout)
        kernel = rollout.get("fp8_kernel", "auto")
        if quantizer.format == "fp8_e4m3" and any(
                choose_fp8_kernel(kernel, quantizer, tuple(m.weight.shape), device) == "scaled_mm"
                for m in model.modules() if isinstance(m, torch.nn.Linear)):
            # the trainer runs the emulation's fp32 arithmetic; torch._scaled_mm accumulates in fewer bits (on an
            # H200 its difference from the emulation was 0.31 of the quantization's own effect): pi_old != mu
            raise ValueError(f"method=matched at rollout.precision=fp8_e4m3 on {device.type}: the engine would run "
                             f"torch._scaled_mm (rollout.fp8_kernel={kernel}), which the trainer cannot reproduce; set "
                             "rollout.fp8_kernel=emulated, for every arm the control is compared with")
        act = DTYPES[rollout.get("act_dtype") or quantizer.fmt.act_dtype_on(device.type)]  # as the engine picks it
        quantize_trainer(model, quantizer, act, bool(rollout.get("quantize_lm_head")),
                         bool(rollout.get("quantize_embeddings")), rollout.get("kv_cache_dtype"))


__all__ = ["Matched"]
