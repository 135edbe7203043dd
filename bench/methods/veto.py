"""Veto, rejection of a whole response that holds one catastrophic token (miles `--rs-veto-threshold`; SkyRL
`outlier_token_is_threshold_low/high`).

rho[i,t] = exp(LR(lold - lmu))
keep_i   = all_t ( veto_low <= rho[i,t] ) and, when veto_high is set, all_t ( rho[i,t] <= veto_high )
L        = agg( keep_i * m * psi(r, A) ),   r = exp(LR(ltheta - lold))

A token with rho < 1e-4 is one the rollout engine sampled at least 10^4 times more readily than the trainer's
policy would: a numerical outlier (a quantization error, a kernel bug) rather than drift, and the rest of that
response was generated after it. The veto drops the response instead of letting any weight of that token
shape the update.

Sources and defaults, each read at a commit:
* miles examples/infra_features/train_infer_mismatch_helper/mis.py `calculate_veto_mask` and mis.yaml
  (`rs_veto_threshold: 1.0e-4`) @31f1ca9: any valid token with log(train / rollout) < log(threshold) zeroes the
  response's mask; there is no upper veto; it is applied after miles' TIS weights (it composes with TIS) and the
  rejected tokens keep their place in the denominator (miles losses.py: "modified masks correct the numerator only;
  denominators stay the precomputed rollout_mask_sums"). Here: veto_low = 1e-4, veto_high = null, no TIS weight.
* SkyRL skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py `compute_outlier_token_mask` and
  skyrl/train/config/config.py `OffPolicyCorrectionConfig` @a956457: both bounds, off by default, suggested
  1e-4 and 100; the ratio clamped at +-20 first; the mask multiplies loss_mask, while the token-mean denominator
  was fixed before it (the advantages are pre-scaled by the unmasked count), so rejected tokens stay in it.

Metrics (`method/veto/*`): seq_masked_frac, low_token_frac / high_token_frac (valid tokens below veto_low / above
veto_high), min_rho (the smallest rho of the batch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch

from bench.domains import num
from bench.methods.base import Batch, MaskingConfig
from bench.registry import METHODS
from bench.methods.importance import behaviour_log_ratio
from bench.methods.rejection import SequenceRejection, row_max


@dataclass
class VetoConfig(MaskingConfig):
    # drop a response holding a token with pi_old/mu below veto_low (miles rs_veto_threshold), or above veto_high
    veto_low: float = num(1e-4, "(0, 1)", {0.0: "no low veto"})
    veto_high: Optional[float] = num(None, "(1, inf)", {None: "no high veto (miles; SkyRL suggests 100)"})


@METHODS.register("veto", schema=VetoConfig, color="#661100", order=39)
class Veto(SequenceRejection):
    """Recompute PPO loss on the responses none of whose tokens has pi_old/mu outside [veto_low, veto_high]."""

    stat_name = None  # the statistic is 0/1: seq_masked_frac says it all
    diagnostics = {"seq_masked_frac": "Veto rejected seq. frac."}
    metric_keys = ("seq_masked_frac", "low_token_frac", "min_rho")

    def _outside(self, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        low = delta < (math.log(self.cfg.veto_low) if self.cfg.veto_low > 0 else -math.inf)
        high = delta > (math.log(self.cfg.veto_high) if self.cfg.veto_high is not None else math.inf)
        return low, high

    def sequence_aggregation(self) -> str:
        return "max"  # any token outside the band: the worst one decides

    def statistic(self, delta: torch.Tensor, mask: torch.Tensor, batch: Batch) -> torch.Tensor:
        low, high = self._outside(delta)
        return row_max(((low | high) & mask).to(delta.dtype), mask)  # 1 if any valid token is outside

    def keep(self, stat: torch.Tensor) -> torch.Tensor:
        return stat == 0

    @torch.no_grad()
    def prepare(self, batch: Batch) -> dict[str, Any]:
        stats = super().prepare(batch)
        mask = batch.mask.bool()
        delta = behaviour_log_ratio(batch, self.algo.log_ratio_clamp)
        low, high = self._outside(delta)
        n = max(int(mask.sum()), 1)
        stats.update({
            "low_token_frac": int((low & mask).sum()) / n,
            "high_token_frac": int((high & mask).sum()) / n,
            "min_rho": float(torch.exp(torch.where(mask, delta, torch.full_like(delta, torch.inf)).min()))
            if mask.any() else 1.0,
        })
        return stats


__all__ = ["Veto", "VetoConfig"]
