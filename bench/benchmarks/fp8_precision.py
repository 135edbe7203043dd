"""How precisely the FP8 GEMM (`torch._scaled_mm`) sums its e4m3 products, against an exact fp64 sum, as Markdown.

    python -m bench.benchmarks.fp8_precision [--device cuda] [--k 64 512 4096]

Why: the first H100 run found the FP8 engine's first-step log-probs further from the CPU emulation (fp32 sums of
the same codes) than the test allowed, while every FP8 layer agreed within a bf16 ulp. One FP8 activation code
flips whenever a GEMM output moves across a rounding midpoint, so any difference in how the products are summed
propagates: on the CPU, relative noise of 2^-17 / 2^-14 / 2^-10 on the FP8 GEMM outputs moves that comparison to
0.05 / 0.22 / 0.43 of the quantization effect, where a wrong scale layout moves it to 5.7 and more. Published
models of the H100's tensor cores (Khattak & Mikaitis, arXiv:2512.07004; DeepSeek-V3 §3.3.2) say its FP8 MMA
accumulates in fewer than fp32's 24 bits (about 13 fraction bits, truncated). This benchmark measures it:

* accumulator bits: the largest k for which 1 + 2^-k comes out exact from a K = 32 product with one term 1 and
  one term 2^-k (the rest zero), unit scales, fp32 output. An fp32 accumulator keeps k up to the 18 probed (the
  smallest e4m3 x e4m3 product is 2^-18); a 13-bit one stops at 13.
* GEMM error, per output dtype and scaling path of `bench.quant.fp8.fp8_gemm`: |y - exact| / sum_i |a_i w_i| (the
  scale of the rounding a sum of K terms can have), in bits (-log2; higher is more precise), median and worst over
  the outputs, on random normal data quantized per token x per channel as the engine does.
On a CPU `torch._scaled_mm` upcasts and runs an fp32 GEMM: fp32 output gives >= 18 accumulator bits and ~20+ bits
of GEMM precision, bf16 output ~8-10 bits (its own rounding).
"""

from __future__ import annotations

import argparse
import math

import torch

from bench.quant.fp8 import SCALED_MM_MIN_ROWS, fp8_gemm, fused_rowwise_ok, scaled_mm_scales
from bench.quant.linear import cuda_capability
from bench.quant.quantizers import Quantizer

#: the smallest e4m3 x e4m3 product is 2^-9 x 2^-9 (subnormals): deeper probes cannot be written as one product
MAX_PROBE_BITS = 18


def _e4m3(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float8_e4m3fn)


def accumulator_bits(device: torch.device) -> int:
    """The largest k <= 18 such that the FP8 GEMM returns 1 + 2^-j exactly for every j <= k (0: not even 1 + 1/2)."""
    one = torch.ones((), dtype=torch.float32, device=device)
    kept = 0
    for k in range(1, MAX_PROBE_BITS + 1):
        a = torch.zeros(SCALED_MM_MIN_ROWS, 32)
        b = torch.zeros(16, 32)  # [N, K]; the kernel takes b.t()
        a[:, 0], b[:, 0] = 1.0, 1.0
        a[:, 1], b[:, 1] = 2.0 ** -math.ceil(k / 2), 2.0 ** -(k // 2)  # both e4m3 (exponent >= -9): their product 2^-k
        y = torch._scaled_mm(_e4m3(a).to(device), _e4m3(b).to(device).t(), scale_a=one, scale_b=one,
                             out_dtype=torch.float32)
        if not bool((y == 1.0 + 2.0 ** -k).all()):
            break
        kept = k
    return kept


def gemm_error_bits(device: torch.device, k: int, out_dtype: torch.dtype, path: str, rows: int = 64, n: int = 256,
                    seed: int = 0) -> tuple[float, float]:
    """(median, worst) precision in bits of one `fp8_gemm` path against the exact product of the same codes.

    path: "tensorwise" (per-tensor x per-tensor scales), "rowwise" (per-token x per-channel scales in the kernel's
    epilogue) or "rowwise_after" (unit-scale GEMM to fp32, scaled after: the fallback `fp8_gemm` takes where the
    epilogue cannot)."""
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(rows, k, generator=g), torch.randn(n, k, generator=g) * 0.05
    granularity = ("per_tensor", "per_tensor") if path == "tensorwise" else ("per_channel", "per_token")
    q = Quantizer("fp8_e4m3", *granularity)
    xc, s_x = q.quantize_act(x)
    wc, s_w = q.quantize_weight(w)
    scale_a, scale_b = scaled_mm_scales(s_x, s_w, rows, n)
    y = fp8_gemm(_e4m3(xc).to(device), _e4m3(wc).to(device), scale_a.to(device), scale_b.to(device), None, out_dtype,
                 fused_rowwise=path != "rowwise_after").double().cpu()
    sa, sb = scale_a.double().reshape(-1, 1), scale_b.double().reshape(1, -1)
    exact = (xc.double() @ wc.double().t()) * sa * sb
    magnitude = (xc.double().abs() @ wc.double().abs().t()) * sa * sb
    rel = ((y - exact).abs() / magnitude).flatten().clamp(min=2.0 ** -60)
    return -math.log2(rel.median().item()), -math.log2(rel.max().item())


def paths_for(device: torch.device, out_dtype: torch.dtype) -> list[str]:
    """The scaling paths `fp8_gemm` can take on this device at this output dtype."""
    capability = cuda_capability(device) if device.type == "cuda" else None
    fused = fused_rowwise_ok(device.type, capability, out_dtype, torch.version.cuda)
    return ["tensorwise"] + (["rowwise"] if fused else []) + ["rowwise_after"]


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--k", type=int, nargs="+", default=[64, 512, 4096], help="inner dimensions (multiples of 16)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (torch's upcast fallback)"
    bits = accumulator_bits(device)
    lines = [f"FP8 `torch._scaled_mm` precision on {where}", "",
             f"accumulator: 1 + 2^-k exact for k <= {bits} "
             f"({'fp32-like: every probed k' if bits >= MAX_PROBE_BITS else f'{bits} fraction bits, narrower than fp32'})",
             "", "GEMM error against the exact sum, in bits (-log2 of |y - exact| / sum |a w|; higher is better):", "",
             "| out | scaling | K | median bits | worst bits |", "|---|---|---|---|---|"]
    for out_dtype in (torch.bfloat16, torch.float32):
        for path in paths_for(device, out_dtype):
            for k in args.k:
                med, worst = gemm_error_bits(device, k, out_dtype, path)
                lines.append(f"| {str(out_dtype).removeprefix('torch.')} | {path} | {k} | {med:.1f} | {worst:.1f} |")
    text = "\n".join(lines)
    print(text)
    return text


if __name__ == "__main__":
    main()
