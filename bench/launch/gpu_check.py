"""The GPU machine check behind `scripts/gpu_check.sh`: every GPU path of the suite, run once, one Markdown report.

    python -m bench.launch.gpu_check [--report gpu_check_report.md]      on a machine with an NVIDIA GPU
    python -m bench.launch.gpu_check --self-test [--report PATH]         the same steps on the CPU, tiny shapes

Steps (each in a child process where it holds the GPU, so one step's memory is gone before the next; a failing
step is reported with its error and the others still run):
  1. environment       torch / CUDA / GPU / vLLM versions
  2. fp8 precision     bench.benchmarks.fp8_precision: the FP8 GEMM's accumulator bits and its error against an exact
                       sum, per output dtype and scaling path (what the FP8 engine test's ceiling depends on)
  3. cuda tests        `pytest -m cuda` (tests/unit/test_gpu_kernels.py and the other cuda-marked tests)
  4. qurl_table1       2 steps of paper/qurl_table1's training shape (256 sequences, micro-batch 8, 512 new tokens,
                       PPO critic) on a random-init Qwen2.5-0.5B built from its config (nothing downloaded; a
                       character tokenizer, the GSM8K fixture): peak torch memory against bench/launch/memory.py's estimate
  4b. long sequences   bench.benchmarks.trainer_memory: peak memory and seconds of one training step on one 8.4k- and
                       one 16.4k-token sequence at the Qwen2.5-1.5B shape (micro-batches cut to their rows, the lm_head
                       in slices) against bench/launch/memory.py's estimate for it
  5. engine steps      3 training steps per engine x precision on a small random Qwen2 (head_dim 64): embedded bf16, fp8_e4m3
                       (torch._scaled_mm), int8 (torch._int_mm); vLLM bf16 and fp8_e4m3 with in-place sync
                       (where vLLM is installed); tokens/s, sync s and the mismatch KL of the last step
  6. int8 layouts      bench.benchmarks.int8_layout: torch._int_mm with column- vs row-major weights (M2)
  7. multi-GPU         on a machine with several GPUs: one run over all of them (train.nproc_per_node), embedded and
                       vLLM engines (one per rank)
  8. vLLM rollout      bench.benchmarks.rollout --engines vllm at random-init 1.5B and 8B shapes: bf16 vs fp8 decode
                       tokens/s and sync + re-quantization ms
The self-test runs steps 1, 2 (torch's CPU fallback), 4 and 4b at tiny shapes, 5 (embedded only), 6 at small shapes
and 7 on 2 CPU processes (gloo): it checks the driver, not the GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
       "WANDB_MODE": "offline", "WANDB_SILENT": "true", "TOKENIZERS_PARALLELISM": "false"}
#: Qwen2.5-0.5B-Instruct's published config.json shape (bench/launch/memory.py SHAPES)
QWEN05 = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
              intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True, rope_theta=1e6, rms_norm_eps=1e-6)
TINY05 = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=128, vocab_size=1024, tie_word_embeddings=True)


def run(cmd: list[str], timeout: float) -> tuple[int, str, float]:
    """(exit code, the last 6000 characters of stdout + stderr, seconds) of a child process in the repo."""
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=timeout)
        return p.returncode, (p.stdout + p.stderr)[-6000:], time.perf_counter() - t0
    except subprocess.TimeoutExpired as e:
        out = ((e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""))
        return 124, out[-6000:] + f"\n(timed out after {timeout:.0f} s)", time.perf_counter() - t0


def fenced(text: str) -> str:
    return "```\n" + text.strip() + "\n```"


def step_environment() -> str:
    code = ("import torch, json, importlib.metadata as md; d = {'torch': torch.__version__, 'cuda': torch.version.cuda, "
            "'gpu': torch.cuda.get_device_name() if torch.cuda.is_available() else None, 'python': __import__('sys').version.split()[0]}\n"
            "for name in ('transformers', 'hydra-core', 'datasets', 'vllm'):\n"
            " try: d[name] = md.version(name)\n except md.PackageNotFoundError: d[name] = None\nprint(json.dumps(d))")
    rc, out, _ = run([sys.executable, "-c", code], 300)
    return fenced(out)


def step_cuda_tests() -> str:
    rc, out, s = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "cuda", "-rfs", "--tb=line",
                      "tests/unit", "tests/integration"], 240)
    return f"exit {rc} in {s:.0f} s\n\n" + fenced(out[-4000:])  # --tb=line: one line per failure, its message


#: the engine rows' model: the random-init mini Qwen2 widened to head_dim 64 (vLLM's CPU attention has no kernel
#: for the mini's head_dim 16; GPU kernels want >= 32 too)
MODEL = ("model=mini_qwen2", "model.hidden_size=256", "model.intermediate_size=512")
ENGINE_ROWS = (("embedded", "bf16"), ("embedded", "fp8_e4m3"), ("embedded", "int8"), ("vllm", "bf16"), ("vllm", "fp8_e4m3"))


def run_briefly(overrides: list[str], timeout: float) -> tuple[int, str, float, dict[str, Any]]:
    """A few steps of the tiny model with `overrides` in a scratch results directory: (exit code, output, seconds,
    its last metrics row or {})."""
    with tempfile.TemporaryDirectory(prefix="qrl-gpu-check-") as out_root:
        rc, out, s = run([sys.executable, "-m", "bench", *MODEL, *overrides, "train.group_size=4", "train.eval_every=100",
                          "task.n_test=16", "tracking=disabled", f"out_root={out_root}"], timeout)
        rows = [json.loads(line) for f in Path(out_root).rglob("metrics.jsonl") for line in f.read_text().splitlines()]
    return rc, out, s, (rows[-1] if rows else {})


def step_engines(device: str, have_vllm: bool) -> str:
    steps, batch = ("3", "32") if device == "cuda" else ("1", "8")
    lines = ["| engine | precision | exit | s | rollout tok/s | sync s | KL k3 |", "|---|---|---|---|---|---|---|"]
    errors = []
    for engine, precision in ENGINE_ROWS:
        if engine == "vllm" and not have_vllm:
            lines.append(f"| {engine} | {precision} | not run: vLLM is not installed | | | | |")
            continue
        method = "bf16" if precision == "bf16" else "naive"  # the uncorrected arm at a low precision
        rc, out, s, last = run_briefly([f"method={method}", f"rollout={engine}", f"rollout.precision={precision}",
                                        f"train.device={device}", f"train.steps={steps}", f"train.batch_size={batch}"],
                                       150)
        cells = [f"{last.get(k, float('nan')):.3g}" for k in ("time/rollout_tokens_per_s", "time/sync_s", "mismatch/kl_k3")]
        lines.append(f"| {engine} | {precision} | {rc} | {s:.0f} | " + " | ".join(cells) + " |")
        if rc != 0:
            errors.append(f"{engine} {precision} failed:\n\n{fenced(out[-1200:])}")
    return "\n".join(lines + [""] + errors)


def step_multi_gpu(gpus: int, have_vllm: bool, device: str = "cuda") -> str:
    """One run over every GPU (train.nproc_per_node): FSDP2 shards, one engine per rank (docs/scaling.md)."""
    lines = ["| engine | precision | ranks | exit | s | rollout tok/s | KL k3 |", "|---|---|---|---|---|---|---|"]
    errors = []
    for engine, precision in (("embedded", "fp8_e4m3"), ("vllm", "fp8_e4m3")):
        if engine == "vllm" and not have_vllm:
            lines.append(f"| {engine} | {precision} | {gpus} | not run: vLLM is not installed | | | |")
            continue
        rc, out, s, last = run_briefly(["method=tis", f"rollout={engine}", f"rollout.precision={precision}",
                                        f"train.device={device}", f"train.nproc_per_node={gpus}", "train.steps=3",
                                        f"train.batch_size={8 * gpus}"], 300)
        cells = [f"{last.get(k, float('nan')):.3g}" for k in ("time/rollout_tokens_per_s", "mismatch/kl_k3")]
        lines.append(f"| {engine} | {precision} | {gpus} | {rc} | {s:.0f} | " + " | ".join(cells) + " |")
        if rc != 0:
            errors.append(f"{engine} {precision} on {gpus} ranks failed:\n\n{fenced(out[-1200:])}")
    return "\n".join(lines + [""] + errors)


def qurl_child(args: argparse.Namespace) -> None:
    """Inside the child: build the random-init model dir, run 2 steps, print the peak memory and the estimate."""
    import torch
    import transformers as tr
    from hydra import compose, initialize_config_dir

    from bench.launch.cli import execute
    from bench.config import CONF_DIR
    from bench.launch.memory import estimate_memory
    from bench.models.tokenizer import build_char_tokenizer

    device = args.device
    shape = QWEN05 if device == "cuda" else TINY05
    with tempfile.TemporaryDirectory(prefix="qrl-qwen05-") as model_dir, \
            tempfile.TemporaryDirectory(prefix="qrl-gpu-check-") as out_root:
        with torch.device(device):
            model = tr.Qwen2ForCausalLM(tr.Qwen2Config(**shape, max_position_embeddings=4096))
        model.save_pretrained(model_dir)
        build_char_tokenizer().save_pretrained(model_dir)
        del model
        real = ["train.batch_size=256", "train.minibatches=4", "task.max_new_tokens=512"] if device == "cuda" else \
               ["train.batch_size=8", "train.minibatches=2", "train.micro_batch_size=2", "task.max_new_tokens=16"]
        overrides = ["+experiment=paper/qurl_table1_mini", "model=hf", f"model.path={model_dir}", "model.name=qwen05-shape",
                     "model.max_length=4096", f"train.device={device}", "train.steps=2", "train.micro_batch_size=8",
                     "train.micro_batch_tokens=4096", "train.threads=0", "budget.prompt_tokens=400",
                     f"out_root={out_root}", *real]
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose("config", overrides=overrides)
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        outcome = execute(cfg)
        est = estimate_memory(cfg)
        peak = torch.cuda.max_memory_allocated() / 1e9 if device == "cuda" else None
        reserved = torch.cuda.max_memory_reserved() / 1e9 if device == "cuda" else None
        print("RESULT " + json.dumps({"status": f"{outcome} {outcome.reason or ''}".strip(), "seconds": time.perf_counter() - t0,
                                      "peak_allocated_gb": peak, "peak_reserved_gb": reserved,
                                      "estimate_gb": est.peak if est else None, "estimate": est.line() if est else None,
                                      "phases": est.phases if est else None}))


def step_qurl_table1(device: str) -> str:
    rc, out, s = run([sys.executable, "-m", "bench.launch.gpu_check", "--qurl-child", "--device", device], 300)
    result = next((json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")), None)
    if result is None:
        return f"exit {rc} after {s:.0f} s, no result:\n\n{fenced(out[-1500:])}"
    return (f"exit {rc}, {s:.0f} s, run status {result['status']}\n\n"
            f"| measured peak allocated GB | peak reserved GB | estimated peak GB (bench/launch/memory.py) |\n|---|---|---|\n"
            f"| {result['peak_allocated_gb']} | {result['peak_reserved_gb']} | {result['estimate_gb']:.1f} |\n\n"
            f"estimate: `{result['estimate']}`; phases (GB): {json.dumps({k: round(v, 1) for k, v in result['phases'].items()})}"
            "\n\n(The estimate assumes prompts of 400 tokens (`budget.prompt_tokens`): the fixture's GSM8K questions "
            "in characters; the measured peak counts tensors torch allocated, not the allocator's fragmentation.)")


#: (shape, sequence lengths) of the long-sequence step: the 1.5B shape at qurl_table2's and p3o_fp8's longest
#: sequences (prompt + response) on a GPU; the 2-layer, full-vocabulary smoke shape at a short one on the CPU
LONG = {"cuda": ("qwen2.5-1.5b", "8448,16640"), "cpu": ("smoke", "320")}


def step_long_sequences(device: str) -> str:
    shape, lengths = LONG[device]
    rc, out, s = run([sys.executable, "-m", "bench.benchmarks.trainer_memory", "--shape", shape, "--lengths", lengths,
                      "--device", device], 300)
    return f"exit {rc}, {s:.0f} s\n\n" + (out if rc == 0 else fenced(out))


def step_fp8_precision(device: str) -> str:
    rc, out, s = run([sys.executable, "-m", "bench.benchmarks.fp8_precision", "--device", device], 120)
    return out if rc == 0 else f"exit {rc}:\n\n{fenced(out)}"


def step_int8_layouts(device: str) -> str:
    extra = [] if device == "cuda" else ["--tokens", "17", "64", "--repeats", "2", "--shapes", "2"]
    rc, out, s = run([sys.executable, "-m", "bench.benchmarks.int8_layout", "--device", device, *extra], 180)
    return out if rc == 0 else f"exit {rc}:\n\n{fenced(out)}"


def step_vllm_rollout() -> str:
    parts = []
    for preset, batch in (("qwen2.5-1.5b", ["64", "256"]), ("qwen3-8b", ["64"])):
        rc, out, s = run([sys.executable, "-m", "bench.benchmarks.rollout", "--engines", "vllm", "--preset", preset,
                          "--batch", *batch, "--new-tokens", "256", "--repeats", "2", "--precisions", "bf16", "fp8_e4m3"], 600)
        parts.append(f"### {preset} ({s:.0f} s, exit {rc})\n\n" + (out if rc == 0 else fenced(out)))
    return "\n\n".join(parts)


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--self-test", action="store_true", help="run the steps on the CPU at tiny shapes")
    ap.add_argument("--report", default="gpu_check_report.md")
    ap.add_argument("--deadline", type=float, default=480.0,
                    help="seconds after which the remaining steps are skipped (reported as such); default 480")
    ap.add_argument("--qurl-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.qurl_child:
        qurl_child(args)
        return 0
    import importlib.util

    device = "cpu" if args.self_test else "cuda"
    have_vllm = importlib.util.find_spec("vllm") is not None and not args.self_test
    steps = [("Environment", step_environment), ("FP8 GEMM precision", lambda: step_fp8_precision(device))]
    if not args.self_test:
        steps.append(("CUDA-marked tests", step_cuda_tests))
    steps += [("qurl_table1 at its real shape: peak memory against the estimate", lambda: step_qurl_table1(device)),
              ("Long sequences: one training step against the estimate", lambda: step_long_sequences(device)),
              ("Engine x precision: a few training steps each", lambda: step_engines(device, have_vllm)),
              ("INT8 weight layouts (M2)", lambda: step_int8_layouts(device))]
    gpus = 2 if args.self_test else _cuda_count()
    if gpus > 1:
        where = "CPU processes (gloo)" if args.self_test else "GPUs"
        steps.append((f"One run on {gpus} {where} (FSDP2, an engine per rank)",
                      lambda: step_multi_gpu(gpus, have_vllm, device)))
    if have_vllm:
        steps.append(("vLLM rollout: bf16 vs fp8 decode, sync + re-quantization", step_vllm_rollout))
    elif not args.self_test:
        steps.append(("vLLM rollout: bf16 vs fp8 decode, sync + re-quantization",
                      lambda: "not run: vLLM is not installed in this interpreter (scripts/gpu_check.sh installs it "
                              "where pip can reach PyPI)"))
    title = "CPU self-test (no GPU: this checks the driver, not a GPU)" if args.self_test else "GPU check"
    sections, failed = [f"# qrl-bench {title}", "", time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())], 0
    start = time.perf_counter()
    for name, step in steps:
        t0 = time.perf_counter()
        if t0 - start > args.deadline:  # the report must exist before the caller's own limit kills us
            body = f"not run: the check's deadline (--deadline {args.deadline:.0f} s) had passed"
        else:
            try:
                body = step()
            except Exception as e:  # a broken step must not hide the others' results
                body, failed = f"step failed: {type(e).__name__}: {e}", failed + 1
        print(f"gpu_check: {name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        sections += ["", f"## {name}", "", f"({time.perf_counter() - t0:.0f} s)", "", body]
        Path(args.report).write_text("\n".join(sections) + "\n")  # after every step: a killed check keeps its results
    print(f"gpu_check: report written to {args.report} after {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
