"""Rollout throughput of both engines at every precision each offers, as a Markdown table.

    python -m bench.benchmarks.rollout [--engines embedded vllm] [--preset 1m|10m|qwen2.5-0.5b|qwen2.5-1.5b|qwen3-8b] [--device auto]
                                       [--layers N] [--batch 16 64] [--new-tokens 64] [--prompt-len 32]
                                       [--mean-response N [--tail 8]] [--variants eager compiled before]
                                       [--threads 2] [--repeats 3] [--hf]

Protocol (perf-notes 2): a model of the preset's SHAPE, random init (std 0.02), no weights downloaded; sampling at
T=1, every engine returning the sampled tokens *and* their log-probs. Throughput = useful (response) tokens / wall
time, prefill included; one warm-up, then the best of `--repeats` rounds, the runs of one batch size interleaved
(the machine is shared: the best is the least disturbed run, and a burst of load hits every method's round).
"sync ms" is one `load_weights` of the trainer's weights into the engine (embedded: copy + fresh quantization; vLLM:
in-place reload + re-quantization + prefix-cache reset), paid once per GRPO step; "vs bf16" is the speed-up over the
same engine's bf16.

Response lengths: without `--mean-response`, no stop id (every row runs `--new-tokens`). With `--mean-response N`,
the RL shape: the top round(vocab / N) token ids are stop ids, so on a near-uniform random model a row stops with
probability ~1/N per token (geometric lengths, a long tail), capped at `--tail` x N new tokens (default 8: max ~8x
mean). The realized mean / max lengths are printed. An engine that decodes a batch until its longest row ends
spends most steps on a few rows; one that drops finished rows (continuous batching in vLLM, compaction in the
embedded engine) does not.

Embedded variants (`--variants`): `eager` (the defaults: a host sync every rollout.sync_every tokens, finished rows
leave the batch, continuous batching, the CPU's oneDNN GEMM and matmul decode attention), `compiled`
(rollout.compile=true: torch.compile'd decode step and fused activation quantization), `graphs`
(rollout.cuda_graphs=true: decode steps replayed from CUDA graphs; on a CPU the same as eager), `plain`
(rollout.cpu_kernels=plain: torch's sgemm and SDPA), `varlen` (rollout.cpu_attention=varlen: the decode attention
over each row's own key columns, a C kernel), `varlen_sync8` (that and rollout.sync_every=8: an ended sequence's
slot is refilled after at most 7 steps instead of 15), `chunked` (rollout.refill=false: a chunk of --slots sequences at
a time, each to its longest row), `before` (rollout.sync_every=1 rollout.compact=false rollout.cpu_kernels=plain
rollout.refill=false: the engine as it was before issue 34, a host sync and stop check every token). The ratios table
gives each variant's useful tokens/s over `before` and over vLLM's fp32 row.

`--slots N` decodes at most N sequences at once, as a GPU's KV-cache budget does at scale (rollout.chunk_tokens): the
embedded engine's chunk (refilled, or one chunk after another) and vLLM's max_num_seqs. With a batch of several
times N, it measures continuous batching on a CPU.

Engines and precisions: embedded, every precision registered in bench/quant/ (fp32, bf16, fp16, fp8_e4m3,
fp8_e5m2, int8, int4, mxfp4, nvfp4; `--precisions` picks some); vLLM fp32 | bf16 | fp8_e4m3 with the
FP8 schemes of the platform (GPU: per_tensor, per_channel; CPU: per_channel). On a GPU each vLLM
precision runs in a child process, so one engine's GPU memory is gone before the next starts; on a CPU the vLLM
engines run in this process, interleaved with the embedded ones. `--hf` adds HF `generate` rows (log-probs from
`output_logits`, as a trainer-side rollout without an engine would get them; no stop ids).

On a CPU without bf16/fp8/int8 hardware (AVX2) the low-precision rows are emulated: they measure the
emulation, not a speed-up. A GPU user (vLLM on the GPU; pip install -e .[vllm]):
    python -m bench.benchmarks.rollout --engines vllm --preset qwen2.5-1.5b --batch 64 256 --new-tokens 512
    python -m bench.benchmarks.rollout --engines embedded vllm --preset qwen2.5-1.5b --batch 32 256 --mean-response 512
    python -m bench.benchmarks.rollout --engines vllm --preset qwen3-8b --batch 64 256 --new-tokens 2048
The CPU comparison of issue 34 (docs/benchmarks.md):
    .venv-vllm/bin/python -m bench.benchmarks.rollout --engines embedded vllm --preset 1m --batch 64 \
        --mean-response 64 --variants before eager compiled --precisions fp32
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from bench.quant.linear import fast_int_mm, native_bf16_matmul
from bench.device import resolve_device
from bench.quant.quantizers import precisions
from bench.rollout.base import SamplingParams
from bench.rollout.embedded import EmbeddedEngine
from bench.timing import synchronize

EMBEDDED_PRECISIONS = tuple(precisions())  # every format registered in bench/quant/
VLLM_PRECISIONS = ("fp32", "bf16", "fp8_e4m3")
#: the engines this benchmark times (--engines)
BENCHMARKED_ENGINES = ("embedded", "vllm")
#: Model shapes. 1m / 10m: perf-notes sizes (Qwen2, GQA 4/2 heads, tied embeddings). The others are the
#: dimensions of the published Hugging Face config.json of Qwen/Qwen2.5-0.5B, Qwen/Qwen2.5-1.5B and
#: Qwen/Qwen3-8B (hidden, layers, heads, kv heads, head_dim, intermediate, vocab, rope theta, tied embeddings).
PRESETS: dict[str, dict] = {
    "1m": dict(model_type="qwen2", hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
               num_key_value_heads=2, intermediate_size=512, vocab_size=128, tie_word_embeddings=True),
    "10m": dict(model_type="qwen2", hidden_size=256, num_hidden_layers=6, num_attention_heads=4,
                num_key_value_heads=2, intermediate_size=1792, vocab_size=1024, tie_word_embeddings=True),
    "qwen2.5-0.5b": dict(model_type="qwen2", hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, intermediate_size=4864, vocab_size=151936, rope_theta=1e6,
                         rms_norm_eps=1e-6, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(model_type="qwen2", hidden_size=1536, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, intermediate_size=8960, vocab_size=151936, rope_theta=1e6,
                         rms_norm_eps=1e-6, tie_word_embeddings=True),
    "qwen3-8b": dict(model_type="qwen3", hidden_size=4096, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, intermediate_size=12288, vocab_size=151936,
                     rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=False),
}


def build_model(preset: str, layers: int | None = None, max_len: int = 4096,
                dtype: torch.dtype = torch.float32, device: str = "cpu") -> torch.nn.Module:
    """A random-init causal LM with the preset's shape (`layers` cuts the depth), nothing downloaded.

    Built directly in `dtype` on `device` (an 8B model in fp32 on the host would need 32 GB).
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of: {', '.join(PRESETS)}")
    shape = dict(PRESETS[preset])
    kind = shape.pop("model_type")
    if layers is not None:
        if not 1 <= layers <= shape["num_hidden_layers"]:
            raise ValueError(f"--layers {layers} must be in 1..{shape['num_hidden_layers']} for {preset}")
        shape["num_hidden_layers"] = layers
    config_cls, model_cls = (Qwen2Config, Qwen2ForCausalLM) if kind == "qwen2" else (Qwen3Config, Qwen3ForCausalLM)
    torch.manual_seed(0)
    cfg = config_cls(**shape, initializer_range=0.02, max_position_embeddings=max_len)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = model_cls(cfg)
    finally:
        torch.set_default_dtype(default)
    return model.eval()


def _sync(device: torch.device) -> None:
    """Wait for the GPU: without it a timer reads kernel launches, not work (no EOS means no host sync)."""
    synchronize(device)


def _timed(run: Callable[[], int], device: torch.device) -> tuple[int, float]:
    """(tokens, seconds) of one call of `run`, the device waited for on both sides."""
    _sync(device)
    t0 = time.perf_counter()
    tokens = run()
    _sync(device)
    return tokens, time.perf_counter() - t0


def best_tokens_per_s(runs: dict[str, Callable[[], int]], repeats: int, device: torch.device) -> dict[str, float]:
    """Warm up every runner, then time them in interleaved rounds (a burst of load from elsewhere hits one
    round of every method rather than all repeats of one) and keep each one's best."""
    for name, run in list(runs.items()):  # the cold round, timed too: on a GPU it pays each shape's one-time setup
        try:
            tokens, seconds = _timed(run, device)
        except Exception as e:  # e.g. a compiler missing on this machine: the other rows still run
            print(f"PROGRESS {name}: failed in the warm-up round: {type(e).__name__}: {str(e)[:300]}",
                  file=sys.stderr, flush=True)
            del runs[name]
            continue
        print(f"PROGRESS {name}: {tokens / seconds:.0f} tok/s (cold: the warm-up round)", file=sys.stderr, flush=True)
    best = dict.fromkeys(runs, 0.0)
    for _ in range(repeats):
        for name, run in runs.items():
            tokens, seconds = _timed(run, device)
            best[name] = max(best[name], tokens / seconds)
            # one line per timed round, at once: a caller's time limit keeps the rows already measured
            print(f"PROGRESS {name}: {tokens / seconds:.0f} tok/s", file=sys.stderr, flush=True)
    return best


def sync_ms(model, precision: str, repeats: int) -> float:
    """Best time of the embedded engine's `load_weights` (copy + fresh quantization)."""
    device = next(model.parameters()).device
    engine = EmbeddedEngine(precision)
    engine.load_weights(model)
    best = float("inf")
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        engine.load_weights(model)
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def stop_ids(vocab: int, mean_response: int | None) -> list[int] | None:
    """The stop ids giving ~`mean_response` tokens per row on a near-uniform model: the top round(vocab / mean)
    ids (None without a mean: no stop, every row runs to the cap)."""
    if mean_response is None:
        return None
    count = max(1, round(vocab / mean_response))
    return list(range(vocab - count, vocab))


def engine_runner(engine, prompts: torch.Tensor, new_tokens: int, lengths: list | None = None) -> Callable[[], int]:
    """Generate once per call; returns the useful (response) tokens. `lengths` collects each row's length."""
    mask = torch.ones_like(prompts, dtype=torch.bool)
    sampling = SamplingParams(max_new_tokens=new_tokens)
    gen = torch.Generator(device=prompts.device)

    def run() -> int:  # the same seed every call: every engine variant samples the same responses
        rollout = engine.generate(prompts, mask, 1, sampling, gen.manual_seed(0))
        if lengths is not None:
            lengths.extend(rollout.response_mask.sum(1).tolist())
        return rollout.num_tokens()

    return run


def hf_runner(model, prompts: torch.Tensor, new_tokens: int) -> Callable[[], int]:
    mask = torch.ones_like(prompts)

    @torch.no_grad()
    def run() -> int:
        out = model.generate(
            prompts, attention_mask=mask, do_sample=True, top_k=0, top_p=1.0, temperature=1.0,
            max_new_tokens=new_tokens, min_new_tokens=new_tokens, output_logits=True,
            return_dict_in_generate=True, pad_token_id=0,
        )
        new = out.sequences[:, prompts.shape[1]:]
        logp = torch.log_softmax(torch.stack(out.logits, dim=1).float(), dim=-1).gather(-1, new[..., None])
        return int(logp.numel())

    return run


def make_prompts(vocab: int, batch: int, length: int, avoid: list[int] | None = None) -> torch.Tensor:
    """Random prompt ids in [1, vocab), none of them a stop id (`avoid`)."""
    top = min(avoid) if avoid else vocab
    return torch.randint(1, top, (batch, length), generator=torch.Generator().manual_seed(batch))


#: embedded engine variants (module docstring): label -> EmbeddedEngine keyword arguments
VARIANTS = {"eager": {}, "compiled": {"compile": True}, "graphs": {"cuda_graphs": True}, "plain": {"cpu_kernels": "plain"},
            "chunked": {"refill": False}, "varlen": {"cpu_attention": "varlen"},
            "varlen_sync8": {"cpu_attention": "varlen", "sync_every": 8},
            "before": {"sync_every": 1, "compact": False, "cpu_kernels": "plain", "refill": False}}
BEFORE = "before"


def slot_knobs(args: argparse.Namespace) -> dict[str, int]:
    """--slots N as the embedded engine's knob: a chunk (or, with refill, the cache) of N sequences."""
    return {} if args.slots is None else {"chunk_tokens": args.slots * (args.prompt_len + args.new_tokens)}


def embedded_label(variant: str) -> str:
    return "embedded" if variant == "eager" else f"embedded ({variant})"


def vllm_variants() -> list[tuple[str, str]]:
    """(precision, weight granularity) rows vLLM offers on this platform (bench.rollout.vllm_engine)."""
    from bench.rollout.vllm_engine import FP8_SCHEMES, import_vllm

    import_vllm()
    from vllm.platforms import current_platform

    device = "cpu" if current_platform.is_cpu() else "gpu"
    return [("fp32", "per_channel"), ("bf16", "per_channel")] + [("fp8_e4m3", g) for g in FP8_SCHEMES[device]]


def vllm_engine(spec: dict, model: torch.nn.Module):
    """A built vLLM engine for one precision of `spec` (its stop ids, lengths, batch), timed."""
    from bench.rollout.vllm_engine import VLLMEngine

    max_len = spec["prompt_len"] + spec["new_tokens"]
    engine = VLLMEngine(spec["precision"], weight_granularity=spec["granularity"], eos_id=spec.get("stops"), max_len=max_len,
                        gpu_memory_utilization=spec["gpu_memory_utilization"],
                        max_num_seqs=spec.get("slots") or max(spec["batch"]),
                        enforce_eager=spec.get("enforce_eager"))
    engine.load_weights(model)
    return engine


def vllm_sync_ms(engine, model, repeats: int) -> float:
    syncs = []
    for _ in range(repeats):
        engine.load_weights(model)
        syncs.append(engine.last_sync_s)
    return min(syncs) * 1e3


def vllm_child(spec: dict) -> dict:
    """One vLLM precision, in this (child) process: engine start, best sync, best tokens/s per batch."""
    torch.set_num_threads(spec["threads"])
    cuda = torch.cuda.is_available()
    max_len = spec["prompt_len"] + spec["new_tokens"]
    # the trainer's copy: fp32 on CPU; bf16 on the GPU (fp32 masters of an 8B model would not leave room)
    model = build_model(spec["preset"], spec["layers"], max_len, torch.bfloat16 if cuda else torch.float32,
                        "cuda" if cuda else "cpu")
    engine = vllm_engine(spec, model)
    out = {"start_s": engine.build_s, "sync_ms": vllm_sync_ms(engine, model, spec["repeats"]), "tok_s": {}}
    for B in spec["batch"]:
        prompts = make_prompts(model.config.vocab_size, B, spec["prompt_len"], spec.get("stops"))
        run = engine_runner(engine, prompts, spec["new_tokens"])
        device = torch.device("cuda" if cuda else "cpu")  # vLLM's
        out["tok_s"][B] = best_tokens_per_s({"r": run}, spec["repeats"], device)["r"]
    return out


def vllm_specs(args) -> list[dict]:
    """One spec per vLLM row: each precision of the platform, eager; with --vllm-compiled also without enforce_eager
    (CUDA graphs on a GPU, torch.compile on a CPU: bench.rollout.vllm_engine.ENFORCE_EAGER)."""
    modes = (True, False) if args.vllm_compiled else (None,)
    return [dict(precision=precision, granularity=granularity, preset=args.preset, layers=args.layers,
                 batch=args.batch, new_tokens=args.new_tokens, prompt_len=args.prompt_len, threads=args.threads,
                 repeats=args.repeats, gpu_memory_utilization=args.gpu_memory_utilization, stops=args.stops,
                 slots=args.slots,
                 enforce_eager=eager)
            for precision, granularity in vllm_variants() if precision in args.precisions for eager in modes]


def vllm_label(precision: str, granularity: str, enforce_eager: bool | None = None) -> str:
    engine = "vllm (compiled)" if enforce_eager is False else "vllm"
    return f"{engine} | {precision}" + (f" {granularity}" if precision == "fp8_e4m3" else "")


def run_vllm_children(args, rows: dict, syncs: dict, notes: list[str]) -> None:
    """A GPU: each vLLM precision in its own child process (its GPU memory is gone before the next)."""
    for spec in vllm_specs(args):
        name = vllm_label(spec["precision"], spec["granularity"], spec["enforce_eager"])
        proc = subprocess.run([sys.executable, "-m", "bench.benchmarks.rollout", "--vllm-child", json.dumps(spec)],
                              capture_output=True, text=True)
        result = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if proc.returncode or not result:
            notes.append(f"{name}: failed ({proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode})")
            continue
        res = json.loads(result[-1][len("RESULT "):])
        rows[name] = {int(B): v for B, v in res["tok_s"].items()}
        syncs[name] = f"{res['sync_ms']:.1f}"
        notes.append(f"{name}: engine start {res['start_s']:.1f} s")


def decode_fit(rows: dict, args, shape: Any, lengths: dict) -> list[str]:
    """The embedded engine's cost per decode step in bench/launch/budget.py's form, t(B) = f + B x r, fitted by least
    squares over the batch sizes: from every embedded row of a run without stop ids (all B rows decode every step, a
    step takes B / tokens-per-second), else from the `before` rows (they keep all B rows to the longest: a step takes
    the run's time over its longest response). Prefill is left in. f is what a step costs whatever its rows (weights
    read, kernel launches), r what each row adds; f over the layers and the eager kernels per layer
    (budget.KERNELS_PER_LAYER) is this machine's cost per kernel, the analogue of budget.KERNEL_S."""
    from bench.launch.budget import ACT_QUANT_KERNELS, KERNELS_PER_LAYER, LINEARS_PER_LAYER
    from bench.launch.memory import EIGHT_BIT

    if len(args.batch) < 2:
        return []
    lines = []
    for name, by_batch in rows.items():
        engine, prec = name.split(" | ")
        if not engine.startswith("embedded") or len(by_batch) < 2 or (args.stops and engine != embedded_label(BEFORE)):
            continue
        if args.stops:  # one call's lengths are the first B collected (every call samples the same responses)
            per_step = {b: sum(lengths[b][:b]) / by_batch[b] / max(lengths[b][:b]) for b in by_batch if lengths.get(b)}
        else:
            per_step = {b: b / by_batch[b] for b in by_batch}
        if len(per_step) < 2:
            continue
        B = torch.tensor([float(b) for b in per_step], dtype=torch.float64)
        t = torch.tensor(list(per_step.values()), dtype=torch.float64)
        f, r = torch.linalg.lstsq(torch.stack([torch.ones_like(B), B], dim=1), t[:, None]).solution.flatten().tolist()
        kernels = KERNELS_PER_LAYER["eager"] + (LINEARS_PER_LAYER * ACT_QUANT_KERNELS["eager"] if prec in EIGHT_BIT else 0)
        per_kernel = f"{f / (shape.config.num_hidden_layers * kernels) * 1e6:.3g}"
        if f <= 0 or r < 0:  # a step cannot cost less with more rows: the timings are noise (a loaded machine)
            per_kernel += " (not a fit: a cost below zero; rerun on an idle machine)"
        lines.append(f"| {engine} | {prec} | {f * 1e3:.3g} | {r * 1e6:.3g} | {per_kernel} |")
    return (["| engine | precision | f ms per step | r us per row and step | f per layer-kernel us |",
             "|---|---|---|---|---|"] + lines) if lines else []


def run_all(args, rows: dict, syncs: dict, notes: list[str], lengths: dict) -> None:
    """The embedded variants (and, on a CPU, the vLLM engines) timed in interleaved rounds per batch size."""
    device = resolve_device(args.device) if "embedded" in args.engines else torch.device("cpu")
    model = build_model(args.preset, args.layers, args.prompt_len + args.new_tokens + 1).to(device)
    model_bf16 = copy.deepcopy(model).to(torch.bfloat16) if args.hf else None
    embedded = [p for p in EMBEDDED_PRECISIONS if p in args.precisions] if "embedded" in args.engines else []
    vllm: dict[str, object] = {}
    if "vllm" in args.engines:  # on a CPU (the caller sends a GPU's vLLM rows to child processes)
        for spec in vllm_specs(args):
            name = vllm_label(spec["precision"], spec["granularity"], spec["enforce_eager"])
            vllm[name] = engine = vllm_engine(spec, model)
            syncs[name] = f"{vllm_sync_ms(engine, model, args.repeats):.1f}"
            notes.append(f"{name}: engine start {engine.build_s:.1f} s")
    for B in args.batch:
        prompts = make_prompts(model.config.vocab_size, B, args.prompt_len, args.stops).to(device)
        runs = {}
        for prec in embedded:
            for variant in args.variants:
                engine = EmbeddedEngine(prec, eos_id=args.stops, **slot_knobs(args), **VARIANTS[variant])
                engine.load_weights(model)
                seen = lengths.setdefault(B, []) if variant == args.variants[0] and prec == embedded[0] else None
                runs[f"{embedded_label(variant)} | {prec}"] = engine_runner(engine, prompts, args.new_tokens, seen)
        for name, engine in vllm.items():
            runs[name] = engine_runner(engine, prompts, args.new_tokens)
        if args.hf:
            runs["hf_generate | fp32"] = hf_runner(model, prompts, args.new_tokens)
            runs["hf_generate | bf16"] = hf_runner(model_bf16, prompts, args.new_tokens)
        for name, tok_s in best_tokens_per_s(runs, args.repeats, device).items():
            rows.setdefault(name, {})[B] = tok_s
        del runs
        gc.collect()
    for prec in embedded:
        syncs[f"embedded | {prec}"] = f"{sync_ms(model, prec, args.repeats):.1f}"
    for engine in vllm.values():
        engine.close()


def ratio_table(rows: dict, args) -> list[str]:
    """Each embedded variant's useful tokens/s over the `before` engine's and over vLLM's fp32 engines' (eager, and
    compiled with --vllm-compiled)."""
    refs = [name for name in ("vllm | fp32", "vllm (compiled) | fp32") if name in rows]
    cols = ["before"] + [r.split(" | ")[0] for r in refs]
    lines = ["| embedded | precision | " + " | ".join(f"B={B} vs {c}" for B in args.batch for c in cols) + " |",
             "|" + "---|" * (2 + len(cols) * len(args.batch))]
    for variant in args.variants:
        if variant == BEFORE:
            continue
        for prec in EMBEDDED_PRECISIONS:
            mine, before = rows.get(f"{embedded_label(variant)} | {prec}"), rows.get(f"{embedded_label(BEFORE)} | {prec}", {})
            if mine is None:
                continue
            cells = [f"{mine[B] / ref[B]:.2f}x" if B in ref else "-" for B in args.batch
                     for ref in [before] + [rows[r] for r in refs]]
            lines.append(f"| {variant} | {prec} | " + " | ".join(cells) + " |")
    return lines


def per_token_arrays(completions: list, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference for `--conversion`: VLLMEngine._to_rollout before issue 34, a Python lookup per token in vLLM's
    per-position log-prob dicts (logprobs=0, flat_logprobs=False)."""
    lengths = torch.tensor([len(c.token_ids) for c in completions])
    B, T = len(completions), int(lengths.max())
    tokens = torch.full((B, T), pad_id, dtype=torch.long)
    logp = torch.zeros(B, T, dtype=torch.float32)
    for i, c in enumerate(completions):
        toks = list(c.token_ids)
        tokens[i, : len(toks)] = torch.tensor(toks, dtype=torch.long)
        logp[i, : len(toks)] = torch.tensor([lp[t].logprob for t, lp in zip(toks, c.logprobs)])
    return tokens, logp


def conversion(args) -> None:
    """`--conversion`: vLLM's completions -> the rollout's tensors, the per-token loop (dict log-probs) against
    `completion_arrays` (flat log-probs), at --batch[0] x --new-tokens tokens: the conversion alone, best of
    --repeats, and the whole generate call of each format (vLLM builds a dict per token for the first)."""
    from bench.rollout.vllm_engine import completion_arrays

    torch.set_num_threads(args.threads)
    B, T = args.batch[0], args.new_tokens
    model = build_model(args.preset, args.layers, args.prompt_len + T + 1)
    spec = dict(precision="fp32", granularity="per_channel", batch=[B], new_tokens=T, prompt_len=args.prompt_len,
                gpu_memory_utilization=args.gpu_memory_utilization, stops=None)
    engine = vllm_engine(spec, model)
    vllm = engine.vllm
    prompts = [{"prompt_token_ids": row.tolist()} for row in make_prompts(model.config.vocab_size, B, args.prompt_len)]
    outputs, generate_s = {}, {}
    for flat in (False, True):
        params = [vllm.SamplingParams(n=1, temperature=1.0, top_k=0, max_tokens=T, min_tokens=T, logprobs=0,
                                      flat_logprobs=flat, ignore_eos=True, seed=i) for i in range(B)]
        t0 = time.perf_counter()
        outputs[flat] = [o.outputs[0] for o in engine.llm.generate(prompts, params, use_tqdm=False)]
        generate_s[flat] = time.perf_counter() - t0
    best = {"per-token loop (dict log-probs)": float("inf"), "completion_arrays (flat log-probs)": float("inf")}
    for _ in range(args.repeats):
        for name, flat, fn in (("per-token loop (dict log-probs)", False, per_token_arrays),
                               ("completion_arrays (flat log-probs)", True, completion_arrays)):
            t0 = time.perf_counter()
            fn(outputs[flat], 0)
            best[name] = min(best[name], time.perf_counter() - t0)
    old_tokens, old_logp = per_token_arrays(outputs[False], 0)
    new_tokens, new_logp, _ = completion_arrays(outputs[True], 0)
    same = torch.equal(old_tokens, torch.from_numpy(new_tokens)) and torch.equal(old_logp, torch.from_numpy(new_logp))
    engine.close()
    print(f"## vLLM output conversion: {B} x {T} tokens ({args.preset}, fp32, {args.threads} threads, best of "
          f"{args.repeats})\n")
    print("| conversion | seconds | generate call (s, one run) |\n|---|---|---|")
    for (name, sec), flat in zip(best.items(), (False, True)):
        print(f"| {name} | {sec:.4f} | {generate_s[flat]:.1f} |")
    ratio = best["per-token loop (dict log-probs)"] / best["completion_arrays (flat log-probs)"]
    print(f"\nspeed-up of the conversion: {ratio:.1f}x; both formats give the same tokens and log-probs "
          f"(same per-request seeds): {same}")


def main(argv: list[str] | None = None) -> None:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.conversion:
        conversion(args)
        return
    if args.vllm_child:
        print("RESULT " + json.dumps(vllm_child(json.loads(args.vllm_child))), flush=True)
        return
    if args.mean_response is not None:
        if args.mean_response < 1 or args.tail < 1:
            ap.error(f"--mean-response {args.mean_response} and --tail {args.tail:g} must be at least 1")
        args.new_tokens = int(args.tail * args.mean_response)
    torch.set_num_threads(args.threads)

    shape = build_model(args.preset, args.layers, 8, device="meta")
    args.stops = stop_ids(shape.config.vocab_size, args.mean_response)
    rows: dict[str, dict[int, float]] = {}
    syncs: dict[str, str] = {}
    notes: list[str] = []
    lengths: dict[int, list] = {}
    gpu_vllm = "vllm" in args.engines and torch.cuda.is_available()
    if "embedded" in args.engines or ("vllm" in args.engines and not gpu_vllm):
        run_all(args, rows, syncs, notes, lengths)
    if gpu_vllm:
        run_vllm_children(args, rows, syncs, notes)

    print_results(args, shape, rows, syncs, notes, lengths)


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's options (the module docstring says what each measures)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", nargs="+", choices=BENCHMARKED_ENGINES, default=["embedded"])
    ap.add_argument("--preset", "--model-size", dest="preset", choices=tuple(PRESETS), default="1m")
    ap.add_argument("--layers", type=int, default=None, help="cut the preset's depth (CPU runs of big shapes)")
    ap.add_argument("--batch", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--new-tokens", type=int, default=64, help="max new tokens (with --mean-response: tail x mean)")
    ap.add_argument("--mean-response", type=int, default=None,
                    help="long-tail lengths: stop ids giving ~this many tokens per row (module docstring)")
    ap.add_argument("--tail", type=float, default=8.0, help="with --mean-response: the cap, in means (default 8)")
    ap.add_argument("--variants", nargs="+", choices=tuple(VARIANTS), default=["eager"],
                    help="embedded engine variants (module docstring); 'before' is the reference of the ratios")
    ap.add_argument("--slots", type=int, default=None,
                    help="sequences decoding at once (embedded: the chunk's rows; vLLM: max_num_seqs); default all")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="auto", help="embedded engine: auto (cuda when available) | cpu | cuda")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--precisions", nargs="+", choices=EMBEDDED_PRECISIONS, default=list(EMBEDDED_PRECISIONS))
    ap.add_argument("--hf", action="store_true", help="add HF generate rows (fp32, bf16)")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.6,
                    help="vLLM's share of the GPU (the trainer's bf16 copy needs the rest: 16 GB for 8B)")
    ap.add_argument("--vllm-compiled", action="store_true",
                    help="add vLLM rows without enforce_eager (CUDA graphs / torch.compile)")
    ap.add_argument("--conversion", action="store_true",
                    help="time vLLM's completions -> rollout tensors, old loop vs numpy, at --batch[0] x --new-tokens")
    ap.add_argument("--vllm-child", help=argparse.SUPPRESS)
    return ap


def print_results(args: argparse.Namespace, shape: Any, rows: dict[str, dict[int, float]], syncs: dict[str, str],
                  notes: list[str], lengths: dict[int, list]) -> None:
    """The Markdown report of the timed rows: the setup, the tokens/s table, the ratios, the decode fit, the notes."""
    n_params = sum(p.numel() for p in shape.parameters())
    cuda = torch.cuda.is_available()
    device = torch.cuda.get_device_name() if cuda else (platform.processor() or platform.machine())
    stops = (f", {len(args.stops)} stop ids (mean response ~{args.mean_response}, cap {args.new_tokens})"
             if args.stops else f", {args.new_tokens} new tokens, no stop id")
    print(f"## Rollout throughput: {args.preset}{f' cut to {args.layers} layers' if args.layers else ''} "
          f"({n_params / 1e6:.1f}M params), prompt {args.prompt_len}{stops}, "
          f"{args.threads} threads, best of {args.repeats}\n")
    print(f"torch {torch.__version__}, {device}, CPU capability {torch.backends.cpu.get_cpu_capability()}, "
          f"fast int8 _int_mm (VNNI): {fast_int_mm()}, native bf16 matmul: {native_bf16_matmul()}\n")
    if not native_bf16_matmul() or "embedded" in args.engines:
        print("CPU rows: bf16 / fp8 / int8 without native hardware are EMULATED here; their speed is the "
              "emulation's, not a speed-up claim (measure low-precision speed on a GPU).\n")
    for B, seen in lengths.items():
        if args.stops and seen:
            print(f"B={B}: response length mean {sum(seen) / len(seen):.0f}, max {max(seen):.0f} "
                  f"(every timed round of the first embedded row)\n")
    header = "| engine | precision | " + " | ".join(f"B={B} tok/s | B={B} vs bf16" for B in args.batch)
    print(header + " | sync ms |")
    print("|" + "---|" * (3 + 2 * len(args.batch)))
    for name, by_batch in rows.items():
        engine, precision = name.split(" | ")
        ref = rows.get(f"{engine} | bf16", {})
        cells = " | ".join(
            f"{by_batch[B]:.0f} | " + (f"{by_batch[B] / ref[B]:.2f}x" if B in ref else "-") for B in args.batch
        )
        print(f"| {engine} | {precision} | {cells} | {syncs.get(name, '-')} |")
    if "embedded" in args.engines and (BEFORE in args.variants or "vllm | fp32" in rows):
        print("\nUseful tokens/s ratios:\n")
        print("\n".join(ratio_table(rows, args)))
    fit = decode_fit(rows, args, shape, lengths)
    if fit:
        print("\nThe embedded decode's cost per step, fitted as t(B) = f + B x r over the batch sizes "
              "(bench/launch/budget.py's form; prefill left in):\n")
        print("\n".join(fit))
    for note in notes:
        print(f"\n- {note}", end="")
    print()


if __name__ == "__main__":
    main()
