"""M1 TIS, truncated importance sampling (methods.md M1; FlashRL, verl rollout_corr_helper, TRL vllm IS).

rho_bar[i,t] = min( exp(LR(lold - lmu)), C ) * m          (constant, computed once per rollout batch in prepare)
L            = agg( rho_bar * psi(r, A) ) [+ beta * agg(k3_ref)],   r = exp(LR(ltheta - lold))

Variants from the config: is_level="sequence" (Seq-TIS: w_i = min(exp(LR(sum_t m*LR(lold - lmu))), C)
broadcast over the sequence) and is_mode="mask" (MIS: weight rho if rho in [is_cap_low or 0, C] else 0).
No lower truncation. The KL-to-ref term is never weighted.
"""

from __future__ import annotations

from typing import Any

import torch

from bench.grpo import safe_log_ratio
from bench.methods.base import Batch, register
from bench.methods.naive import PPOClipMethod


def behaviour_log_ratio(batch: Batch, clamp: float) -> torch.Tensor:
    """LR(lold - lmu) [B, T], 0 off-mask: the log of rho = pi_old / mu (methods.md section 0). Detached."""
    if batch.logp_old is None:
        raise ValueError("importance weights pi_old/mu need the recompute pass (batch.logp_old is None)")
    lold = batch.logp_old.detach()
    dt = torch.float64 if lold.dtype == torch.float64 else torch.float32
    return safe_log_ratio(lold.to(dt), batch.logp_mu.detach().to(dt), batch.mask.bool(), clamp)


def truncated_weights(rho: torch.Tensor, cap: float, mode: str, cap_low: float | None) -> torch.Tensor:
    """truncate: min(rho, C) (TIS); mask: rho if cap_low <= rho <= C else 0 (MIS, cap_low None = 0)."""
    if mode == "truncate":
        return rho.clamp(max=cap)
    if mode == "mask":
        low = 0.0 if cap_low is None else cap_low
        return torch.where((rho >= low) & (rho <= cap), rho, torch.zeros_like(rho))
    raise ValueError(f"unknown is_mode {mode!r}; valid: truncate, mask")


@torch.no_grad()
def weight_stats(w: torch.Tensor, rho: torch.Tensor, mask: torch.Tensor, cap: float) -> dict[str, float]:
    """verl-style rollout_is_* statistics of the applied weights w over valid tokens (methods.md M1 Metrics).

    is_mean/max/min/std (population std) of w; is_frac_high: rho > C, is_frac_low: rho < 1/C (rho before
    truncation); is_ess = (sum w)^2 / (N sum w^2). Empty mask: mean/max/min 1, std 0, fractions 0, ESS 1;
    all weights zero (MIS dropped every token): ESS 0.
    """
    m = mask.bool()
    n = int(m.sum())
    if n == 0:
        return {"is_mean": 1.0, "is_max": 1.0, "is_min": 1.0, "is_std": 0.0,
                "is_frac_high": 0.0, "is_frac_low": 0.0, "is_ess": 1.0}
    wv = w[m].to(torch.float64)
    rv = rho[m].to(torch.float64)
    s1, s2 = float(wv.sum()), float((wv * wv).sum())
    return {
        "is_mean": float(wv.mean()),
        "is_max": float(wv.max()),
        "is_min": float(wv.min()),
        "is_std": float(wv.std(unbiased=False)),
        "is_frac_high": float((rv > cap).double().mean()),
        "is_frac_low": float((rv < 1.0 / cap).double().mean()),
        "is_ess": s1 * s1 / (n * s2) if s2 > 0 else 0.0,
    }


class ConstantWeightMethod(PPOClipMethod):
    """A PPO-clip arm whose per-token weight is a detached constant computed in `prepare` (stats["is_weights"])."""

    def weights(self, batch: Batch, stats: dict[str, Any]) -> torch.Tensor:
        return stats["is_weights"]


@register("tis")
class TIS(ConstantWeightMethod):
    """Token-level (default) or sequence-level truncated / masked IS on top of the recompute PPO loss."""

    @torch.no_grad()
    def prepare(self, batch: Batch) -> dict[str, Any]:
        cfg = self.cfg
        mask = batch.mask.bool()
        if cfg.is_level == "token":
            rho = torch.exp(behaviour_log_ratio(batch, cfg.log_ratio_clamp))
        elif cfg.is_level == "sequence":
            # LR is applied to the sequence sum, not per token (methods.md M1 Seq-TIS)
            raw = behaviour_log_ratio(batch, float("inf"))
            seq_log_rho = raw.sum(-1).clamp(-cfg.log_ratio_clamp, cfg.log_ratio_clamp)
            rho = torch.exp(seq_log_rho)[:, None].expand_as(raw)
        else:
            raise ValueError(f"unknown is_level {cfg.is_level!r}; valid: token, sequence")
        w = truncated_weights(rho, cfg.is_cap_C, cfg.is_mode, cfg.is_cap_low) * mask
        stats: dict[str, Any] = weight_stats(w, rho, mask, cfg.is_cap_C)  # seq level: per token of each row
        if cfg.is_level == "sequence":
            stats.update(_seq_stats(_row_weight(w, mask)[mask.any(-1)]))
        stats["is_weights"] = w.detach()
        return stats


def _row_weight(w: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The single weight of each row of a sequence-level weight tensor (0 for empty rows)."""
    return torch.where(mask, w, torch.zeros_like(w)).sum(-1) / mask.sum(-1).clamp(min=1)


def _seq_stats(seq_w: torch.Tensor) -> dict[str, float]:
    """seq_mean/max/min/std (population) of the per-sequence weights of non-empty sequences."""
    if seq_w.numel() == 0:
        return {"seq_mean": 1.0, "seq_max": 1.0, "seq_min": 1.0, "seq_std": 0.0}
    v = seq_w.to(torch.float64)
    return {"seq_mean": float(v.mean()), "seq_max": float(v.max()), "seq_min": float(v.min()),
            "seq_std": float(v.std(unbiased=False))}


__all__ = ["ConstantWeightMethod", "TIS", "behaviour_log_ratio", "truncated_weights", "weight_stats"]
