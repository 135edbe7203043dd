"""Rejection by a per-response statistic of the behaviour ratio, shared by the arms that drop whole responses
(trm_k2, trm_k3, k3_rs, veto, prob_diff_seq; docs/arms.md §4.13-4.18). Not an arm itself.

delta[i,t] = LR(lold - lmu)            the log of rho = pi_old / mu, clamped at +-20 as verl's rejection does
s_i        = statistic(delta, m)       the arm's: max_t k2, max_t k3, mean_t k3, ...
keep_i     = the arm's test of s_i     (a response without valid tokens is kept: there is nothing to drop)
w[i,t]     = keep_i * m[i,t]           constant, once per rollout batch
L          = agg( w * psi(r, A) ) [+ beta_ref * agg(k3_ref)],   r = exp(LR(ltheta - lold))

The per-token divergences are the k-estimators of KL(mu || pi_old) on the sampled tokens (verl
rollout_corr_helper.compute_rollout_rejection_mask @1dda039): k1 = -delta, k2 = delta^2 / 2, k3 = rho - 1 - delta
(>= 0), with delta clamped in both terms of k3. A rejected response keeps its tokens in the token-mean denominator
with weight 0 unless denominator="kept" (verl removes them from response_mask: its loss is ours x N / N_kept).
"""

from __future__ import annotations

from typing import Any

import torch

from bench.methods.base import Batch
from bench.methods.importance import ConstantWeightMethod, behaviour_log_ratio


def k2(delta: torch.Tensor) -> torch.Tensor:
    """Per-token k2 = delta^2 / 2."""
    return 0.5 * delta * delta


def k3(delta: torch.Tensor) -> torch.Tensor:
    """Per-token k3 = exp(delta) - 1 - delta (>= 0; delta already clamped)."""
    return torch.exp(delta) - 1.0 - delta


def row_max(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Max over each row's valid tokens; 0 for an empty row (verl's _sequence_max)."""
    out = torch.where(mask, x, torch.full_like(x, -torch.inf)).max(-1).values if x.shape[-1] else x.new_zeros(x.shape[0])
    return torch.where(mask.any(-1), out, torch.zeros_like(out))


def row_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over each row's valid tokens; 0 for an empty row."""
    return torch.where(mask, x, torch.zeros_like(x)).sum(-1) / mask.sum(-1).clamp(min=1)


class SequenceRejection(ConstantWeightMethod):
    """An arm that keeps or drops whole responses by a statistic of their tokens' behaviour log-ratios.

    Subclasses implement `statistic(delta, mask, batch) -> [B]` and `keep(stat) -> bool [B]`; `stat_name` names
    the statistic's metrics (`method/<arm>/<stat_name>_{mean,max}` over the non-empty responses; None: none).
    """

    stat_name: str | None = "stat"
    metric_keys = ("seq_masked_frac",)

    def statistic(self, delta: torch.Tensor, mask: torch.Tensor, batch: Batch) -> torch.Tensor:
        raise NotImplementedError

    def keep(self, stat: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @torch.no_grad()
    def prepare(self, batch: Batch) -> dict[str, Any]:
        mask = batch.mask.bool()
        delta = behaviour_log_ratio(batch, self.algo.log_ratio_clamp)
        stat = self.statistic(delta, mask, batch)
        rows = mask.any(-1)
        keep = self.keep(stat) | ~rows
        w = (keep[:, None] & mask).to(delta.dtype)
        n_rows = max(int(rows.sum()), 1)
        out: dict[str, Any] = {"seq_masked_frac": float((~keep & rows).sum()) / n_rows, "is_weights": w}
        if self.stat_name is not None:
            s = stat[rows].double()
            out[f"{self.stat_name}_mean"] = float(s.mean()) if s.numel() else 0.0
            out[f"{self.stat_name}_max"] = float(s.max()) if s.numel() else 0.0
        return out


__all__ = ["SequenceRejection", "k2", "k3", "row_max", "row_mean"]
