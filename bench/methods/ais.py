"""M4 AIS, adaptive importance sampling for quantized RL: the "AIS-R" reconstruction of docs/arms.md §4.8.

THIS IS OUR RECONSTRUCTION, NOT THE PAPER'S FORMULA. The AIS paper (Zhou et al., arXiv 2605.13907) states only
that a per-batch coefficient alpha, built from three diagnostics (weight reliability, divergence severity,
variance amplification), interpolates between the uncorrected and the importance-weighted gradient; its exact
diagnostics, combination rule, truncation constant and level were not available and no code was found
(docs/arms.md §4.8, section 12 question 1). The definitions below are ours, chosen to satisfy the paper's stated
properties (P2 bounded second moment of the truncated estimator, P3 on-policy recovery):

rho_bar[i,t] = min( exp(LR(lold - lmu)), C )                          constant
w[i,t]       = (1 - alpha) + alpha * rho_bar[i,t]                     alpha in [0, 1]: 0 = B1(a) naive, 1 = TIS
L            = agg( m * w * psi(r, A) ) [+ beta * agg(k3_ref)],     r = exp(LR(ltheta - lold))

alpha is computed once per rollout batch in `prepare` (pi_old fixed) from S = {i: n_i > 0, |A_i| > ais_adv_eps}:
c_i = A_i * mean_t (rho_bar - 1) (per-token advantages, GAE: mean_t A_it (rho_bar - 1), S = rows with some
|A_it| > eps), c_mean, c_var (Bessel), R = (sum rho_bar)^2 / (N_S sum rho_bar^2),
B = max(0, c_mean^2 - c_var/n), V = c_var / (R n), alpha = B / (B + V) (0 if B + V = 0 or n < 2): a plug-in of the
oracle alpha* = mu_D^2 / (mu_D^2 + Var(D)) of a surrogate MSE between the uncorrected and IS estimates.
When n < max(2, ais_n_min) forces alpha to 0 (c_var undefined), B and V are reported as 0 too (ours): with one
response B = c_mean^2 and V = 0 would read as "all bias, alpha should be 1" for a batch alpha ignores.

Precision: everything that feeds alpha is float64, rho_bar included: the (fp32) log-probs are cast to fp64
before rho_bar = min(exp(LR(lold - lmu)), C) is formed (docs/arms.md §7 item 10). In a nearly matched
batch (rho - 1 ~ 1e-2) the ~6e-8 relative rounding of an fp32 rho is a ~1e-5 relative error of each c_i, which
B / (B + V) amplifies (up to 1.7e-3 relative in the cross-check's fp32 cases). The applied weights w are formed
from the same fp64 rho_bar and then cast to the log-probs' working dtype (fp32, or fp64 for fp64 inputs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from bench.domains import num
from bench.methods.base import Batch, MethodConfig, is_cap_c
from bench.registry import METHODS
from bench.methods.importance import ConstantWeightMethod, behaviour_log_ratio, weight_stats


@dataclass
class AISConfig(MethodConfig):
    is_cap_C: float = is_cap_c(2.0)  # noqa: N815  (ours: the paper's truncation constant is not available)
    ais_adv_eps: float = num(1e-8, "[0, inf)")  # responses with |A| <= eps carry no gradient: left out of alpha's statistics
    ais_n_min: int = num(2, "[2, inf)")  # alpha needs a variance
    ais_alpha_min: float = num(0.0, "[0, 1]")  # (<= ais_alpha_max)
    ais_alpha_max: float = num(1.0, "[0, 1]")

    def check(self) -> None:
        if not self.ais_alpha_min <= self.ais_alpha_max:
            raise ValueError(f"method.ais_alpha_min/max=({self.ais_alpha_min}, {self.ais_alpha_max}) must satisfy "
                             "0 <= min <= max <= 1")


@torch.no_grad()
def ais_alpha(
    rho_bar: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    adv_eps: float = 1e-8,
    n_min: int = 2,
    alpha_range: tuple[float, float] = (0.0, 1.0),
) -> dict[str, float]:
    """alpha and its diagnostics (alpha, R, B, V, c_mean, c_var, n) in fp64, as Python floats (docs/arms.md §4.8).

    Degenerate batches: with n < max(2, n_min) (c_var undefined) alpha = 0 and B = V = 0; with no valid token
    in S, R = 1. The final alpha is clamped to alpha_range.
    """
    m = mask.bool()
    rb = torch.where(m, rho_bar.to(torch.float64), torch.zeros((), dtype=torch.float64, device=rho_bar.device))
    a = adv.to(torch.float64)
    n_i = m.sum(-1)
    excess = torch.where(m, rb - 1.0, torch.zeros_like(rb))
    if a.dim() == 1:  # sequence advantages (GRPO): c_i = A_i * mean_t (rho_bar - 1)
        in_s = (n_i > 0) & (a.abs() > adv_eps)
        c_all = a * (excess.sum(-1) / n_i.clamp(min=1))
    else:  # per-token advantages (GAE) [ours]: c_i = mean_t A_it (rho_bar - 1); S = rows with a token |A| > eps
        in_s = (n_i > 0) & (m & (a.abs() > adv_eps)).any(-1)
        c_all = (a * excess).sum(-1) / n_i.clamp(min=1)
    n = int(in_s.sum())

    c = c_all[in_s]
    c_mean = float(c.mean()) if n > 0 else 0.0
    c_var = float(c.var(unbiased=True)) if n >= 2 else 0.0

    tok = m & in_s[:, None]
    n_s = int(tok.sum())
    s1, s2 = float(rb[tok].sum()), float((rb[tok] ** 2).sum())
    reliability = s1 * s1 / (n_s * s2) if n_s > 0 and s2 > 0 else 1.0

    bias2 = max(0.0, c_mean**2 - c_var / n) if n > 0 else 0.0
    var = c_var / (reliability * n) if n > 0 and reliability > 0 else 0.0
    alpha = bias2 / (bias2 + var) if bias2 + var > 0 else 0.0
    if n < max(2, n_min):
        alpha, bias2, var = 0.0, 0.0, 0.0  # forced: the diagnostics say so too
    alpha = min(max(alpha, alpha_range[0]), alpha_range[1])
    return {"alpha": alpha, "R": reliability, "B": bias2, "V": var, "c_mean": c_mean, "c_var": c_var, "n": float(n)}


@METHODS.register("ais", schema=AISConfig, color="#8C510A", order=60)
class AIS(ConstantWeightMethod):
    """TIS with a per-batch interpolation alpha between no correction and full truncated IS (AIS-R, ours).
    No verl preset (the paper has no public code)."""

    diagnostics = {"alpha": "AIS α"}
    metric_keys = ("alpha", "R", "B", "V", "c_mean", "c_var", "n")

    @torch.no_grad()
    def prepare(self, batch: Batch) -> dict[str, Any]:
        cfg = self.cfg
        mask = batch.mask.bool()
        rho = torch.exp(behaviour_log_ratio(batch, self.algo.log_ratio_clamp, torch.float64))  # alpha's input: fp64
        rho_bar = rho.clamp(max=cfg.is_cap_C)
        stats: dict[str, Any] = ais_alpha(
            rho_bar, batch.adv.detach(), mask, cfg.ais_adv_eps, cfg.ais_n_min, (cfg.ais_alpha_min, cfg.ais_alpha_max)
        )
        alpha = stats["alpha"]
        work = torch.float64 if batch.logp_old.dtype == torch.float64 else torch.float32  # as the other arms
        w = (((1.0 - alpha) + alpha * rho_bar) * mask).to(work)
        stats.update(weight_stats(w, rho, mask, cfg.is_cap_C))
        stats["is_weights"] = w.detach()
        return stats


__all__ = ["AIS", "AISConfig", "ais_alpha"]
