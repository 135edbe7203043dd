"""M2 QuRL: Adaptive Clipping Range (ACR) + Update-Aware Quantization (UAQ) (docs/arms.md §4.6; QuRL Eq. 6-9, 10-12).

rho     = exp(LR(lold - lmu)),   rho_bar = min(rho, C)                       (constants, prepare)
upper   = (1 + eps_high) * max(1, rho / C)    == (1 + eps_high) / kappa, kappa = min(1, C/rho), no division by kappa
L_t     = rho_bar * max( -r*A, -clip(r, 1 - eps_low, upper)*A )              (QuRL Eq. 9)

rho <= C gives kappa = 1 and exactly the TIS loss; rho > C enlarges only the upper bound, so more A>0 tokens keep
their gradient while A<0 tokens are treated as in TIS. `acr_uaq` is the same loss with the trainer's weights
reparametrized once before RL (cfg.uaq_scale = 1.5, bench/quant/uaq.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from bench.domains import num
from bench.methods.base import Batch, MethodConfig, is_cap_c
from bench.registry import METHODS
from bench.methods.importance import ConstantWeightMethod, behaviour_log_ratio, weight_stats
from bench.quant.uaq import apply_uaq, check_targets


@dataclass
class ACRConfig(MethodConfig):
    is_cap_C: float = is_cap_c(2.0)  # noqa: N815  (not stated in QuRL; ours, as TIS: docs/arms.md §4.6)
    uaq_scale: float = num(1.0, "(0, 10]", {1.0: "no UAQ"})  # `acr_uaq` sets 1.5 (QuRL's ablation optimum)
    uaq_targets: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj"])

    def check(self) -> None:
        try:
            check_targets(self.uaq_targets)
        except ValueError as e:
            raise ValueError(f"method.uaq_targets={list(self.uaq_targets)}: {e}") from None


@METHODS.register("acr_uaq", schema=ACRConfig, color="#009E73", order=45)
@METHODS.register("acr", schema=ACRConfig, color="#56B4E9", order=40)
class ACR(ConstantWeightMethod):
    """Token-level TIS weights with QuRL's per-token adaptive upper clip bound (no verl preset: QuRL has no
    public code)."""

    diagnostics = {"frac_acr_active": "ACR active frac. (ρ>C)"}
    metric_keys = ("frac_acr_active", "acr_upper_mean", "clipfrac_pos", "clipfrac_neg", "rho_max")

    def setup_model(self, model: torch.nn.Module) -> dict[str, float]:
        """UAQ invariant scaling of the trainer's master weights, once before RL, when uaq_scale != 1."""
        if self.cfg.uaq_scale == 1.0:
            return {}
        return apply_uaq(model, self.cfg.uaq_scale, tuple(self.cfg.uaq_targets))

    @torch.no_grad()
    def prepare(self, batch: Batch) -> dict[str, Any]:
        cfg = self.cfg
        mask = batch.mask.bool()
        cap, base_upper = cfg.is_cap_C, 1.0 + self.algo.clip_eps_high
        rho = torch.exp(behaviour_log_ratio(batch, self.algo.log_ratio_clamp))
        w = rho.clamp(max=cap) * mask
        upper = base_upper * torch.clamp(rho / cap, min=1.0)
        active = (rho > cap) & mask
        n = int(mask.sum())
        raw = behaviour_log_ratio(batch, float("inf"))
        stats: dict[str, Any] = weight_stats(w, rho, mask, cap)
        stats.update(
            {
                "frac_acr_active": float(active.sum()) / max(n, 1),
                # mean effective upper bound over active tokens; with none active it is the plain 1 + eps_high
                "acr_upper_mean": float(upper[active].double().mean()) if active.any() else base_upper,
                "kl_k1": float(-raw[mask].double().mean()) if n else 0.0,  # KL(mu || pi_old), k1
                "rho_max": float(rho[mask].max()) if n else 1.0,
                "is_weights": w.detach(),
                "acr_upper": upper.detach(),
            }
        )
        return stats

    def upper(self, batch: Batch, stats: dict[str, Any]) -> torch.Tensor:
        return stats["acr_upper"]

    def extra_metrics(
        self, clipped: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, stats: dict[str, Any]
    ) -> dict[str, float]:
        """clipfrac split by the sign of A; both are fractions of all valid tokens, so they sum to clipfrac."""
        n = max(int(mask.sum()), 1)
        return {
            "clipfrac_pos": float((clipped & (adv > 0)).sum()) / n,
            "clipfrac_neg": float((clipped & (adv < 0)).sum()) / n,
        }


__all__ = ["ACR", "ACRConfig"]
