"""The PPO-clip core shared by every ratio-based arm (docs/arms.md §2.2, B0, B1, M1, M2, M4).

L = agg( w * psi(exp(LR(ltheta - l_prox)), A; 1 - eps_low, upper) ) [+ beta * agg(k3_ref)]

The arms differ only in the proximal log-prob (lold, or lmu for the bypass arm), the constant per-token
weight w (1, TIS/AIS weights) and the upper clip bound (ACR): docs/arms.md §5's summary table.
"""

from __future__ import annotations

from typing import Any

import torch

from bench.grpo import (
    agg_loss,
    clip_mask,
    clipped_surrogate_bounds,
    compute_dtype,
    kl_ref_penalty,
    masked_mean,
    safe_log_ratio,
)
from bench.methods.base import Batch, Method, token_advantages


class PPOClipMethod(Method):
    """L = agg( w * psi(exp(LR(ltheta - l_prox)), A; 1 - eps_low, upper) ) [+ beta * agg(k3_ref)].

    Hooks for subclasses (all return detached constants): `prox_logp` (the denominator of the PPO ratio:
    lold, or lmu for the bypass arm), `weights` (the constant per-token weight, None = 1), `upper` and `lower`
    (the clip bounds, 1 + eps_high unless ACR, 1 - eps_low; M2PO's unclipped ratio opens both) and
    `extra_metrics`.
    """

    needs_recompute = True

    def prox_logp(self, batch: Batch) -> torch.Tensor:
        if batch.logp_old is None:
            raise ValueError(f"method {self.name!r} needs the recompute pass (batch.logp_old is None)")
        return batch.logp_old

    def weights(self, batch: Batch, stats: dict[str, Any]) -> torch.Tensor | None:
        return None

    def upper(self, batch: Batch, stats: dict[str, Any]) -> float | torch.Tensor:
        return 1.0 + self.algo.clip_eps_high

    def lower(self, batch: Batch, stats: dict[str, Any]) -> float:
        return 1.0 - self.algo.clip_eps_low

    def extra_metrics(
        self, clipped: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, stats: dict[str, Any]
    ) -> dict[str, float]:
        return {}

    def kept_tokens(self, batch: Batch, stats: dict[str, Any], logp: torch.Tensor) -> torch.Tensor | None:
        """The valid tokens whose constant weight is nonzero (None: the arm weights every token)."""
        w = self.weights(batch, stats)
        return None if w is None else (w.detach() != 0) & batch.mask.bool()

    def loss(self, logp: torch.Tensor, batch: Batch, stats: dict[str, Any]) -> tuple[torch.Tensor, dict[str, float]]:
        algo = self.algo
        dt = compute_dtype(logp)
        lt = logp.to(dt)
        mask = batch.mask.bool()
        lprox = self.prox_logp(batch).detach().to(dt)
        adv = token_advantages(batch.adv, lt)

        ratio = torch.exp(safe_log_ratio(lt, lprox, mask, algo.log_ratio_clamp))
        lower, upper = self.lower(batch, stats), self.upper(batch, stats)
        psi = clipped_surrogate_bounds(ratio, adv, lower, upper, algo.dual_clip_c)
        w = self.weights(batch, stats)
        per_token = psi if w is None else w.detach().to(dt) * psi
        agg_mask, n_tokens = denominator_mask(self, mask, w, batch.n_tokens)
        loss = agg_loss(per_token, agg_mask, algo.loss_agg, n_tokens)

        with torch.no_grad():
            clipped = clip_mask(ratio, adv, lower, upper, algo.dual_clip_c) & mask
            metrics = {
                "clipfrac": float(masked_mean(clipped.to(dt), mask)),
                "ppo_kl": float(masked_mean(lprox - lt.detach(), mask)),
            }
            metrics.update(self.extra_metrics(clipped, adv, mask, stats))
        loss, metrics["kl_ref"] = add_kl_ref(self, loss, lt, batch)
        return loss, metrics


def denominator_mask(
    method: Method, mask: torch.Tensor, w: torch.Tensor | None, n_tokens: float
) -> tuple[torch.Tensor, float]:
    """(mask, token-mean denominator) the loss aggregates over: the batch's, or, for an arm configured with
    `denominator: kept` (verl's rollout_rs, ROLL), only the tokens whose weight is nonzero, so that a dropped token
    leaves the denominator too (the loss is then ours x N / N_kept; 0, not NaN, when nothing is kept)."""
    if w is None or getattr(method.cfg, "denominator", "all") == "all":
        return mask, n_tokens
    kept = mask & (w.detach() != 0)
    return kept, max(1.0, float(kept.sum()))


def add_kl_ref(method: Method, loss: torch.Tensor, logp: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, float]:
    """loss + beta * agg(k3(ltheta, lref)) when algo.kl_ref_beta > 0 (docs/arms.md §2.3); returns the mean k3 (0 if off).

    A configured KL that silently does nothing would be a bug, so beta > 0 without batch.logp_ref raises.
    """
    beta = method.algo.kl_ref_beta
    if not beta > 0:
        return loss, 0.0
    if batch.logp_ref is None:
        raise ValueError(f"method {method.name!r}: algo.kl_ref_beta={beta} > 0 but batch.logp_ref is None")
    term, k3_mean = kl_ref_penalty(
        logp, batch.logp_ref.detach(), batch.mask.bool(), beta, method.algo.loss_agg, batch.n_tokens
    )
    return loss + term, k3_mean


__all__ = ["PPOClipMethod", "add_kl_ref", "denominator_mask"]
