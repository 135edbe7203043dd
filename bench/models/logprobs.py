"""Teacher-forced log-probs of sampled tokens under the trainer's model: log pi_theta and log pi_old.

One function for the trainer, the recompute pass and the tests, so that "trainer log-prob" means the same
computation everywhere. Temperature is applied exactly as the rollout engine applies it (logits / T), so
that log pi and log mu are log-probs of the same family of distributions (docs/arms.md §1).
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager
from typing import Iterator

import torch

from bench.device import DTYPES
from bench.quant.qat import engine_kwargs
from bench.rollout.base import Rollout

#: train.dtype -> the low-precision compute dtype (None: plain fp32). Master weights are fp32 in every case.
LOW_PRECISION = {name: None if name == "fp32" else dtype for name, dtype in DTYPES.items()}
TRAINER_DTYPES = tuple(LOW_PRECISION)


def sequence_inputs(rollout: Rollout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """input_ids, attention_mask, position_ids for a teacher-forced pass over prompt + response.

    The last response token is never an input (nothing is predicted after it). Positions count real tokens
    only, so left padding does not shift them; the rollout engine uses the same convention.
    """
    ids = torch.cat([rollout.prompt_ids, rollout.response_ids], dim=1)[:, :-1]
    attn = torch.cat([rollout.prompt_mask, torch.ones_like(rollout.response_mask)], dim=1)[:, :-1]
    pos = (attn.long().cumsum(-1) - 1).clamp(min=0)
    return ids, attn.long(), pos


_EMULATING: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()


def check_dtype(dtype: str) -> None:
    if dtype not in LOW_PRECISION:
        raise ValueError(f"unknown trainer dtype {dtype!r}; valid: {', '.join(TRAINER_DTYPES)}")


@contextmanager
def emulated_weights(model: torch.nn.Module, dtype: str) -> Iterator[None]:
    """On a CPU: the fp32 master parameters rounded to bf16/fp16 for the duration, restored on exit.

    On a CPU, bf16 GEMMs are 8-13x slower than fp32 unless it has AVX512-BF16/AMX (measured here: Zen3, AVX2
    only), so the "BF16 trainer" on CPU uses bf16 (or fp16) *weights* with fp32 arithmetic. The rounded
    values replace the parameters' data in place, so autograd differentiates at the rounded weights and the
    gradient lands on the master parameter: a straight-through estimator. Hold the context over forward AND
    backward: a gradient-checkpointed layer re-runs its forward inside backward and must see the same
    rounded weights. Re-entrant (an inner context on the same model does nothing); a no-op for fp32 and on
    CUDA, where `autocast` does the low-precision compute instead.
    """
    check_dtype(dtype)
    low = LOW_PRECISION[dtype]
    params = list(model.parameters())
    if low is None or model in _EMULATING or not params or params[0].device.type == "cuda":
        yield
        return
    masters = [p.data for p in params]
    _EMULATING.add(model)
    try:
        for p in params:
            p.data = p.data.to(low).float()
        yield
    finally:
        for p, m in zip(params, masters):
            p.data = m
        _EMULATING.discard(model)


@contextmanager
def autocast(model: torch.nn.Module, dtype: str) -> Iterator[None]:
    """On CUDA: torch.autocast to bf16/fp16 (weights and activations, fp32 masters); elsewhere a no-op."""
    check_dtype(dtype)
    low = LOW_PRECISION[dtype]
    device = next(model.parameters()).device
    if low is None or device.type != "cuda":
        yield
        return
    with torch.autocast("cuda", dtype=low):
        yield


def forward(model: torch.nn.Module, dtype: str, **inputs: torch.Tensor):
    """The trainer's forward at its precision: fp32; bf16/fp16 autocast on CUDA; rounded weights on CPU."""
    with emulated_weights(model, dtype), autocast(model, dtype):
        return model(**inputs)


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
    no-grad passes (recompute, reference: bench/compute.py `TrainerCompute.logprobs`, `train.micro_batch_tokens`);
    under autograd every chunk's graph would be kept until backward, so the training pass splits its minibatch
    itself (`train.micro_batch_size`, `TrainerCompute.backward`).
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
    logits = forward(model, dtype, input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False,
                     **engine_kwargs(model, P)).logits
    logits = logits[:, P - 1 :].float() / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    del logits
    logp = logp_all.gather(-1, rollout.response_ids.unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy
