"""B1(b) naive low-precision rollout, PPO-IS / bypass form (docs/arms.md §4.2(b); QuRL Eq. 3; verl bypass_mode ppo_clip).

L = agg( psi(u, A) ),   u = exp(LR(ltheta - lmu)):  no recompute pass, the rollout engine's log mu plays the role
of log pi_old. At theta = theta_old the ratio is already pi_old/mu != 1, so tokens are clipped before any update
and, for A < 0, the unclipped gradient -u*A has no upper bound; this arm exists to show that failure mode.
"""

from __future__ import annotations

import torch

from bench.methods.base import Batch, MethodConfig
from bench.registry import METHODS
from bench.methods.ppo_clip import PPOClipMethod


@METHODS.register("naive_ppo_is", schema=MethodConfig, color="#E69F00", order=20)
class PPOIS(PPOClipMethod):
    """PPO clip with the behaviour policy mu as the proximal policy; ppo_kl is mean_m(lmu - ltheta)."""

    needs_recompute = False

    def prox_logp(self, batch: Batch) -> torch.Tensor:
        return batch.logp_mu


__all__ = ["PPOIS"]
