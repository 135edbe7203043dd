"""MXFP4 W4A4 (OCP Microscaling v1.0): blocks of 32 along the input dim, E2M1 elements, a shared power-of-two
E8M0 scale per block (bench/quant/blockscale.py `quantize_mxfp4`). Activations are quantized the same way,
per row, on every call ('none' makes it weight-only, W4A16).
"""

from __future__ import annotations

from torch import nn

from bench.quant.blockscale import quantize_mxfp4
from bench.quant.linear import FakeQuantLinear
from bench.quant.quantizers import FORMATS, Format, Quantizer


@FORMATS.register("mxfp4")
class MxFp4(Format):
    label, bits, act_bits = "MXFP4", 4, 4
    weight_granularities = ("per_block",)
    act_granularities = ("per_block", "none")
    act_dtype = "bf16"

    def quantize(self, x, granularity, scale=None):
        if scale is not None:
            raise ValueError("mxfp4: block scales are always recomputed (no static scale)")
        q = quantize_mxfp4(x)
        return q.codes, q.element_scales()

    def make_linear(self, weight, bias, quantizer: Quantizer, out_dtype, int8_kernel="auto") -> nn.Module:
        return FakeQuantLinear(weight, bias, quantizer, out_dtype)
