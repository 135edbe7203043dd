"""FP8 W8A8: e4m3 (vLLM / QuRL / FlashRL's FP8 rollouts) and e5m2 (two more exponent bits, one fewer mantissa
bit: a rung further down the severity ladder), emulated bit-exactly by fake quantization.

Q_fp8(x; s) = s * fp8_RNE( clamp(x/s, -qmax, qmax) ),  s = amax / qmax,  qmax = 448 (e4m3) / 57344 (e5m2)
(methods.md 2.2): the clamp comes BEFORE the rounding, so nothing overflows to NaN/inf. fp32 inputs are rounded
with a bit trick, fp64 inputs (the numeric tests) in fp64 (bench.quant.minifloat: rounding fp64 through fp32
can land one grid step off next to a midpoint, -(400+2^-30) -> -384 instead of -416). Weights are quantized once
per weight sync (per channel or per tensor), activations per token (or per tensor) on every call, then an fp32
GEMM on the quantized values (`FakeQuantLinear`). FP8 rollouts on a GPU run FP8 GEMMs inside an otherwise-bf16
engine, hence act_dtype bf16.
"""

from __future__ import annotations

import torch
from torch import nn

from bench.quant.linear import FakeQuantLinear
from bench.quant.minifloat import E4M3, E5M2, MiniFloat, round_to_minifloat
from bench.quant.quantizers import FORMATS, Format, Quantizer, amax_scale, work_dtype

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


class _Fp8(Format):
    bits, act_bits = 8, 8
    weight_granularities = ("per_channel", "per_tensor")
    act_granularities = ("per_token", "per_tensor", "none")
    act_dtype = "bf16"
    element: MiniFloat

    def quantize(self, x, granularity, scale=None):
        work = work_dtype(x)
        xf = x.to(work)
        qmax = self.element.max_finite
        scale = amax_scale(xf, qmax, granularity) if scale is None else scale.to(work)
        y = (xf / scale).clamp_(-qmax, qmax)
        fast = work == torch.float32 and self.element is E4M3
        return (round_e4m3(y) if fast else round_to_minifloat(y, self.element)), scale

    def make_linear(self, weight, bias, quantizer: Quantizer, out_dtype, int8_kernel="auto") -> nn.Module:
        return FakeQuantLinear(weight, bias, quantizer, out_dtype)


@FORMATS.register("fp8_e4m3")
class Fp8E4M3(_Fp8):
    label, element = "FP8", E4M3


@FORMATS.register("fp8_e5m2")
class Fp8E5M2(_Fp8):
    label, element = "FP8-E5M2", E5M2
