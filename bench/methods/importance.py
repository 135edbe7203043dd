"""Importance weights pi_old / mu shared by the IS-based arms (TIS, ACR, AIS; docs/arms.md §1, M1).

rho[i,t] = exp(LR(lold - lmu)) on valid tokens (0 log-ratio elsewhere), computed once per rollout batch from
detached inputs; `truncated_weights` turns it into TIS's min(rho, C) or MIS's masked rho, and `weight_stats`
reports verl-style rollout_is_* statistics of the weights an arm actually applies.
"""

from __future__ import annotations

from typing import Any

import torch

from bench.grpo import safe_log_ratio
from bench.methods.base import Batch
from bench.methods.ppo_clip import PPOClipMethod


def behaviour_log_ratio(batch: Batch, clamp: float, dtype: torch.dtype | None = None) -> torch.Tensor:
    """LR(lold - lmu) [B, T], 0 off-mask: the log of rho = pi_old / mu (docs/arms.md §1). Detached.

    Computed in `dtype` (both log-probs cast first), by default fp32, or fp64 when lold is fp64."""
    if batch.logp_old is None:
        raise ValueError("importance weights pi_old/mu need the recompute pass (batch.logp_old is None)")
    lold = batch.logp_old.detach()
    dt = dtype or (torch.float64 if lold.dtype == torch.float64 else torch.float32)
    return safe_log_ratio(lold.to(dt), batch.logp_mu.detach().to(dt), batch.mask.bool(), clamp)


#: how a ratio becomes a weight: truncate min(rho, C) (TIS); mask rho inside [cap_low, C], 0 outside (MIS, IcePop);
#: reject 1 inside [cap_low, C], 0 outside (rejection sampling without a weight: verl's rollout_rs alone, SkyRL's
#: sequence masks, ROLL's filters)
IS_MODES = ("truncate", "mask", "reject")


def truncated_weights(rho: torch.Tensor, cap: float, mode: str, cap_low: float | None) -> torch.Tensor:
    """The weight of each ratio under `mode` (IS_MODES); cap_low None = 0 (no lower edge)."""
    if mode == "truncate":
        return rho.clamp(max=cap)
    low = 0.0 if cap_low is None else cap_low
    inside = (rho >= low) & (rho <= cap)
    if mode == "mask":
        return torch.where(inside, rho, torch.zeros_like(rho))
    if mode == "reject":
        return inside.to(rho.dtype)
    raise ValueError(f"unknown is_mode {mode!r}; valid: {', '.join(IS_MODES)}")


def low_edge(cap: float, mode: str, cap_low: float | None) -> float:
    """The ratio below which is_frac_low counts: 1/C for truncation, the band's lower edge (cap_low, 0 when
    unset) in mask and reject modes, as verl counts rollout_is_ratio_fraction_low for a "lo_hi" threshold."""
    if mode == "truncate":
        return 1.0 / cap
    return 0.0 if cap_low is None else cap_low


@torch.no_grad()
def weight_stats(
    w: torch.Tensor, rho: torch.Tensor, mask: torch.Tensor, cap: float, low: float | None = None
) -> dict[str, float]:
    """verl-style rollout_is_* statistics of the applied weights w over valid tokens (docs/arms.md §4.4 Metrics).

    is_mean/max/min/std (population std) of w; is_frac_high: rho > C, is_frac_low: rho < `low` (1/C unless given:
    a band's lower edge, `low_edge`) (rho before truncation); is_ess = (sum w)^2 / (N sum w^2). Empty mask:
    mean/max/min 1, std 0, fractions 0, ESS 1; all weights zero (MIS dropped every token): ESS 0.
    """
    low = 1.0 / cap if low is None else low
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
        "is_frac_low": float((rv < low).double().mean()),
        "is_ess": s1 * s1 / (n * s2) if s2 > 0 else 0.0,
    }


class ConstantWeightMethod(PPOClipMethod):
    """A PPO-clip arm whose per-token weight is a detached constant computed in `prepare` (stats["is_weights"])."""

    def weights(self, batch: Batch, stats: dict[str, Any]) -> torch.Tensor:
        return stats["is_weights"]

    def rejected_rows(self, batch: Batch, stats: dict[str, Any]) -> torch.Tensor:
        """Non-empty responses all of whose weights are 0."""
        mask = batch.mask.bool()
        return mask.any(-1) & ~((stats["is_weights"] != 0) & mask).any(-1)


__all__ = ["ConstantWeightMethod", "IS_MODES", "behaviour_log_ratio", "low_edge", "truncated_weights", "weight_stats"]
