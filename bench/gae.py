"""PPO with a learned critic on token-level LM rollouts: outcome rewards, discounted returns, GAE(gamma, lambda),
masked whitening and the clipped value loss (issue 11, QuRL Table 1: "PPO on GSM8K").

Pure tensor functions on [B, T] response tensors (B responses, T padded response positions), so the trainer can
swap `algo.advantage=grpo` for `gae` without touching the arms: the arms' corrections act on the policy loss
only, exactly as with GRPO (docs/arms.md §5); this module only changes where the advantage comes from.

Conventions (the same as verl, read at volcengine/verl@b178a3c; formulas re-derived, not copied):

* `mask[i, t]` is True for a response token that is trained on (docs/arms.md §1). Masked positions are
  *skipped*: they contribute no reward, no value and no discount, so a response with a hole in its mask (e.g. a
  tool observation) is treated as the contiguous sequence of its valid tokens. This is what verl's
  `compute_gae_advantage_return` does ("skip values and TD-error on observation tokens"); for ordinary
  right-padded responses it just means the padding is ignored.
* `values[i, t] = V(s_t)`: the critic's estimate for the state *before* token t is generated (prompt + y_<t).
  verl reads it from the critic's output at the position preceding token t
  (`verl/workers/critic/dp_critic.py`, `values[:, -response_length - 1 : -1]`).
* Outcome rewards: the scalar reward of a response is placed on its last valid token and all other token
  rewards are 0, as verl's reward managers do (`reward_tensor[i, valid_response_length - 1] = score`,
  `verl/workers/reward_manager/naive.py`). The state after the last valid token is terminal: V = 0.
* Outputs are exactly 0 at masked positions and are computed with `where`, so garbage (inf/NaN) in padded
  positions of any input never reaches a valid position. (verl instead multiplies by the mask, which lets a NaN
  in padding leak into the recursion; it also leaves the carried advantage at masked positions. Both only
  matter at positions that are masked out of every loss.)
"""

from __future__ import annotations

import warnings

import torch

from bench.grpo import agg_loss

WHITEN_EPS = 1e-8  # verl masked_whiten: (x - mean) * rsqrt(var + 1e-8)


def _check_shapes(*tensors: torch.Tensor) -> None:
    shape = tensors[0].shape
    if len(shape) != 2:
        raise ValueError(f"expected [B, T] tensors, got shape {tuple(shape)}")
    for x in tensors[1:]:
        if x.shape != shape:
            raise ValueError(f"shape mismatch: {tuple(x.shape)} vs {tuple(shape)}")


def _float(x: torch.Tensor) -> torch.Tensor:
    """fp64 stays fp64 (hand-computed tests), everything else is computed in fp32."""
    return x if x.dtype == torch.float64 else x.to(torch.float32)


def outcome_token_rewards(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B] scalar rewards -> [B, T] token rewards with each score on its response's last valid token.

    This is how an outcome reward (correct / incorrect) becomes a token-level reward for GAE, matching verl's
    reward managers. A response with no valid token gets no reward at all (its score is dropped: there is no
    token to attach it to, and such a row is excluded from every loss anyway).
    """
    if scores.dim() != 1 or mask.dim() != 2 or scores.shape[0] != mask.shape[0]:
        raise ValueError(f"scores [B] and mask [B, T] expected, got {tuple(scores.shape)} and {tuple(mask.shape)}")
    mask = mask.bool()
    t = mask.shape[1]
    positions = torch.arange(t, device=mask.device).expand_as(mask)
    last = torch.where(mask, positions, torch.full_like(positions, -1)).max(dim=1).values  # -1: no valid token
    out = torch.zeros(mask.shape, dtype=_float(scores).dtype, device=scores.device)
    rows = torch.nonzero(last >= 0).squeeze(1)
    out[rows, last[rows]] = _float(scores)[rows]
    return out


def discounted_returns(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = r_t + gamma * G_{t+1} over the valid tokens of each response; G after the last valid token is 0.

    Masked positions are skipped (no reward, no discount) and get 0. With gamma = 1 and an outcome reward R on
    the last token, every valid token has G_t = R. These are the Monte-Carlo targets; GAE with lambda = 1 gives
    the same returns (its advantages telescope to G_t - V_t).
    """
    _check_shapes(token_rewards, mask)
    mask = mask.bool()
    r = _float(token_rewards)
    zero = torch.zeros((), dtype=r.dtype, device=r.device)
    running = torch.zeros(r.shape[0], dtype=r.dtype, device=r.device)
    out = torch.zeros_like(r)
    for t in reversed(range(r.shape[1])):
        valid = mask[:, t]
        running = torch.where(valid, torch.where(valid, r[:, t], zero) + gamma * running, running)
        out[:, t] = torch.where(valid, running, zero)
    return out


def gae_advantages_returns(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation (Schulman et al. 2016) over the valid tokens of each response.

        delta_t = r_t + gamma * V_{t+1} - V_t           (V after the last valid token = 0: terminal state)
        A_t     = delta_t + gamma * lam * A_{t+1}        (A after the last valid token = 0)
        R_t     = A_t + V_t                              (the critic's regression target, "returns")

    where t+1 is the next *valid* token (masked positions are skipped, see the module docstring). Returns the raw
    (not whitened) advantages and the returns, both [B, T] and 0 at masked positions; both are detached
    constants. verl: `compute_gae_advantage_return` in verl/trainer/ppo/core_algos.py, which additionally
    whitens the advantages (use `masked_whiten` below for that: returns are always taken before whitening).
    lam = 1 gives A_t = G_t - V_t (Monte-Carlo advantage); lam = 0 gives the one-step TD error delta_t.
    verl's defaults are gamma = lam = 1 (verl/trainer/config/ppo_trainer.yaml, `algorithm.gamma/lam`).
    """
    _check_shapes(token_rewards, values, mask)
    mask = mask.bool()
    r = _float(token_rewards).detach()
    v = _float(values).detach().to(r.dtype)
    zero = torch.zeros((), dtype=r.dtype, device=r.device)
    next_value = torch.zeros(r.shape[0], dtype=r.dtype, device=r.device)
    next_adv = torch.zeros_like(next_value)
    adv = torch.zeros_like(r)
    for t in reversed(range(r.shape[1])):
        valid = mask[:, t]
        v_t = torch.where(valid, v[:, t], zero)
        delta = torch.where(valid, r[:, t], zero) + gamma * next_value - v_t
        a_t = delta + gamma * lam * next_adv
        next_adv = torch.where(valid, a_t, next_adv)
        next_value = torch.where(valid, v_t, next_value)
        adv[:, t] = torch.where(valid, a_t, zero)
    returns = torch.where(mask, adv + torch.where(mask, v, zero), zero)
    return adv, returns


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """(x - mean) / sqrt(var + 1e-8) with mean and the Bessel-corrected variance over the valid entries.

    The statistics are taken over every valid token of the batch passed in (verl whitens over the whole
    rollout batch, once, inside compute_gae_advantage_return; verl/utils/torch_functional.py `masked_whiten`,
    `masked_var(unbiased=True)`). shift_mean=False adds the mean back (rescale only). Masked positions are 0.
    Fewer than 2 valid entries: the variance is undefined (verl raises); here the result is x - mean (0 for a
    single entry, i.e. no advantage signal) with a warning, so one short batch cannot stop a run [ours].
    """
    _check_shapes(x, mask)
    mask = mask.bool()
    xf = _float(x)
    zero = torch.zeros((), dtype=xf.dtype, device=xf.device)
    n = int(mask.sum())
    if n == 0:
        return torch.zeros_like(xf)
    x0 = torch.where(mask, xf, zero)
    mean = x0.sum() / n
    centered = torch.where(mask, xf - mean, zero)
    if n < 2:
        warnings.warn("masked_whiten: fewer than 2 valid entries, returning x - mean unscaled", stacklevel=2)
        out = centered
    else:
        var = (centered**2).sum() / (n - 1)
        out = centered * torch.rsqrt(var + WHITEN_EPS)
    if not shift_mean:
        out = out + mean
    return torch.where(mask, out, zero)


def clipped_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    old_values: torch.Tensor,
    mask: torch.Tensor,
    clip_range: float | None,
    loss_agg: str = "token-mean",
    n_tokens: float | None = None,
) -> tuple[torch.Tensor, float]:
    """PPO2's clipped value loss and the fraction of tokens on the clipped branch.

        V_clip = old_V + clamp(V - old_V, -c, +c)
        loss_t = 0.5 * max( (V - R)^2, (V_clip - R)^2 )
        loss   = agg(loss_t)   (token-mean by default, the same aggregation as the policy loss; bench.grpo.agg_loss)

    `vpreds` V are the critic's current predictions (with gradient), `old_values` old_V the predictions made
    when the rollout was scored (the critic's "old policy"), `returns` R the GAE targets; old_V and R are
    constants. Taking the max is pessimistic: once V has moved more than c from old_V *toward* R, the clipped
    error is the larger one and its gradient is 0, so that token stops pulling V further from old_V (a trust
    region for the critic); moving away from R is never clipped. clip_range=None gives the plain 0.5 * (V - R)^2. The 0.5 factor and
    max() follow verl `compute_value_loss` (verl/trainer/ppo/core_algos.py, itself from TRL's PPO trainer and
    OpenAI baselines' PPO2). verl's default c is 0.5 (`critic.cliprange_value`). Returns (loss, clipfrac) with
    clipfrac = masked mean of [clipped error > unclipped error] (verl's `vf_clipfrac`).
    """
    _check_shapes(vpreds, returns, old_values, mask)
    mask = mask.bool()
    # Zero every input at masked positions first (double-where), so inf/NaN padding gives neither a NaN loss
    # nor a NaN gradient (a NaN times the zero gradient of a masked entry is still NaN).
    v_raw = _float(vpreds)
    zero = torch.zeros((), dtype=v_raw.dtype, device=v_raw.device)
    v = torch.where(mask, v_raw, zero)
    r = torch.where(mask, _float(returns).detach().to(v.dtype), zero)
    unclipped = (v - r) ** 2
    if clip_range is None:
        per_token = unclipped
        use_clipped = torch.zeros_like(mask)
    else:
        old = torch.where(mask, _float(old_values).detach().to(v.dtype), zero)
        v_clip = old + (v - old).clamp(-clip_range, clip_range)
        clipped = (v_clip - r) ** 2
        use_clipped = clipped > unclipped
        per_token = torch.where(use_clipped, clipped, unclipped)
    loss = 0.5 * agg_loss(per_token, mask, loss_agg, n_tokens)
    n = int(mask.sum())
    clipfrac = float((use_clipped & mask).sum()) / n if n else 0.0
    return loss, clipfrac


def gae_from_outcome(
    scores: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole advantage step of PPO for outcome rewards: scores [B] -> (advantages, returns), both [B, T].

    Reward on the last valid token, GAE(gamma, lam), then (by default) advantages whitened over the batch, as
    verl does; returns are not whitened. Defaults gamma = lam = 1 are verl's.
    """
    adv, returns = gae_advantages_returns(outcome_token_rewards(scores, mask), values, mask, gamma, lam)
    if whiten:
        adv = masked_whiten(adv, mask)
    return adv, returns


__all__ = [
    "clipped_value_loss",
    "discounted_returns",
    "gae_advantages_returns",
    "gae_from_outcome",
    "masked_whiten",
    "outcome_token_rewards",
]
