"""Teacher-forced log-probs of sampled tokens under the trainer's model: log pi_theta and log pi_old.

One function for the trainer, the recompute pass and the tests, so that "trainer log-prob" means the same
computation everywhere. Temperature is applied exactly as the rollout engine applies it (logits / T), so
that log pi and log mu are log-probs of the same family of distributions (methods.md section 0).
"""

from __future__ import annotations

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


def bf16_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The fp32 master parameters rounded to bf16, with a straight-through gradient to the masters.

    On a CPU, bf16 GEMMs are 8-13x slower than fp32 unless it has AVX512-BF16/AMX (measured here: Zen3,
    AVX2 only), so the "BF16 trainer" on CPU uses bf16 *weights* with fp32 arithmetic; on CUDA it is
    autocast (bf16 weights and activations). Either way the optimizer updates fp32 master weights.
    """
    return {n: p + (p.detach().to(torch.bfloat16).float() - p.detach()) for n, p in model.named_parameters()}


def forward(model: torch.nn.Module, dtype: str, **inputs: torch.Tensor):
    """The trainer's forward at its precision: fp32, or bf16 weights over fp32 master weights."""
    if dtype not in TRAINER_DTYPES:
        raise ValueError(f"unknown trainer dtype {dtype!r}; valid: {', '.join(TRAINER_DTYPES)}")
    if dtype == "fp32":
        return model(**inputs)
    device = next(model.parameters()).device
    if device.type == "cuda":
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return model(**inputs)
    return torch.func.functional_call(model, bf16_weights(model), args=(), kwargs=inputs)


def token_logprobs(
    model: torch.nn.Module,
    rollout: Rollout,
    temperature: float = 1.0,
    dtype: str = "fp32",
    with_entropy: bool = False,
    micro_batch_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(response token | prefix) for every response position, [B, T] float32.

    Masked positions are returned as computed (finite garbage); callers mask them. Entropy [B, T] of the
    temperature-scaled distribution is returned when asked (detached: it is a diagnostic only).

    `micro_batch_tokens`: rows go through the model in chunks of at most this many tokens (rows x padded
    sequence length, at least one row), so that a pass holds one chunk's activations and [rows, T, vocab]
    logits at a time instead of the whole batch's. Rows are computed independently of each other, so the
    result is bit-identical to the unchunked pass (tests/unit/test_logprobs.py). This bounds memory in the
    no-grad passes (recompute, reference); under autograd every chunk's graph would be kept until backward,
    so the training pass splits its minibatch before calling this (bench/train.py `update`).
    """
    rows = rows_per_chunk(rollout, micro_batch_tokens)
    if rows >= rollout.batch_size:
        return _token_logprobs(model, rollout, temperature, dtype, with_entropy)
    parts = [_token_logprobs(model, rollout.select(slice(i, i + rows)), temperature, dtype, with_entropy)
             for i in range(0, rollout.batch_size, rows)]
    logp = torch.cat([lp for lp, _ in parts])
    return logp, (torch.cat([e for _, e in parts]) if with_entropy else None)


def rows_per_chunk(rollout: Rollout, micro_batch_tokens: int | None) -> int:
    """Rows per chunk so that rows x (prompt + response - 1) tokens stay within `micro_batch_tokens` (>= 1 row)."""
    if micro_batch_tokens is None:
        return rollout.batch_size
    if micro_batch_tokens < 1:
        raise ValueError(f"micro_batch_tokens={micro_batch_tokens} must be positive (or None for the whole batch)")
    length = rollout.prompt_ids.shape[1] + rollout.response_ids.shape[1] - 1
    return max(1, micro_batch_tokens // max(1, length))


def _token_logprobs(
    model: torch.nn.Module, rollout: Rollout, temperature: float, dtype: str, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One pass over all rows of `rollout`.

    The logits of every position are computed and the response positions sliced out afterwards. Asking HF
    for the response positions only (`logits_to_keep`) would spare the prompt's [rows, P, vocab], but the
    lm_head then multiplies a non-contiguous slice, which torch.matmul computes by a different kernel with
    and without autograd: log pi_old (no grad) and log pi_theta at theta_old (grad) would then differ in the
    last bits (measured: 4e-6), and the on-policy ratio would no longer be exactly 1.
    """
    ids, attn, pos = sequence_inputs(rollout)
    P = rollout.prompt_ids.shape[1]
    logits = forward(model, dtype, input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False).logits
    logits = logits[:, P - 1 :].float() / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    del logits
    logp = logp_all.gather(-1, rollout.response_ids.unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy
