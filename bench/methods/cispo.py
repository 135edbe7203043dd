"""CISPO, clipped importance-sampling-weight policy optimization (MiniMax, "MiniMax-M1: Scaling Test-Time Compute
Efficiently with Lightning Attention", arXiv 2506.13585, Eq. 4-5): REINFORCE with a clipped, detached IS weight.

r[i,t] = exp(LR(ltheta - l_a))          l_a = lold (cispo_anchor=old, the paper's pi_old) or lmu (rollout)
w[i,t] = sg( clip(r, 1 - cispo_eps_low, 1 + cispo_eps_high) )
L      = agg( -w * A * ltheta ) [+ beta_ref * agg(k3_ref)]
dL/dltheta_t = -w_t * A_t * m / N       for every token, clipped or not

Why: PPO's clip zeroes the gradient of a token whose ratio left the band, and those are disproportionately the
rare "fork" tokens (However, Wait) that steer a reasoning chain; CISPO clips the weight instead and keeps every
token's gradient. No token is dropped (kept_tokens is None).

The anchor decides what the clip corrects. With cispo_anchor=old (the paper, verl, ROLL, SkyRL's default) r is
the on-policy ratio pi_theta/pi_old: at the first minibatch r = 1, so the rollout/trainer mismatch is not corrected
at all (CISPO then behaves as REINFORCE on mu's samples, like the naive arm's gradient). With cispo_anchor=rollout
(SkyRL's option for asynchronous training) r = pi_theta/mu is the full off-policy correction and the clip is a TIS
cap on it.

Sources and defaults:
* SkyRL skyrl/train/config/config.py `CISPOConfig` @a956457: cispo_eps_clip_low 1.0, cispo_eps_clip_high 4.0
  (bounds [0, 5], "following the ScaleRL recipe", arXiv 2510.13786), cispo_anchor "old" | "rollout": our defaults.
* verl verl/trainer/ppo/core_algos.py `compute_policy_loss_cispo` @1dda039: ratio pi_theta/pi_old clamped at +-20,
  clip(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high) detached, loss -sg(clip) * A * log_prob; the bounds are the
  actor's clip_ratio_low/high (0.2/0.2 by default, verl/workers/config/actor.py).
* ROLL roll/pipeline/agentic/agentic_actor_pg_worker.py `_compute_cispo_loss` @8eb27cc: the same loss,
  cispo_epsilon_low/high 0.1/0.1 by default.
* AReaL areal/utils/functional/functional.py `cispo_loss_fn` @cbff54d: the same loss; its docstring names
  eps_clip=1.0, eps_clip_higher=4.0 as the canonical MiniMax-M1/ScaleRL range.

Metrics (`method/cispo/*`): clip_frac_low / clip_frac_high (valid tokens whose r is below / above the band),
weight_mean (mean w). train/clipfrac is their sum (tokens whose weight was clipped, verl's pg_clipfrac).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from bench.domains import num
from bench.grpo import agg_loss, compute_dtype, masked_mean, safe_log_ratio
from bench.methods.base import Batch, Method, MethodConfig, token_advantages
from bench.registry import METHODS
from bench.methods.ppo_clip import add_kl_ref

ANCHORS = ("old", "rollout")


@dataclass
class CISPOConfig(MethodConfig):
    cispo_eps_low: float = num(1.0, "[0, 1]", {1.0: "no lower bound (SkyRL/ScaleRL)"})  # weight >= 1 - eps
    cispo_eps_high: float = num(4.0, "(0, inf)")  # weight <= 1 + eps (SkyRL/ScaleRL: 5), CISPO's defining clip
    cispo_anchor: str = "old"  # old: r = pi_theta/pi_old (the paper) | rollout: r = pi_theta/mu (no recompute pass)

    def check(self) -> None:
        if self.cispo_anchor not in ANCHORS:
            raise ValueError(f"method.cispo_anchor={self.cispo_anchor!r} is not valid; choose one of: "
                             f"{', '.join(ANCHORS)}")


@METHODS.register("cispo", schema=CISPOConfig, color="#CC3311", order=55)
class CISPO(Method):
    """REINFORCE on every token with the detached weight clip(pi_theta / pi_anchor, 1 - eps_low, 1 + eps_high)."""

    diagnostics = {"clip_frac_high": "CISPO weight clipped high frac."}
    metric_keys = ("clip_frac_low", "clip_frac_high", "weight_mean")

    def __init__(self, cfg: Any, algo: Any) -> None:
        super().__init__(cfg, algo)
        self.needs_recompute = cfg.cispo_anchor == "old"

    def loss(self, logp: torch.Tensor, batch: Batch, stats: dict[str, Any]) -> tuple[torch.Tensor, dict[str, float]]:
        cfg, algo = self.cfg, self.algo
        dt = compute_dtype(logp)
        lt = logp.to(dt)
        mask = batch.mask.bool()
        anchor = batch.logp_old if cfg.cispo_anchor == "old" else batch.logp_mu
        if anchor is None:
            raise ValueError("method 'cispo' with cispo_anchor=old needs the recompute pass (batch.logp_old is None)")
        la = anchor.detach().to(dt)
        adv = token_advantages(batch.adv, lt)
        zero = torch.zeros((), dtype=dt, device=lt.device)
        with torch.no_grad():
            r = torch.exp(safe_log_ratio(lt.detach(), la, mask, algo.log_ratio_clamp))
            lo, hi = 1.0 - cfg.cispo_eps_low, 1.0 + cfg.cispo_eps_high
            w = r.clamp(lo, hi)
        per_token = -w * adv * torch.where(mask, lt, zero)
        loss = agg_loss(per_token, mask, algo.loss_agg, batch.n_tokens)
        with torch.no_grad():
            low, high = (r < lo) & mask, (r > hi) & mask
            metrics = {
                "clipfrac": float(masked_mean((low | high).to(dt), mask)),
                "ppo_kl": float(masked_mean(la - lt.detach(), mask)),
                "clip_frac_low": float(masked_mean(low.to(dt), mask)),
                "clip_frac_high": float(masked_mean(high.to(dt), mask)),
                "weight_mean": float(masked_mean(w, mask)) if mask.any() else 1.0,
            }
        loss, metrics["kl_ref"] = add_kl_ref(self, loss, lt, batch)
        return loss, metrics


__all__ = ["CISPO", "CISPOConfig"]
