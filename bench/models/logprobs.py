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
import torch.utils.checkpoint

from bench.device import DTYPES
from bench.rollout.qat import engine_kwargs
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


#: Response positions whose logits exist at once in a log-prob pass: the lm_head runs over the sequence in slices
#: of this many positions (all rows of a forward flattened), so a pass holds [HEAD_CHUNK_TOKENS, vocab] logits
#: instead of [rows, response length, vocab]; under autograd each slice is checkpointed (recomputed in backward).
#: At a 152k vocabulary a slice's logits, their fp32 copies and gradients take ~3 GB (bench/launch/memory.py),
#: where one 16k-token sequence's whole logits took ~50 GB.
HEAD_CHUNK_TOKENS = 1024


def token_logprobs(
    model: torch.nn.Module,
    rollout: Rollout,
    temperature: float = 1.0,
    dtype: str = "fp32",
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(response token | prefix) for every response position, [B, T] float32, in one forward of all rows.

    Masked positions are returned as computed (finite garbage); callers mask them. Entropy [B, T] of the
    temperature-scaled distribution is returned when asked (detached: it is a diagnostic only).

    The logits never exist for the whole sequence: the model's lm_head is swapped, for this forward, for
    `head_logprobs`, which takes the final hidden states of the response positions and returns their log-probs
    and entropies slice by slice (HEAD_CHUNK_TOKENS positions at a time); the model returns those log-probs as
    its "logits", so they stay its output (FSDP2 hooks the root module's outputs for its backward). Memory and
    batching across forwards are the caller's (bench/compute.py: micro-batches cut to their rows' length).

    The slices are contiguous copies, computed by the same function with and without autograd, so the
    recompute pass (no grad) and the training pass (grad) give bit-identical log-probs: the on-policy ratio is
    exactly 1 (tests/unit/test_logprobs.py). A model whose forward transforms the lm_head's output (logit
    soft-capping) is refused: its log-probs would not be those of its logits.
    """
    ids, attn, pos = sequence_inputs(rollout)
    P = rollout.prompt_ids.shape[1]
    head = model.get_output_embeddings()
    if head is None:
        raise ValueError(f"{type(model).__name__} has no output embedding (lm_head) to compute log-probs with")
    out: dict[str, torch.Tensor | None] = {}

    def response_logprobs(hidden: torch.Tensor) -> torch.Tensor:  # replaces head.forward for this call
        out["logp"], out["entropy"] = head_logprobs(head, hidden[:, P - 1 :], rollout.response_ids, temperature,
                                                    with_entropy)
        return out["logp"]

    head.forward = response_logprobs  # an instance attribute: nn.Module.__call__ finds it before the class's
    try:
        result = forward(model, dtype, input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False,
                         **engine_kwargs(model, P))
    finally:
        del head.forward
    if result.logits is not out.get("logp"):
        raise ValueError(f"{type(model).__name__} transforms its lm_head output (e.g. logit soft-capping): the "
                         "trainer's chunked log-probs do not support it")
    return out["logp"], out["entropy"]


def head_logprobs(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float,
                  with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(head(hidden) / temperature) at `targets` [rows, T] (and the entropy), HEAD_CHUNK_TOKENS
    positions at a time; under autograd each slice is checkpointed, so only one slice's logits exist in backward.
    """
    rows, T = targets.shape
    flat = hidden.reshape(rows * T, hidden.shape[-1])  # a contiguous copy of the response positions
    goal = targets.reshape(rows * T)
    grad = torch.is_grad_enabled() and flat.requires_grad
    logps, entropies = [], []
    for i in range(0, rows * T, HEAD_CHUNK_TOKENS):
        args = (head, flat[i : i + HEAD_CHUNK_TOKENS], goal[i : i + HEAD_CHUNK_TOKENS], temperature, with_entropy)
        lp, ent = (torch.utils.checkpoint.checkpoint(_slice_logprobs, *args, use_reentrant=False) if grad
                   else _slice_logprobs(*args))
        logps.append(lp)
        entropies.append(ent)
    # a copy, not a view of the cat: this is the model's output, and FSDP2 warns on a root output that is a view
    # (an in-place op on one would skip its pre-backward all-gather)
    logp = torch.cat(logps).view(rows, T).clone()
    return logp, (torch.cat(entropies).view(rows, T) if with_entropy else None)


def _slice_logprobs(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float,
                    with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One slice of positions [n, hidden] -> (log-prob of its target [n], entropy [n] or None), in fp32."""
    logits = type(head).forward(head, hidden).float() / temperature  # the module's own forward, not the swap
    logp_all = torch.log_softmax(logits, dim=-1)
    del logits
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy
