"""B0 BF16 rollout and B1(a) naive low-precision rollout, recompute form (docs/arms.md §4.1, B1(a)).

L = agg( psi(r, A) ) [+ beta * agg(k3_ref)],   r = exp(LR(ltheta - lold)),   lmu unused.

Both arms run the same loss. `bf16` is the matched-precision baseline (it rolls out in bf16 only); `naive` is the
same loss at whatever `rollout.precision` says (fp8_e4m3 by default): `naive@int8`, `naive@mxfp4`, ... The
precision is data, never code.
"""

from __future__ import annotations

from bench.methods.base import MethodConfig
from bench.registry import METHODS
from bench.methods.ppo_clip import PPOClipMethod


@METHODS.register("naive", schema=MethodConfig, color="#D55E00", order=10)
@METHODS.register("bf16", schema=MethodConfig, precision="bf16", color="#000000", order=0)
class Naive(PPOClipMethod):
    """B0 / B1(a): plain GRPO on the recomputed pi_old; the rollout/trainer mismatch is left uncorrected."""


__all__ = ["Naive"]
