"""Rollout engines: the embedded torch engine (default) and an optional vLLM engine.

`build_engine(cfg.rollout, tokenizer)` is the one place a config becomes an engine, so the precision of an arm
stays data (rollout.precision, granularities) and the trainer never branches on it.
"""

from __future__ import annotations

from typing import Any

from bench.config import ENGINES, PRECISIONS
from bench.rollout.base import Rollout, RolloutEngine, SamplingParams
from bench.rollout.embedded import EmbeddedEngine

__all__ = ["EmbeddedEngine", "Rollout", "RolloutEngine", "SamplingParams", "build_engine"]


def build_engine(
    rollout_cfg: Any,
    tokenizer: Any = None,
    model: Any = None,
    *,
    eos_id: int | None = None,
    pad_id: int | None = None,
    max_len: int | None = None,
) -> RolloutEngine:
    """The engine a `RolloutConfig` (dataclass or DictConfig) describes.

    EOS/pad ids come from `tokenizer.eos_token_id` / `tokenizer.pad_token_id` unless given explicitly; pad
    falls back to EOS, then 0. `max_len` (prompt + new tokens) defaults to the model's
    `config.max_position_embeddings` when a model is given. Raises ValueError for an unknown engine or
    precision.
    """
    engine = rollout_cfg.engine
    precision = rollout_cfg.precision
    if engine not in ENGINES:
        raise ValueError(f"rollout.engine={engine!r} is not valid; choose one of: {', '.join(ENGINES)}")
    if precision not in PRECISIONS:
        raise ValueError(f"rollout.precision={precision!r} is not valid; choose one of: {', '.join(PRECISIONS)}")
    if eos_id is None and tokenizer is not None:
        eos_id = getattr(tokenizer, "eos_token_id", None)
    if pad_id is None and tokenizer is not None:
        pad_id = getattr(tokenizer, "pad_token_id", None)
    if pad_id is None:
        pad_id = eos_id if eos_id is not None else 0
    if max_len is None and model is not None:
        max_len = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if engine == "vllm":
        from bench.rollout.vllm_engine import VLLMEngine  # imports vllm lazily, with an install hint

        kwargs = {} if max_len is None else {"max_len": max_len}
        return VLLMEngine(
            precision, rollout_cfg.weight_granularity, rollout_cfg.act_granularity, eos_id, pad_id, **kwargs
        )
    return EmbeddedEngine(
        precision=precision,
        weight_granularity=rollout_cfg.weight_granularity,
        act_granularity=rollout_cfg.act_granularity,
        quantize_lm_head=rollout_cfg.quantize_lm_head,
        quantize_embeddings=rollout_cfg.quantize_embeddings,
        eos_id=eos_id,
        pad_id=pad_id,
        max_len=max_len,
    )
