"""Sequence masking on the geometric-mean ratio ("Geo-RS"; Liu, Li et al. 2025, "When Speed Kills Stability", part 3
"Trust Region Optimization via Sequence Masking"; verl docs/algo/rollout_corr_math.md section 3.3.3).

log g_i  = (1/n_i) sum_t m * LR(lold - lmu)                     log of the geometric mean of rho over the valid
                                                                tokens (n_i = 0: g_i = 1, the row has no token)
keep_i   = 1[ lo <= g_i <= hi ]                                 compared in log space: log lo <= log g_i <= log hi
w[i,t]   = keep_i                          (seq_mis_token_tis = false)
w[i,t]   = keep_i * min(rho[i,t], C)       (seq_mis_token_tis = true: token TIS on the kept sequences)
L        = agg( w * psi(r, A) ) [+ beta_ref * agg(k3_ref)],     r = exp(LR(ltheta - lold))

The geometric mean is length-invariant: a whole response is dropped when its average per-token log-ratio leaves
the band, however long it is (the product ratio of Seq-TIS grows with length and rejects every long answer). A
dropped sequence keeps weight 0 inside the step's token-mean denominator; verl removes rejected tokens from the
response mask instead, which renormalizes the loss by the kept fraction (the same gradient direction, scaled by
1/kept per step).

Defaults lo = 0.9, hi = 1.1 (ours). verl's presets use "0.999_1.001" (+-0.1 %), chosen for BF16-vs-FP32 mismatch
of large models with long responses. Measured on the embedded default (tiny model, arithmetic, ~3-token answers,
4 batches of 64 at the warm start): that band drops 91 % of the responses already with a BF16 rollout and 97 %
with FP8, so the arm would not train; [0.9, 1.1] drops 0 % (bf16, int8), 5 % (fp8_e4m3), 18 % (fp8_e5m2),
14 % (int4), 28 % (nvfp4), 62 % (mxfp4): it grades with the severity. Set seq_mis_lo/seq_mis_hi to verl's values
to reproduce the preset exactly.

verl presets: `RolloutCorrectionConfig.decoupled_geo_rs()` (rollout_is=None, rollout_rs="seq_mean_k1") and, with
seq_mis_token_tis=true, `decoupled_geo_rs_token_tis()` (rollout_is="token", rollout_is_threshold=C). Note: verl's
code (verl/trainer/ppo/rollout_corr_helper.py, commit b178a3cd) tests mean_t(-log rho) against [log lo, log hi],
i.e. 1/g_i in [lo, hi]; its docs define the test on g_i = exp(mean_t log rho) as here. The two agree for a band
symmetric in log space (lo = 1/hi).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from bench.methods.base import METHODS, Batch, MethodConfig
from bench.methods.importance import ConstantWeightMethod, behaviour_log_ratio, weight_stats


@dataclass
class SeqMISConfig(MethodConfig):
    seq_mis_lo: float = 0.9  # keep a sequence when seq_mis_lo <= geometric-mean(pi_old/mu) <= seq_mis_hi
    seq_mis_hi: float = 1.1
    seq_mis_token_tis: bool = False  # also weight kept tokens by min(pi_old/mu, is_cap_C) (Geo-RS-Token-TIS)
    is_cap_C: float = 2.0  # noqa: N815  (the TIS cap C, used only with seq_mis_token_tis)

    def check(self) -> None:
        if not 0.0 < self.seq_mis_lo <= 1.0 <= self.seq_mis_hi:
            raise ValueError(f"method.seq_mis_lo={self.seq_mis_lo}, method.seq_mis_hi={self.seq_mis_hi}: "
                             "need 0 < lo <= 1 <= hi (the band must contain 1, no mismatch)")
        if not self.is_cap_C > 0:
            raise ValueError(f"method.is_cap_C={self.is_cap_C} must be positive")


@torch.no_grad()
def geometric_keep(log_rho: torch.Tensor, mask: torch.Tensor, lo: float, hi: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(keep [B] bool, log g [B]): the per-sequence geometric-mean test on log-ratios (0 off-mask)."""
    m = mask.bool()
    n = m.sum(-1)
    log_g = torch.where(m, log_rho, torch.zeros_like(log_rho)).sum(-1) / n.clamp(min=1)
    keep = (log_g >= math.log(lo)) & (log_g <= math.log(hi))
    return keep, log_g


@METHODS.register("seq_mis", schema=SeqMISConfig, color="#44AA99", order=34)
class SeqMIS(ConstantWeightMethod):
    """Recompute PPO loss on the sequences whose geometric-mean pi_old/mu lies in [lo, hi]; optional token TIS."""

    diagnostics = {"seq_masked_frac": "Seq-MIS dropped seq. frac."}

    @torch.no_grad()
    def prepare(self, batch: Batch) -> dict[str, Any]:
        cfg = self.cfg
        mask = batch.mask.bool()
        log_rho = behaviour_log_ratio(batch, self.algo.log_ratio_clamp)
        rho = torch.exp(log_rho)
        keep, log_g = geometric_keep(log_rho, mask, cfg.seq_mis_lo, cfg.seq_mis_hi)
        w = rho.clamp(max=cfg.is_cap_C) if cfg.seq_mis_token_tis else torch.ones_like(rho)
        w = w * keep[:, None] * mask
        stats: dict[str, Any] = weight_stats(w, rho, mask, cfg.is_cap_C)
        rows = mask.any(-1)
        n_rows = max(int(rows.sum()), 1)
        g = torch.exp(log_g[rows].double())
        stats.update({
            "seq_masked_frac": float((~keep & rows).sum()) / n_rows,
            "geo_mean": float(g.mean()) if g.numel() else 1.0,
            "geo_min": float(g.min()) if g.numel() else 1.0,
            "geo_max": float(g.max()) if g.numel() else 1.0,
            "is_weights": w.detach(),
        })
        return stats


__all__ = ["SeqMIS", "SeqMISConfig", "geometric_keep"]
