"""Unscaled precisions: fp32 (the identity), bf16 and fp16 (roundings of weights and activations, fp32 accumulate).

* `fp32`  plain fp32 GEMM.
* `bf16`  bf16 operands, fp32 accumulation, bf16 result - what a bf16 GEMM computes. On CPUs without native
  bf16 matmul (no AVX512-BF16/AMX, e.g. Zen3) torch's bf16 GEMM is a slow fallback (8-13x slower than fp32
  here), so the same numbers are produced by an fp32 GEMM on the bf16 values: products of two bf16 numbers are
  exact in fp32, so only the summation order differs, as between any two bf16 kernels.
* `fp16`  the same with IEEE half (5 exponent, 10 mantissa bits: 8x finer than bf16, range +-65504, overflow to
  inf as a real fp16 engine does): the rollout side of the `fp16` arm (Precision-RL, arXiv 2510.26788, which
  runs trainer and engine both in FP16). Products of two fp16 numbers (11-bit significands) are exact in fp32
  as well; on a CPU (no fast fp16 GEMM) it is always computed that way, on CUDA with the native fp16 GEMM.

Rounding to bf16/fp16 is round-to-nearest-even from the input's own dtype. For fp32 inputs that is torch's cast.
For fp64 inputs (the numeric tests) torch's cast rounds through fp32, i.e. twice, and a value just past a
midpoint can land on it and then tie to even: 2049 + 2^-30 becomes 2048 in fp16 where the correct result is
2050. fp64 inputs are therefore rounded once, in fp64, on the format's grid (`round_half_f64`).
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from bench.quant.linear import QuantLinear, native_bf16_matmul
from bench.quant.minifloat import MiniFloat, round_to_minifloat, work_dtype
from bench.quant.quantizers import Format, Quantizer
from bench.registry import FORMATS


class Fp32Linear(QuantLinear):
    fp32_gemm = True

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype = torch.float32):
        super().__init__(weight, out_dtype)
        self.register_buffer("weight", weight.detach().float().clone())
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fp32_linear(x.float()).to(self.out_dtype)


def native_half(half: torch.dtype, device: torch.device) -> bool:
    """Whether a GEMM in `half` (bf16 or fp16) runs natively on `device`: every GPU here has bf16/fp16 tensor cores;
    a CPU has a fast bf16 GEMM at best (AVX512-BF16 / AMX), never an fp16 one. Elsewhere the exact fp32 emulation."""
    return device.type == "cuda" or (half == torch.bfloat16 and native_bf16_matmul())


class HalfLinear(QuantLinear):
    """16-bit float weights and inputs (`half` = bf16 or fp16), fp32 accumulation, result rounded to `half`
    (the native kernel on CUDA and on CPUs with bf16 hardware, else the exact fp32 emulation)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype = torch.bfloat16,
                 half: torch.dtype = torch.bfloat16):
        super().__init__(weight, out_dtype)
        self.half = half
        self.native = native_half(half, weight.device)
        store = half if self.native else torch.float32  # fp32 storage holds 16-bit values exactly
        self.fp32_gemm = not self.native
        self.register_buffer("weight", weight.detach().to(half).to(store))
        self.register_buffer("bias", None if bias is None else bias.detach().to(half).to(store))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.half)
        y = F.linear(x, self.weight, self.bias) if self.native else self.fp32_linear(x.float())
        return y.to(self.half).to(self.out_dtype)


def Bf16Linear(weight: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype = torch.bfloat16) -> HalfLinear:  # noqa: N802
    """bf16 weights and inputs, fp32 accumulation, bf16-rounded result (the bf16 format's layer)."""
    return HalfLinear(weight, bias, out_dtype, torch.bfloat16)


@FORMATS.register("fp32")
class Fp32(Format):
    label, bits = "FP32", 32

    def quantize(self, x, granularity, scale=None):
        return x.to(work_dtype(x)), torch.ones((), dtype=work_dtype(x))

    def make_linear(self, weight, bias, quantizer: Quantizer, out_dtype, int8_kernel="auto",
                    fp8_kernel="auto") -> nn.Module:
        return Fp32Linear(weight, bias, out_dtype)


#: the IEEE value grids of the two 16-bit formats (binary16: max 65504, min subnormal 2^-24; bfloat16: fp32's
#: exponent range, 7 stored significand bits), for rounding fp64 inputs without passing through fp32
HALF_GRIDS = {
    torch.float16: MiniFloat("fp16", exp_bits=5, man_bits=10, bias=15, max_finite=65504.0, has_inf=True),
    torch.bfloat16: MiniFloat("bf16", exp_bits=8, man_bits=7, bias=127, max_finite=(2 - 2**-7) * 2.0**127,
                              has_inf=True),
}


def round_half_f64(x: torch.Tensor, half: torch.dtype) -> torch.Tensor:
    """fp64 `x` rounded once to the nearest `half` (fp16 or bf16) value, ties to even, as fp64. Unlike the
    saturating minifloat rounding, magnitudes at or past the overflow midpoint become +-inf, as IEEE rounding
    (and torch's cast) does: max_finite + ulp/2 is a tie whose even neighbour is the first power of two out of
    range. NaN stays NaN; a value rounding to zero keeps its sign."""
    grid = HALF_GRIDS[half]
    top_ulp = 2.0 ** (math.frexp(grid.max_finite)[1] - 1 - grid.man_bits)
    y = round_to_minifloat(x, grid)
    overflow = x.abs() >= grid.max_finite + top_ulp / 2
    return torch.where(overflow, torch.copysign(torch.full_like(x, math.inf), x), y)


class HalfFormat(Format):
    """A 16-bit float precision: weights and activations rounded to `half`, no scales."""

    half: ClassVar[torch.dtype]

    def quantize(self, x, granularity, scale=None):
        work = work_dtype(x)
        if work == torch.float64:  # torch's cast would round through fp32 (module docstring)
            return round_half_f64(x, self.half), torch.ones((), dtype=work)
        return x.to(work).to(self.half).to(work), torch.ones((), dtype=work)

    def make_linear(self, weight, bias, quantizer: Quantizer, out_dtype, int8_kernel="auto",
                    fp8_kernel="auto") -> nn.Module:
        return HalfLinear(weight, bias, out_dtype, self.half)


@FORMATS.register("bf16")
class Bf16(HalfFormat):
    label, bits, half = "BF16", 16, torch.bfloat16
    act_dtype = "bf16"


@FORMATS.register("fp16")
class Fp16(HalfFormat):
    label, bits, half = "FP16", 16, torch.float16
    act_dtype = "fp16"
