"""INT4 W4A16, symmetric, round-to-nearest, one scale per group of 128 inputs (GPTQ / compressed-tensors W4A16
checkpoints as vLLM runs them; bench/quant/blockscale.py `quantize_int4` documents the convention and its
sources). Weight-only: activations stay in the engine's bf16.
"""

from __future__ import annotations

from torch import nn

from bench.quant.blockscale import INT4_GROUP_SIZE, quantize_int4
from bench.quant.linear import FakeQuantLinear
from bench.quant.quantizers import FORMATS, Format, Quantizer


@FORMATS.register("int4")
class Int4(Format):
    label, bits, act_bits = "INT4", 4, None
    weight_granularities = ("per_group",)  # groups of INT4_GROUP_SIZE inputs of each output row
    act_granularities = ("none",)
    act_dtype = "bf16"

    def quantize(self, x, granularity, scale=None):
        if scale is not None:
            raise ValueError("int4: group scales are always recomputed from the weight (no static scale)")
        q = quantize_int4(x, INT4_GROUP_SIZE)
        return q.codes, q.element_scales()

    def make_linear(self, weight, bias, quantizer: Quantizer, out_dtype, int8_kernel="auto") -> nn.Module:
        return FakeQuantLinear(weight, bias, quantizer, out_dtype)
