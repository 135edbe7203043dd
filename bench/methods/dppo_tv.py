"""DPPO-Binary-TV with the Kimi KL, prime-rl's default loss (DPPO: arXiv 2602.04879; the squared-log-ratio KL:
Kimi K2.5, arXiv 2602.02276): a trust region in probability space conditioned on the advantage's sign, plus a
quadratic pull of pi_theta towards the behaviour policy on every token.

l_b[i,t] = lmu (dppo_behaviour=rollout: prime-rl's bypass form) or lold (recompute: verl's dppo_tv)
r        = exp(LR(ltheta - l_b)),   d = exp(ltheta) - exp(l_b)                   (d detached: it only masks)
drop_t   = (A > 0 and d > dppo_eps_high) or (A <= 0 and d < -dppo_eps_low)
L        = agg( -A * sg(min(r, c) / r) * r * (1 - drop) + dppo_kl_tau * (log r)^2 )
dL/dltheta = [ -A * min(r, c) * (1 - drop) + 2 * tau * log r ] * m / N           c = dppo_ratio_cap (null: none)

Why: PPO's ratio clip treats a token at p = 1e-4 -> 3e-4 like one at 0.3 -> 0.9; a bound on the change of the
token's probability (its binary total variation) is a trust region on what the update moves. A positive-advantage
token whose probability already rose by more than eps_high, or a negative one whose probability fell by more than
eps_low, leaves the policy-gradient term; the (log r)^2 term stays on every valid token, dropped or not, so a
dropped token is still pulled back. Unlike every other arm, a batch whose tokens are all dropped still has a loss
and a gradient: the KL term's (conformance: `regularizes_dropped`).

Sources and defaults, each read at a commit:
* prime-rl src/prime_rl/trainer/rl/loss.py `default_loss_fn` and packages/prime-rl-configs/src/prime_rl/configs/
  trainer.py `DefaultLossConfig` @559b447: ratio trainer/inference (bypass, no +-20 clamp there), probs_diff =
  exp(trainer) - exp(inference), mask torch.where(A > 0, diff > dppo_mask_high, diff < -dppo_mask_low) (an
  advantage of 0 takes the low branch), loss -A * ratio * keep + kl_tau * log_ratio^2 over the loss mask, summed and
  divided by the step's token count; dppo_mask_low = dppo_mask_high = 0.2, kl_tau = 1e-3, adv_tau = 1.0 (a scale of
  A, not a knob here). The surrogate's value is -A*r, its gradient -A*r (no cap): our defaults.
* verl verl/trainer/ppo/core_algos.py `compute_policy_loss_dppo_tv` @1dda039: anchor pi_old (its old_log_prob),
  bounds clip_ratio_low/high (0.2), loss -A * sg(min(r, clip_ratio_c)) * log_prob * valid (the same gradient, another
  value), clip_ratio_c = 3.0 by default (verl/workers/config/actor.py), no KL term.
* SkyRL skyrl/train/config/config.py `DPPOConfig` @a956457: dppo_type binary_tv, delta_low = delta_high = 0.2.

Metrics (`method/dppo_tv/*`): masked_frac, masked_frac_high (A > 0 dropped) and masked_frac_low (A < 0 dropped)
over the valid tokens, kl_term (mean (log r)^2). train/clipfrac is masked_frac.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Optional

import torch

from bench.domains import num
from bench.grpo import agg_loss, compute_dtype, masked_mean, safe_log_ratio
from bench.methods.base import Batch, MaskingConfig, Method, token_advantages
from bench.registry import METHODS
from bench.methods.ppo_clip import add_kl_ref, denominator_mask

BEHAVIOURS = ("rollout", "recompute")


@dataclass
class DPPOConfig(MaskingConfig):
    # drop an A <= 0 token whose probability fell by more than eps_low, an A > 0 one whose rose by more than eps_high
    # (prime-rl dppo_mask_low / dppo_mask_high): changes of a probability
    dppo_eps_low: float = num(0.2, "[0, 1]")
    dppo_eps_high: float = num(0.2, "[0, 1]")
    # coefficient of the (log pi_theta/l_b)^2 term on every token (prime-rl kl_tau)
    dppo_kl_tau: float = num(1e-3, "(0, 100]", {0.0: "no KL term (SkyRL, verl)"})
    dppo_behaviour: str = "rollout"  # rollout: l_b = log mu (prime-rl, no recompute) | recompute: log pi_old (verl)
    # cap of the ratio's weight in the gradient (verl clip_ratio_c)
    dppo_ratio_cap: Optional[float] = num(None, "(0, inf)", {None: "no cap (prime-rl)"})

    def check(self) -> None:
        super().check()
        if self.dppo_behaviour not in BEHAVIOURS:
            raise ValueError(f"method.dppo_behaviour={self.dppo_behaviour!r} is not valid; choose one of: "
                             f"{', '.join(BEHAVIOURS)}")


@METHODS.register("dppo_tv", schema=DPPOConfig, color="#009988", order=56)
class DPPOTV(Method):
    """prime-rl's default loss: advantage-signed probability trust region + tau * (log r)^2 on every token."""

    needs_recompute = False  # the default behaviour policy is mu; recompute (verl) sets it per instance
    regularizes_dropped: ClassVar[bool] = True
    diagnostics = {"masked_frac": "DPPO-TV masked token frac."}
    metric_keys = ("masked_frac", "masked_frac_high", "masked_frac_low", "kl_term")

    def __init__(self, cfg: Any, algo: Any) -> None:
        super().__init__(cfg, algo)
        self.needs_recompute = cfg.dppo_behaviour == "recompute"

    def behaviour(self, batch: Batch) -> torch.Tensor:
        lb = batch.logp_mu if self.cfg.dppo_behaviour == "rollout" else batch.logp_old
        if lb is None:
            raise ValueError("method 'dppo_tv' with dppo_behaviour=recompute needs the recompute pass "
                             "(batch.logp_old is None)")
        return lb

    @torch.no_grad()
    def _drop(self, lt: torch.Tensor, lb: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        zero = torch.zeros((), dtype=lt.dtype, device=lt.device)
        d = torch.exp(torch.where(mask, lt, zero)) - torch.exp(torch.where(mask, lb, zero))
        high, low = d > self.cfg.dppo_eps_high, d < -self.cfg.dppo_eps_low
        return torch.where(adv > 0, high, low) & mask

    def kept_tokens(self, batch: Batch, stats: dict[str, Any], logp: torch.Tensor) -> torch.Tensor:
        dt = compute_dtype(logp)
        lt = logp.detach().to(dt)
        mask = batch.mask.bool()
        return mask & ~self._drop(lt, self.behaviour(batch).detach().to(dt), token_advantages(batch.adv, lt), mask)

    def loss(self, logp: torch.Tensor, batch: Batch, stats: dict[str, Any]) -> tuple[torch.Tensor, dict[str, float]]:
        cfg = self.cfg
        dt = compute_dtype(logp)
        lt = logp.to(dt)
        mask = batch.mask.bool()
        lb = self.behaviour(batch).detach().to(dt)
        adv = token_advantages(batch.adv, lt)
        log_r = safe_log_ratio(lt, lb, mask, self.algo.log_ratio_clamp)
        r = torch.exp(log_r)
        drop = self._drop(lt.detach(), lb, adv, mask)
        keep = (mask & ~drop).to(dt)
        with torch.no_grad():
            scale = torch.ones_like(r) if cfg.dppo_ratio_cap is None else r.clamp(max=cfg.dppo_ratio_cap) / r
        pg = -adv * scale * r * keep
        agg_mask, n_tokens = denominator_mask(self, mask, keep, batch.n_tokens)
        loss = agg_loss(pg, agg_mask, self.algo.loss_agg, n_tokens)
        if cfg.dppo_kl_tau > 0:
            loss = loss + cfg.dppo_kl_tau * agg_loss(log_r * log_r, mask, self.algo.loss_agg, batch.n_tokens)
        with torch.no_grad():
            metrics = {
                "clipfrac": float(masked_mean(drop.to(dt), mask)),
                "ppo_kl": float(masked_mean(lb - lt.detach(), mask)),
                "masked_frac": float(masked_mean(drop.to(dt), mask)),
                "masked_frac_high": float(masked_mean((drop & (adv > 0)).to(dt), mask)),
                "masked_frac_low": float(masked_mean((drop & (adv < 0)).to(dt), mask)),
                "kl_term": float(masked_mean((log_r * log_r).detach(), mask)),
            }
        loss, metrics["kl_ref"] = add_kl_ref(self, loss, lt, batch)
        return loss, metrics


__all__ = ["DPPOConfig", "DPPOTV"]
