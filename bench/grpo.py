"""GRPO core shared by every arm (docs/arms.md §2): advantages, clipped surrogate, KL-to-ref, aggregation.

Every function here is pure tensor math with no knowledge of the method being trained, so that the six arms
differ only in the ratio they clip and the constant weight they multiply the per-token loss by (docs/arms.md
§5). Masked positions never reach `exp`: log-ratios are set to 0 there first (docs/arms.md §1),
so padding with -inf/garbage log-probs can produce neither inf/NaN values nor NaN gradients.
"""

from __future__ import annotations

import warnings

import torch

from bench.algo_config import LOSS_AGGS


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """Ratio/weight arithmetic runs in at least fp32 (docs/arms.md §1); fp64 inputs stay fp64 (tests)."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def group_advantages(
    rewards: torch.Tensor, group_size: int, eps: float = 1e-6, norm_by_std: bool = True,
    keep: torch.Tensor | None = None,
) -> torch.Tensor:
    """GRPO group-normalized advantages Â_i = (R_i - mean_g R) / (std_g R + eps)  (docs/arms.md §2.1).

    `rewards` [B] is ordered group by group (B = n_groups * group_size). std is the Bessel (ddof=1) std as in
    verl/TRL/FeynRL; norm_by_std=False gives Dr.GRPO's R_i - mean_g R. Groups whose rewards are all equal get
    exactly 0 (the mean subtraction alone leaves ~1e-11 for non-binary rewards). group_size == 1 gives 0 with a
    warning (ours: verl/FeynRL would return the raw reward). Computed in fp64, returned in the rewards' float
    dtype (fp32 for integer rewards).

    `keep` [B] bool (algo.baseline=kept): a group's mean and std come from its kept responses only, and a response
    that is not kept gets 0; a group with fewer than 2 kept responses gets 0 everywhere (its baseline is undefined,
    as for group_size 1). Rewards [1, 1, 0, 0] with the 2nd dropped give [0.666667, 0, -0.333333, -0.333333]
    without std scaling; with all four kept the dropped response would have pulled the mean to 0.5.
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [B], got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"batch of {rewards.numel()} rewards is not divisible into groups of {group_size}")
    out_dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    if group_size == 1:
        warnings.warn("group_size=1: GRPO advantages are undefined, returning 0 (docs/arms.md §2.1)", stacklevel=2)
        return torch.zeros_like(rewards, dtype=out_dtype)
    r = rewards.detach().to(torch.float64).view(-1, group_size)
    if keep is None:
        centered = r - r.mean(dim=1, keepdim=True)
        adv = centered / (r.std(dim=1, keepdim=True, unbiased=True) + eps) if norm_by_std else centered
        all_equal = (r == r[:, :1]).all(dim=1, keepdim=True)
        adv = torch.where(all_equal, torch.zeros_like(adv), adv)
        return adv.reshape(-1).to(out_dtype)
    k = keep.detach().to(device=r.device, dtype=torch.bool).view(-1, group_size)
    n = k.sum(dim=1, keepdim=True).to(torch.float64)
    mean = torch.where(k, r, torch.zeros_like(r)).sum(dim=1, keepdim=True) / n.clamp(min=1)
    centered = torch.where(k, r - mean, torch.zeros_like(r))
    std = (centered.square().sum(dim=1, keepdim=True) / (n - 1).clamp(min=1)).sqrt()
    adv = centered / (std + eps) if norm_by_std else centered
    kept_r = torch.where(k, r, mean)  # rejected rows read as the mean: they never break "all equal"
    all_equal = (kept_r == mean).all(dim=1, keepdim=True) | (n < 2)
    adv = torch.where(all_equal | ~k, torch.zeros_like(adv), adv)
    return adv.reshape(-1).to(out_dtype)


def safe_log_ratio(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor, clamp: float = 20.0) -> torch.Tensor:
    """where(mask, clamp(a - b, -clamp, clamp), 0)  (docs/arms.md §1, LR(x)).

    Both inputs are zeroed at masked positions *before* subtracting (double-where), so -inf - -inf = NaN never
    appears anywhere in the graph and masked positions receive exactly zero gradient.
    """
    zero = torch.zeros((), dtype=a.dtype, device=a.device)
    a0 = torch.where(mask, a, zero)
    b0 = torch.where(mask, b.to(a.dtype), zero)
    return torch.where(mask, (a0 - b0).clamp(-clamp, clamp), zero)


#: A clipping bound: one number, or a detached per-token tensor (ACR's adaptive upper bound).
Bound = float | torch.Tensor


def clip_bounds(eps_low: float, eps_high: Bound) -> tuple[float, Bound]:
    """(1 - eps_low, 1 + eps_high): the PPO clipping interval."""
    return 1.0 - eps_low, 1.0 + eps_high


def clipped_surrogate_bounds(ratio: torch.Tensor, adv: torch.Tensor, lower: Bound, upper: Bound,
                             dual_clip_c: float | None = None) -> torch.Tensor:
    """psi = max(-r*A, -clip(r, lower, upper)*A), optional dual-clip min(psi, -c*A) for A<0 (docs/arms.md §2.2).

    `lower`/`upper` may be per-token tensors (ACR's adaptive upper bound, docs/arms.md §4.6); they must be
    detached. The clip is written with `where` so a clipped token has exactly zero gradient and an unclipped one
    exactly -r*A (torch.maximum splits a tie evenly between two identical branches, which sums to the same).
    """
    lower_t = torch.as_tensor(lower, dtype=ratio.dtype, device=ratio.device)
    upper_t = torch.as_tensor(upper, dtype=ratio.dtype, device=ratio.device)
    clipped_r = torch.where(ratio > upper_t, upper_t, torch.where(ratio < lower_t, lower_t, ratio))
    psi = torch.maximum(-ratio * adv, -clipped_r * adv)
    if dual_clip_c is not None:
        psi = torch.where(adv < 0, torch.minimum(psi, -dual_clip_c * adv), psi)
    return psi


def clipped_surrogate(
    ratio: torch.Tensor,
    adv: torch.Tensor,
    eps_low: float,
    eps_high: float,
    dual_clip_c: float | None = None,
) -> torch.Tensor:
    """Per-token PPO loss psi(r, A; eps_low, eps_high) = -min(r*A, clip(r, 1-eps_low, 1+eps_high)*A)."""
    lower, upper = clip_bounds(eps_low, eps_high)
    return clipped_surrogate_bounds(ratio, adv, lower, upper, dual_clip_c)


def clip_mask(ratio: torch.Tensor, adv: torch.Tensor, lower: Bound, upper: Bound,
              dual_clip_c: float | None = None) -> torch.Tensor:
    """Bool [.]: token on a clipped (zero-gradient) branch of psi (docs/arms.md §2.2, 11 'PPO clipfrac').

    Clipped <=> (A>0 and r>upper) or (A<0 and r<lower); with dual-clip also A<0 and r>c.
    """
    clipped = ((adv > 0) & (ratio > upper)) | ((adv < 0) & (ratio < lower))
    if dual_clip_c is not None:
        clipped = clipped | ((adv < 0) & (ratio > dual_clip_c))
    return clipped


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x over mask (0 when the mask is empty); masked-out values may be inf/NaN."""
    x0 = torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))
    return x0.sum() / mask.sum().clamp(min=1)


def agg_loss(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token-mean",
    n_tokens: float | None = None,
    t_max: int | None = None,
) -> torch.Tensor:
    """Reduce a [B, T] per-token loss to a scalar (docs/arms.md §2.4, verl agg_loss / TRL loss_type).

    token-mean              sum(m*l) / max(1, n_tokens); n_tokens = valid tokens of the optimizer step
                            (defaults to mask.sum(), i.e. this call is the whole step)
    seq-mean-token-mean     mean over sequences with n_i > 0 of sum_t(m*l)/n_i (0 if there are none)
    seq-mean-token-sum-norm sum(m*l) / (B * T_max), T_max defaults to the padded length T (Dr.GRPO)
    Masked entries are excluded with `where`, so inf/NaN there cannot leak into the value or the gradient.
    """
    zero = torch.zeros((), dtype=per_token.dtype, device=per_token.device)
    lm = torch.where(mask, per_token, zero)
    if mode == "token-mean":
        denom = float(mask.sum()) if n_tokens is None else float(n_tokens)
        return lm.sum() / max(1.0, denom)
    if mode == "seq-mean-token-mean":
        n_i = mask.sum(dim=-1)
        has = n_i > 0
        seq = lm.sum(dim=-1) / n_i.clamp(min=1)
        return torch.where(has, seq, zero).sum() / has.sum().clamp(min=1)
    if mode == "seq-mean-token-sum-norm":
        t = mask.shape[-1] if t_max is None else t_max
        return lm.sum() / max(1, mask.shape[0] * t)
    raise ValueError(f"unknown loss_agg {mode!r}; valid: {', '.join(LOSS_AGGS)}")


def k3_kl(logp: torch.Tensor, logp_ref: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi_theta || pi_ref): exp(d) - d - 1, d = clamp(lref - ltheta, -20, 20),
    clamped to [-10, 10] (docs/arms.md §2.3, verl "low_var_kl"). 0 at masked positions when a mask is given."""
    if mask is None:
        mask = torch.ones_like(logp, dtype=torch.bool)
    d = safe_log_ratio(logp_ref.to(logp.dtype), logp, mask, 20.0)
    return (torch.exp(d) - d - 1.0).clamp(-10.0, 10.0)


def kl_ref_penalty(
    logp: torch.Tensor,
    logp_ref: torch.Tensor,
    mask: torch.Tensor,
    beta: float,
    mode: str = "token-mean",
    n_tokens: float | None = None,
) -> tuple[torch.Tensor, float]:
    """beta * agg(k3(ltheta, lref)) and the detached mean k3 for logging (docs/arms.md §2.3).

    Added outside any importance weighting, as verl and TRL do.
    """
    k3 = k3_kl(logp, logp_ref, mask)
    return beta * agg_loss(k3, mask, mode, n_tokens), float(masked_mean(k3.detach(), mask))


__all__ = [
    "agg_loss",
    "clip_bounds",
    "clip_mask",
    "clipped_surrogate",
    "clipped_surrogate_bounds",
    "compute_dtype",
    "group_advantages",
    "k3_kl",
    "kl_ref_penalty",
    "masked_mean",
    "safe_log_ratio",
]
