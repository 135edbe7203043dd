"""GPU-hours of a run, estimated from its composed config (`qrl-bench -m +experiment=... --dry-run`).

Per training step (B = train.batch_size sequences, L_p / L_r = the mean prompt / response length in tokens):

    generated tokens   B * L_r / keep_rate          keep_rate < 1 only with algo.dynamic_sampling (refill rounds)
    trained tokens     B * (L_p + L_r) * epochs      forward + backward: the policy, and the critic too with GAE
    forward tokens     B * (L_p + L_r) * passes      passes = recompute (arms that need pi_old) + reference model
                                                     (algo.kl_ref_beta > 0) + critic values (algo.advantage=gae)

    seconds = generated / gen_tokens_per_s + trained / train_tokens_per_s + forward / forward_tokens_per_s

plus `eval_tokens` generated at every evaluation (step 0, every train.eval_every steps, and the final one).
GPU-hours are GPU-seconds / 3600, whatever the number of GPUs per job; `gpus` only turns them into wall-clock.

Throughputs are per GPU. A recipe either states them (measured or cited; `source` says where), or gives the
model's size and they follow from its FLOPs: 2 N per generated or forward token, 6 N per trained token, at
`gen_mfu` / `train_mfu` of `peak_tflops` (989 TFLOP/s: an H100 SXM's dense BF16 peak, NVIDIA's datasheet). The
utilisations are ours (0.10 for generation, which is memory-bound; 0.30 for FSDP training); no overhead (weight
sync, scoring, checkpoints) is counted. The measured anchor we cite is verl's quickstart log
(docs/start/quickstart.rst: PPO on GSM8K with Qwen2.5-0.5B-Instruct, 256 prompts x 1 response, one GPU of unstated
type): step 0 shows timing/gen 21.47 s for 256 x 239.1 generated tokens (2,851 tokens/s), timing/update_actor
20.31 s for 256 x (104.9 + 239.1) tokens (4,335 tokens/s forward + backward) and timing/values 5.80 s for the same
tokens (15,184 tokens/s forward). A small model is far below its FLOPs bound (the FLOPs model would give it
~100k tokens/s), which is why the 0.5B recipes state the measurement instead. No estimate (the CPU configs) when
neither the throughputs nor `params_b` are set.

The rate above is vLLM's (continuous batching, paged KV cache, fused kernels, CUDA graphs). A job on the embedded
engine (`rollout.engine=embedded`) is priced by a model of that engine's own decode instead (`embedded_rollout_s`,
below): the rollout share of its step and its GPU-hours follow, and where it costs more than CHEAPER_BY x what
vLLM would, the dry run says so and names the override (`rollout=vllm`), or says that vLLM cannot serve the
precision (INT8 and the emulated formats).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from bench.domains import num
from bench.eval_config import as_eval_config, eval_engine_kind, set_config

VERL_QUICKSTART = ("measured: verl quickstart log (docs/start/quickstart.rst), Qwen2.5-0.5B-Instruct PPO on GSM8K, "
                   "one GPU of unstated type, step 0")
FLOPS_MODEL = "FLOPs model (ours): 2N / 6N FLOPs per generated / trained token at the stated utilisation"


@dataclass
class BudgetConfig:
    """`budget.*`: what the dry run's GPU-hours estimate assumes (module docstring)."""

    # the policy's parameters, in billions (the FLOPs model)
    params_b: Optional[float] = num(None, "(0, 1e5]", {None: "unknown: no FLOPs model (stated rates only)"})
    prompt_tokens: float = num(0.0, "[0, 1e7]")  # mean prompt length L_p
    response_tokens: float = num(0.0, "[0, 1e7]")  # mean response length L_r
    keep_rate: float = num(1.0, "(0, 1]")  # dynamic sampling: fraction of generated groups kept
    eval_tokens: float = num(0.0, "[0, 1e12]")  # tokens generated per evaluation (every eval set and sample)
    # per GPU: generated, trained (forward + backward) and forward-only tokens/s
    gen_tokens_per_s: Optional[float] = num(None, "(0, 1e9]", {None: "from the FLOPs model"})
    train_tokens_per_s: Optional[float] = num(None, "(0, 1e9]", {None: "from the FLOPs model"})
    forward_tokens_per_s: Optional[float] = num(None, "(0, 1e9]", {None: "from the FLOPs model"})
    peak_tflops: float = num(989.0, "(0, 1e6]")  # H100 SXM dense BF16 (NVIDIA datasheet)
    gen_mfu: float = num(0.10, "(0, 1]")  # ours
    train_mfu: float = num(0.30, "(0, 1]")  # ours
    source: str = FLOPS_MODEL
    gpus: int = num(1, "[1, 1e6]")  # GPUs per job (wall-clock hours = GPU-hours / gpus)
    gpu_memory_gb: float = num(80.0, "(0, 1e4]")  # the GPU the memory estimate is checked against (bench/launch/memory.py): H100 80 GB



def throughputs(b: Any) -> tuple[float, float, float] | None:
    """(generated, trained, forward) tokens/s per GPU: stated, else from FLOPs; None when neither is possible."""
    stated = (b.gen_tokens_per_s, b.train_tokens_per_s, b.forward_tokens_per_s)
    if b.params_b is None and None in stated:
        return None
    flops = b.peak_tflops * 1e12
    n = (b.params_b or 0.0) * 1e9
    derived = (flops * b.gen_mfu / (2 * n) if n else None, flops * b.train_mfu / (6 * n) if n else None,
               flops * b.train_mfu / (2 * n) if n else None)
    return tuple(s if s is not None else d for s, d in zip(stated, derived))  # type: ignore[return-value]


# ------------------------------------------------------------------ the embedded engine's rollout (rollout.engine)
#
# The embedded engine (bench/rollout/embedded.py) decodes a batch in chunks of R = chunk_tokens // (L_p + T)
# sequences (T = task.max_new_tokens), each chunk for as many steps as its longest row, taken to be T (a chunk of
# tens of long-tail responses has one near the cap). Every decode step reads the engine's weights and launches the
# layers' kernels one by one (eager PyTorch: a GPU decode at these batch sizes waits on the host); each live row
# also reads its KV cache and samples from its full vocabulary. Per GPU (B / budget.gpus sequences of one round):
#     seconds = chunks x T x (weight bytes / HBM + layers x kernels x KERNEL_S)           the steps
#             + B/gpus x L_r x (L_p + L_r / 2) x kv bytes / HBM                           live rows' KV (compaction)
#             [ without rollout.compact: + B/gpus x T x (L_p + T / 2) x kv bytes / HBM: every row runs T steps ]
# With rollout.refill (continuous batching, the default) a batch of more than R sequences decodes in one cache of R
# slots, an ended sequence's slot taken by a queued one at the next sync: the slots stay busy until the queue is
# empty, so the steps are T + (B/gpus - R) x L_r / R instead of chunks x T (the first R sequences decode as one
# chunk; each later one adds its L_r steps over R slots), and a queued sequence attends over a window of at most
# L_p + T columns (from the batch's oldest live sequence; its own and masked ones): its KV term is priced at that
# bound, L_r x (L_p + T) instead of L_r x (L_p + L_r / 2).
#             + B/gpus x L_r x vocabulary x SAMPLE_S                                      live rows' sampling
#             + B/gpus x L_p x 2 P / (peak x gen_mfu)                                      the prompts' prefill
# Kernels per layer (counted in FastDecoder): 45 in eager bf16; the W8A8 formats add ~17 per linear (4 per layer)
# to quantize activations eagerly, 1 with rollout.compile. Calibration, an H200 with torch 2.11 (2026-11-28,
# results/gpu_check/h200-2026-11-28.md; n = 1 run each): the trainer's own rollout in one qurl_table1 step (0.5B,
# 256 rows, every row 512 tokens) took 20.8 ms a decode step in bf16 and 40.5 ms in fp8_e4m3; the two rows fit
# KERNEL_S = 12 us and SAMPLE_S = 0.19 ns (a bf16 step is then 13.4 ms of layers + 7.4 ms of sampling 256 rows over
# 152k tokens: the float64 CDF of bench.rollout.embedded.inverse_cdf). Fitted on those two rows, the model was then
# checked on the rollout benchmark's (long-tail lengths, mean 32, cap 256, B = 256): bf16 eager 3.5 s measured, 4.0
# s modelled; fp8 eager 7.7 s and 9.0 s (1.14-1.16x pessimistic, as it takes every chunk to the cap). With
# rollout.compile the benchmark measured bf16 at 0.92x its eager speed and fp8 at 1.96x its eager speed (fp8 then
# as fast as bf16): compiled graphs with dynamic shapes do not launch fewer host-side calls than eager kernels here,
# so "compiled" counts 48 kernel-equivalents per layer and 1 per activation quantization.
# Before the engine bucketed its decode attention's key lengths (ATTN_BUCKET_CUDA), a cold rollout paid SDPA's
# per-shape plan at every decode step (43.5 ms against 0.09 ms warm per call, H200): the H100 record's 73 ms a step.
# On the shared 2-core CPU the benchmark's fit is noise under load, so the CPU checks the model's form (at long-tail
# lengths compaction's gain follows the steps and live rows it removes: docs/benchmarks.md), not its constants.
# The embedded engine is never priced below vLLM's rate (vLLM is the faster engine by construction; where the model
# says otherwise, e.g. qurl_table1's 0.5B at 512 tokens, the stated vLLM rate is the conservative figure).

KERNEL_S = 1.2e-5  # one eager kernel launch + dispatch, fitted on an H200 host (module comment above)
SAMPLE_S = 1.9e-10  # per live row, decode step and vocabulary entry: the sampler (module comment above)
KERNELS_PER_LAYER = {"eager": 45, "compiled": 48}
ACT_QUANT_KERNELS = {"eager": 17, "compiled": 1}  # per W8A8 linear: dynamic activation quantization
LINEARS_PER_LAYER = 4  # fused qkv, o, fused gate_up, down
#: the embedded engine would cost more than this many times vLLM's rollout: the dry run names the override
CHEAPER_BY = 3.0
#: rollout precisions vLLM serves (bench/rollout/vllm_engine.py DTYPES); the others have no vLLM alternative
VLLM_PRECISIONS = ("fp32", "bf16", "fp8_e4m3")


def embedded_rollout_s(cfg: Any, shape: Any, sequences: float) -> float:
    """Seconds one GPU's embedded engine takes for `sequences` rollouts (the model above)."""
    from bench.launch.memory import EIGHT_BIT, engine_bytes
    from bench.rollout.embedded import CHUNK_TOKENS

    b, r = cfg.budget, cfg.rollout
    L_p, L_r, T = float(b.prompt_tokens), float(b.response_tokens), int(cfg.task.max_new_tokens)
    act_bytes = 4 if r.precision == "fp32" else 2
    chunk = r.get("chunk_tokens", CHUNK_TOKENS)
    rows = max(1, int((chunk or 2**62) // (L_p + T)))
    chunks = math.ceil(sequences / rows)
    mode = "compiled" if r.get("compile", False) else "eager"
    kernels = KERNELS_PER_LAYER[mode] + (LINEARS_PER_LAYER * ACT_QUANT_KERNELS[mode] if r.precision in EIGHT_BIT else 0)
    step = engine_bytes(shape, r.precision, act_bytes) / HBM_BYTES_PER_S + shape.layers * kernels * KERNEL_S
    kv = shape.kv_bytes(act_bytes) / HBM_BYTES_PER_S
    compact = r.get("compact", True)
    live = sequences * (L_r * (L_p + L_r / 2) if compact else T * (L_p + T / 2)) * kv
    steps = chunks * T
    queued = sequences - rows
    if r.get("refill", True) and queued > 0:  # continuous batching (module comment above)
        steps = T + queued * L_r / rows
        live = (rows * L_r * (L_p + L_r / 2) + queued * L_r * (L_p + T)) * kv
    sample = sequences * (L_r if compact else T) * shape.vocab * SAMPLE_S
    prefill = sequences * L_p * 2 * shape.params / (b.peak_tflops * 1e12 * b.gen_mfu)
    return steps * step + live + sample + prefill


@dataclass
class Estimate:
    """Tokens per step and the GPU-hours of one run; the rollout priced by the engine that runs it."""

    generated_per_step: float
    trained_per_step: float
    forward_per_step: float
    evals: int
    gpu_hours: float
    wall_hours: float
    engine: str = "vllm"  # whose rollout cost the hours count
    rollout_share: float = 0.0  # of a step's GPU-seconds
    vllm_gpu_hours: float | None = None  # the same run on vLLM's rollout (embedded jobs)
    step_s: float = 0.0  # one training step's wall seconds on the job's GPUs (evaluations apart)
    eval_s: float = 0.0  # one evaluation's wall seconds on the job's GPUs, on the engine that runs it
    eval_slowdown: float = 1.0  # the evaluation's engine's time over vLLM's (`eval_slowdown`)

    @property
    def vllm_would_save(self) -> bool:
        """The embedded engine costs more than CHEAPER_BY x vLLM's rollout would."""
        return self.vllm_gpu_hours is not None and self.gpu_hours > CHEAPER_BY * self.vllm_gpu_hours

    def line(self, precision: str) -> str:
        """The dry run's cost column: engine, rollout share, GPU-hours (and vLLM's, where it would save)."""
        slow = f"; evaluations on embedded, {self.eval_slowdown:,.1f}x vLLM's" if self.eval_slowdown > 1 else ""
        text = (f"~{self.gpu_hours:,.1f} GPU-h on {self.engine} (rollout {self.rollout_share:.0%} of a step; "
                f"{self.generated_per_step:,.0f} generated + {self.trained_per_step:,.0f} trained tokens/step{slow})")
        if self.vllm_would_save:
            how = ("set rollout=vllm" if precision in VLLM_PRECISIONS else
                   f"vLLM has no {precision}: no override, the embedded engine is the one that serves it")
            text += f"  {self.gpu_hours / self.vllm_gpu_hours:,.0f}x vLLM's ~{self.vllm_gpu_hours:,.1f} GPU-h: {how}"
        return text


def estimate(cfg: Any, needs_recompute: bool) -> Estimate | None:
    """The estimate for one composed run config, or None when the config sets no throughput. The rollout is the
    embedded engine's model (`embedded_rollout_s`) for rollout.engine=embedded where the model's shape is known,
    else the generation rate."""
    from bench.launch.memory import model_shape

    b, train, algo = cfg.budget, cfg.train, cfg.algo
    rates = throughputs(b)
    if rates is None:
        return None
    gen_tps, train_tps, fwd_tps = rates
    seqs, length = train.batch_size, b.prompt_tokens + b.response_tokens
    gae = algo.advantage == "gae"
    rounds = 1.0 / b.keep_rate if algo.dynamic_sampling else 1.0
    generated = seqs * b.response_tokens * rounds
    trained = seqs * length * train.epochs * (2 if gae else 1)
    forward = seqs * length * (int(needs_recompute) + int(algo.kl_ref_beta > 0) + int(gae))
    other_s = trained / train_tps + forward / fwd_tps
    evals = math.ceil(train.steps / train.eval_every) + 1 if b.eval_tokens else 0
    slowdown = eval_slowdown(cfg)
    eval_each_s = b.eval_tokens / gen_tps * slowdown  # GPU-seconds of one evaluation, on the engine that runs it
    eval_s = evals * eval_each_s

    def hours(rollout_s: float) -> float:
        return (train.steps * (rollout_s + other_s) + eval_s) / 3600.0

    vllm_s = generated / gen_tps
    engine = cfg.rollout.engine if cfg.get("rollout") is not None else "vllm"
    shape = model_shape(cfg.model) if engine == "embedded" else None
    if shape is None:
        gpu_hours = hours(vllm_s)
        return Estimate(generated, trained, forward, evals, gpu_hours, gpu_hours / b.gpus,
                        "vllm" if engine == "vllm" else "embedded at vLLM's rate (shape unknown)",
                        vllm_s / (vllm_s + other_s), step_s=(vllm_s + other_s) / b.gpus,
                        eval_s=eval_each_s / b.gpus, eval_slowdown=slowdown)
    # GPU-seconds; never below vLLM's: where the model says otherwise, the stated vLLM rate is the conservative one
    rollout_s = max(b.gpus * embedded_rollout_s(cfg, shape, seqs / b.gpus) * rounds, vllm_s)
    gpu_hours = hours(rollout_s)
    return Estimate(generated, trained, forward, evals, gpu_hours, gpu_hours / b.gpus, "embedded",
                    rollout_s / (rollout_s + other_s), hours(vllm_s), step_s=(rollout_s + other_s) / b.gpus,
                    eval_s=eval_each_s / b.gpus, eval_slowdown=slowdown)


def eval_slowdown(cfg: Any) -> float:
    """How many times vLLM's time the run's evaluations take on the engine that runs them (eval.engine): 1 through
    vLLM; through the embedded eager decoder its time over vLLM's at the evaluation's own shape (`eval_estimate`),
    never below 1 (as the rollout's); 1 where the model's shape or a set's size is unknown. The GPU-hours price the
    budget's evaluation tokens (budget.eval_tokens) at vLLM's rate times this."""
    if cfg.get("eval") is None or cfg.get("rollout") is None:
        return 1.0
    if eval_engine_kind(as_eval_config(cfg.eval).engine, cfg.rollout.engine) != "embedded":
        return 1.0
    ev = eval_estimate(cfg)
    return 1.0 if ev is None or not ev.vllm_s_per_eval else ev.embedded_s_per_eval / ev.vllm_s_per_eval


def describe(cfg: Any) -> str:
    """One line: the assumptions behind the estimate (for the dry run's summary)."""
    b = cfg.budget
    gen, trained, fwd = throughputs(b)  # type: ignore[misc]
    how = b.source if b.source != FLOPS_MODEL else (
        f"{FLOPS_MODEL} (generation {b.gen_mfu:g}, training {b.train_mfu:g} of {b.peak_tflops:g} TFLOP/s, "
        f"{b.params_b:g}B parameters)")
    return (f"L_p {b.prompt_tokens:g} / L_r {b.response_tokens:g} tokens, keep rate {b.keep_rate:g}, "
            f"{b.eval_tokens:,.0f} tokens per evaluation; per GPU {gen:,.0f} generated / {trained:,.0f} trained / "
            f"{fwd:,.0f} forward tokens/s: {how}")


# ------------------------------------------------------------------ evaluation time per engine (eval.engine)
#
# The evaluation's generated tokens are counted at their upper bound, every response running to its max tokens T:
#     per evaluation   test problems x 1 x task.max_new_tokens                  (eval/accuracy: greedy)
#                    + sum over eval.sets: problems x samples x max new tokens (eval.max_new_tokens or the set's)
#     evaluations      step 0, every train.eval_every steps, and the final one
# and decoded on one GPU by either engine:
#     vllm      at the rollout rate `throughputs(b)[0]` (stated, or the FLOPs model), the rate the GPU-hours use
#     embedded  an eager decoder, memory-bound: B = min(eval.batch_size, CHUNK_TOKENS // (L_p + T)) sequences per
#               decode step (bench/rollout/embedded.py chunks a batch by KV-cache positions), and a step reads
#               the fp32 evaluation copy (4 B x params) and the fp32 KV cache of the B sequences at their mean
#               length L_p + T/2, at H100 HBM bandwidth, plus a host-side launch overhead per layer:
#                   tokens/s = B / ((4 P + B (L_p + T/2) kv_bytes) / HBM_BYTES_PER_S + layers x EAGER_LAYER_S)
# Problem counts come from the task config (n_test, max_test, test_size) or, for a hub test split, the dataset
# card's row count (HUB_TEST_ROWS); an unknown set size (a local file without max_test) or model shape gives no
# estimate. An upper bound on tokens and a lower bound on the eager decoder's time: a small model at short
# lengths decodes eagerly about as fast as the quoted vLLM rate (qurl_table1); the gap opens with model size
# and length (docs/gpu.md "Evaluation through vLLM").

HBM_BYTES_PER_S = 3.35e12  # H100 SXM HBM3 (NVIDIA datasheet)
EAGER_LAYER_S = 3.5e-4  # ours: ~35 eager PyTorch ops per decoder layer (norms, RoPE, cache writes, GEMMs) x ~10 us
EVAL_BYTES = 4  # the embedded evaluation engine is fp32 (weights and KV cache)
#: test rows of the hub sets the recipes evaluate on (the dataset cards), for the split the task reads
HUB_TEST_ROWS = {"HuggingFaceH4/aime_2024": 30, "math-ai/aime25": 30, "AI-MO/aimo-validation-amc": 83,
                 "HuggingFaceH4/MATH-500": 500, "openai/gsm8k": 1319, "nlile/hendrycks-MATH-benchmark": 5000,
                 "math-ai/minervamath": 272, "math-ai/olympiadbench": 674,
                 "MathArena/aime_2026": 30}


def problem_count(task: Any) -> int | None:
    """How many problems a task config's test split holds (None: unknown without reading the data)."""
    get = task.get if hasattr(task, "get") else lambda k, d=None: getattr(task, k, d)
    if get("n_test") is not None:  # generated tasks
        return int(get("n_test"))
    rows = int(get("test_size") or 0) if get("test_split") is None else HUB_TEST_ROWS.get(get("source"))
    cap = get("max_test")
    if rows is None:
        return None if cap is None else int(cap)
    return rows if cap is None else min(rows, int(cap))


def eval_passes(cfg: Any) -> list[tuple[int, int, int]] | None:
    """(problems, samples, max new tokens) of every generation pass of one evaluation: the training task's
    greedy eval/accuracy, then each eval set; None when a set's size is unknown."""
    ev = as_eval_config(cfg.eval)
    passes = [(problem_count(cfg.task), 1, int(cfg.task.max_new_tokens))]
    for name in ev.sets:
        own = name == cfg.task.name and name not in ev.overrides
        task = cfg.task if own else set_config(name, ev.overrides.get(name))
        passes.append((problem_count(task), ev.samples, int(ev.max_new_tokens or task.max_new_tokens)))
    return None if any(n is None for n, _, _ in passes) else passes  # type: ignore[return-value]


def eager_tokens_per_s(shape: Any, batch_size: int, prompt_tokens: float, max_new: int) -> float:
    """The embedded fp32 engine's decode rate on one GPU (the model above)."""
    from bench.rollout.embedded import CHUNK_TOKENS

    batch = max(1, min(batch_size, CHUNK_TOKENS // int(prompt_tokens + max_new)))
    read = EVAL_BYTES * shape.params + batch * (prompt_tokens + max_new / 2) * shape.kv_bytes(EVAL_BYTES)
    return batch / (read / HBM_BYTES_PER_S + shape.layers * EAGER_LAYER_S)


@dataclass
class EvalEstimate:
    """The run's evaluations on one GPU through either engine."""

    tokens_per_eval: float
    evals: int
    embedded_s_per_eval: float
    vllm_s_per_eval: float

    @property
    def embedded_hours(self) -> float:
        return self.evals * self.embedded_s_per_eval / 3600.0

    @property
    def vllm_hours(self) -> float:
        return self.evals * self.vllm_s_per_eval / 3600.0

    def line(self) -> str:
        """At most, on one GPU: every response at its max tokens (the GPU-hours count budget.eval_tokens instead)."""
        return (f"eval <= ~{self.embedded_hours:,.1f} h embedded / ~{self.vllm_hours:,.1f} h vLLM on 1 GPU "
                f"({self.evals} x <= {self.tokens_per_eval:,.0f} tokens, every response at its max)")


def eval_estimate(cfg: Any) -> EvalEstimate | None:
    """The evaluation time of one composed run config through either engine (above), or None without a
    throughput, the model's shape or a set's size."""
    from bench.launch.memory import model_shape

    rates, passes, shape = throughputs(cfg.budget), eval_passes(cfg), model_shape(cfg.model)
    if rates is None or passes is None or shape is None:
        return None
    tokens = sum(n * k * t for n, k, t in passes)
    eager_s = sum(n * k * t / eager_tokens_per_s(shape, cfg.eval.batch_size, cfg.budget.prompt_tokens, t)
                  for n, k, t in passes)
    evals = math.ceil(cfg.train.steps / cfg.train.eval_every) + 1
    vllm_s = tokens / rates[0]
    return EvalEstimate(float(tokens), evals, max(eager_s, vllm_s), vllm_s)  # never below vLLM's rate (as a rollout)


def describe_embedded() -> str:
    """One line: what the embedded engine's rollout model assumes (for the dry run's summary)."""
    return (f"the embedded engine's rollout: max new tokens decode steps plus each queued sequence's response over "
            f"the cache's rows (continuous batching; chunks x max new tokens with rollout.refill=false), each reading "
            f"its weights at "
            f"{HBM_BYTES_PER_S / 1e12:g} TB/s and launching layers x kernels at {KERNEL_S * 1e6:g} us (ours), plus the "
            "live rows' KV cache, never below vLLM's rate (bench/launch/budget.py embedded_rollout_s)")


def describe_eval() -> str:
    """One line: what the evaluation-time estimate assumes (for the dry run's summary)."""
    return (f"evaluation on one GPU, every response at its max tokens: vLLM at the generation rate above; the "
            f"embedded eager fp32 decoder reading weights + KV cache at {HBM_BYTES_PER_S / 1e12:g} TB/s (H100 HBM3) "
            f"+ {EAGER_LAYER_S * 1e3:g} ms of launches per layer and step (ours; bench/launch/budget.py)")


__all__ = ["BudgetConfig", "Estimate", "EvalEstimate", "FLOPS_MODEL", "VERL_QUICKSTART", "describe", "describe_eval",
           "describe_embedded", "eager_tokens_per_s", "embedded_rollout_s", "estimate", "eval_estimate", "eval_passes",
           "problem_count", "throughputs"]
