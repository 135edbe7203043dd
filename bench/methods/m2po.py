"""M2PO, second-moment trust policy optimization (Zheng et al., "Prosperity before Collapse: How Far Can Off-Policy
RL Reach with Stale Data on LLMs?", arXiv 2510.01161): drop the tokens with the largest squared log-ratio until the
second moment of the rest is below tau, and train the rest on the plain ratio.

m2[i,t] = (lmu - lold)^2                              on valid tokens; constant, once per rollout batch
sort m2 in decreasing order and drop its largest values, one by one, until the mean of the rest is < m2po_tau
L       = agg( keep * psi_open(r, A) ),   r = exp(LR(ltheta - lold)),   psi_open(r, A) = -r * A (no clip)

Why the second moment: it bounds the variance of the importance weights without clipping each token, so M2PO
drops only the few extreme outliers of a stale or mismatched batch (at tau = 0.04, a batch whose tokens all have
|log rho| < 0.2 keeps every token) while PPO's clip and TIS's cap act on ordinary tokens too.

Source and defaults: AReaL areal/trainer/ppo/actor.py `_apply_m2po_masking` / `_get_m2po_loss_mask` and
examples/math/gsm8k_m2po.yaml (`actor.m2_threshold: 0.04`) @cbff54d, and docs/en/algorithms/m2po.md (objective
1/sum|o_i| sum_i,t M_i,t r_i,t A_i,t: the plain ratio, no clip):
* m2 = (old_logp - prox_logp)^2 with old = the engine's log-probs (AReaL's behaviour policy) and prox = the
  recomputed ones: here (lmu - lold)^2.
* the first k of the sorted values are dropped, k the first index whose suffix mean is strictly below the threshold;
  when none is, all but the smallest are dropped (AReaL raises on an empty mask; so does the rule's "until", which
  needs one token to average). Ties keep the sort's order.
* AReaL applies the mask per loss call (its example runs one minibatch per batch, so per rollout batch, as here),
  then runs its PPO loss on the kept tokens and normalizes by the kept count: the token-mean denominator is N_kept
  there (denominator=kept, with m2po_clip=true for its clipped surrogate); here, by default, the paper's objective:
  the unclipped ratio over the 1/sum|o_i| of all tokens.

Metrics (`method/m2po/*`): masked_frac (valid tokens dropped), m2_before / m2_after (mean m2 of all valid tokens /
of the kept ones).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from bench.domains import num
from bench.methods.base import Batch, MaskingConfig
from bench.registry import METHODS
from bench.methods.importance import ConstantWeightMethod, behaviour_log_ratio


@dataclass
class M2POConfig(MaskingConfig):
    # drop the largest (log pi_old/mu)^2 until the mean of the rest is < tau (AReaL m2_threshold)
    m2po_tau: float = num(0.04, "(0, inf)")
    m2po_clip: bool = False  # false: the paper's unclipped ratio; true: PPO's clip (algo.clip_eps_*) as AReaL's loss


@torch.no_grad()
def m2po_keep(m2: torch.Tensor, mask: torch.Tensor, tau: float) -> torch.Tensor:
    """Bool [B, T]: the valid tokens M2PO keeps (module docstring); all of them when their mean is below tau."""
    m = mask.bool()
    values = m2[m]
    keep = torch.zeros_like(m)
    if values.numel() == 0:
        return keep
    order = torch.argsort(values, descending=True, stable=True)
    sorted_m2 = values[order].double()
    n = sorted_m2.numel()
    suffix_mean = sorted_m2.flip(0).cumsum(0).flip(0) / torch.arange(n, 0, -1, dtype=torch.float64, device=m2.device)
    below = torch.nonzero(suffix_mean < tau)
    n_drop = int(below[0]) if below.numel() else n - 1
    kept_sorted = torch.arange(n, device=m2.device) >= n_drop
    kept_values = torch.empty_like(kept_sorted)
    kept_values[order] = kept_sorted
    keep[m] = kept_values
    return keep


@METHODS.register("m2po", schema=M2POConfig, color="#EE7733", order=43)
class M2PO(ConstantWeightMethod):
    """The unclipped ratio objective on the tokens left after M2PO's second-moment mask."""

    diagnostics = {"masked_frac": "M2PO masked token frac."}
    metric_keys = ("masked_frac", "m2_before", "m2_after")

    def lower(self, batch: Batch, stats: dict[str, Any]) -> float:
        return super().lower(batch, stats) if self.cfg.m2po_clip else 0.0

    def upper(self, batch: Batch, stats: dict[str, Any]) -> float | torch.Tensor:
        return super().upper(batch, stats) if self.cfg.m2po_clip else math.inf

    @torch.no_grad()
    def prepare(self, batch: Batch) -> dict[str, Any]:
        mask = batch.mask.bool()
        delta = behaviour_log_ratio(batch, float("inf"))  # raw lold - lmu, 0 off-mask
        m2 = delta * delta
        keep = m2po_keep(m2, mask, self.cfg.m2po_tau)
        n, n_kept = int(mask.sum()), int(keep.sum())
        return {
            "masked_frac": (n - n_kept) / max(n, 1),
            "m2_before": float(m2[mask].double().mean()) if n else 0.0,
            "m2_after": float(m2[keep].double().mean()) if n_kept else 0.0,
            "is_weights": keep.to(delta.dtype),
        }


__all__ = ["M2PO", "M2POConfig", "m2po_keep"]
