"""Unscaled precisions: fp32 (the identity) and bf16 (a rounding of weights and activations, fp32 accumulate).

* `fp32`  plain fp32 GEMM.
* `bf16`  bf16 operands, fp32 accumulation, bf16 result - what a bf16 GEMM computes. On CPUs without native
  bf16 matmul (no AVX512-BF16/AMX, e.g. Zen3) torch's bf16 GEMM is a slow fallback (8-13x slower than fp32
  here), so the same numbers are produced by an fp32 GEMM on the bf16 values: products of two bf16 numbers are
  exact in fp32, so only the summation order differs, as between any two bf16 kernels.
"""

from __future__ import annotations

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


class Bf16Linear(QuantLinear):
    """bf16 weights and inputs, fp32 accumulation, bf16-rounded result (native kernel or exact emulation)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype = torch.bfloat16):
        super().__init__(weight, out_dtype)
        self.native = weight.is_cuda or native_bf16_matmul()  # every GPU here has bf16 tensor cores
        store = torch.bfloat16 if self.native else torch.float32  # fp32 storage holds bf16 values exactly
        self.register_buffer("weight", weight.detach().to(torch.bfloat16).to(store))
        self.register_buffer("bias", None if bias is None else bias.detach().to(torch.bfloat16).to(store))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(torch.bfloat16)
        y = F.linear(x, self.weight, self.bias) if self.native else F.linear(x.float(), self.weight, self.bias)
        return y.to(torch.bfloat16).to(self.out_dtype)


@FORMATS.register("fp32")
class Fp32(Format):
    label, bits = "FP32", 32

    def quantize(self, x, granularity, scale=None):
        return x.to(work_dtype(x)), torch.ones((), dtype=work_dtype(x))

    def make_linear(self, weight, bias, quantizer: Quantizer, out_dtype, int8_kernel="auto") -> nn.Module:
        return Fp32Linear(weight, bias, out_dtype)


@FORMATS.register("bf16")
class Bf16(Format):
    label, bits = "BF16", 16
    act_dtype = "bf16"

    def quantize(self, x, granularity, scale=None):
        work = work_dtype(x)
        return x.to(work).to(torch.bfloat16).to(work), torch.ones((), dtype=work)

    def make_linear(self, weight, bias, quantizer: Quantizer, out_dtype, int8_kernel="auto") -> nn.Module:
        return Bf16Linear(weight, bias, out_dtype)
