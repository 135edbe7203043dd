"""The trainer's and the critic's passes over a sharded model (bench/distributed/__init__.py): each rank runs its
rows of every micro-batch and the [B, T] results are all-gathered, so every arm's loss is the whole minibatch's."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn

from bench.compute import Diverged, LossFn, TrainerCompute
from bench.critic import Critic
from bench.distributed.group import rank, world_size
from bench.distributed.sharding import fsdp_modules, is_sharded, load_full_optim_state, load_full_state, rebuilt_optimizer, reshard, shard
from bench.models import logprobs as lp
from bench.rollout.base import Rollout

@contextmanager
def emulated_shards(model: nn.Module, dtype: str) -> Iterator[None]:
    """bench.models.logprobs.emulated_weights for a sharded model: each rank rounds its own shards in place
    (FSDP2 all-gathers from its shard storage, which `p.data = ...` would bypass); rounding is elementwise, so
    the gathered weights are the one-process rounded weights. Inner `emulated_weights` calls become no-ops."""
    low = lp.LOW_PRECISION[dtype]
    params = list(model.parameters())
    if low is None or model in lp._EMULATING or not params or params[0].device.type == "cuda":
        yield
        return
    def shards() -> list[torch.Tensor]:
        # FSDP2 registers either the sharded or the (possibly freed) unsharded parameter on a module, depending
        # on where it is in forward/backward: its own record of each shard is the stable handle
        return [fp.sharded_param._local_tensor for m in fsdp_modules(model)
                for group in _param_groups(m) for fp in group.fsdp_params]

    masters = [t.detach().clone() for t in shards()]
    lp._EMULATING.add(model)
    try:
        with torch.no_grad():
            for t in shards():
                t.copy_(t.to(low).float())
        yield
    finally:
        with torch.no_grad():
            for t, m in zip(shards(), masters):
                t.copy_(m)
        lp._EMULATING.discard(model)


def _param_groups(module: nn.Module) -> list[Any]:
    group = module._get_fsdp_state()._fsdp_param_group
    return [] if group is None else [group]


def rank_rows(parts: list[torch.Tensor], r: int) -> tuple[torch.Tensor, int]:
    """Rank r's rows of one micro-batch (`parts`, one per rank: bench.compute.micro_batches), padded to the largest
    part by repeating a row (its own first, else the micro-batch's first), and how many are its own: every rank
    then runs the same forwards, which FSDP's collectives need; a padding row's outputs and gradient are dropped."""
    width = max(len(p) for p in parts)
    mine = parts[r]
    fill = mine[:1] if len(mine) else parts[0][:1]
    return torch.cat([mine, fill.expand(width - len(mine))]), len(mine)


def sharded_rows(plan: list[list[torch.Tensor]], n: int, fn: Callable[[torch.Tensor], list[torch.Tensor]]
                 ) -> list[torch.Tensor]:
    """Run `fn(rows)` over this rank's part of every micro-batch of `plan`, and all-gather each of its outputs
    ([rows, T] at the rollout's width) into the whole batch's [n, T] in row order."""
    outs = [fn(rank_rows(parts, rank())[0]) for parts in plan]
    result = []
    for i in range(len(outs[0])):
        local = torch.cat([o[i] for o in outs])
        gathered = [torch.empty_like(local) for _ in range(world_size())]
        dist.all_gather(gathered, local.contiguous())
        whole = local.new_zeros((n, *local.shape[1:]))
        for r, part in enumerate(gathered):
            at = 0
            for parts in plan:
                rows, own = rank_rows(parts, r)
                whole[rows[:own].to(whole.device)] = part[at: at + own]
                at += len(rows)
        result.append(whole)
    return result


def accumulating(model: nn.Module, slices: list[Any]) -> Iterator[Any]:
    """The micro-batches of one backward, in order. Under HSDP (across nodes) the gradients are reduce-scattered
    within the node after every micro-batch and accumulate there, and all-reduced across the nodes once, with
    the last: the network carries one gradient per minibatch, not one per micro-batch (FSDP2's
    set_requires_all_reduce)."""
    hsdp = next(model.parameters()).device_mesh.ndim == 2
    slices = list(slices)
    try:
        for i, s in enumerate(slices):
            if hsdp:
                model.set_requires_all_reduce(i == len(slices) - 1)
            yield s
    finally:
        if hsdp:
            model.set_requires_all_reduce(True)


class ShardedCompute(TrainerCompute):
    """TrainerCompute for a sharded model: no-grad passes and the micro-batched backward over the rank's rows,
    with the [B, T] log-probs all-gathered so that the loss is the whole minibatch's (bench/compute.py)."""

    @classmethod
    def of(cls, compute: TrainerCompute) -> "ShardedCompute":
        return cls(compute.device, compute.dtype, compute.temperature, compute.micro_batch_size, compute.scaler,
                   compute.micro_batch_tokens, compute.cut)

    @torch.no_grad()
    def logprobs(self, model: nn.Module, rollout: Rollout, with_entropy: bool = False, minibatches: int = 1
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if not is_sharded(model):
            return super().logprobs(model, rollout, with_entropy, minibatches)

        def part(rows: torch.Tensor) -> list[torch.Tensor]:
            lp_, ent = self._pass(model, rollout, rows, with_entropy)
            return [lp_] + ([ent] if with_entropy else [])

        with emulated_shards(model, self.dtype):
            out = sharded_rows(self.plan(rollout, minibatches, world_size()), rollout.batch_size, part)
        reshard(model)
        return out[0], (out[1] if with_entropy else None)

    def backward(self, model: nn.Module, rollout: Rollout, loss_fn: LossFn, step: int
                 ) -> tuple[torch.Tensor, dict[str, float], torch.Tensor, torch.Tensor]:
        logp, entropy = self.logprobs(model, rollout, with_entropy=True)
        leaf = logp.clone().requires_grad_(True)
        loss, metrics = self._checked(loss_fn, leaf, step)
        (grad,) = torch.autograd.grad(self.scaler.scale(loss), leaf)
        with emulated_shards(model, self.dtype):
            for parts in accumulating(model, self.plan(rollout, 1, world_size())):
                rows, own = rank_rows(parts, rank())
                part, _ = self._pass(model, rollout, rows, with_entropy=False)
                keep = (torch.arange(len(rows), device=grad.device) < own)[:, None]  # padding rows: no gradient
                part.backward(grad[rows.to(grad.device)] * keep)
        return loss.detach(), metrics, logp, entropy

    def metrics(self) -> dict[str, float]:
        """As TrainerCompute.metrics, `pad_fraction` over every rank's forwards (a collective: every rank calls it
        once per step); with the same micro-batches, the one-process figure."""
        device = "cuda" if dist.get_backend() == "nccl" else "cpu"
        counts = torch.tensor(self.tokens, dtype=torch.float64, device=device)
        dist.all_reduce(counts)
        self.tokens = [int(counts[0]), int(counts[1])]
        return super().metrics()

    def step(self, model: nn.Module, optimizer: torch.optim.Optimizer, grad_clip: float, step: int) -> float | None:
        """As TrainerCompute.step; the gradient norm is the norm of the whole (sharded) gradient."""
        scaler = self.scaler
        scaler.unscale_(optimizer)
        params = [p for p in model.parameters() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm([p.grad for p in params], 2.0)
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        torch.nn.utils.clip_grads_with_norm_(params, grad_clip, norm)
        if not torch.isfinite(norm) and (not scaler.is_enabled() or scaler.get_scale() <= 1.0):
            raise Diverged(f"step {step}: non-finite gradient norm ({norm.item()})")
        scaler.step(optimizer)
        scaler.update()
        if not torch.isfinite(norm):
            self.skipped += 1
            return None
        return float(norm)


class ShardedCritic(Critic):
    """The critic of bench/critic.py over a sharded value model: values and the value loss's gradient by rows."""

    @classmethod
    def adopt(cls, critic: Critic) -> "ShardedCritic":
        new = cls.__new__(cls)
        new.__dict__.update(critic.__dict__)
        shard(new.model)
        new.optimizer = rebuilt_optimizer(critic.optimizer, new.model)
        new.compute = ShardedCompute.of(critic.compute)
        return new

    @torch.no_grad()
    def values(self, rollout: Rollout, minibatches: int | None = None) -> torch.Tensor:
        minibatches = self.train.minibatches if minibatches is None else minibatches
        plan = self.compute.plan(rollout, minibatches, world_size())
        with emulated_shards(self.model, self.train.dtype):
            out = sharded_rows(plan, rollout.batch_size, lambda rows: [self._values(rollout, rows)])[0]
        reshard(self.model)
        return out

    def _backward(self, rollout: Rollout, loss_fn: Any, step: int) -> tuple[torch.Tensor, float, torch.Tensor]:
        leaf = self.values(rollout, minibatches=1).requires_grad_(True)
        loss, clipfrac = self._checked(loss_fn, leaf, step)
        (grad,) = torch.autograd.grad(self.compute.scaler.scale(loss), leaf)
        with emulated_shards(self.model, self.train.dtype):
            for parts in accumulating(self.model, self.compute.plan(rollout, 1, world_size())):
                rows, own = rank_rows(parts, rank())
                keep = (torch.arange(len(rows), device=grad.device) < own)[:, None]
                self._values(rollout, rows).backward(grad[rows.to(grad.device)] * keep)
        return loss.detach(), clipfrac, leaf.detach()

    # (saved through bench/checkpoint.py's DCP checkpoint; loading a one-process checkpoint at N > 1 comes here)
    def load_state_dict(self, state: dict[str, Any]) -> None:
        load_full_state(self.model, state["model"])
        load_full_optim_state(self.model, self.optimizer, state["optimizer"])
        self.compute.load_state_dict(state.get("grad_scaler") or {})
