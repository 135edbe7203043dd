"""TRM, trust-region masking (Li, Liu, Xu, Tong, Li, Wang, "Trust Region Masking for Long-Horizon LLM Reinforcement
Learning", arXiv 2512.23075, ICML 2026): drop a whole response when any of its tokens leaves the trust region.

delta[i,t] = LR(lold - lmu)
D_i        = max_t k(delta[i,t])        k2 = delta^2 / 2 (arm trm_k2) or k3 = exp(delta) - 1 - delta (arm trm_k3)
keep_i     = D_i <= trm_delta
L          = agg( keep_i * m * psi(r, A) ),   r = exp(LR(ltheta - lold))

Why the max: the paper's bounds on the surrogate's error depend on the largest token-level KL of the sequence,
D_KL^{tok,max}, a sequence-level quantity that PPO's token clip cannot control; TRM therefore masks sequences
(bench/methods/rejection.py has the shared mechanics).

Source of the rule and its defaults: verl `rollout_rs="seq_max_k2"` / `"seq_max_k3"` (PR #4544, "trust region
sequence masking"), verl/trainer/ppo/rollout_corr_helper.py `compute_rollout_rejection_mask` @1dda039: per-token k2
and k3 from the log-ratio clamped at +-20, the max over the valid tokens (0 for an empty response), kept when
<= the threshold (upper bound only), rejected tokens removed from response_mask (here: weight 0 in the
denominator unless denominator=kept). verl has no preset and no default threshold for seq_max_*; its example
examples/rollout_correction/run_qwen2_5_7b_fsdp_multi_rs.sh and docs/algo/rollout_corr.md (Example 7) @1dda039 use
2.5 for seq_max_k2 ("sequence max chi^2/2 guard"): our trm_delta for both arms. No source gives a seq_max_k3
threshold; k3 ~ k2 for small delta, and k3 is smaller than k2 for delta < 0 and larger for delta > 0 (at the k2 edge
|delta| = 2.236: k3 = 1.34 below, 6.12 above). AReaL's rejection_sampling with metric=kl_k2/kl_k3, level=sequence,
agg=max (areal/api/cli_args.py RejectionSamplingConfig @cbff54d) computes the same statistic with its default
upper 5.0.

Metrics (`method/<arm>/*`): seq_masked_frac (non-empty responses dropped), max_k_mean / max_k_max (D over the
non-empty responses).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bench.domains import num
from bench.methods.base import Batch, MaskingConfig
from bench.registry import METHODS
from bench.methods.rejection import SequenceRejection, k2, k3, row_max

DIVERGENCES = {"k2": k2, "k3": k3}


@dataclass
class TRMConfig(MaskingConfig):
    trm_divergence: str = "k2"  # k2 = delta^2/2 (verl seq_max_k2) | k3 = rho - 1 - delta (verl seq_max_k3)
    # keep a response when max_t k <= trm_delta (verl's seq_max_k2 example value); a divergence, k2 <= 200 at |delta| 20
    trm_delta: float = num(2.5, "(0, inf)")

    def check(self) -> None:
        super().check()
        if self.trm_divergence not in DIVERGENCES:
            raise ValueError(f"method.trm_divergence={self.trm_divergence!r} is not valid; choose one of: "
                             f"{', '.join(DIVERGENCES)}")


@dataclass
class TRMK3Config(TRMConfig):
    trm_divergence: str = "k3"


@METHODS.register("trm_k3", schema=TRMK3Config, color="#B8860B", order=38)
@METHODS.register("trm_k2", schema=TRMConfig, color="#DDCC77", order=37)
class TRM(SequenceRejection):
    """Recompute PPO loss on the responses whose largest token divergence k(pi_old/mu) is within trm_delta."""

    stat_name = "max_k"
    diagnostics = {"seq_masked_frac": "TRM rejected seq. frac."}
    metric_keys = ("seq_masked_frac", "max_k_mean", "max_k_max")

    def sequence_aggregation(self) -> str:
        return "max"

    def statistic(self, delta: torch.Tensor, mask: torch.Tensor, batch: Batch) -> torch.Tensor:
        return row_max(DIVERGENCES[self.cfg.trm_divergence](delta), mask)

    def keep(self, stat: torch.Tensor) -> torch.Tensor:
        return stat <= self.cfg.trm_delta


__all__ = ["TRM", "TRMConfig", "TRMK3Config"]
