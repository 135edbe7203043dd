"""B0 BF16 rollout and B1(a) naive FP8 rollout, recompute form (methods.md B0, B1(a)).

L = agg( psi(r, A) ) [+ beta * agg(k3_ref)],   r = exp(LR(ltheta - lold)),   lmu unused.

Both arms run the same loss; they differ only in the rollout precision of their config (`bf16` vs `fp8`), never
in code (DESIGN.md: precision is data).
"""

from __future__ import annotations

from bench.methods.base import METHODS, MethodConfig
from bench.methods.ppo_clip import PPOClipMethod


@METHODS.register("fp8", schema=MethodConfig, color="#D55E00", order=10)
@METHODS.register("bf16", schema=MethodConfig, color="#000000", order=0)
class Naive(PPOClipMethod):
    """B0 / B1(a): plain GRPO on the recomputed pi_old; the rollout/trainer mismatch is left uncorrected."""


__all__ = ["Naive"]
