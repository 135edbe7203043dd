"""FP8 e4m3 W8A8 (vLLM / QuRL / FlashRL's FP8 rollouts), emulated bit-exactly by fake quantization.

Q_fp8(x; s) = s * e4m3_RNE( clamp(x/s, -448, 448) )   (methods.md 2.2): the clamp comes BEFORE the cast, because
in the e4m3fn encoding an overflow is NaN (torch 2.13 on CPU happens to saturate). Weights are quantized once per
weight sync (per channel or per tensor), activations per token (or per tensor) on every call, then an fp32 GEMM
on the quantized values, result cast to `out_dtype`. perf-notes 3b: this is bit-identical to the CPU
`torch._scaled_mm` path and 3-10x faster; CPUs have no fast FP8 GEMM without AMX. FP8 rollouts on a GPU run FP8
GEMMs inside an otherwise-bf16 engine, hence act_dtype bf16.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bench.quant.linear import QuantLinear
from bench.quant.quantizers import FORMATS, Format, Quantizer, amax_scale, work_dtype

E4M3_MAX = 448.0
_EXPONENT_BITS = torch.tensor(0x7F800000, dtype=torch.int32)


def round_e4m3(y: torch.Tensor) -> torch.Tensor:
    """Round fp32 values in [-448, 448] to the nearest e4m3 value, ties to even, as fp32.

    Bit-identical to `y.to(torch.float8_e4m3fn).float()` (tests/unit/test_quantizers.py checks every grid
    point, midpoint and its neighbours) but up to 4x faster on CPU, where the fp8 -> fp32 cast is a slow scalar
    loop and this runs on every linear of an FP8 rollout. The e4m3 grid spacing is 2^(E-3) for |y| in
    [2^E, 2^(E+1)), E >= -6, and 2^-9 below 2^-6 (subnormals): 2^E is y's fp32 bits with sign and mantissa
    masked off; divide by the spacing (exact), round half to even, multiply back (exact).
    """
    pow2 = torch.bitwise_and(y.view(torch.int32), _EXPONENT_BITS).view(torch.float32)
    step = pow2.clamp_(min=2.0**-6).mul_(0.125)
    return torch.round(y / step).mul_(step)


class Fp8Linear(QuantLinear):
    """FP8 e4m3 W8A8 (or W8A16 with act_granularity='none') by fake quantization, fp32 GEMM."""

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None, quantizer: Quantizer, out_dtype: torch.dtype
    ):
        super().__init__(weight, out_dtype)
        self.quantizer = quantizer
        codes, scale = quantizer.quantize_weight(weight.detach().float())
        self.register_buffer("weight", codes * scale)
        self.register_buffer("weight_scale", scale)
        # the bias as the engine would store it (in its activation dtype), added in fp32
        self.register_buffer("bias", None if bias is None else bias.detach().to(out_dtype).float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xq = self.quantizer.fake_quant_act(x.float())
        return F.linear(xq, self.weight, self.bias).to(self.out_dtype)


@FORMATS.register("fp8_e4m3")
class Fp8E4M3(Format):
    label, bits, act_bits = "FP8", 8, 8
    weight_granularities = ("per_channel", "per_tensor")
    act_granularities = ("per_token", "per_tensor", "none")
    act_dtype = "bf16"

    def quantize(self, x, granularity, scale=None):
        work = work_dtype(x)
        xf = x.to(work)
        scale = amax_scale(xf, E4M3_MAX, granularity) if scale is None else scale.to(work)
        y = (xf / scale).clamp_(-E4M3_MAX, E4M3_MAX)
        codes = round_e4m3(y) if work == torch.float32 else y.to(torch.float8_e4m3fn).to(work)
        return codes, scale

    def make_linear(self, weight, bias, quantizer: Quantizer, out_dtype, int8_kernel="auto") -> nn.Module:
        return Fp8Linear(weight, bias, quantizer, out_dtype)
