"""OPSM, off-policy sequence masking (DeepSeek-AI, "DeepSeek-V3.2: Pushing the Frontier of Open Large Language
Models", arXiv 2512.02556, section 3.1 "Off-Policy Sequence Masking").

D_i    = (1/n_i) sum_t m * (l_b - ltheta)      per-sequence mean log-ratio, ltheta detached, recomputed at every
                                               loss call (the paper's pi_theta is the policy being optimized);
                                               NOT clamped: there is no exp to protect, and the report, TRL's
                                               get_off_policy_mask and slime's compute_opsm_mask all average the
                                               raw log-ratio (a +-20 clamp per token would let one extreme token
                                               hide: [+25, -0.75 x 19] averages 0.5375, clamped 0.2875)
M_i    = 0 if A_i < 0 and D_i > delta, else 1  (detached; n_i = 0 gives D_i = 0)
L      = agg( M_i * psi(r, A) ) [+ beta_ref * agg(k3_ref)],   r = exp(LR(ltheta - lold))

l_b is the behaviour log-prob. The report writes log pi_old / pi_theta and states that pi_old there is the
sampling probability returned by the inference framework, so that this KL covers both the training-inference
mismatch and the policy staleness; hence the default opsm_behaviour="rollout" (l_b = log mu, the rollout
engine's log-probs). TRL implements it the same way (GRPOConfig.off_policy_mask_threshold: the mask reads
`sampling_per_token_logps`, the PPO ratio `old_per_token_logps`), which is the decoupled form used here: the PPO
ratio keeps the recomputed pi_old. opsm_behaviour="recompute" uses l_b = lold instead (staleness only).

At the first minibatch of an update ltheta = lold, so D_i is the per-sequence k1 estimate of KL(mu || pi_old): a
negative-advantage response the rollout engine sampled far off the trainer's policy is not pushed down, while
positive-advantage responses are always kept.

delta: the report gives no value; the default 0.5 nats/token is TRL's suggested starting point ("While the paper
doesn't specify a delta value used, a good starting point could be delta = 0.5", TRL docs/source/paper_index.md).
Measured on the embedded default (tiny model, arithmetic, warm start, 256 responses): the fraction of responses
with mean_t(log mu - log pi_old) > 0.5 is 0 for bf16/fp8_e4m3/int8, 0.4 % fp8_e5m2, 1.2 % int4, 2.7 % nvfp4, 8.6 %
mxfp4 (before the A < 0 condition, which keeps roughly half of them); > 0.05 gives 11 % for fp8_e4m3. Lower
opsm_delta to make the mask bite at low severities.

verl 0.9.1 preset: none (verl's rejection sampling ignores the sign of the advantage).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from bench.domains import num
from bench.grpo import safe_log_ratio
from bench.methods.base import Batch, MaskingConfig
from bench.registry import METHODS
from bench.methods.ppo_clip import PPOClipMethod

BEHAVIOURS = ("rollout", "recompute")


@dataclass
class OPSMConfig(MaskingConfig):
    opsm_delta: float = num(0.5, "[0, inf)")  # threshold on the mean per-token log-ratio (nats); TRL's suggested value
    opsm_behaviour: str = "rollout"  # rollout: log mu (DeepSeek-V3.2, TRL) | recompute: log pi_old

    def check(self) -> None:
        super().check()
        if self.opsm_behaviour not in BEHAVIOURS:
            raise ValueError(f"method.opsm_behaviour={self.opsm_behaviour!r} is not valid; choose one of: "
                             f"{', '.join(BEHAVIOURS)}")


@torch.no_grad()
def opsm_keep(
    logp: torch.Tensor, logp_b: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, delta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(keep [B] bool, D [B]): M_i = 0 where A_i < 0 and mean_t(l_b - ltheta) > delta, on the unclamped
    log-ratios (docs/arms.md §4.11).

    Per-token advantages [B, T] (PPO's GAE) give keep [B, T]: the tokens with A_t < 0 of a drifted sequence [ours].
    """
    m = mask.bool()
    d_tok = safe_log_ratio(logp_b.detach().to(logp.dtype), logp.detach(), m, float("inf"))
    d = d_tok.sum(-1) / m.sum(-1).clamp(min=1)
    drifted = d > delta
    keep = ~((adv.to(d.dtype) < 0) & (drifted if adv.dim() == 1 else drifted[:, None]))
    return keep, d


@METHODS.register("opsm", schema=OPSMConfig, color="#999933", order=36)
class OPSM(PPOClipMethod):
    """Recompute PPO loss without the negative-advantage sequences that drifted more than delta per token."""

    diagnostics = {"seq_masked_frac": "OPSM masked seq. frac."}
    metric_keys = ("seq_masked_frac", "seq_log_ratio_mean")

    def loss(self, logp: torch.Tensor, batch: Batch, stats: dict[str, Any]) -> tuple[torch.Tensor, dict[str, float]]:
        mask = batch.mask.bool()
        logp_b = batch.logp_mu if self.cfg.opsm_behaviour == "rollout" else self.prox_logp(batch)
        keep, d = opsm_keep(logp, logp_b, batch.adv, mask, self.cfg.opsm_delta)
        loss, metrics = super().loss(logp, batch, {**stats, "opsm_keep": keep})
        rows = mask.any(-1)
        n_rows = max(int(rows.sum()), 1)
        masked = ~keep if keep.dim() == 1 else (~keep & mask).any(-1)
        metrics.update({
            "seq_masked_frac": float((masked & rows).sum()) / n_rows,
            "seq_log_ratio_mean": float(d[rows].double().mean()) if rows.any() else 0.0,
            "seq_log_ratio_max": float(d[rows].max()) if rows.any() else 0.0,
        })
        return loss, metrics

    def sequence_aggregation(self) -> str:
        return "mean"

    def kept_tokens(self, batch: Batch, stats: dict[str, Any], logp: torch.Tensor) -> torch.Tensor:
        logp_b = batch.logp_mu if self.cfg.opsm_behaviour == "rollout" else self.prox_logp(batch)
        keep, _ = opsm_keep(logp, logp_b, batch.adv, batch.mask.bool(), self.cfg.opsm_delta)
        return self.weights(batch, {**stats, "opsm_keep": keep})

    def weights(self, batch: Batch, stats: dict[str, Any]) -> torch.Tensor:
        keep = stats["opsm_keep"]
        return (keep[:, None].expand_as(batch.mask) if keep.dim() == 1 else keep) & batch.mask.bool()


__all__ = ["OPSM", "OPSMConfig", "opsm_keep"]
