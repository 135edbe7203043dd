"""NVFP4 W4A4: blocks of 16 along the input dim, E2M1 elements, an E4M3 scale per block and an fp32 scale per
tensor (NVIDIA's recipe as vLLM's kernel computes it; bench/quant/blockscale.py `quantize_nvfp4`).
Activations use a dynamic per-tensor global scale (vLLM uses a calibrated static one; without calibration data
the dynamic amax is the closest stand-in), blocks per row; 'none' makes it weight-only (W4A16).
"""

from __future__ import annotations

from torch import nn

from bench.quant.blockscale import quantize_nvfp4
from bench.quant.linear import FakeQuantLinear
from bench.quant.quantizers import FORMATS, Format, Quantizer


@FORMATS.register("nvfp4")
class NvFp4(Format):
    label, bits, act_bits = "NVFP4", 4, 4
    weight_granularities = ("per_block",)
    act_granularities = ("per_block", "none")
    act_dtype = "bf16"

    def quantize(self, x, granularity, scale=None):
        if scale is not None:
            raise ValueError("nvfp4: block scales are always recomputed (no static scale)")
        q = quantize_nvfp4(x)
        return q.codes, q.element_scales()

    def make_linear(self, weight, bias, quantizer: Quantizer, out_dtype, int8_kernel="auto") -> nn.Module:
        return FakeQuantLinear(weight, bias, quantizer, out_dtype)
