"""What one decode step's attention costs when its key length is new (cold) and when it was seen before (warm), per
SDPA backend, with and without the embedded engine's key-length buckets, as Markdown.

    python -m bench.benchmarks.decode_attention [--device cuda] [--batch 256] [--steps 64] [--prompt 156]

Why: on an H100 (results/gpu_check/h100-2026-11-28.md) the trainer's first rollout of a qurl_table1 step took ~73 ms
per decode step, the rollout benchmark ~15 ms at the same batch. The benchmark times a round after a warm-up round of
the same lengths; the trainer's rollout meets every key length for the first time. An attention backend that builds
a plan per shape (cuDNN does, and caches it) pays that plan at each new length: every decode step of an unbucketed
engine. This benchmark runs `grouped_attention` (bench/rollout/embedded.py) over `--steps` consecutive decode
lengths twice, at the Qwen2.5-0.5B attention shape (14 query / 2 KV heads, head dim 64, bf16 on a GPU), under each
backend SDPA may choose; the first pass is cold, the second warm. Each configuration gets its own range of lengths,
so no configuration warms another's. "buckets" rounds the key length up to ATTN_BUCKET_CUDA as the engine does on
CUDA (the masked positions cost attention work, but few distinct shapes).
On a CPU the backends are not selectable and nothing is planned per shape: the rows measure the same kernel twice.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bench.device import resolve_device
from bench.rollout.embedded import ATTN_BUCKET_CUDA, grouped_attention
from bench.timing import synchronize

#: SDPA backends to pin (None: SDPA's own choice); names of torch.nn.attention.SDPBackend
BACKENDS = (None, "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH")


def _context(backend: str | None):
    import contextlib

    if backend is None:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([getattr(SDPBackend, backend)])


def time_pass(device: torch.device, batch: int, lengths: list[int], bucket: int, backend: str | None,
              heads: int = 14, kv_heads: int = 2, head_dim: int = 64) -> list[float]:
    """Milliseconds of each decode attention call over `lengths` (each call waited for)."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    total = max(lengths) + bucket
    k = torch.randn(batch, kv_heads, total, head_dim, device=device, dtype=dtype)
    v = torch.randn_like(k)
    q = torch.randn(batch, heads, 1, head_dim, device=device, dtype=dtype)
    valid = torch.zeros(batch, 1, 1, total, device=device, dtype=dtype)
    out = []
    with _context(backend):
        for n in lengths:
            keys = min(total, -(-n // bucket) * bucket)
            mask = valid[..., :keys].clone()
            mask[..., n:] = float("-inf")
            synchronize(device)
            t0 = time.perf_counter()
            grouped_attention(q, k[:, :, :keys], v[:, :, :keys], mask, head_dim**-0.5)
            synchronize(device)
            out.append(1e3 * (time.perf_counter() - t0))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=64, help="decode lengths per pass")
    ap.add_argument("--prompt", type=int, default=156, help="key length of the first decode step")
    args = ap.parse_args(argv)
    device = resolve_device(args.device)
    backends = BACKENDS if device.type == "cuda" else (None,)
    print(f"Decode attention, batch {args.batch}, 14/2 heads, head dim 64, {args.steps} consecutive key lengths; "
          f"median ms per call (first pass cold, second warm); device {device}\n")
    print("| backend | key lengths | cold ms | warm ms | cold / warm |")
    print("|---|---|---|---|---|")
    start = args.prompt
    for backend in backends:
        for bucket, label in ((1, "exact"), (ATTN_BUCKET_CUDA, f"buckets of {ATTN_BUCKET_CUDA}")):
            lengths = list(range(start, start + args.steps))
            start += args.steps + ATTN_BUCKET_CUDA  # the next configuration's lengths are new to every backend
            try:
                cold = statistics.median(time_pass(device, args.batch, lengths, bucket, backend))
                warm = statistics.median(time_pass(device, args.batch, lengths, bucket, backend))
            except RuntimeError as e:  # a pinned backend that cannot serve this call says why
                print(f"| {backend or 'SDPA default'} | {label} | not served: {str(e).splitlines()[0][:80]} | | |",
                      flush=True)
                continue
            print(f"| {backend or 'SDPA default'} | {label} | {cold:.3f} | {warm:.3f} | {cold / warm:.1f} |", flush=True)


if __name__ == "__main__":
    main()
