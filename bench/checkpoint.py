"""The run's resumable state and the checkpoint it is saved as, in one place.

    TrainState      everything a resumed run must get back to continue as if never stopped: the policy, its
                    optimizer, the sampling generator and the global RNGs, the loss scaler, the reference policy
                    and the advantage estimator (GAE: the critic with its optimizer and scaler); `state_dict` /
                    `load_state_dict` in whole tensors, `tensor_states` / `set_tensor_states` as DCP state dicts;
                    `shard` spreads it over the process group (FSDP2, bench/distributed/)
    save / restore  the checkpoint manager: one process writes ckpt/last.pt (one file, whole tensors); several
                    write a torch.distributed.checkpoint (DCP) directory, ckpt/last.dcp, each rank its shards.
                    Either form loads at any world size (whole tensors are sharded on load, DCP reshards)

The run directory (bench/run/store.py) owns where checkpoints lie and the atomic file operations (write a file,
rename a finished one into place, keep the one before it, read one back), which the resume decision reads
(bench/run/resume.py); what goes into a checkpoint and how it comes back is decided here only.
"""

from __future__ import annotations

import os
import shutil
import warnings
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from bench.advantages import AdvantageEstimator
from bench.compute import TrainerCompute
from bench.critic import Critic
from bench.device import restore_rng, rng_state
from bench.distributed.compute import ShardedCompute, ShardedCritic
from bench.distributed.group import broadcast_object, rank, world_size
from bench.distributed.sharding import load_full_optim_state, load_full_state, rebuilt_optimizer, shard
from bench.run.identity import CKPT_DIR
from bench.run.store import DCP_EXTRA, DCP_SUFFIX, RunDir


@dataclass(kw_only=True)
class TrainState:
    """What a checkpoint holds besides the step (torchtitan's and lingua's `TrainState`, as one record)."""

    policy: nn.Module
    optimizer: torch.optim.Optimizer
    generator: torch.Generator  # the sampling generator (bench/sampling.py)
    seed: int  # the run's seed: a checkpoint from another device reseeds the generator from (seed, step)
    compute: TrainerCompute  # its loss scaler is state (fp16)
    advantage: AdvantageEstimator
    ref_policy: nn.Module | None = None  # algo.kl_ref_beta > 0: a frozen copy of the initial policy

    def shard(self) -> None:
        """Spread the state over the process group (bench/distributed/): the policy sharded with FSDP2, its
        optimizer rebuilt over the shards, the trainer's passes and the critic's by rows. Nothing at world size 1."""
        if world_size() == 1:
            return
        shard(self.policy)
        self.optimizer = rebuilt_optimizer(self.optimizer, self.policy)
        self.compute = ShardedCompute.of(self.compute)
        if self.critic is not None:
            self.advantage.critic = ShardedCritic.adopt(self.critic)

    # ------------------------------------------------------------------ whole tensors (the one-file form)
    def state_dict(self) -> dict[str, Any]:
        """The state in whole tensors (ckpt/last.pt, with the step beside it)."""
        return {"policy": self.policy.state_dict(), "optimizer": self.optimizer.state_dict(), **self.small_states(),
                "ref_policy": self.ref_policy.state_dict() if self.ref_policy else None,
                "advantage": self.advantage.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of `state_dict` (plus "step": a generator from another device is reseeded from it), into a
        sharded state too (a one-process checkpoint resumed at N > 1). Tensors read onto the CPU move to the
        run's device: optimizer states follow their parameters'."""
        load_full_state(self.policy, state["policy"])
        load_full_optim_state(self.policy, self.optimizer, state["optimizer"])
        if self.ref_policy is not None and state["ref_policy"] is not None:
            load_full_state(self.ref_policy, state["ref_policy"])
        self.advantage.load_state_dict(state.get("advantage") or {})
        self.load_small_states(state)

    def small_states(self) -> dict[str, Any]:
        """What is not a tensor state of a model or optimizer: the RNGs and the loss scaler (identical on every
        rank; a DCP checkpoint keeps them in its extra.pt)."""
        return {**rng_state(self.generator), "grad_scaler": self.compute.state_dict()}

    def load_small_states(self, state: dict[str, Any]) -> None:
        restore_rng(self.generator, state, self.seed, int(state["step"]))
        self.compute.load_state_dict(state.get("grad_scaler") or {})

    # ------------------------------------------------------------------ DCP state dicts (the sharded form)
    @property
    def critic(self) -> Critic | None:
        """The advantage estimator's critic (GAE), None for an estimator without one (GRPO)."""
        return getattr(self.advantage, "critic", None)

    def tensor_states(self) -> dict[str, Any]:
        """The tensor states as DCP state dicts (torch.distributed.checkpoint.state_dict): the policy, its
        optimizer, the reference model and the critic with its optimizer (GAE). Keys are parameter names, so the
        dicts of a sharded model (each rank its shards) and of a whole one (world size 1) name the same tensors: a
        checkpoint of N processes loads into M. Optimizer states are created here if no step has run yet (a
        zero-learning-rate step, torch's own), so that a fresh run has the tensors to load into."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

        model, optim = get_state_dict(self.policy, self.optimizer)
        states = {"policy": model, "optimizer": optim}
        if self.ref_policy is not None:
            states["ref_policy"] = get_model_state_dict(self.ref_policy)
        if self.critic is not None:
            model, optim = get_state_dict(self.critic.model, self.critic.optimizer)
            states["critic"] = {"model": model, "optimizer": optim}
        return states

    def set_tensor_states(self, states: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

        set_state_dict(self.policy, self.optimizer, model_state_dict=states["policy"],
                       optim_state_dict=states["optimizer"])
        if self.ref_policy is not None and "ref_policy" in states:
            set_model_state_dict(self.ref_policy, states["ref_policy"])
        if self.critic is not None:
            set_state_dict(self.critic.model, self.critic.optimizer, model_state_dict=states["critic"]["model"],
                           optim_state_dict=states["critic"]["optimizer"])

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """The optimizers by the key their states have in `tensor_states`."""
        return {"optimizer": self.optimizer, **({"critic": self.critic.optimizer} if self.critic is not None else {})}

    def unstepped(self) -> list[str]:
        """The optimizers that have not stepped yet (no state: e.g. dynamic sampling kept no group so far)."""
        return [k for k, o in self.optimizers().items() if not o.state]

    def forget_states(self, keys: list[str]) -> None:
        """Give back their empty state to optimizers `tensor_states` initialized (its zero-learning-rate step leaves
        AdamW states at step 1, which the next real step's bias correction would see): the run goes on exactly as
        if never checkpointed."""
        for k in keys:
            self.optimizers()[k].state.clear()


# ---------------------------------------------------------------------------------------- the manager


def save(state: TrainState, run: RunDir, step: int) -> None:
    """Checkpoint `state` before step `step`: one process writes ckpt/last.pt, several a DCP directory."""
    if world_size() == 1:
        run.save_checkpoint({"step": step, **state.state_dict()})
    else:
        save_shards(state, run, step)


def restore(state: TrainState, ckpt: dict[str, Any]) -> int:
    """Load a checkpoint (RunDir.load_checkpoint: read onto the CPU, it may come from another device) into `state`;
    returns its step. A one-process checkpoint loads at any world size (whole tensors, sharded on load), a DCP
    one likewise."""
    if "dcp" in ckpt:
        load_shards(state, ckpt)
        state.load_small_states(ckpt)
    else:
        state.load_state_dict(ckpt)
    return int(ckpt["step"])


def save_shards(state: TrainState, run: RunDir, step: int) -> None:
    """Write the checkpoint as a DCP directory, atomically; every rank calls it (a collective).

    Every rank writes its shards into ckpt/last.dcp.tmp<step>; once all have (DCP's own final gather, then a
    barrier), rank 0 adds extra.pt (step, RNG, loss scalers: identical on every rank) and renames the directory
    to ckpt/last.dcp (RunDir.commit_checkpoint: the last one becomes prev.dcp). A rank killed while writing
    leaves only the temporary, which the next start removes; the last complete checkpoint stays in place.
    """
    import torch.distributed.checkpoint as dcp

    small = state.small_states()  # before DCP's collectives, as the one-file form reads them
    tmp = run.path / CKPT_DIR / f"last{DCP_SUFFIX}.tmp{step}"
    if rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)  # a stale one of a killed attempt at the same step
        tmp.mkdir(parents=True)
    dist.barrier()
    fresh = state.unstepped()
    dcp.save(state.tensor_states(), checkpoint_id=tmp)
    state.forget_states(fresh)
    dist.barrier()
    error = None
    if rank() == 0:
        try:
            extra = {"step": step, **small, "world_size": world_size(), "unstepped": fresh,
                     "critic_grad_scaler": None if state.critic is None else state.critic.compute.state_dict()}
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


def load_shards(state: TrainState, ckpt: dict[str, Any]) -> None:
    """Read a DCP checkpoint's tensor states (`ckpt["dcp"]`, from RunDir.load_checkpoint) into `state`: each rank
    its own shards at any world size, a single process whole tensors (no process group needed)."""
    import torch.distributed.checkpoint as dcp

    states = state.tensor_states()
    with warnings.catch_warnings():  # one process reading a sharded checkpoint is intended here
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process")
        dcp.load(states, checkpoint_id=ckpt["dcp"])
    state.set_tensor_states(states)
    state.forget_states(ckpt.get("unstepped", []))
    if state.critic is not None:
        state.critic.compute.load_state_dict(ckpt.get("critic_grad_scaler") or {})


__all__ = ["TrainState", "load_shards", "restore", "save", "save_shards"]
