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
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from bench.quant.linear import QuantLinear, native_bf16_matmul
from bench.quant.quantizers import FORMATS, Format, Quantizer, work_dtype


class Fp32Linear(QuantLinear):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype = torch.float32):
        super().__init__(weight, out_dtype)
        self.register_buffer("weight", weight.detach().float().clone())
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.float(), self.weight, self.bias).to(self.out_dtype)


class HalfLinear(QuantLinear):
    """16-bit float weights and inputs (`half` = bf16 or fp16), fp32 accumulation, result rounded to `half`
    (the native kernel on CUDA and on CPUs with bf16 hardware, else the exact fp32 emulation)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype = torch.bfloat16,
                 half: torch.dtype = torch.bfloat16):
        super().__init__(weight, out_dtype)
        self.half = half
        # every GPU here has bf16/fp16 tensor cores; a CPU has a fast bf16 GEMM at best, never an fp16 one
        self.native = weight.is_cuda or (half == torch.bfloat16 and native_bf16_matmul())
        store = half if self.native else torch.float32  # fp32 storage holds 16-bit values exactly
        self.register_buffer("weight", weight.detach().to(half).to(store))
        self.register_buffer("bias", None if bias is None else bias.detach().to(half).to(store))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.half)
        y = F.linear(x, self.weight, self.bias) if self.native else F.linear(x.float(), self.weight, self.bias)
        return y.to(self.half).to(self.out_dtype)


def Bf16Linear(weight: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype = torch.bfloat16) -> HalfLinear:  # noqa: N802
    """bf16 weights and inputs, fp32 accumulation, bf16-rounded result (the bf16 format's layer)."""
    return HalfLinear(weight, bias, out_dtype, torch.bfloat16)


@FORMATS.register("fp32")
class Fp32(Format):
    label, bits = "FP32", 32

    def quantize(self, x, granularity, scale=None):
        return x.to(work_dtype(x)), torch.ones((), dtype=work_dtype(x))

    def make_linear(self, weight, bias, quantizer: Quantizer, out_dtype, int8_kernel="auto") -> nn.Module:
        return Fp32Linear(weight, bias, out_dtype)


class HalfFormat(Format):
    """A 16-bit float precision: weights and activations rounded to `half`, no scales."""

    half: ClassVar[torch.dtype]

    def quantize(self, x, granularity, scale=None):
        work = work_dtype(x)
        return x.to(work).to(self.half).to(work), torch.ones((), dtype=work)

    def make_linear(self, weight, bias, quantizer: Quantizer, out_dtype, int8_kernel="auto") -> nn.Module:
        return HalfLinear(weight, bias, out_dtype, self.half)


@FORMATS.register("bf16")
class Bf16(HalfFormat):
    label, bits, half = "BF16", 16, torch.bfloat16
    act_dtype = "bf16"


@FORMATS.register("fp16")
class Fp16(HalfFormat):
    label, bits, half = "FP16", 16, torch.float16
    act_dtype = "fp16"
