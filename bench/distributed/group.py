"""The process group of a multi-process run: joining it, launching ranks on one machine, gathering objects,
agreeing on a stop, leaving together (bench/distributed/__init__.py)."""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
from contextlib import nullcontext
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.distributed as dist

from bench.run.preempt import die_with_parent, passing_signals_to

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from bench.run.preempt import PreemptionGuard

#: what a launcher exports to every rank (torch.distributed.run, submitit's TorchDistributedEnvironment)
ENV_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
#: How long a collective waits for the other ranks before the run fails: generous during start-up (loading the model,
#: building the engines, the first evaluation: minutes apart between ranks), then short (`settle`), so that a rank
#: that hangs (a stuck NCCL peer) ends the job in minutes rather than half an hour; verl's default is 10 minutes too.
TIMEOUT = timedelta(minutes=float(os.environ.get("QRL_DIST_TIMEOUT_MIN", "30")))
STEP_TIMEOUT = timedelta(minutes=float(os.environ.get("QRL_DIST_STEP_TIMEOUT_MIN", "10")))
#: A rank that has left the process group waits this long at most for its peers before it exits (`_rank_main`): they
#: leave within a moment of each other when the run ends together; a failed or vanished peer never comes.
EXIT_WAIT_S = 60.0
#: Once a rank of a local launch failed, how long its peers get to end on their own before they are ended (twice: a
#: SIGTERM, then a SIGKILL), instead of torch's 30 s: a peer blocked in a collective with the dead rank ends only so.
GRACE_S = 5.0


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


def rank_gpu(local_rank: int, visible: int) -> int:
    """The GPU index of a rank among the `visible` ones: its local rank where the rank sees every GPU of its node
    (torchrun, the spawned ranks, SLURM tasks without GPU binding), else its share of what it sees (SLURM's
    --gpus-per-task or a site's --gpu-bind give each task only its own GPU, as device 0)."""
    if visible < 1:
        raise ValueError(f"LOCAL_RANK={local_rank} runs on CUDA but this process sees no GPU")
    return local_rank if local_rank < visible else local_rank % visible


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
        torch.cuda.set_device(rank_gpu(int(os.environ["LOCAL_RANK"]), torch.cuda.device_count()))
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
               exits: Any, own_group: bool) -> None:
    if own_group:  # the launcher passes each signal on (launch_local): none may reach a rank twice
        os.setpgid(0, 0)
        # and when the launcher dies, SIGTERM rather than torch's SIGINT: a rank killed that way saw its SIGINT come
        # twice (measured; the second of a Ctrl-C pair means "stop now, no checkpoint"), a repeated SIGTERM is one
        die_with_parent(signal.SIGTERM)
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
        try:
            results.put(out)
        except OSError:  # the launcher is gone (killed): nobody reads the outcome, and no peer should wait for us
            exits.abort()
    # no rank exits (closing its sockets, and rank 0 the rendezvous store) before every rank has left the group
    try:
        exits.wait(timeout=EXIT_WAIT_S)
    except threading.BrokenBarrierError:
        pass


def launch_local(nproc: int, fn: Callable[..., Any], *args: Any, pass_signals: bool = False) -> Any:
    """Run `fn(*args)` in `nproc` processes on this machine (torch.multiprocessing spawn, torchrun's env
    contract); returns rank 0's result. A rank that dies (an error, kill -9) ends the others within seconds
    (`_join`). `pass_signals`: each rank is a process group of its own and every signal this process gets is passed
    on to the ranks, once (a `kill` of this process, or a terminal's Ctrl-C, which reaches only this process
    group), so that they checkpoint and end as one process would; torch's spawn has each rank get a SIGINT when
    this process dies (kill -9), here a SIGTERM, which ends them the same way."""
    import torch.multiprocessing as mp


    ctx = mp.get_context("spawn")
    results, exits = ctx.SimpleQueue(), ctx.Barrier(nproc)
    ranks = mp.start_processes(_rank_main, args=(nproc, free_port(), fn, args, results, exits, pass_signals),
                               nprocs=nproc, join=False, start_method="spawn")
    with passing_signals_to(ranks.pids) if pass_signals else nullcontext():
        _join(ranks, exits)
    return results.get()


def _join(ranks: Any, exits: Any) -> None:
    """Wait for every rank (a torch ProcessContext). When one fails, the others are released from the exit barrier
    (they would wait there for it), get GRACE_S to end on their own, and are then ended; torch's join raises naming
    the failed rank."""
    from multiprocessing.connection import wait

    running = {p.sentinel: p for p in ranks.processes}
    while running:
        for sentinel in wait(list(running)):
            process = running.pop(sentinel)
            process.join()
            if process.exitcode != 0:
                exits.abort()
                running.clear()
                break
    while not ranks.join(grace_period=GRACE_S):
        pass


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


def agree(guard: PreemptionGuard) -> bool:
    """Whether to checkpoint and stop after this step: `guard.requested`, read once. With several ranks, a
    signal caught by any rank is the decision of every rank (the largest signal number wins), so that all
    checkpoint after the same step and exit together; a signal that lands while a rank is past this point
    counts from the next step (the caller must use the returned value, not re-read the flag, or that rank
    would checkpoint and stop alone)."""
    if world_size() == 1:
        return guard.requested
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    mine = torch.tensor([int(guard._signum or 0)], dtype=torch.long, device=device)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    signum = int(mine.item())
    if signum:
        guard.requested, guard._signum, guard.signal_name = True, signum, signal.Signals(signum).name
    return bool(signum)


def resume_note(ckpt: dict[str, Any] | None, cfg: DictConfig) -> str | None:
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
