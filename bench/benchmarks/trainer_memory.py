"""Peak memory and seconds of the trainer's step on long sequences, against the dry run's estimate; the log-prob
phase before and after the chunked lm_head; trainer tokens/s with and without micro-batches cut to their rows.

    python -m bench.benchmarks.trainer_memory --shape qwen2.5-1.5b --lengths 8448,16640 [--device cuda] [--before]
    python -m bench.benchmarks.trainer_memory --shape smoke --logprob-phase --lengths 2048
    python -m bench.benchmarks.trainer_memory --shape smoke --throughput [--max-len 1024] [--rows 64]

Random weights at the model's real shape (bench/launch/memory.py SHAPES; memory and time do not depend on the
values); `--shape smoke` is a 2-layer model with the real 151,936-entry vocabulary, for a CPU. Every measurement
runs in a fresh process (a peak cannot be reset within one on the CPU): on CUDA torch's max_memory_allocated, on the
CPU the peak resident set minus the process's size before the model was built.

Default (a training step): one sequence of L tokens (256 prompt + L - 256 response) through one optimizer step
as a run computes it (bench/compute.py: bf16 compute over fp32 master weights, gradient checkpointing, AdamW),
one row per length: peak GB and seconds, and the estimate bench/launch/memory.py makes for it (trainer states,
autocast copies and the training phase of a one-sequence micro-batch). `--before` adds the same step through the
lm_head as it was before issue 33 (every position's logits at once, `full_logits_logprobs`).

`--logprob-phase`: the no-grad log-prob pass of one sequence of L tokens (the recompute pass), full logits
(before) against the chunked lm_head (after); peak and the ratio.

`--throughput`: a batch whose response lengths have a long tail (L_max x u^4, mean L_max / 5), the recompute
pass and the micro-batched update (train.micro_batch_size=4) with every micro-batch at the batch's padded width
(before) and cut to its rows (after): trainer tokens/s (real tokens of the forwards over seconds) and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from typing import Any

from bench.benchmarks.logprob_memory import rss_mib

PROMPT = 256  # prompt tokens of the one-sequence steps
SMOKE = (128, 2, 4, 2, 32, 256, 151936, True)  # hidden, layers, heads, kv heads, head_dim, MLP, vocabulary, tied


def shape_of(name: str) -> tuple:
    """(shape tuple, hub path or None) of a conf/model preset name, or the CPU smoke shape."""
    if name == "smoke":
        return SMOKE, None
    from omegaconf import OmegaConf

    from bench.launch.config import CONF_DIR
    from bench.launch.memory import SHAPES

    preset = CONF_DIR / "model" / f"{name.removesuffix('-instruct')}-instruct.yaml"
    preset = preset if preset.exists() else CONF_DIR / "model" / f"{name}.yaml"
    if not preset.exists():
        raise SystemExit(f"--shape {name}: no such model preset in {CONF_DIR / 'model'} (or 'smoke')")
    path = str(OmegaConf.load(preset).get("path"))
    if path not in SHAPES:
        raise SystemExit(f"--shape {name}: {path} has no shape in bench/launch/memory.py SHAPES")
    return SHAPES[path], preset.stem


def build(shape: tuple, device: str, positions: int):
    import torch
    import transformers as tr

    hidden, layers, heads, kv, head_dim, mlp, vocab, tied = shape
    config = tr.Qwen2Config(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                            num_key_value_heads=kv, head_dim=head_dim, intermediate_size=mlp, vocab_size=vocab,
                            tie_word_embeddings=tied, max_position_embeddings=positions)
    with torch.device(device):
        return tr.Qwen2ForCausalLM(config).train()


def rollout_of(lengths: list[int], vocab: int, device: str, prompt: int = PROMPT):
    """Rows of `prompt` prompt tokens and the given response lengths, right-padded to the longest."""
    import torch

    from bench.rollout.base import Rollout

    g = torch.Generator().manual_seed(0)
    B, T = len(lengths), max(lengths)
    mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    return Rollout(torch.randint(0, vocab, (B, prompt), generator=g), torch.ones(B, prompt, dtype=torch.bool),
                   torch.randint(0, vocab, (B, T), generator=g) * mask, mask, torch.zeros(B, T)).to(device)


def full_logits_logprobs(model: Any, rollout: Any, temperature: float = 1.0, dtype: str = "fp32",
                         with_entropy: bool = False) -> tuple:
    """The trainer's log-probs as they were computed before the chunked lm_head: every position's logits at
    once, their fp32 copy / T, a log-softmax kept for backward, the entropy from it (the "before" of N9)."""
    import torch

    from bench.models.logprobs import forward, sequence_inputs

    ids, attn, pos = sequence_inputs(rollout)
    P = rollout.prompt_ids.shape[1]
    logits = forward(model, dtype, input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False).logits
    logp_all = torch.log_softmax(logits[:, P - 1:].float() / temperature, dim=-1)
    del logits
    logp = logp_all.gather(-1, rollout.response_ids.unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def synchronize(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def measure(mode: str, shape_name: str, length: int, device: str, before: bool, threads: int,
            max_len: int, rows: int) -> dict:
    """One measurement in this process (the child of `main`)."""
    import torch

    import bench.compute as compute_mod
    from bench.compute import TrainerCompute, enable_gradient_checkpointing

    torch.set_num_threads(threads)
    if before and mode != "throughput":  # the lm_head as it was (N9); --throughput's before is the uncut batch (N4)
        compute_mod.token_logprobs = full_logits_logprobs
    shape, _ = shape_of(shape_name)
    base = rss_mib()
    model = build(shape, device, positions=max(length, max_len) + PROMPT)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    out: dict[str, Any] = {"length": length}
    if mode == "step":
        enable_gradient_checkpointing(model)
        compute = TrainerCompute(torch.device(device), "bf16", 1.0, micro_batch_size=1)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
        rollout = rollout_of([length - PROMPT], shape[6], device)
        synchronize(device)
        t0 = time.perf_counter()
        compute.backward(model, rollout, lambda lp: (-(lp * rollout.response_mask).sum() / length, {}), 0)
        compute.step(model, optimizer, 1.0, 0)
        synchronize(device)
        out["seconds"] = time.perf_counter() - t0
    elif mode == "logprob":
        compute = TrainerCompute(torch.device(device), "bf16", 1.0, micro_batch_size=1, micro_batch_tokens=None)
        rollout = rollout_of([length - PROMPT], shape[6], device)
        synchronize(device)
        t0 = time.perf_counter()
        compute.logprobs(model, rollout, with_entropy=True)
        synchronize(device)
        out["seconds"] = time.perf_counter() - t0
    else:  # throughput: a long-tailed batch, recompute + micro-batched update
        g = torch.Generator().manual_seed(1)
        lengths = [max(1, int(max_len * float(u) ** 4)) for u in torch.rand(rows, generator=g)]
        lengths[0] = max_len  # the batch is padded to its longest, as a rollout is
        rollout = rollout_of(lengths, shape[6], device, prompt=32)
        compute = TrainerCompute(torch.device(device), "bf16", 1.0, micro_batch_size=4, micro_batch_tokens=None,
                                 cut=not before)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
        synchronize(device)
        t0 = time.perf_counter()
        compute.logprobs(model, rollout)
        compute.backward(model, rollout, lambda lp: (-(lp * rollout.response_mask).sum() / sum(lengths), {}), 0)
        compute.step(model, optimizer, 1.0, 0)
        synchronize(device)
        out["seconds"] = time.perf_counter() - t0
        real = sum(32 + n - 1 for n in lengths)
        out |= {"real_tokens": 3 * real, "mean_len": sum(lengths) / rows, "pad_fraction": compute.metrics()["pad_fraction"]}
    if device == "cuda":
        out["peak_gb"] = torch.cuda.max_memory_allocated() / 1e9
    else:
        out["peak_gb"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base) * 2**20 / 1e9
    return out


def estimate_gb(shape_name: str, length: int) -> float | None:
    """The dry run's estimate for the one-sequence step: trainer states + autocast copies + training phase."""
    _, preset = shape_of(shape_name)
    if preset is None:
        return None
    from hydra import compose, initialize_config_dir

    from bench.launch.config import CONF_DIR, register_configs
    from bench.launch.memory import estimate_memory

    register_configs()  # the group yamls extend the registered schemas (the GPU check's first 1.5B run failed here)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[
            f"model={preset}", "train.batch_size=1", "train.group_size=1", "train.minibatches=1",
            "train.micro_batch_size=1", "train.micro_batch_tokens=null", "train.gradient_checkpointing=true",
            "train.dtype=bf16", f"budget.prompt_tokens={PROMPT}", f"task.max_new_tokens={length - PROMPT}"])
    est = estimate_memory(cfg)
    return est.parts["trainer states"] + est.parts.get("autocast copies", 0.0) + est.phases["training"]


def child(args: argparse.Namespace, mode: str, length: int, before: bool) -> dict:
    cmd = [sys.executable, "-m", "bench.benchmarks.trainer_memory", "--child", mode, "--shape", args.shape,
           "--lengths", str(length), "--device", args.device, "--threads", str(args.threads),
           "--max-len", str(args.max_len), "--rows", str(args.rows)] + (["--before"] if before else [])
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["?"])[-1]
        return {"length": length, "error": "out of memory" if "out of memory" in res.stderr.lower() else last[:120]}
    return json.loads(res.stdout.strip().splitlines()[-1])


def cell(r: dict, key: str, fmt: str) -> str:
    return r["error"] if "error" in r else format(r[key], fmt)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="qwen2.5-1.5b", help="a conf/model preset (qwen2.5-1.5b, ...) or smoke (CPU)")
    ap.add_argument("--lengths", default="8448,16640", help="comma-separated sequence lengths (prompt + response)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--before", action="store_true", help="also the step through the full-logits lm_head")
    ap.add_argument("--logprob-phase", action="store_true", help="the no-grad log-prob pass, before and after")
    ap.add_argument("--throughput", action="store_true", help="trainer tokens/s, micro-batches uncut and cut")
    ap.add_argument("--max-len", type=int, default=1024, help="--throughput: the longest response")
    ap.add_argument("--rows", type=int, default=64, help="--throughput: sequences in the batch")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    if args.child is not None:
        print(json.dumps(measure(args.child, args.shape, lengths[0], args.device, args.before, args.threads,
                                 args.max_len, args.rows)))
        return
    where = f"shape {args.shape}, {args.device}, {args.threads} threads"
    if args.throughput:
        before, after = child(args, "throughput", 0, True), child(args, "throughput", 0, False)
        print(f"Trainer tokens/s, {args.rows} sequences, responses up to {args.max_len} tokens with a long tail "
              f"(mean {before.get('mean_len', float('nan')):.0f}), micro-batches of 4 ({where}):\n")
        print("| micro-batches | pad fraction | seconds | tokens/s |\n|---|---|---|---|")
        for name, r in (("at the padded width (before)", before), ("cut to their rows (after)", after)):
            tps = "-" if "error" in r else f"{r['real_tokens'] / r['seconds']:,.0f}"
            print(f"| {name} | {cell(r, 'pad_fraction', '.2f')} | {cell(r, 'seconds', '.2f')} | {tps} |")
        if "error" not in before and "error" not in after:
            print(f"\nratio after / before: {before['seconds'] / after['seconds']:.2f}x tokens/s")
        return
    if args.logprob_phase:
        print(f"Peak memory of the no-grad log-prob pass of one sequence ({where}):\n")
        print("| tokens | full logits (before) GB | chunked lm_head (after) GB | ratio |\n|---|---|---|---|")
        for L in lengths:
            b, a = child(args, "logprob", L, True), child(args, "logprob", L, False)
            ratio = "-" if "error" in a or "error" in b else f"{b['peak_gb'] / a['peak_gb']:.1f}x"
            print(f"| {L:,} | {cell(b, 'peak_gb', '.2f')} | {cell(a, 'peak_gb', '.2f')} | {ratio} |")
        return
    print(f"One training step on one sequence (prompt {PROMPT} + response; bf16 compute, fp32 AdamW, gradient "
          f"checkpointing; {where}):\n")
    head = "| tokens | peak GB | estimate GB | peak / estimate | seconds |"
    rule = "|---|---|---|---|---|"
    if args.before:
        head, rule = head + " full-logits peak GB | full-logits seconds |", rule + "---|---|"
    print(head + "\n" + rule)
    for L in lengths:
        r, est = child(args, "step", L, False), estimate_gb(args.shape, L)
        ratio = "-" if est is None or "error" in r else f"{r['peak_gb'] / est:.2f}"
        line = (f"| {L:,} | {cell(r, 'peak_gb', '.2f')} | {'-' if est is None else f'{est:.1f}'} | {ratio} | "
                f"{cell(r, 'seconds', '.2f')} |")
        if args.before:
            b = child(args, "step", L, True)
            line += f" {cell(b, 'peak_gb', '.2f')} | {cell(b, 'seconds', '.2f')} |"
        print(line)


if __name__ == "__main__":
    main()
