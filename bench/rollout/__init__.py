"""Rollout engines behind one protocol (bench/rollout/base.py): the embedded torch engine and vLLM.

`build_engine(cfg.rollout, tokenizer, model)` is the one place a config becomes an engine; each engine
registers itself in `ENGINES` with its config schema, so the precision of an arm stays data and the trainer
never branches on the engine or the precision.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench.rollout.base import ENGINES, Rollout, RolloutConfig, RolloutEngine, SamplingParams, token_ids

__all__ = ["ENGINES", "Rollout", "RolloutConfig", "RolloutEngine", "SamplingParams", "build_engine"]


def build_engine(
    rollout_cfg: Any,
    tokenizer: Any = None,
    model: Any = None,
    *,
    eos_id: int | Sequence[int] | None = None,
    pad_id: int | None = None,
    max_len: int | None = None,
    **overrides: Any,
) -> RolloutEngine:
    """The engine a `rollout` config (dataclass or DictConfig) describes; `overrides` replace config keys
    (e.g. precision="fp32" for the evaluation engine).

    Stop ids (`eos_id`: one id or several) come from the tokenizer and the model's generation config
    (bench.models.tokenizer.stop_token_ids: every EOS id the model may emit) unless given explicitly; the pad
    id from `tokenizer.pad_token_id`, falling back to the first stop id, then 0. `max_len` (prompt + new
    tokens) defaults to the model's `config.max_position_embeddings` when a model is given.
    """
    if eos_id is None and (tokenizer is not None or model is not None):
        from bench.models.tokenizer import stop_token_ids

        stops = stop_token_ids(tokenizer, model)
        eos_id = stops[0] if len(stops) == 1 else (stops or None)
    if pad_id is None and tokenizer is not None:
        pad_id = getattr(tokenizer, "pad_token_id", None)
    if pad_id is None:
        stops = token_ids(eos_id)
        pad_id = stops[0] if stops else 0
    if max_len is None and model is not None:
        max_len = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    cls = ENGINES.get(rollout_cfg.engine)
    return cls.from_config(rollout_cfg, eos_id=eos_id, pad_id=pad_id, max_len=max_len, **overrides)
