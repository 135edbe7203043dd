"""FSDP2 sharding of the run's models (bench/distributed/__init__.py): `shard` over the run's device mesh (FSDP
on one node, HSDP across nodes), whole parameters for the duration of an engine's copy, whole (one-process)
state dicts loaded into shards, and a frozen sharded copy of the policy."""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch import nn

from bench.distributed.group import world_size

def fsdp_modules(model: nn.Module) -> list[nn.Module]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def is_sharded(model: nn.Module | None) -> bool:
    return model is not None and bool(fsdp_modules(model))


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks: each becomes one FSDP unit (its parameters all-gathered together)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    if not layers:
        raise ValueError(f"{type(model).__name__} has no decoder layers to shard")
    return layers


def mesh_shape(world: int, per_node: int) -> tuple[int, ...]:
    """The device mesh of a run of `world` ranks, `per_node` on each node: (world,) on one node (FSDP: every
    rank holds 1/world of each state), (nodes, per_node) across nodes (HSDP: each node holds a whole copy,
    sharded over its ranks; gradients are reduce-scattered within a node over NVLink, then all-reduced across
    nodes, so the slow network carries 1/per_node of the gradient per rank and no parameter all-gathers)."""
    if world < 1 or per_node < 1 or world % per_node:
        raise ValueError(f"WORLD_SIZE={world} is not a whole number of nodes of LOCAL_WORLD_SIZE={per_node} ranks")
    nodes = world // per_node
    return (world,) if nodes == 1 else (nodes, per_node)


MESH_DIMS = {1: ("shard",), 2: ("replicate", "shard")}


def device_mesh() -> Any:
    """The run's DeviceMesh (mesh_shape of WORLD_SIZE and LOCAL_WORLD_SIZE; a launcher that does not say how many
    ranks share a node, e.g. a bare torchrun on one node, gets one node)."""
    from torch.distributed.device_mesh import init_device_mesh

    W = world_size()
    shape = mesh_shape(W, int(os.environ.get("LOCAL_WORLD_SIZE") or W))
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    return init_device_mesh(device, shape, mesh_dim_names=MESH_DIMS[len(shape)])


def shard(model: nn.Module) -> nn.Module:
    """fully_shard per decoder layer plus the root over the run's mesh (FSDP on one node, HSDP across nodes),
    fp32 shards, gradients summed across ranks.

    Summed, not averaged: the loss is already that of the whole minibatch (the arm's own normalization), and
    every rank back-propagates only its rows' share of it. gloo refuses the PREMUL_SUM reduction FSDP2 uses for
    a divide factor of 1; forcing plain sums avoids it (NCCL takes either).
    """
    from torch.distributed.fsdp import fully_shard

    mesh = device_mesh()
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for m in fsdp_modules(model):
        m.set_gradient_divide_factor(1.0)
        m.set_force_sum_reduction_for_comms(True)
    return model


def reshard(model: nn.Module) -> None:
    """Free every all-gathered parameter: FSDP2 keeps the root's after a forward (for the backward that
    usually follows), which a no-grad pass never runs."""
    for m in fsdp_modules(model):
        m.reshard()


@contextmanager
def unsharded(model: nn.Module) -> Iterator[nn.Module]:
    """Every parameter of a sharded model whole (all-gathered) for the duration: the engine reads them."""
    units = fsdp_modules(model)
    for m in units:
        m.unshard()
    try:
        yield model
    finally:
        for m in units:
            m.reshard()


@contextmanager
def gathered(module: nn.Module) -> Iterator[nn.Module]:
    """`module`'s own parameters whole for the duration, if it is an FSDP unit (not its child units': a decoder
    layer at a time, bench.rollout.embedded.Gather); a module that is no unit is left as it is."""
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(module, FSDPModule):
        yield module
        return
    module.unshard()
    try:
        yield module
    finally:
        module.reshard()


def load_full_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load a whole (one-process) state dict into a model, sharded or not: a ckpt/last.pt resumed at N > 1."""
    if not is_sharded(model):
        model.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True))


def load_full_optim_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    if not is_sharded(model):
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    names = [name for name, _ in model.named_parameters()]
    sd = {"state": {names[i]: v for i, v in state["state"].items()},
          "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]]}
    set_optimizer_state_dict(model, optimizer, sd, options=StateDictOptions(full_state_dict=True))


def rebuilt_optimizer(optimizer: torch.optim.Optimizer, model: nn.Module) -> torch.optim.Optimizer:
    """The same optimizer over the model's (now sharded) parameters."""
    import inspect

    accepted = inspect.signature(type(optimizer).__init__).parameters
    return type(optimizer)(model.parameters(), **{k: v for k, v in optimizer.defaults.items() if k in accepted})


def frozen_copy(model: nn.Module) -> nn.Module:
    """A frozen copy of the policy (the reference model of algo.kl_ref_beta), sharded like it at N > 1.

    FSDP2 refuses `copy.deepcopy` of a sharded module, so a sharded policy's copy is built on the meta device (no
    memory), sharded over the same mesh, materialized empty, and each rank copies its own shards of the policy's
    parameters into it (same class, config and mesh: the same placements) and the buffers: nothing is gathered, and
    no rank ever holds more than its shards (a full state dict on every rank was ~60 GB transient at 7B)."""
    import copy

    if not is_sharded(model):
        return copy.deepcopy(model).requires_grad_(False)
    first = next(model.parameters())
    with torch.device("meta"):
        ref = type(model)(model.config).to(first.dtype)
    shard(ref)
    ref.to_empty(device=first.device)
    with torch.no_grad():
        for (name, r), (other, p) in zip(ref.named_parameters(), model.named_parameters(), strict=True):
            assert name == other, (name, other)
            r.to_local().copy_(p.to_local())
        for (name, r), (other, p) in zip(ref.named_buffers(), model.named_buffers(), strict=True):
            r.copy_(p)
    return ref.requires_grad_(False)
