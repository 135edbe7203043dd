"""torch._int_mm time for the two INT8 weight layouts (issue 22, M2), as a Markdown table.

    python -m bench.benchmarks.int8_layout [--device cuda] [--tokens 17 256 8192] [--repeats 20]

On CUDA the engine stores INT8 weight codes contiguous [N, K] and passes `w.t()` (a column-major [K, N] operand,
cuBLASLt's "TN" case: bench/quant/int8.py); "row_major" stores them so that `w.t()` is contiguous (the CPU's
choice). Both must give the same int32 result (checked on every shape); the faster one on a GPU should be
`INT_MM_LAYOUTS_BY_DEVICE["cuda"]`. Shapes:
the decoder GEMMs of Qwen2.5-1.5B (K x N: qkv 1536x2048, o 1536x1536, gate/up 1536x17920, down 8960x1536) and the
third-party A100 reference shape (5376 x 28672). On a CPU the timings say nothing about cuBLASLt.
"""

from __future__ import annotations

import argparse
import time

import torch

from bench.quant.int8 import INT_MM_LAYOUTS, INT_MM_MIN_ROWS, int_mm_layout, int_mm_weight
from bench.timing import synchronize

#: (name, K, N) of each GEMM
SHAPES = (("qkv 1.5B", 1536, 2048), ("o 1.5B", 1536, 1536), ("gate_up 1.5B", 1536, 17920),
          ("down 1.5B", 8960, 1536), ("A100 reference", 5376, 28672))


def time_layouts(tokens: int, k: int, n: int, device: torch.device, repeats: int) -> dict[str, float]:
    """Best ms of torch._int_mm(a [tokens, K], w.t()) for each layout; asserts the results are identical."""
    g = torch.Generator().manual_seed(0)
    a = torch.randint(-128, 128, (max(tokens, INT_MM_MIN_ROWS), k), generator=g, dtype=torch.int8).to(device)
    codes = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    out, ms = {}, {}
    for layout in INT_MM_LAYOUTS:
        w = int_mm_weight(codes, layout).to(device)
        w = w if layout == "column_major" else w.t().contiguous().t()  # .to() may re-layout: restore it
        out[layout] = torch._int_mm(a, w.t())  # warm-up (cuBLASLt heuristics) and the result
        best = float("inf")
        for _ in range(repeats):
            synchronize(device)
            t0 = time.perf_counter()
            torch._int_mm(a, w.t())
            synchronize(device)
            best = min(best, time.perf_counter() - t0)
        ms[layout] = best * 1e3
    if not torch.equal(out["column_major"], out["row_major"]):
        raise AssertionError(f"_int_mm results differ between layouts at {tokens}x{k}x{n}")
    return ms


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tokens", type=int, nargs="+", default=[17, 256, 8192])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--shapes", type=int, default=len(SHAPES), help="the first N shapes only (CPU self-test)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    lines = [f"INT8 `torch._int_mm` layouts on {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}"
             f" (engine default here: {int_mm_layout(device)}); best of {args.repeats}, ms", "",
             "| GEMM | tokens | K x N | column_major ms | row_major ms | row / column |", "|---|---|---|---|---|---|"]
    for name, k, n in SHAPES[:args.shapes]:
        for tokens in args.tokens:
            ms = time_layouts(tokens, k, n, device, args.repeats)
            lines.append(f"| {name} | {tokens} | {k}x{n} | {ms['column_major']:.3f} | {ms['row_major']:.3f} | "
                         f"{ms['row_major'] / ms['column_major']:.2f} |")
    text = "\n".join(lines)
    print(text)
    return text


if __name__ == "__main__":
    main()
