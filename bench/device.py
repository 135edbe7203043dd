"""Where a run computes (`train.device`) and the device-dependent state a checkpoint must carry.

`train.device=auto` takes the GPU when torch sees one (a SLURM job started with `gpus_per_node=1` does) and the
CPU otherwise; `cuda` insists on a GPU and fails at start-up when there is none, naming why (a CPU-only torch
wheel, or no visible device), instead of silently training on the CPU for hours.

The sampling generator lives on the run's device (the engine draws tokens there with it). Its state is
device-specific (a CPU Mersenne-Twister state is 5 KB, a CUDA Philox state 16 bytes), so a checkpoint records
which device it came from; resuming on another device reseeds it from (seed, step) and says so, because the
tokens sampled after that point cannot equal those of an uninterrupted run.
"""

from __future__ import annotations

import os
import platform
import random
import warnings
from typing import Any

import torch

DEVICES = ("auto", "cpu", "cuda")
#: the one map from the dtype names of the configs (train.dtype, model.dtype, rollout.act_dtype, a format's
#: act_dtype) to torch dtypes; each user takes the names it allows
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def cuda_problem() -> str | None:
    """Why CUDA cannot be used here, or None when it can."""
    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        return (f"this torch ({torch.__version__}) is a CPU-only build; install a CUDA build "
                "(README 'Running on GPUs': TORCH_SPEC=... bash scripts/install.sh)")
    if not torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        where = f"CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else "CUDA_VISIBLE_DEVICES unset"
        return (f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU ({where}); on SLURM request "
                "one with hydra.launcher.gpus_per_node=1")
    return None


def resolve_device(name: str) -> torch.device:
    """`auto` -> cuda when available, else cpu; `cuda` without a usable GPU -> ValueError saying why."""
    if name not in DEVICES:
        raise ValueError(f"train.device={name!r} is not valid; choose one of: {', '.join(DEVICES)}")
    if name == "cpu" or (name == "auto" and cuda_problem() is not None):
        return torch.device("cpu")
    problem = cuda_problem()
    if problem is not None:
        raise ValueError(f"train.device=cuda but CUDA is not usable: {problem}; or run with train.device=cpu/auto")
    return torch.device("cuda")  # the current device: a SLURM job sees only the GPU(s) it was given


def describe(device: torch.device) -> dict[str, Any]:
    """The device as run.json records it for the analysis: type ("cpu" | "cuda") and a human name."""
    if device.type == "cuda":
        return {"device": "cuda", "device_name": torch.cuda.get_device_name(device),
                "capability": ".".join(map(str, torch.cuda.get_device_capability(device)))}
    return {"device": "cpu", "device_name": f"cpu ({torch.backends.cpu.get_cpu_capability()})", "cpu_model": cpu_model()}


#: the instruction-set flags that select different CPU float/int kernels in torch (and this project's bf16/int8 paths)
KERNEL_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8")


def cpu_model() -> str:
    """The CPU's model name and its kernel-relevant flags ("AMD EPYC [avx2 avx512f avx512_bf16 avx512_vnni]"):
    float results of the CPU kernels differ between instruction sets (AVX2, AVX-512, AVX512-BF16, AMX), so the
    report names the CPU each run computed on."""
    name, flags = "", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and not name:
                    name = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    name = name or platform.processor() or platform.machine()
    have = [f for f in KERNEL_FLAGS if f in flags]
    return f"{name} [{' '.join(have)}]" if have else name


def make_generator(device: torch.device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def rng_state(generator: torch.Generator) -> dict[str, Any]:
    """Every RNG a resumed run needs, with the sampling generator's device."""
    state = {"generator": generator.get_state(), "generator_device": generator.device.type,
             "torch_rng": torch.get_rng_state(), "python_rng": random.getstate()}
    if generator.device.type == "cuda":
        state["cuda_rng"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(generator: torch.Generator, state: dict[str, Any], seed: int, step: int) -> None:
    """Inverse of `rng_state`. A checkpoint from another device (or one written before devices were recorded
    on another device type) cannot restore the sampling generator: it is reseeded from (seed, step) instead,
    with a warning, so the run continues reproducibly from here on but not token-identically."""
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["python_rng"])
    saved = state.get("generator_device", "cpu")
    if saved == generator.device.type:
        generator.set_state(state["generator"])
    else:
        warnings.warn(f"checkpoint written on {saved}, resumed on {generator.device.type}: the sampling generator "
                      f"is reseeded from (seed={seed}, step={step}); later tokens differ from an uninterrupted run",
                      stacklevel=2)
        generator.manual_seed(seed * 1_000_003 + step)
    if "cuda_rng" in state and torch.cuda.is_available() and len(state["cuda_rng"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
