"""Peak memory (RSS) of the trainer's no-grad log-prob pass (recompute of log pi_old, reference policy) on long
responses, whole batch against micro-batches (`train.micro_batch_tokens`, bench/compute.py).

    python -m bench.benchmarks.logprob_memory [--model tiny] [--batch 64] [--prompt-len 32] [--response-len 2048]
        [--micro-batch-tokens none,16384,4096] [--dtype bf16] [--threads 1]

Each setting runs in a fresh process (peak RSS, ru_maxrss, cannot be reset within one): it builds the model
preset with random weights (memory does not depend on their values; `model.max_position_embeddings` is raised
to fit prompt + response), a random batch of the given shape, and runs `token_logprobs` under no_grad exactly
as bench/train.py `recompute` does (bench/compute.py `TrainerCompute.logprobs`). Reported: RSS before the pass,
peak RSS, their difference (what the pass itself holds at its peak), wall seconds, and whether the log-probs equal
the whole-batch pass bit for bit. The lm_head's own slicing (bench.models.logprobs HEAD_CHUNK_TOKENS) and a training
step on long sequences: bench/benchmarks/trainer_memory.py.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time


def rss_mib() -> float:
    """Current resident set size of this process (MiB), from /proc."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def one(model_name: str, batch: int, prompt_len: int, response_len: int, micro: int | None, dtype: str,
        threads: int, save: str | None) -> dict:
    """Measure one setting in this process."""
    import torch
    from hydra import compose, initialize_config_dir

    from bench.launch.cli import CONF_DIR
    from bench.compute import TrainerCompute
    from bench.models.tiny import build_tiny_model
    from bench.models.tokenizer import build_char_tokenizer
    from bench.rollout.base import Rollout

    torch.set_num_threads(threads)
    total = prompt_len + response_len
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"model={model_name}", f"model.max_position_embeddings={total}"])
    tok = build_char_tokenizer(total)
    model = build_tiny_model(cfg.model, tok, seed=0).train()  # the trainer's policy is in train mode
    g = torch.Generator().manual_seed(0)
    vocab = len(tok)
    rollout = Rollout(torch.randint(4, vocab, (batch, prompt_len), generator=g), torch.ones(batch, prompt_len, dtype=torch.bool),
                      torch.randint(4, vocab, (batch, response_len), generator=g), torch.ones(batch, response_len, dtype=torch.bool),
                      torch.zeros(batch, response_len))
    before = rss_mib()
    t0 = time.perf_counter()
    logp, _ = TrainerCompute(torch.device("cpu"), dtype, 1.0, micro_batch_tokens=micro).logprobs(model, rollout)
    wall = time.perf_counter() - t0
    out = {"micro_batch_tokens": micro, "rss_before_mib": before, "peak_rss_mib": peak_rss_mib(),
           "wall_s": wall, "params": sum(p.numel() for p in model.parameters())}
    out["pass_mib"] = out["peak_rss_mib"] - before
    if save:
        torch.save(logp, save)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny", help="a conf/model preset of the built-in model (tiny, tiny10m, ...)")
    ap.add_argument("--batch", type=int, default=64, help="sequences (prompts x group size)")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--response-len", type=int, default=2048)
    ap.add_argument("--micro-batch-tokens", default="none,16384,4096",
                    help="comma-separated train.micro_batch_tokens values; none = the whole batch in one pass")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"], help="train.dtype")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # child mode: one setting, JSON to stdout
    ap.add_argument("--save", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one is not None:
        micro = None if args.one == "none" else int(args.one)
        print(json.dumps(one(args.model, args.batch, args.prompt_len, args.response_len, micro, args.dtype,
                             args.threads, args.save)))
        return

    import tempfile

    import torch

    settings = [s.strip() for s in args.micro_batch_tokens.split(",") if s.strip()]
    print(f"model={args.model} batch={args.batch} prompt={args.prompt_len} response={args.response_len} "
          f"dtype={args.dtype} threads={args.threads} (no-grad log-prob pass, fresh process per row)")
    print(f"{'micro_batch_tokens':>18} {'rows/chunk':>10} {'RSS before MiB':>15} {'peak RSS MiB':>13} "
          f"{'pass MiB':>9} {'wall s':>7} {'== whole batch':>15}")
    with tempfile.TemporaryDirectory() as tmp:
        ref = None
        for s in settings:
            save = os.path.join(tmp, f"{s}.pt")
            cmd = [sys.executable, "-m", "bench.benchmarks.logprob_memory", "--one", s, "--save", save,
                   "--model", args.model, "--batch", str(args.batch), "--prompt-len", str(args.prompt_len),
                   "--response-len", str(args.response_len), "--dtype", args.dtype, "--threads", str(args.threads)]
            res = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if res.returncode != 0:
                print(f"{s:>18} failed (exit {res.returncode}): {res.stderr.strip().splitlines()[-1:]}")
                continue
            r = json.loads(res.stdout.strip().splitlines()[-1])
            logp = torch.load(save)
            ref = logp if ref is None else ref
            rows = args.batch if s == "none" else max(1, int(s) // (args.prompt_len + args.response_len - 1))
            print(f"{s:>18} {min(rows, args.batch):>10} {r['rss_before_mib']:>15.0f} {r['peak_rss_mib']:>13.0f} "
                  f"{r['pass_mib']:>9.0f} {r['wall_s']:>7.1f} {str(bool(torch.equal(logp, ref))):>15}")


if __name__ == "__main__":
    main()
