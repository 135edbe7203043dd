"""The probability-difference filter (ROLL `train_infer_correction` filters with `diff_enabled`): drop tokens
(arm prob_diff) or whole responses (arm prob_diff_seq) where the trainer's and the engine's probabilities of the
sampled token differ by more than a band, in probability, not in log-ratio.

d[i,t]  = exp(lold) - exp(lmu)                            p_old - p_mu, in [-1, 1]; no clamp (there is no exp of a ratio)
prob_diff:      keep[i,t] = lo <= d[i,t] <= hi
prob_diff_seq:  D_i = mean_t d (prob_diff_agg=mean, ROLL's "geometric" level) or sum_t d (sum, ROLL's "sequence"),
                keep_i = lo <= D_i <= hi
L       = agg( keep * m * psi(r, A) ),   r = exp(LR(ltheta - lold))

Why a difference of probabilities: a ratio band treats p = 1e-6 -> 3e-6 like 0.3 -> 0.9; the difference only
flags the tokens whose probability mass actually moved, which are the ones that move the gradient.

Source and defaults: ROLL roll/utils/train_infer_corrections.py (`_compute_all_granularity`,
`compute_train_infer_correction`) and roll/configs/base_config.py `TrainInferFilterConfig` @8eb27cc: diff =
old_log_probs.exp() - infer_log_probs.exp() (old = the recomputed trainer log-probs), kept when
diff_low <= diff <= diff_high, inclusive, defaults -0.2 / 0.2 (diff_enabled defaults to false); levels token,
geometric (mean over the response's tokens), sequence (sum) and segment (multi-turn, not here); a filtered token
weighs 1 when kept (the filter is a mask; ROLL's IS weight is separate and off by default). ROLL removes the
filtered tokens from response_mask before its loss (apply_train_infer_correction_to_batch), so its token-mean
denominator counts the kept tokens only: here weight 0 in the denominator unless denominator=kept. NeMo-RL's
`seq_logprob_error_threshold` (nemo_rl/algorithms/grpo.py @7ea279a) is a related sequence filter on
mean_t exp(|lmu - lold|), which every arm logs as mismatch/token_mult_prob_error.

Metrics (`method/<arm>/*`): masked_frac (valid tokens dropped), seq_masked_frac (non-empty responses with a dropped
token), diff_mean (mean d), diff_abs_max (max |d|); prob_diff_seq also stat_mean / stat_max of D_i.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from bench.domains import num
from bench.methods.base import Batch, MaskingConfig
from bench.registry import METHODS
from bench.methods.importance import ConstantWeightMethod
from bench.methods.rejection import SequenceRejection, row_mean

AGGS = ("mean", "sum")


@dataclass
class ProbDiffConfig(MaskingConfig):
    # keep a token when prob_diff_low <= p_old - p_mu <= prob_diff_high (ROLL); the band contains 0, no mismatch
    # (a summed difference, prob_diff_agg=sum, can pass +-1)
    prob_diff_low: float = num(-0.2, "[-inf, 0]")
    prob_diff_high: float = num(0.2, "[0, inf]")


@dataclass
class ProbDiffSeqConfig(ProbDiffConfig):
    prob_diff_agg: str = "mean"  # mean: ROLL agg_type=geometric | sum: ROLL agg_type=sequence

    def check(self) -> None:
        super().check()
        if self.prob_diff_agg not in AGGS:
            raise ValueError(f"method.prob_diff_agg={self.prob_diff_agg!r} is not valid; choose one of: "
                             f"{', '.join(AGGS)}")


def prob_diff(batch: Batch) -> torch.Tensor:
    """p_old - p_mu [B, T] of every valid token, 0 elsewhere (detached; fp64 for fp64 inputs, else fp32)."""
    if batch.logp_old is None:
        raise ValueError("the probability-difference filter needs the recompute pass (batch.logp_old is None)")
    mask = batch.mask.bool()
    dt = torch.float64 if batch.logp_old.dtype == torch.float64 else torch.float32
    zero = torch.zeros((), dtype=dt, device=mask.device)
    p_old = torch.exp(torch.where(mask, batch.logp_old.detach().to(dt), zero))
    p_mu = torch.exp(torch.where(mask, batch.logp_mu.detach().to(dt), zero))
    return torch.where(mask, p_old - p_mu, zero)


def diff_stats(d: torch.Tensor, w: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """masked_frac, seq_masked_frac, diff_mean, diff_abs_max of a filter's weights `w` and differences `d`."""
    n = max(int(mask.sum()), 1)
    dropped = (w == 0) & mask
    rows = mask.any(-1)
    return {
        "masked_frac": int(dropped.sum()) / n,
        "seq_masked_frac": float((dropped.any(-1) & rows).sum()) / max(int(rows.sum()), 1),
        "diff_mean": float(d.sum()) / n,
        "diff_abs_max": float(d.abs().max()) if d.numel() else 0.0,
    }


@METHODS.register("prob_diff", schema=ProbDiffConfig, color="#6699CC", order=41)
class ProbDiff(ConstantWeightMethod):
    """Recompute PPO loss without the tokens whose p_old - p_mu leaves [prob_diff_low, prob_diff_high]."""

    diagnostics = {"masked_frac": "Prob.-diff masked token frac."}
    metric_keys = ("masked_frac", "seq_masked_frac", "diff_mean", "diff_abs_max")

    @torch.no_grad()
    def prepare(self, batch: Batch) -> dict[str, Any]:
        mask = batch.mask.bool()
        d = prob_diff(batch)
        keep = (d >= self.cfg.prob_diff_low) & (d <= self.cfg.prob_diff_high) & mask
        w = keep.to(d.dtype)
        return diff_stats(d, w, mask) | {"is_weights": w}


@METHODS.register("prob_diff_seq", schema=ProbDiffSeqConfig, color="#004488", order=42)
class ProbDiffSeq(SequenceRejection):
    """Recompute PPO loss on the responses whose mean (or summed) p_old - p_mu is inside the band."""

    diagnostics = {"seq_masked_frac": "Prob.-diff rejected seq. frac."}
    metric_keys = ("seq_masked_frac", "stat_mean", "stat_max", "diff_mean")

    def sequence_aggregation(self) -> str:
        return self.cfg.prob_diff_agg

    def statistic(self, delta: torch.Tensor, mask: torch.Tensor, batch: Batch) -> torch.Tensor:
        d = prob_diff(batch)
        return row_mean(d, mask) if self.cfg.prob_diff_agg == "mean" else d.sum(-1)

    def keep(self, stat: torch.Tensor) -> torch.Tensor:
        return (stat >= self.cfg.prob_diff_low) & (stat <= self.cfg.prob_diff_high)

    @torch.no_grad()
    def prepare(self, batch: Batch) -> dict[str, Any]:
        stats = super().prepare(batch)
        mask = batch.mask.bool()
        return diff_stats(prob_diff(batch), stats["is_weights"], mask) | stats


__all__ = ["ProbDiff", "ProbDiffConfig", "ProbDiffSeq", "ProbDiffSeqConfig", "prob_diff"]
