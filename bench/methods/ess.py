"""M3 P3O "Trust the Batch": ESS-adaptive score-function objective, as implemented in FeynRL algs/P3O/p3o.py
(docs/arms.md §4.7).

x      = where(m, LR(ltheta - lmu), 0);   w = exp(x)              no recompute: lmu plays the role of old
ESS    = (sum_m w)^2 / (sum_m w^2 + 1e-8) / N                     fp64, per loss call (= per minibatch), Python float
rho    = sg( clamp(w, 0, ESS) )                                   every weight <= ESS <= 1
KLb_t  = d + exp(clamp(-d, -10, 10)) - 1,  d = ltheta - lmu         FeynRL's term (p3o_kl_estimator=feynrl)
L      = agg( -rho * ltheta * A + (1 - ESS) * KLb ) [+ beta * agg(k3_ref)]

FeynRL's term is k3 for KL(pi || mu) only under samples from pi; the tokens are mu's, so its expectation is
E_mu[d + mu/pi - 1] = chi2(mu || pi) - KL(mu || pi), not KL(pi || mu) (docs/arms.md §4.7). `p3o_kl_estimator=is_k3`
weights the k3 term by pi/mu instead, E_mu[(pi/mu) (mu/pi - 1 - log(mu/pi))] = E_mu[1 - e^d + d e^d] = KL(pi || mu),
with d clamped as FeynRL clamps its exp (+-p3o_kl_exp_clamp); its gradient, differentiated through the weight,
is E_mu[e^d d grad d] = grad KL(pi || mu).

A REINFORCE loss (ltheta times a detached weight), not a ratio objective: clip_eps_low/high only feed the
monitoring clipfrac (w outside [1 - eps_low, 1 + eps_high]). Fresh data (w ~ 1) gives ESS ~ 1, plain REINFORCE and
no KL pull; concentrated ratios shrink ESS, capping every weight and pulling pi_theta back towards mu.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from bench.domains import num
from bench.grpo import agg_loss, compute_dtype, masked_mean, safe_log_ratio
from bench.methods.base import Batch, Method, MethodConfig, token_advantages
from bench.registry import METHODS
from bench.methods.ppo_clip import add_kl_ref


@dataclass
class ESSConfig(MethodConfig):
    p3o_ess_eps: float = num(1e-8, "[0, 1]")  # the 1e-8 in ESS's denominator (FeynRL calculate_ess)
    p3o_kl_exp_clamp: float = num(10.0, "(0, 80]")  # clamp of the exp inside the KL estimate (exp overflows past ~88)
    # entropy bonus: only 0 (the loss sees sampled-token log-probs only; check() says so for any other value)
    p3o_ent_beta: float = num(0.0, "[0, inf)")
    p3o_kl_estimator: str = "feynrl"  # feynrl (FeynRL's term, E = chi2(mu||pi) - KL(mu||pi)) | is_k3 (E = KL(pi||mu))

    def check(self) -> None:
        if self.p3o_ent_beta != 0.0:
            raise ValueError(f"method.p3o_ent_beta={self.p3o_ent_beta} is not supported (must be 0): "
                             "the loss sees only sampled-token log-probs, an entropy bonus needs the full distribution")
        if self.p3o_kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"method.p3o_kl_estimator={self.p3o_kl_estimator!r} is not valid; choose one of: "
                             f"{', '.join(KL_ESTIMATORS)}")


#: the KL(pi_theta || mu) term's estimators (module docstring): FeynRL's, and the importance-weighted k3
KL_ESTIMATORS = ("feynrl", "is_k3")


def p3o_kl_term(d: torch.Tensor, estimator: str = "feynrl", clamp: float = 10.0) -> torch.Tensor:
    """The per-token KL term on mu's samples, d = ltheta - lmu (differentiable in d).

    feynrl  d + exp(clamp(-d)) - 1              E_mu = chi2(mu || pi) - KL(mu || pi)
    is_k3   1 - exp(dc) + dc exp(dc), dc = clamp(d)   E_mu = KL(pi || mu) (>= 0 per token)
    """
    if estimator == "feynrl":
        return d + torch.exp((-d).clamp(-clamp, clamp)) - 1.0
    if estimator == "is_k3":
        dc = d.clamp(-clamp, clamp)
        w = torch.exp(dc)
        return 1.0 - w + dc * w
    raise ValueError(f"p3o KL estimator {estimator!r} is not valid; choose one of: {', '.join(KL_ESTIMATORS)}")


@torch.no_grad()
def p3o_ess(w: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> float:
    """(sum w)^2 / (sum w^2 + eps) / N over valid tokens, in fp64, as a Python float (hence gradient-free).

    1.0 when N == 0 or a sum is non-finite (FeynRL calculate_ess).
    """
    m = mask.bool()
    n = int(m.sum())
    if n == 0:
        return 1.0
    wv = w.detach()[m].to(torch.float64)
    s1, s2 = float(wv.sum()), float((wv * wv).sum())
    if not (math.isfinite(s1) and math.isfinite(s2)):
        return 1.0
    return s1 * s1 / (s2 + eps) / n


def p3o_weights(
    logp: torch.Tensor, logp_mu: torch.Tensor, mask: torch.Tensor, log_ratio_clamp: float = 20.0, eps: float = 1e-8
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(w, rho_P3O, ESS): the detached ratio pi_theta/mu, its one-sided cap at ESS, and ESS itself."""
    with torch.no_grad():
        w = torch.exp(safe_log_ratio(logp.detach(), logp_mu.detach(), mask.bool(), log_ratio_clamp))
        ess = p3o_ess(w, mask, eps)
        rho = w.clamp(0.0, ess) * mask
    return w, rho, ess


@METHODS.register("ess", schema=ESSConfig, color="#CC79A7", order=50)
class ESS(Method):
    """P3O with ESS recomputed at every loss call from the current minibatch (FeynRL scope). No verl preset."""

    needs_recompute = False
    diagnostics = {"ess_factor": "P3O ESS factor"}
    metric_keys = ("ess_factor", "kl_behavioral", "approx_kl", "pi_loss")

    def __init__(self, cfg: Any, algo: Any) -> None:
        super().__init__(cfg, algo)
        ESSConfig.check(cfg)  # type: ignore[arg-type]  (also when built outside the CLI)

    def loss(self, logp: torch.Tensor, batch: Batch, stats: dict[str, Any]) -> tuple[torch.Tensor, dict[str, float]]:
        cfg = self.cfg
        dt = compute_dtype(logp)
        lt = logp.to(dt)
        mask = batch.mask.bool()
        lmu = batch.logp_mu.detach().to(dt)
        adv = token_advantages(batch.adv, lt)
        zero = torch.zeros((), dtype=dt, device=lt.device)

        w, rho, ess = p3o_weights(lt, lmu, mask, self.algo.log_ratio_clamp, cfg.p3o_ess_eps)
        lt0 = torch.where(mask, lt, zero)
        pg = -rho * lt0 * adv
        d = safe_log_ratio(lt, lmu, mask, float("inf"))  # ltheta - lmu, unclamped (the exp below is clamped)
        klb = p3o_kl_term(d, cfg.p3o_kl_estimator, cfg.p3o_kl_exp_clamp)

        pi_loss = agg_loss(pg, mask, self.algo.loss_agg, batch.n_tokens)
        loss = pi_loss + (1.0 - ess) * agg_loss(klb, mask, self.algo.loss_agg, batch.n_tokens)
        loss, kl_ref = add_kl_ref(self, loss, lt, batch)

        with torch.no_grad():
            log_w = torch.log(w)
            outside = ((w < 1.0 - self.algo.clip_eps_low) | (w > 1.0 + self.algo.clip_eps_high)) & mask
            metrics = {
                "ess_factor": ess,
                "kl_behavioral": float(masked_mean(klb.detach(), mask)),
                "approx_kl": float(masked_mean(w - 1.0 - log_w, mask)),
                "clipfrac": float(masked_mean(outside.to(dt), mask)),
                "ppo_kl": float(masked_mean(lmu - lt.detach(), mask)),
                "pi_loss": float(pi_loss.detach()),
                "loss_total": float(loss.detach()),
                "ent_mc": float(masked_mean(-lt.detach(), mask)),
                "kl_ref": kl_ref,
            }
        return loss, metrics


__all__ = ["ESS", "ESSConfig", "KL_ESTIMATORS", "p3o_ess", "p3o_kl_term", "p3o_weights"]
