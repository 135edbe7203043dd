"""M1 TIS, truncated importance sampling (docs/arms.md §4.4; FlashRL, verl rollout_corr_helper, TRL vllm IS).

rho_bar[i,t] = min( exp(LR(lold - lmu)), C ) * m          (constant, computed once per rollout batch in prepare)
L            = agg( rho_bar * psi(r, A) ) [+ beta * agg(k3_ref)],   r = exp(LR(ltheta - lold))

Variants from the config: is_level="sequence" (Seq-TIS: w_i = min(exp(LR(sum_t m*(lold - lmu))), C)
broadcast over the sequence; is_seq_ratio="geometric" takes the per-token mean instead of the sum, AReaL's and
ROLL's sequence ratio), is_mode="mask" (MIS: weight rho if rho in [is_cap_low or 0, C] else 0) and
is_mode="reject" (rejection sampling without a weight: 1 inside [is_cap_low or 0, C], 0 outside). A dropped token
stays in the token-mean denominator unless denominator="kept" (bench/methods/base.py MaskingConfig).

Metrics (`method/tis/*`, bench/methods/importance.weight_stats): is_mean/max/min/std/ess over the valid tokens'
applied weights. is_frac_high / is_frac_low count where the ratio the weight is computed from leaves its band:
above C, and below 1/C when truncating or below the band's lower edge is_cap_low (0 when unset) in mask and
reject modes (verl's rollout_is_ratio_fraction_low for a "lo_hi" threshold; rho = [0.6, 1] in the band [0.8, 2]
gives 0.5). At token level they are fractions of valid tokens (rho = pi_old/mu); at sequence level (Seq-TIS) of
non-empty sequences by their sequence ratio (verl's rollout_is_ratio_fraction_high/low at sequence level), not
the token ratios inside them, which the weight never sees. verl's sequence-level fractions divide by every row of
the batch, empty ones included; these divide by the non-empty rows (docs/arms.md §8).
No lower truncation (unless is_mode="mask" sets is_cap_low). The KL-to-ref term is never weighted.

verl 0.9.1 presets (`algorithm.rollout_correction = RolloutCorrectionConfig.<preset>()`):
* `tis`: `decoupled_token_is(threshold=C)` (rollout_is="token");
  `method.is_level=sequence`: `decoupled_seq_is(threshold=C)` (rollout_is="sequence").
* `seq_is_rs`: verl's Seq-MIS, `decoupled_seq_is_rs(is_threshold=2.0, rs_threshold="0.5_2.0")`: the sequence
  ratio rho_seq = exp(LR(sum_t m * (lold - lmu))) is the weight when 0.5 <= rho_seq <= 2, else the sequence is
  rejected (weight 0). The same arm with is_level=sequence, is_mode=mask, is_cap_low=0.5, is_cap_C=2 as its
  defaults (SeqISRSConfig). Two differences from verl: a rejected sequence stays in the token-mean denominator
  with weight 0 (verl drops it from response_mask: its loss is ours times N / N_kept), and verl's rejection sums
  per-token-clamped log-ratios while both the decision and the weight here use the raw sum, clamped once (they
  differ only when some |lold - lmu| > 20). The band [0.5, 2] is symmetric in log space, so verl's 1/rho
  orientation does not matter. Not Geo-RS (bench/methods/geo_rs.py), which rejects on the geometric mean.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from bench.domains import num
from bench.methods.base import Batch, MaskingConfig, is_cap_c
from bench.registry import METHODS
from bench.methods.importance import (
    IS_MODES,
    ConstantWeightMethod,
    behaviour_log_ratio,
    low_edge,
    truncated_weights,
    weight_stats,
)

IS_LEVELS = ("token", "sequence")
SEQ_RATIOS = ("product", "geometric")


@dataclass
class TISConfig(MaskingConfig):
    is_cap_C: float = is_cap_c(2.0)  # noqa: N815  (the C of docs/arms.md: verl rollout_is_threshold, FlashRL "TIS-2")
    is_level: str = "token"  # token | sequence (Seq-TIS)
    is_mode: str = "truncate"  # truncate (TIS) | mask (MIS: weight 0 outside [is_cap_low, C]) | reject (weight 1 inside)
    is_cap_low: Optional[float] = num(None, "[0, inf)", {None: "no lower bound (0)"})  # mask/reject modes' lower edge
    is_seq_ratio: str = "product"  # sequence level: product exp(sum_t) (verl, TRL, SkyRL) | geometric exp(mean_t) (AReaL)

    def check(self) -> None:
        super().check()
        if self.is_seq_ratio not in SEQ_RATIOS:
            raise ValueError(f"method.is_seq_ratio={self.is_seq_ratio!r} is not valid; choose one of: "
                             f"{', '.join(SEQ_RATIOS)}")
        if self.is_level not in IS_LEVELS:
            raise ValueError(f"method.is_level={self.is_level!r} is not valid; choose one of: {', '.join(IS_LEVELS)}")
        if self.is_mode not in IS_MODES:
            raise ValueError(f"method.is_mode={self.is_mode!r} is not valid; choose one of: {', '.join(IS_MODES)}")
        if self.is_cap_low is not None and not self.is_cap_low <= self.is_cap_C:
            raise ValueError(f"method.is_cap_low={self.is_cap_low} must be in [0, method.is_cap_C={self.is_cap_C}] "
                             "(or null: no lower bound)")


@METHODS.register("tis", schema=TISConfig, color="#0072B2", order=30)
class TIS(ConstantWeightMethod):
    """Token-level (default) or sequence-level truncated / masked IS on top of the recompute PPO loss."""

    diagnostics = {"is_frac_high": "TIS truncated frac. (ρ>C)"}
    metric_keys = ("is_mean", "is_max", "is_frac_high", "is_ess")

    def sequence_aggregation(self) -> str:
        if self.cfg.is_level == "token":
            return "token"
        return "sum" if self.cfg.is_seq_ratio == "product" else "mean"

    @torch.no_grad()
    def prepare(self, batch: Batch) -> dict[str, Any]:
        cfg = self.cfg
        mask = batch.mask.bool()
        if cfg.is_level == "token":
            rho = torch.exp(behaviour_log_ratio(batch, self.algo.log_ratio_clamp))
        elif cfg.is_level == "sequence":
            # LR is applied to the sequence sum (or mean), not per token (docs/arms.md §4.4 Seq-TIS)
            raw = behaviour_log_ratio(batch, float("inf"))
            seq_log_rho = raw.sum(-1)
            if cfg.is_seq_ratio == "geometric":
                seq_log_rho = seq_log_rho / mask.sum(-1).clamp(min=1)
            seq_log_rho = seq_log_rho.clamp(-self.algo.log_ratio_clamp, self.algo.log_ratio_clamp)
            rho = torch.exp(seq_log_rho)[:, None].expand_as(raw)
        else:
            raise ValueError(f"unknown is_level {cfg.is_level!r}; valid: token, sequence")
        w = truncated_weights(rho, cfg.is_cap_C, cfg.is_mode, cfg.is_cap_low) * mask
        low = low_edge(cfg.is_cap_C, cfg.is_mode, cfg.is_cap_low)
        stats: dict[str, Any] = weight_stats(w, rho, mask, cfg.is_cap_C, low)  # seq level: per token of each row
        if cfg.is_level == "sequence":
            rows = mask.any(-1)
            stats.update(_seq_stats(_row_weight(w, mask)[rows]))
            stats.update(_seq_fractions(rho[:, 0][rows] if rho.shape[1] else rho.new_zeros(0), cfg.is_cap_C, low))
        stats["is_weights"] = w.detach()
        return stats


def _row_weight(w: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The single weight of each row of a sequence-level weight tensor (0 for empty rows)."""
    return torch.where(mask, w, torch.zeros_like(w)).sum(-1) / mask.sum(-1).clamp(min=1)


def _seq_fractions(seq_rho: torch.Tensor, cap: float, low: float) -> dict[str, float]:
    """is_frac_high / is_frac_low of Seq-TIS: the fraction of non-empty sequences whose sequence ratio is above C
    or below `low` (0 when there is none)."""
    if seq_rho.numel() == 0:
        return {"is_frac_high": 0.0, "is_frac_low": 0.0}
    v = seq_rho.to(torch.float64)
    return {"is_frac_high": float((v > cap).double().mean()), "is_frac_low": float((v < low).double().mean())}


def _seq_stats(seq_w: torch.Tensor) -> dict[str, float]:
    """seq_mean/max/min/std (population) of the per-sequence weights of non-empty sequences."""
    if seq_w.numel() == 0:
        return {"seq_mean": 1.0, "seq_max": 1.0, "seq_min": 1.0, "seq_std": 0.0}
    v = seq_w.to(torch.float64)
    return {"seq_mean": float(v.mean()), "seq_max": float(v.max()), "seq_min": float(v.min()),
            "seq_std": float(v.std(unbiased=False))}


@dataclass
class SeqISRSConfig(TISConfig):
    """verl's Seq-MIS (`decoupled_seq_is_rs`): sequence-level masked IS on the product ratio, band [0.5, 2]."""

    is_cap_C: float = 2.0  # noqa: N815  (verl is_threshold and the upper rejection edge)
    is_level: str = "sequence"
    is_mode: str = "mask"
    is_cap_low: Optional[float] = 0.5  # verl rs_threshold "0.5_2.0": the lower rejection edge


@METHODS.register("seq_is_rs", schema=SeqISRSConfig, color="#117733", order=31)
class SeqISRS(TIS):
    """verl's Seq-MIS: the TIS arm at sequence level in mask mode (SeqISRSConfig's defaults)."""

    diagnostics = {"is_frac_high": "Seq-MIS rejected frac. (ρ_seq>C)"}
    metric_keys = ("is_mean", "is_frac_high", "is_frac_low", "is_ess", "seq_mean")


__all__ = ["SeqISRS", "SeqISRSConfig", "TIS", "TISConfig"]
