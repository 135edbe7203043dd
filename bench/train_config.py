"""The `train` config: the training loop's settings (bench/train.py).

Torch-free, so that the configuration (bench/launch/config.py) imports no torch; the checks that ask torch (is the
device usable?) import it when `check` runs, as part of validating a run's configuration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from bench.domains import num
from bench.run.resume import RESUME_FROM


@dataclass
class TrainConfig:
    """`train.*`: the loop's settings."""

    steps: int = num(100, "[1, inf)")
    batch_size: int = num(64, "[1, inf)")  # sequences per rollout batch = prompts x group_size
    group_size: int = num(8, "[1, inf)")  # GRPO needs 2 or more: bench.launch.config.check_across
    minibatches: int = num(1, "[1, inf)")  # optimizer steps per rollout batch
    epochs: int = num(1, "[1, inf)")  # passes over each rollout batch
    lr: float = num(3e-5, "(0, 1]")  # the ~1M model: the default run (arithmetic) learns at 3e-5 and unlearns at 1e-4
    # (README); the chain sweeps learn at 1e-4 and pin it; 3e-4+ destroys a warm start's accuracy
    # rollout steps over which the learning rate rises linearly from 0 (`scheduled_lr`); 0: constant from step 0
    lr_warmup_steps: int = num(0, "[0, inf)")
    weight_decay: float = num(0.0, "[0, 1]")  # AdamW's decoupled decay (times lr per step)
    grad_clip: float = num(1.0, "(0, inf)")  # the largest gradient norm an update keeps (negative would train in reverse)
    dtype: str = "bf16"  # compute over fp32 master weights: bf16 | fp16 (+ loss scaling) | fp32 (bench/compute.py)
    device: str = "auto"  # auto (cuda when torch sees a GPU, else cpu) | cpu | cuda (bench/device.py)
    # sequences per forward/backward
    micro_batch_size: Optional[int] = num(None, "[1, inf)", {None: "the whole minibatch"})
    # tokens per forward, every pass (rows x the micro-batch's cut length; at least one row)
    micro_batch_tokens: Optional[int] = num(16384, "[1, inf)", {None: "no cap"})
    gradient_checkpointing: bool = False  # recompute decoder layers in backward (activation memory -> ~1 layer)
    # both divide the step number in the loop; a value >= train.steps means only at the end (eval: and at step 0)
    eval_every: int = num(10, "[1, inf)")
    checkpoint_every: int = num(10, "[1, inf)")
    threads: int = num(0, "[1, 1024]", {0: "leave torch's default"})  # torch threads (sweeps set 1 per job)
    keep_checkpoint: bool = False  # keep ckpt/last.pt after completion (it is always kept while resumable)
    overwrite: bool = False  # restart from step 0 even if the run directory holds results (bench/run/resume.py)
    resume_from: str = "last"  # last | previous: the checkpoint to resume from (previous = ckpt/prev.pt)
    # processes of this run on this machine (FSDP2, bench/distributed/); >1 launches them
    nproc_per_node: int = num(1, "[1, 1024]")
    # prompt blocks with their own sampling streams
    sampling_shards: Optional[int] = num(None, "[1, inf)", {None: "1, or 1 per rank"})

    def check(self) -> None:
        """What the declared domains cannot say: relations between keys, and the choices."""
        if self.batch_size % self.group_size:
            raise ValueError(f"train.batch_size={self.batch_size} is not divisible by train.group_size={self.group_size}")
        if (self.batch_size // self.group_size) % self.minibatches:
            raise ValueError(f"train.minibatches={self.minibatches} must divide the "
                             f"{self.batch_size // self.group_size} prompts per step")
        from bench.device import DEVICES, DTYPES, resolve_device  # torch: asked only when a config is checked

        for key, valid in (("dtype", tuple(DTYPES)), ("device", DEVICES), ("resume_from", RESUME_FROM)):
            if getattr(self, key) not in valid:
                raise ValueError(f"train.{key}={getattr(self, key)!r} is not valid; choose one of: {', '.join(valid)}")
        resolve_device(self.device)  # cuda without a usable GPU fails here, before any work, saying why
