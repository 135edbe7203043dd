"""IcePop: token-level double-sided masking of the trainer/engine ratio (Ling team, "Every Step Evolves:
Scaling Reinforcement Learning for Trillion-Scale Thinking Model" (Ring-1T), arXiv 2510.18855, IcePop section).

rho[i,t] = exp(LR(lold - lmu))                                   pi_old / mu, constant (prepare)
w[i,t]   = M(rho; alpha, beta) = rho if alpha <= rho <= beta else 0,   alpha = 0.5, beta = 5   (the paper's values)
L        = agg( w * psi(r, A) ) [+ beta_ref * agg(k3_ref)],      r = exp(LR(ltheta - lold))

Inside the band the token keeps its importance weight rho (not 1): the paper's masking function is
M(k) = k on [alpha, beta] and 0 outside, and every implementation we checked applies rho there (OpenRLHF
`--vllm_is_correction_type icepop`, openrlhf/models/loss.py: `vllm_is * mask`; NeMo-RL
`truncated_importance_sampling_type: icepop`, ratio 0.5..5: "set weights outside [min, max] to zero"). A masked
token carries weight 0 but stays in the token-mean denominator (agg over the step's valid tokens), as in those
implementations. It is TIS's mask mode (`tis is_mode=mask`) with IcePop's two-sided band; unlike truncation,
a token far outside the band contributes nothing instead of a capped weight. icepop_weight="one" keeps the band
and drops the weight (a pure token filter: ROLL's ratio filter, verl's token_k1 rejection).

Metrics (`method/icepop/*`): masked_frac{,_low,_high} (rho outside [alpha, beta], below alpha, above beta);
is_mean/max/min/std/ess of the applied weights (zero weights count); is_frac_low = rho < alpha and
is_frac_high = rho > beta, the band edges, as verl's rollout_is_ratio_fraction_low/high for a "lo_hi" threshold
(not TIS's 1/C and C).

verl 0.9.1 preset: `RolloutCorrectionConfig.decoupled_token_icepop(threshold=5.0, threshold_lower=0.5)`
(rollout_is="token", rollout_is_threshold="0.5_5.0", rollout_rs=None): weights outside the band zeroed,
response_mask unchanged, so the loss and gradient are the same as here. Not equivalent: token rejection
sampling (rollout_rs="token_k1"), which removes rejected tokens from the token-mean denominator and whose code
tests -log rho, i.e. 1/rho, against the band.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from bench.domains import num
from bench.methods.base import Batch, MaskingConfig
from bench.registry import METHODS
from bench.methods.importance import ConstantWeightMethod, behaviour_log_ratio, truncated_weights, weight_stats

ICEPOP_WEIGHTS = ("ratio", "one")


@dataclass
class IcePopConfig(MaskingConfig):
    # the kept band of pi_old/mu (Ring-1T's edges); it contains rho = 1, no mismatch
    icepop_alpha: float = num(0.5, "[0, 1)")
    icepop_beta: float = num(5.0, "(1, inf)")
    icepop_weight: str = "ratio"  # ratio: a kept token weighs rho (Ring-1T) | one: a filter only (ROLL, verl token_k1)

    def check(self) -> None:
        super().check()
        if self.icepop_weight not in ICEPOP_WEIGHTS:
            raise ValueError(f"method.icepop_weight={self.icepop_weight!r} is not valid; choose one of: "
                             f"{', '.join(ICEPOP_WEIGHTS)}")


@METHODS.register("icepop", schema=IcePopConfig, color="#882255", order=32)
class IcePop(ConstantWeightMethod):
    """Recompute PPO loss, each token weighted by rho = pi_old/mu inside [alpha, beta] and dropped outside."""

    diagnostics = {"masked_frac": "IcePop masked frac. (ρ∉[α,β])"}
    metric_keys = ("masked_frac", "is_mean", "is_ess")

    @torch.no_grad()
    def prepare(self, batch: Batch) -> dict[str, Any]:
        cfg = self.cfg
        mask = batch.mask.bool()
        rho = torch.exp(behaviour_log_ratio(batch, self.algo.log_ratio_clamp))
        mode = "mask" if cfg.icepop_weight == "ratio" else "reject"
        w = truncated_weights(rho, cfg.icepop_beta, mode, cfg.icepop_alpha) * mask
        stats: dict[str, Any] = weight_stats(w, rho, mask, cfg.icepop_beta, cfg.icepop_alpha)
        n = max(int(mask.sum()), 1)
        low = int(((rho < cfg.icepop_alpha) & mask).sum())
        high = int(((rho > cfg.icepop_beta) & mask).sum())
        stats.update({"masked_frac": (low + high) / n, "masked_frac_low": low / n, "masked_frac_high": high / n,
                      "is_frac_low": low / n, "is_frac_high": high / n,  # the band edges, not 1/C and C
                      "is_weights": w.detach()})
        return stats


__all__ = ["IcePop", "IcePopConfig"]
