"""NVFP4 W4A4: blocks of 16 along the input dim, E2M1 elements, an E4M3 scale per block and an fp32 scale per
tensor (NVIDIA's recipe as vLLM's kernel computes it; bench/quant/blockscale.py `quantize_nvfp4`).
Activations use a dynamic per-tensor global scale (vLLM uses a calibrated static one; without calibration data
the dynamic amax is the closest stand-in), blocks per row; 'none' makes it weight-only (W4A16).
"""

from __future__ import annotations

from bench.quant.blockscale import quantize_nvfp4
from bench.quant.linear import BlockFormat
from bench.registry import FORMATS


@FORMATS.register("nvfp4")
class NvFp4(BlockFormat):
    label, bits, act_bits = "NVFP4", 4, 4
    weight_granularities = ("per_block",)
    act_granularities = ("per_block", "none")

    def act_scales_per_token(self, granularity: str) -> bool:
        return False  # the global fp32 scale is the amax of the whole activation tensor

    def block_quantize(self, x):
        return quantize_nvfp4(x)
