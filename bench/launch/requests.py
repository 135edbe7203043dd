"""What a sweep may ask of the machine it runs on, checked before anything is submitted or started: the GPUs, cores,
host memory and time limit a SLURM job requests (hydra.launcher.*) against the jobs' ranks and models, and how a local
sweep's workers share the visible GPUs. Pure checks over the composed configs (no submission, no CUDA context): the
launchers call them, and so do the quick check and the dry run (bench/launch/overrides.py), so that a request the
launcher would refuse is refused in one line before the launch.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any, Dict, Sequence

from omegaconf import DictConfig, OmegaConf

#: the SLURM launcher's class (hydra/launcher=slurm's _target_, hydra_plugins.qrl_bench.launchers)
SLURM_LAUNCHER = "SnapshotSlurmLauncher"


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (its entries when it is set, else
    0..n-1); none without CUDA. Asked without creating a CUDA context here (torch counts them through NVML)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def gpu_blocks(visible: Sequence[str], nproc: int, n_workers: int) -> list[str] | None:
    """The CUDA_VISIBLE_DEVICES of each local worker: the visible GPUs in blocks of `nproc` (a run's ranks, one GPU
    each: rank r takes GPU r of its block), worker i the i-th block; as many workers as whole blocks at most.
    None without a GPU: nothing changes (the workers inherit the environment, CPU runs). Without this every worker
    saw every GPU and took cuda:0 (a run of `nproc` ranks: cuda:0..nproc-1), so concurrent jobs shared GPU 0."""
    if not visible:
        return None
    if nproc > len(visible):
        raise ValueError(f"train.nproc_per_node={nproc} needs {nproc} GPUs, one per rank; {len(visible)} visible "
                         f"(CUDA_VISIBLE_DEVICES={','.join(visible)})")
    blocks = [",".join(visible[i: i + nproc]) for i in range(0, len(visible) - nproc + 1, nproc)]
    return [blocks[i % len(blocks)] for i in range(min(n_workers, len(blocks)))]


#: the SLURM launcher's numeric settings: (the least value, whether it must be whole); None is SLURM's default
LAUNCHER_NUMBERS = {"timeout_min": (1, False), "signal_delay_s": (0, True), "max_num_timeout": (0, True),
                    "nodes": (1, True), "tasks_per_node": (1, True), "cpus_per_task": (1, True),
                    "array_parallelism": (1, True), "gpus_per_node": (0, True), "gpus_per_task": (1, True),
                    "cpus_per_gpu": (1, True), "mem_gb": (1, False), "mem_per_gpu": (1, False),
                    "mem_per_cpu": (1, False)}
#: SLURM's longest signal delay (sbatch --signal takes at most 65535 s)
SIGNAL_MAX_S = 65535


def check_launcher_values(params: Dict[str, Any]) -> None:
    """ValueError naming the first hydra.launcher setting SLURM or submitit would refuse at submission (an sbatch
    error that names no setting, or a traceback) or take silently (array_parallelism=0): a number out of range
    or not a number, a signal that does not exist. A value from the environment names its variable."""
    import signal

    for key, (least, whole) in LAUNCHER_NUMBERS.items():
        value = params.get(key)
        if value is None:
            continue
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or value < least or (whole and value != int(value)) or (key == "signal_delay_s" and value > SIGNAL_MAX_S):
            kind = "a whole number" if whole else "a number"
            most = f" and <= {SIGNAL_MAX_S}" if key == "signal_delay_s" else ""
            raise ValueError(f"hydra.launcher.{key}={value!r}{_from_env(key)} is not valid: {kind} >= {least}{most}")
    name = str(params.get("preempt_signal", "USR1")).upper().removeprefix("SIG")
    if f"SIG{name}" not in signal.Signals.__members__:
        raise ValueError(f"hydra.launcher.preempt_signal={params.get('preempt_signal')!r}{_from_env('preempt_signal')} "
                         "is not a signal; use USR1 (the default), USR2 or TERM")


def _from_env(key: str) -> str:
    """' (from QRL_SLURM_X)' when the setting's environment variable is set (conf/hydra/launcher/slurm.yaml)."""
    from bench import CONF_DIR

    raw = (CONF_DIR / "hydra" / "launcher" / "slurm.yaml").read_text()
    found = re.search(rf"^{key}:.*?oc\.env:(\w+)", raw, flags=re.M)
    return f" (from {found[1]})" if found and found[1] in os.environ else ""


def check_signal_delay(params: Dict[str, Any]) -> None:
    """ValueError when the time-limit signal cannot do its work: SLURM sends it `signal_delay_s` before the job's
    `timeout_min`, and submitit counts a signal as the time limit's (its requeues bounded by max_num_timeout) only
    after min(80 %, limit - 10 min) of the limit has run; an earlier one is taken for a preemption and requeued
    without bound, each allocation training little more than one step."""
    delay, limit_min = params.get("signal_delay_s"), params.get("timeout_min")
    if delay is None or limit_min is None:
        return
    delay, limit = float(delay), 60.0 * float(limit_min)
    latest = max(0.2 * limit, 600.0)  # submitit's guaranteed walltime: min(0.8 limit, limit - 10 min)
    way = f"set hydra.launcher.timeout_min>={math.ceil(5 * delay / 60)} or signal_delay_s<={min(latest, limit / 2):g}"
    if delay >= limit:
        raise ValueError(f"hydra.launcher.signal_delay_s={delay:g} is not less than the time limit "
                         f"(timeout_min={float(limit_min):g}, {limit:g} s): the signal would come at the start; {way}")
    if delay > latest:
        raise ValueError(f"hydra.launcher.signal_delay_s={delay:g} comes before submitit counts a signal as the time "
                         f"limit's (the last {latest:g} s of timeout_min={float(limit_min):g}): every time-limit signal "
                         f"would requeue the job as a preemption, without bound; {way}")


def check_partition(params: Dict[str, Any]) -> None:
    """ValueError when hydra.launcher.partition names none of the cluster's partitions, listing them (sbatch says
    only "Invalid partition name specified"); nothing where sinfo is not here to ask (a machine outside the
    cluster) or does not answer."""
    import shutil
    import subprocess

    wanted = params.get("partition")
    if not wanted or shutil.which("sinfo") is None:
        return
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%R"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return
    names = sorted(set(out.stdout.split()))
    if out.returncode != 0 or not names:
        return
    for name in str(wanted).split(","):
        if name not in names:
            raise ValueError(f"hydra.launcher.partition={wanted}{_from_env('partition')}: this cluster has no partition "
                             f"{name!r}; its partitions (sinfo): {', '.join(names)}")


def slurm_params(launcher: DictConfig | None) -> Dict[str, Any] | None:
    """The SLURM launcher's parameters (hydra.launcher, composed, resolved), or None for another launcher."""
    if not isinstance(launcher, DictConfig) or not str(launcher.get("_target_", "")).endswith(f".{SLURM_LAUNCHER}"):
        return None
    return OmegaConf.to_container(launcher, resolve=True)  # type: ignore[return-value]


def slurm_request_error(launcher: DictConfig, configs: Sequence[DictConfig] = ()) -> str | None:
    """What the SLURM launcher (hydra.launcher, composed) would refuse of its request, in one line, before anything
    is submitted (the dry run, the quick check): `check_signal_delay`, `check_gpu_request` against the jobs' ranks.
    None for another launcher or a good request."""
    params = slurm_params(launcher)
    if params is None:
        return None
    try:
        check_launcher_values(params)
        check_signal_delay(params)
        check_gpu_request(params, ranks_per_node(params, configs) if configs else None)
        check_partition(params)
    except ValueError as e:
        return str(e)
    return None


def request_warnings(params: Dict[str, Any], configs: Sequence[Any]) -> list[str]:
    """What the SLURM launcher warns about when it submits (and the dry run before): a request that leaves GPUs
    idle or gives their ranks too few cores (`check_gpu_request`), no GPU for jobs that want one
    (`check_gpus_asked`), the partition's default memory for models built whole on the host (`check_host_memory`)."""
    return (check_gpu_request(params, ranks_per_node(params, configs)) + check_gpus_asked(params, configs)
            + check_host_memory(params, configs))


def check_gpu_blocks(configs: Any, nproc: int) -> None:
    """Every job of a local GPU sweep runs at most `nproc` ranks (its worker's block of GPUs, sized by the sweep's
    base config)."""
    wanted = max(int(OmegaConf.select(c, "train.nproc_per_node", default=1) or 1) for c in configs)
    if wanted > nproc:
        raise ValueError(f"a job of this sweep sets train.nproc_per_node={wanted}, but the local workers' GPU blocks "
                         f"hold {nproc} (the sweep's base train.nproc_per_node): sweep it in separate launches")


def check_gpu_request(params: Dict[str, Any], ranks_per_node: int | None = None) -> list[str]:
    """Coherence of a job's GPU/CPU request (hydra.launcher.*); raises ValueError for a contradiction and
    returns warnings for a request that runs but wastes what it asked for.

    submitit writes `gpus_per_node` as `#SBATCH --gpus-per-node=N`; SLURM then exports CUDA_VISIBLE_DEVICES to
    the job, where `train.device=auto` finds the GPU. Asking twice (a gpu `gres` as well) double-books or gets
    the job rejected; `cpus_per_gpu` is ignored by SLURM without `gpus_per_task` (submitit only warns). A job runs
    `ranks_per_node` ranks on each node, one GPU each (SLURM tasks, `tasks_per_node`, or the processes one task
    spawns, `train.nproc_per_node`; None: not known yet): more GPUs than ranks idle, fewer cannot start.
    """
    per_node, per_task = params.get("gpus_per_node"), params.get("gpus_per_task")
    gres = str(params.get("gres") or "")
    if (per_node or per_task) and "gpu" in gres:
        raise ValueError(f"hydra.launcher: GPUs requested twice (gpus_per_node={per_node}, gpus_per_task={per_task}, "
                         f"gres={gres!r}); use gpus_per_node=1 alone")
    if params.get("cpus_per_gpu") and not per_task:
        raise ValueError(f"hydra.launcher.cpus_per_gpu={params['cpus_per_gpu']} needs gpus_per_task (SLURM ignores it "
                         "with gpus_per_node); set cpus_per_task instead")
    tasks = int(params.get("tasks_per_node") or 1)
    n_gpus = int(per_node or 0) or int(per_task or 0) * tasks
    if ranks_per_node is None or not n_gpus:
        return []
    if n_gpus < ranks_per_node:
        raise ValueError(f"hydra.launcher asks for {n_gpus} GPU(s) per node, but a job runs {ranks_per_node} ranks per "
                         f"node, one GPU each (train.nproc_per_node / hydra.launcher.tasks_per_node): ask for "
                         f"hydra.launcher.gpus_per_node={ranks_per_node}")
    warnings = []
    cores = (int(params.get("cpus_per_gpu") or 0) * n_gpus) or int(params.get("cpus_per_task") or 1) * tasks
    if cores < ranks_per_node:  # SLURM confines a task and the processes it spawns to its cores
        warnings.append(f"hydra.launcher gives a job {cores} CPU core(s) per node for its {ranks_per_node} ranks, "
                        f"each driving a GPU and scoring its rollouts on the host: set hydra.launcher.cpus_per_task="
                        f"{-(-ranks_per_node // tasks)} at least (QRL_SLURM_CPUS)")
    if n_gpus > ranks_per_node:
        spread = several_tasks(params)
        fix = (f"hydra.launcher.tasks_per_node={n_gpus} (a task per GPU)" if spread
               else f"train.nproc_per_node={n_gpus} (one run over them; with rollout=vllm, train.sampling_shards a "
                    f"multiple of {n_gpus})")
        warnings.append(f"hydra.launcher asks for {n_gpus} GPUs per node, but a job runs {ranks_per_node} rank(s) per "
                        f"node, one GPU each: {n_gpus - ranks_per_node} idle; set {fix} or "
                        f"hydra.launcher.gpus_per_node={ranks_per_node}")
    return warnings


#: sbatch options that ask for GPUs (as `additional_parameters` keys, `-` or `_`); `gres` asks when its value names gpu
GPU_OPTIONS = ("gpus", "gpus_per_node", "gpus_per_task", "gpus_per_socket")


def sbatch_extra(params: Dict[str, Any]) -> dict[str, str]:
    """A SLURM launcher's `additional_parameters`, keys as submitit spells its own (lower case, `_`)."""
    extra = params.get("additional_parameters") or {}
    return {str(k).lower().replace("-", "_"): str(v).lower() for k, v in extra.items()}


def model_of(cfg: Any) -> Any:
    """The shape of a job's model (bench.launch.memory.model_shape), or None when unknown or the config has none."""
    from bench.launch.memory import model_shape

    return model_shape(cfg.model) if OmegaConf.select(cfg, "model") is not None else None


def asks_for_gpus(params: Dict[str, Any]) -> bool:
    """Whether a SLURM launcher's parameters ask for a GPU in any of the ways SLURM takes one."""
    extra = sbatch_extra(params)
    return bool(params.get("gpus_per_node") or params.get("gpus_per_task") or "gpu" in str(params.get("gres") or "")
                or any(k in GPU_OPTIONS or (k == "gres" and "gpu" in v) for k, v in extra.items()))


#: A model from this many parameters is a GPU job (the smallest recipe model, Qwen2.5-0.5B, has 4.9e8): on a CPU a
#: step of it at a recipe's batch takes hours.
GPU_MODEL_PARAMS = 2e8


def check_gpus_asked(params: Dict[str, Any], configs: Sequence[Any]) -> list[str]:
    """A warning when a SLURM sweep asks for no GPU but its jobs want them (`train.device=cuda`, several ranks, or a
    model of GPU_MODEL_PARAMS): with `train.device=auto` such a job found no GPU and ran on the node's CPUs, silently,
    its first step hours away. Empty when the request holds a GPU or no job wants one."""
    if asks_for_gpus(params):
        return []
    wanting, ranks = 0, ranks_per_node(params, configs)
    for c in configs:
        device = OmegaConf.select(c, "train.device", default="auto")
        several = ranks_per_node(params, [c]) > 1
        shape = model_of(c)
        if device == "cuda" or (device != "cpu" and (several or (shape and shape.params >= GPU_MODEL_PARAMS))):
            wanting += 1
    if not wanting:
        return []
    return [f"hydra.launcher asks SLURM for no GPU, but {wanting} job(s) of this sweep want {ranks} (train.device, "
            f"train.nproc_per_node or a model of {GPU_MODEL_PARAMS:.0e}+ parameters): they would run on the node's "
            f"CPUs; set hydra.launcher.gpus_per_node={ranks}, or train.device=cpu for a CPU run"]


def check_host_memory(params: Dict[str, Any], configs: Sequence[Any]) -> list[str]:
    """A warning when a SLURM sweep leaves the job's memory to the partition's default while its jobs need more than
    a default gives: every rank of a job builds the whole model on the host before sharding it (docs/scaling.md,
    Limits), ranks x 4 B x P at start (8 x 30 GB for a 7B recipe), and a default of a few GB per core ends the job
    out of memory at start-up, after its wait in the queue. Empty when a memory is set or the model is small."""
    from bench.launch.memory import GB

    if any(params.get(k) for k in ("mem_gb", "mem_per_gpu", "mem_per_cpu")) or set(sbatch_extra(params)) & {
            "mem", "mem_per_cpu", "mem_per_gpu"}:
        return []
    need, ranks = 0.0, ranks_per_node(params, configs)  # a node's ranks: its SLURM tasks or the processes one spawns
    for c in configs:
        shape = model_of(c)
        if shape is not None:
            per_param = 2 if OmegaConf.select(c, "model.dtype") == "bf16" else 4
            need = max(need, ranks * per_param * shape.params / GB)
    if need < HOST_MEMORY_WARN_GB:
        return []
    return [f"hydra.launcher.mem_gb is null (the partition's default memory per node), but each rank of a job "
            f"builds the whole model on the host before sharding it: ~{need:,.0f} GB at start; set hydra.launcher.mem_gb="
            f"{int(need * 1.25) + 16} (QRL_SLURM_MEM_GB) or more"]


#: Host memory a job's models need at start above which a SLURM sweep should state its memory (check_host_memory).
HOST_MEMORY_WARN_GB = 16


def several_tasks(params: Dict[str, Any]) -> bool:
    """Whether a job has more than one SLURM task (tasks_per_node x nodes): then each task is one rank and
    `train.nproc_per_node` is not used (bench.distributed.group.export_slurm_tasks)."""
    return int(params.get("tasks_per_node") or 1) * int(params.get("nodes") or 1) > 1


def ranks_per_node(params: Dict[str, Any], configs: Sequence[DictConfig]) -> int:
    """Ranks a job of the sweep runs on each node: its SLURM tasks, or else the processes its task spawns
    (`train.nproc_per_node`; the largest of the sweep's jobs)."""
    tasks = int(params.get("tasks_per_node") or 1)
    if several_tasks(params):
        return tasks
    return max([int(OmegaConf.select(c, "train.nproc_per_node", default=1) or 1) for c in configs] or [1])
