"""K3-RS, rejection of whole responses by their mean k3 divergence (verl's `decoupled_k3_rs`; the estimator is from
verl docs/algo/rollout_corr_math.md §3.3.5 "K3 Divergence Aggregation", after Liu, Li et al. 2025, "When Speed
Kills Stability", https://richardli.xyz/rl-collapse).

delta[i,t] = LR(lold - lmu)
K3_i       = mean_t ( exp(delta) - 1 - delta )      >= 0 per token; E_mu[K3] = KL(mu || pi_old)
keep_i     = K3_i <= k3_rs_delta
L          = agg( keep_i * m * psi(r, A) ),   r = exp(LR(ltheta - lold))

Unlike Geo-RS (mean_t delta, whose sign can flip on noise), each k3 term is non-negative, so a response with tokens
drifting both ways is still seen as far off. Defaults from verl @1dda039: `RolloutCorrectionConfig.decoupled_k3_rs
(rs_threshold=0.01)` (verl/trainer/config/algorithm.py: rollout_is=None, rollout_rs="seq_mean_k3") and
rollout_corr_helper.compute_rollout_rejection_mask (delta clamped at +-20 in both terms, mean over the valid
tokens, kept when <= the threshold, rejected tokens removed from response_mask: here weight 0 in the denominator
unless denominator=kept). verl's docs give 0.001-0.01 as the typical range, tuned for BF16-vs-FP32 mismatch;
a W4A4 rollout of the tiny default model has a per-token k3 of ~0.05 (results/smoke_short), so this band rejects
most responses there: the arm is run as the source defines it.

Metrics (`method/k3_rs/*`): seq_masked_frac, k3_mean / k3_max (K3_i over the non-empty responses).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bench.domains import num
from bench.methods.base import Batch, MaskingConfig
from bench.registry import METHODS
from bench.methods.rejection import SequenceRejection, k3, row_mean


@dataclass
class K3RSConfig(MaskingConfig):
    k3_rs_delta: float = num(0.01, "(0, inf)")  # keep a response when mean_t k3 <= k3_rs_delta (verl decoupled_k3_rs)


@METHODS.register("k3_rs", schema=K3RSConfig, color="#AA4499", order=35)
class K3RS(SequenceRejection):
    """Recompute PPO loss on the responses whose mean k3(pi_old/mu) is within k3_rs_delta."""

    stat_name = "k3"
    diagnostics = {"seq_masked_frac": "K3-RS rejected seq. frac."}
    metric_keys = ("seq_masked_frac", "k3_mean", "k3_max")

    def sequence_aggregation(self) -> str:
        return "mean"

    def statistic(self, delta: torch.Tensor, mask: torch.Tensor, batch: Batch) -> torch.Tensor:
        return row_mean(k3(delta), mask)

    def keep(self, stat: torch.Tensor) -> torch.Tensor:
        return stat <= self.cfg.k3_rs_delta


__all__ = ["K3RS", "K3RSConfig"]
