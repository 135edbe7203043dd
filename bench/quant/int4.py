"""INT4 W4A16, symmetric, round-to-nearest, one scale per group of 128 inputs (GPTQ / compressed-tensors W4A16
checkpoints as vLLM runs them; bench/quant/blockscale.py `quantize_int4` documents the convention and its
sources). Weight-only: activations stay in the engine's bf16.
"""

from __future__ import annotations

from bench.quant.blockscale import INT4_GROUP_SIZE, quantize_int4
from bench.quant.linear import BlockFormat
from bench.registry import FORMATS


@FORMATS.register("int4")
class Int4(BlockFormat):
    label, bits, act_bits = "INT4", 4, None
    weight_granularities = ("per_group",)  # groups of INT4_GROUP_SIZE inputs of each output row
    act_granularities = ("none",)
    scale_kind = "group"

    def block_quantize(self, x):
        return quantize_int4(x, INT4_GROUP_SIZE)
