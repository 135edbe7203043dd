"""Geo-RS, rejection of whole sequences by their geometric-mean ratio (Liu, Li et al. 2025, "When Speed Kills
Stability", part 3 "Trust Region Optimization via Sequence Masking"; verl docs/algo/rollout_corr_math.md
section 3.3: rho_geo = exp(mean_t log rho_t), acceptance set A_geo = {lo <= rho_geo <= hi}).

log g_i  = (1/n_i) sum_t m * LR(lold - lmu)                     each token's log-ratio clamped at +-20 BEFORE the
                                                                mean (verl's code); n_i = 0: g_i = 1 (no token)
keep_i   = 1[ log lo <= log g_i <= log hi ]                     compared in log space, inclusive; the band is on g
w[i,t]   = keep_i                          (geo_rs_token_tis = false)
w[i,t]   = keep_i * min(rho[i,t], C)       (geo_rs_token_tis = true: token TIS on the kept sequences)
w[i,t]   = keep_i * g_i                    (geo_rs_weighted = true: AReaL's sequence-level ratio weight)
L        = agg( w * psi(r, A) ) [+ beta_ref * agg(k3_ref)],     r = exp(LR(ltheta - lold))

Not verl's Seq-MIS: that one masks on the product ratio rho_seq = prod_t rho_t and keeps rho_seq as the weight
(here `method=seq_is_rs`, a configuration of the TIS arm, bench/methods/tis.py). The geometric mean is
length-invariant: a per-token drift of 0.02 on a 50-token answer gives g = e^0.02 (kept) while the product ratio
is e^1 = 2.72, and a product-ratio band eventually rejects every long answer. A rejected sequence keeps weight 0
inside the step's token-mean denominator; verl removes rejected tokens from the response mask instead, so its
loss is ours times N / N_kept (the same direction, a step size growing with the rejection rate; NaN when every
row is rejected, 0 here).

Default band [1/1.1, 1.1] (ours, +-0.0953 nats per token): symmetric in log space, so the docs' reading (band on
g) and verl's code (which tests mean_t(-LR(lold - lmu)) against [log lo, log hi], i.e. 1/g in [lo, hi]) keep the
same sequences. To reproduce verl's code for an asymmetric verl band [lo_v, hi_v], configure [1/hi_v, 1/lo_v].
verl's presets use "0.999_1.001" (+-0.1 %), chosen for BF16-vs-FP32 mismatch of large models with long answers.
Measured on the embedded default (tiny model, arithmetic, ~3-token answers, 4 batches of 64 at the warm start),
that band drops 91 % of the responses already with a BF16 rollout and 97 % with FP8, so the arm would not train;
the earlier default [0.9, 1.1] dropped 0 % (bf16, int8), 5 % (fp8_e4m3), 18 % (fp8_e5m2), 14 % (int4),
28 % (nvfp4), 62 % (mxfp4). [1/1.1, 1.1] is slightly tighter on the low side and has not been measured yet.

verl 0.9.1 presets: `RolloutCorrectionConfig.decoupled_geo_rs(rs_threshold=...)` (rollout_is=None,
rollout_rs="seq_mean_k1") and, with geo_rs_token_tis=true, `decoupled_geo_rs_token_tis(is_threshold=C, ...)`
(rollout_is="token" plus the same rejection).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from bench.domains import num
from bench.methods.base import Batch, MaskingConfig, is_cap_c
from bench.registry import METHODS
from bench.methods.importance import ConstantWeightMethod, behaviour_log_ratio, weight_stats


@dataclass
class GeoRSConfig(MaskingConfig):
    # keep a sequence when geo_rs_lo <= geometric-mean(pi_old/mu) <= geo_rs_hi (the band contains 1: no mismatch)
    geo_rs_lo: float = num(1.0 / 1.1, "(0, 1]", {0.0: "no lower edge (AReaL's lower=None)"})
    geo_rs_hi: float = num(1.1, "[1, inf)")
    geo_rs_token_tis: bool = False  # also weight kept tokens by min(pi_old/mu, is_cap_C) (Geo-RS-Token-TIS)
    geo_rs_weighted: bool = False  # weight a kept sequence's tokens by g itself (AReaL's sequence-level ratio)
    is_cap_C: float = is_cap_c(2.0)  # noqa: N815  (the TIS cap C, used only with geo_rs_token_tis)

    def check(self) -> None:
        super().check()
        if self.geo_rs_token_tis and self.geo_rs_weighted:
            raise ValueError("method.geo_rs_token_tis and method.geo_rs_weighted are both true: choose one weight "
                             "(token TIS min(rho, C), or the sequence's g)")


@torch.no_grad()
def geometric_keep(log_rho: torch.Tensor, mask: torch.Tensor, lo: float, hi: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(keep [B] bool, log g [B]): the per-sequence geometric-mean test on (already clamped) per-token
    log-ratios, 0 off-mask; inclusive at both edges, in log space."""
    m = mask.bool()
    n = m.sum(-1)
    log_g = torch.where(m, log_rho, torch.zeros_like(log_rho)).sum(-1) / n.clamp(min=1)
    keep = (log_g >= (math.log(lo) if lo > 0 else -math.inf)) & (log_g <= math.log(hi))
    return keep, log_g


@METHODS.register("geo_rs", schema=GeoRSConfig, color="#44AA99", order=34)
class GeoRS(ConstantWeightMethod):
    """Recompute PPO loss on the sequences whose geometric-mean pi_old/mu lies in [lo, hi]; optional token TIS."""

    diagnostics = {"seq_masked_frac": "Geo-RS rejected seq. frac."}
    metric_keys = ("seq_masked_frac", "geo_mean", "geo_min", "geo_max")

    def sequence_aggregation(self) -> str:
        return "mean"

    @torch.no_grad()
    def prepare(self, batch: Batch) -> dict[str, Any]:
        cfg = self.cfg
        mask = batch.mask.bool()
        log_rho = behaviour_log_ratio(batch, self.algo.log_ratio_clamp)  # per-token clamp before the mean
        rho = torch.exp(log_rho)
        keep, log_g = geometric_keep(log_rho, mask, cfg.geo_rs_lo, cfg.geo_rs_hi)
        if cfg.geo_rs_token_tis:
            w = rho.clamp(max=cfg.is_cap_C)
        elif cfg.geo_rs_weighted:
            w = torch.exp(log_g)[:, None].expand_as(rho)
        else:
            w = torch.ones_like(rho)
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


__all__ = ["GeoRS", "GeoRSConfig", "geometric_keep"]
