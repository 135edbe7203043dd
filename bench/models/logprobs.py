"""Teacher-forced log-probs of sampled tokens under the trainer's model: log pi_theta and log pi_old.

One function for the trainer, the recompute pass and the tests, so that "trainer log-prob" means the same
computation everywhere. Temperature is applied exactly as the rollout engine applies it (logits / T), so
that log pi and log mu are log-probs of the same family of distributions (methods.md section 0).
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from bench.rollout.base import Rollout

TRAINER_DTYPES = ("bf16", "fp32")


def sequence_inputs(rollout: Rollout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """input_ids, attention_mask, position_ids for a teacher-forced pass over prompt + response.

    The last response token is never an input (nothing is predicted after it). Positions count real tokens
    only, so left padding does not shift them; the rollout engine uses the same convention.
    """
    ids = torch.cat([rollout.prompt_ids, rollout.response_ids], dim=1)[:, :-1]
    attn = torch.cat([rollout.prompt_mask, torch.ones_like(rollout.response_mask)], dim=1)[:, :-1]
    pos = (attn.long().cumsum(-1) - 1).clamp(min=0)
    return ids, attn.long(), pos


def autocast_for(dtype: str):
    """bf16 = mixed precision (fp32 master weights, bf16 matmuls); fp32 = plain."""
    if dtype not in TRAINER_DTYPES:
        raise ValueError(f"unknown trainer dtype {dtype!r}; valid: {', '.join(TRAINER_DTYPES)}")
    return torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bf16" else nullcontext()


def token_logprobs(
    model: torch.nn.Module,
    rollout: Rollout,
    temperature: float = 1.0,
    dtype: str = "fp32",
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(response token | prefix) for every response position, [B, T] float32.

    Masked positions are returned as computed (finite garbage); callers mask them. Entropy [B, T] of the
    temperature-scaled distribution is returned when asked (detached: it is a diagnostic only).
    """
    ids, attn, pos = sequence_inputs(rollout)
    P = rollout.prompt_ids.shape[1]
    with autocast_for(dtype):
        logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False).logits
    logits = logits[:, P - 1 :].float() / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, rollout.response_ids.unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy
