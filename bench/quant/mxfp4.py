"""MXFP4 W4A4 (OCP Microscaling v1.0): blocks of 32 along the input dim, E2M1 elements, a shared power-of-two
E8M0 scale per block (bench/quant/blockscale.py `quantize_mxfp4`). Activations are quantized the same way,
per row, on every call ('none' makes it weight-only, W4A16).
"""

from __future__ import annotations

from bench.quant.blockscale import quantize_mxfp4
from bench.quant.linear import BlockFormat
from bench.registry import FORMATS


@FORMATS.register("mxfp4")
class MxFp4(BlockFormat):
    label, bits, act_bits = "MXFP4", 4, 4
    weight_granularities = ("per_block",)
    act_granularities = ("per_block", "none")

    def block_quantize(self, x):
        return quantize_mxfp4(x)
