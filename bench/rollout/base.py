"""The rollout engine contract shared by every engine (embedded torch, vLLM).

A rollout engine holds its own copy of the policy in the rollout precision. The trainer pushes its weights
with `load_weights` at every sync (quantized engines re-quantize with fresh scales there) and asks for
samples with `generate`. `logp_mu` must be the log-prob of each sampled token under the distribution the
token was actually drawn from (temperature applied), because every correction in bench/methods divides by it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, Optional, Protocol, runtime_checkable

import torch
from omegaconf import MISSING

from bench.domains import num
from bench.quant.quantizers import Quantizer
from bench.registry import FORMATS


def rollout_quantizer(rollout: Any) -> Quantizer:
    """The quantizer of a `rollout` config (schema or composed DictConfig): the one place a run's precision, weight and
    activation granularities become a Quantizer (the engine's, the matched trainer's, run.json's description)."""
    return Quantizer(rollout.precision, getattr(rollout, "weight_granularity", None),
                     getattr(rollout, "act_granularity", None))


@dataclass
class RolloutConfig:
    """`rollout.*` keys every engine has; an engine's schema adds its own (bench/rollout/<engine>.py)."""

    engine: str = MISSING
    precision: str = "${qrl_default_precision:${method.name}}"  # a name registered in bench/quant/; default: the arm's
    weight_granularity: Optional[str] = None  # null: the precision's default (per_channel for fp8/int8)
    act_granularity: Optional[str] = None  # null: the precision's default (per_token); none = weight-only
    # the sampling temperature (1.0: the policy's own distribution; beyond ~10 sampling is near uniform)
    temperature: float = num(1.0, "(0, 10]")

    def quantizer(self) -> Quantizer:
        """The precision as a validated Quantizer (the one check of a precision setting)."""
        return rollout_quantizer(self)

    def check(self) -> None:
        if self.precision not in FORMATS:
            raise ValueError(f"rollout.precision={self.precision!r} is not valid; choose one of: {', '.join(FORMATS.names())}")
        try:
            self.quantizer()
        except ValueError as e:
            raise ValueError(f"rollout.precision={self.precision}: {e}") from None




@dataclass
class SamplingParams:
    """How to sample. `greedy=True` takes the argmax (evaluation); log-probs are then those of T=1.

    `top_k` > 0 keeps the k most likely tokens and `top_p` < 1 the nucleus (the smallest set of most likely
    tokens whose probability reaches top_p, of the top-k distribution when both are set, as vLLM and HF order
    them), renormalized; the log-probs returned are then those of that truncated distribution, log p - log S with S
    the kept mass, so that rho = pi/mu carries the truncation (docs/arms.md §1). The trainer's log pi is not
    truncated, so training rollouts keep top_k = 0 and top_p = 1; truncation is for evaluation (`eval.top_k`,
    `eval.top_p`).
    """

    max_new_tokens: int
    temperature: float = 1.0
    greedy: bool = False
    top_p: float = 1.0
    top_k: int = 0  # 0: off


def token_ids(ids: int | Sequence[int] | None) -> tuple[int, ...]:
    """One id, several or none, as a tuple (stop ids are given either way)."""
    if ids is None:
        return ()
    if isinstance(ids, int):
        return (ids,)
    return tuple(int(i) for i in ids)


def sampling_device(engine: Any) -> torch.device:
    """The device an engine samples on, where a sampling generator handed to its `generate` belongs: the
    engine's `sampling_device` attribute (the embedded engine's is where its weights live, e.g. cuda), else the
    CPU (vLLM draws per-request seeds on the host)."""
    return torch.device(getattr(engine, "sampling_device", None) or "cpu")


def response_budget(max_new_tokens: int, prompt_len: int, engine: Any) -> int:
    """New tokens a batch may generate: `max_new_tokens`, cut so that prompt + response fits the engine's
    `max_len` (the model's context, `model.max_length`). A prompt that leaves no room is an error naming both."""
    max_len = getattr(engine, "max_len", None)
    if max_len is None:
        return max_new_tokens
    room = int(max_len) - prompt_len
    if room < 1:
        raise ValueError(f"a prompt of {prompt_len} tokens leaves no room for a response within the model's "
                         f"{max_len} tokens (model.max_length); shorten the prompts or raise model.max_length")
    return min(max_new_tokens, room)


@dataclass
class Rollout:
    """A batch of sampled responses, rows grouped by prompt: [p0]*n, [p1]*n, ...

    prompt_ids    [B, P] long, left-padded with the pad id
    prompt_mask   [B, P] bool, True on real prompt tokens
    response_ids  [B, T] long, right-padded with the pad id after EOS
    response_mask [B, T] bool, True on generated tokens, EOS included
    logp_mu       [B, T] float32, log mu(sampled token); 0.0 where response_mask is False
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    logp_mu: torch.Tensor

    @property
    def batch_size(self) -> int:
        return self.response_ids.shape[0]

    def select(self, idx: torch.Tensor | slice) -> "Rollout":
        return Rollout(**{f.name: getattr(self, f.name)[idx] for f in fields(self)})

    def to(self, device: torch.device | str) -> "Rollout":
        """The same rollout with every tensor on `device` (the trainer's; engines may return them elsewhere)."""
        return Rollout(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    def num_tokens(self) -> int:
        return int(self.response_mask.sum())


@runtime_checkable
class RolloutEngine(Protocol):
    """What the trainer, the evaluation and the sampler read from a rollout engine: everything here, nothing else.

    A new engine is one module in bench/rollout/ with `@ENGINES.register("<name>", schema=<its RolloutConfig>)`
    on a class that has every member below (tests/unit/test_engine_contract.py checks each registered engine).
    `bench.rollout.build_engine` calls the class with the schema's keys as keywords (precision and the engine's
    knobs) and `eos_id`, `pad_id`, `max_len`; the engine builds its schema from them and checks it (`check_schema`).
    """

    precision: str  # the registered precision name the engine samples in (bench/quant)
    eos_id: int | Sequence[int] | None  # a response ends after any of these ids (None: only at the length limit)
    pad_id: int  # right-pads responses, left-pads prompts
    max_len: int | None  # prompt + new tokens the engine may hold (None: unchecked); bench.rollout.base.response_budget
    sampling_device: torch.device | str | None  # where a generator handed to `generate` belongs (None: the CPU)

    def load_weights(self, model: torch.nn.Module) -> None:
        """Copy the trainer's current weights in; quantized engines recompute every scale here."""

    def quant_metrics(self) -> dict[str, float]:
        """`quant/quant_error/<layer type>` of the last load_weights (empty for unscaled precisions)."""

    def generate(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, n: int, sampling: SamplingParams,
                 generator: torch.Generator | None = None) -> Rollout:
        """Sample `n` responses for every prompt row (rows repeated in place, group-contiguous)."""

    def release(self) -> None:
        """Free what the engine holds between uses (the evaluation engine's copy of the policy); may do nothing."""


def detach_aliases(root: torch.nn.Module, source: torch.nn.Module) -> None:
    """Replace every tensor under `root` that shares storage with `source`'s parameters by a copy of its own.

    An engine's conversion of a weight to the dtype it already has returns the weight itself (an fp32 engine's
    embedding, a bf16 engine's linears from a bf16 model): such an engine tensor would alias the trainer's parameter,
    which the optimizer updates in place, and under FSDP2 its all-gathered storage, freed when the unit reshards
    (resharded units have no storage and are skipped).
    """
    ptrs = {_storage(p) for p in source.parameters()} - {None}
    for m in root.modules():
        for store in (m._parameters, m._buffers, vars(m)):
            for k, v in list(store.items()):
                if isinstance(v, torch.Tensor) and _storage(v) in ptrs:
                    store[k] = v.detach().clone()


def _storage(t: torch.Tensor) -> int | None:
    """The address of a tensor's storage; None for a freed one (a resharded FSDP2 parameter) or a tensor subclass
    without storage of its own (a sharded DTensor)."""
    try:
        storage = t.untyped_storage()
        return storage.data_ptr() if storage.size() else None
    except RuntimeError:
        return None
