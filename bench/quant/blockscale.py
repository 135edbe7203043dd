"""Block/group-scaled and FP8 fake quantization: the rungs of the severity ladder beyond 8-bit per-channel.

Formats (all as pure tensor functions; fp64 inputs are computed in fp64, anything else in fp32):

* `int4`     W4A16, symmetric, round-to-nearest, one scale per `group_size` (128) inputs of each output row.
* `mxfp4`    OCP MX: blocks of 32, E2M1 elements, shared power-of-two E8M0 scale.
* `nvfp4`    blocks of 16, E2M1 elements, an E4M3 scale per block and an fp32 scale per tensor.
* `fake_quant_kv`          an FP8 KV cache as vLLM writes one without calibrated scales.

These are the math; the precisions users select (`rollout.precision=int4|mxfp4|nvfp4`) are the `Format`s of
bench/quant/int4.py, mxfp4.py and nvfp4.py, which call them (amax-scaled fp8 e4m3/e5m2: bench/quant/fp8.py).

Blocks always run along the last dim: the input dim of a weight [out, in] and the hidden dim of an activation
[..., in], which is also how W4A4 activations (mxfp4, nvfp4) are quantized dynamically, per row. A last dim that
is not a multiple of the block size gets a shorter last block, with exactly the result of zero-padding it to a
full block (padding with zeros changes no amax), as ModelOpt pads (`reduce_block_padding` in
modelopt/torch/quantization/qtensor/nvfp4_tensor.py NVFP4QTensor.quantize). Real kernels (vLLM Marlin/CUTLASS)
require divisibility; the emulation does not need to.

A new block format reshapes with `to_blocks` (zero-padding the last block) and back with `from_blocks`.

Codes are float tensors holding the code values (int4: -8..7; e2m1: -6..6) and scales are decoded float values,
so x_hat = codes * scale per block, exactly as in `bench.quant.quantizers`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bench.registry import check_choice
from bench.quant.minifloat import E2M1, E4M3, E5M2, MiniFloat, floor_log2, pow2, round_to_minifloat, work_dtype

__all__ = [
    "BlockQuant",
    "INT4_QMIN",
    "INT4_QMAX",
    "INT4_GROUP_SIZE",
    "MX_BLOCK_SIZE",
    "MX_SCALE_ROUNDINGS",
    "NVFP4_BLOCK_SIZE",
    "KV_CACHE_DTYPES",
    "quantize_int4",
    "mx_shared_exponent",
    "quantize_mxfp4",
    "nvfp4_global_scale",
    "quantize_nvfp4",
    "fake_quant_kv",
    "from_blocks",
    "to_blocks",
]

INT4_QMIN, INT4_QMAX = -8, 7
INT4_GROUP_SIZE = 128
MX_BLOCK_SIZE = 32
MX_SCALE_ROUNDINGS = ("floor", "ceil")
NVFP4_BLOCK_SIZE = 16
#: vLLM's `kv_cache_dtype` values for FP8 ("fp8" means e4m3 on CUDA) [docs: vLLM "Quantized KV Cache"].
KV_CACHE_DTYPES = ("fp8", "fp8_e4m3", "fp8_e5m2")

#: float32 machine epsilon, 2^-23: compressed-tensors' floor on integer scales (see `quantize_int4`).
_F32_EPS = torch.finfo(torch.float32).eps


def _check_block_size(block_size: int) -> None:
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
        raise ValueError(f"block/group size must be a positive int, got {block_size!r}")


def to_blocks(x: torch.Tensor, block_size: int) -> torch.Tensor:
    """[..., K] -> [..., ceil(K / B), B] in the working dtype, the last block zero-padded: the layout every block
    format here computes its scales on, and what a new block precision builds on (with `from_blocks`)."""
    if x.dim() == 0:
        raise ValueError("block quantization needs a tensor with at least one dim, got a scalar")
    xf = x.to(work_dtype(x))
    pad = -xf.shape[-1] % block_size
    if pad:
        xf = torch.nn.functional.pad(xf, (0, pad))
    return xf.reshape(*xf.shape[:-1], xf.shape[-1] // block_size, block_size)


def from_blocks(xb: torch.Tensor, k: int) -> torch.Tensor:
    """Inverse of `to_blocks`: [..., n, B] -> [..., K] (drops the padding)."""
    return xb.reshape(*xb.shape[:-2], -1)[..., :k]


@dataclass(frozen=True)
class BlockQuant:
    """A block-quantized tensor: `codes` [..., K] on the element grid, `scales` [..., ceil(K / block_size)].

    `scales` are decoded per-block scales: int4 amax / 7.5, mxfp4 2^e (the E8M0 value), nvfp4 the E4M3 block
    scale. `global_scale` (nvfp4 only) is the per-tensor *encode* scale G = 448 * 6 / amax_tensor, the
    convention of compressed-tensors checkpoints (`weight_global_scale`) and of vLLM's `scaled_fp4_quant`
    (ModelOpt stores 1 / G as `weight_scale_2`); the effective scale of a block is scales / G.
    """

    codes: torch.Tensor
    scales: torch.Tensor
    block_size: int
    global_scale: torch.Tensor | None = None

    def block_scales(self) -> torch.Tensor:
        """The effective (decoded) scale of each block: scales, or scales / G for nvfp4."""
        return self.scales if self.global_scale is None else self.scales / self.global_scale

    def dequantize(self) -> torch.Tensor:
        return self.codes * self.element_scales()

    def element_scales(self) -> torch.Tensor:
        """The effective scale of every element, [..., K]: codes * element_scales() = the dequantized tensor
        (the (codes, scale) form of bench.quant.quantizers)."""
        k = self.codes.shape[-1]
        return self.block_scales().repeat_interleave(self.block_size, dim=-1)[..., :k]


# ---- int4 W4A16 ---------------------------------------------------------------------------------------


def quantize_int4(w: torch.Tensor, group_size: int = INT4_GROUP_SIZE) -> BlockQuant:
    """Symmetric int4 per group of `group_size` along the last (input) dim, round to nearest even.

        scale = max(amax_group / 7.5, 2^-23)        codes = round_half_even(clamp(w / scale, -8, 7))

    The convention of the W4A16 checkpoints vLLM runs, read from:
    * compressed-tensors `quantization/utils/helpers.py` `calculate_qparams` (llm-compressor's observers):
      symmetric scale = max(|min|, |max|) / (bit_range / 2) with bit_range = q_max - q_min = 7 - (-8) = 15,
      i.e. amax / 7.5, clamped below at `torch.finfo(torch.float32).eps`; `calculate_range`: int4 codes in
      [-8, 7]; `lifecycle/forward.py` `_quantize`: x / scale, clamp to [q_min, q_max], then torch.round.
    * AutoGPTQ `auto_gptq/quantization/quantizer.py` `Quantizer.find_params` (sym=True): scale =
      (xmax - xmin) / maxq = 2 * amax / 15, zero = (maxq + 1) / 2 = 8, q = clamp(round(x / scale) + 8, 0, 15)
      -> the same codes -8..7 and the same scale.
    * vLLM's GPTQ-Marlin / compressed-tensors WNA16 kernels store symmetric int4 as `uint4b8` (code + 8), i.e.
      dequantize (q - 8) * scale with q in 0..15: the range is [-8, 7], not [-7, 7].
    So +amax maps to code 7.5 -> 7 (dequantized 14/15 amax) and -amax to -7.5 -> -8 (ties to even; 16/15 amax).
    That tie is real arithmetic, not exact: -amax / (amax / 7.5) lands on -7.5 or one ulp either side, so the
    code of a group's negative extreme is -8 or -7 depending on the last bit of the scale, here as in the
    reference implementations (on a 256x512 Gaussian weight fp32 and fp64 disagree on 110 of the 514 negative
    extremes, and nowhere else).
    Checkpoints store the scale in fp16/bf16; here it stays in the working dtype (a relative difference of at
    most 2^-8 (bf16) in the scale). AutoGPTQ's quirk for groups with no negative value (scale = amax / 15) is not
    reproduced. AWQ checkpoints default to asymmetric (zero-point) int4; this is the symmetric variant the
    severity ladder asks for.
    """
    _check_block_size(group_size)
    wb = to_blocks(w, group_size)
    amax = wb.abs().amax(dim=-1)
    scale = (amax / torch.full_like(amax, 7.5)).clamp_(min=_F32_EPS)  # a tensor divisor: exact on CUDA too (amax_scale)
    codes = torch.round((wb / scale.unsqueeze(-1)).clamp_(INT4_QMIN, INT4_QMAX))
    return BlockQuant(from_blocks(codes, w.shape[-1]), scale, group_size)


# ---- MXFP4 (OCP Microscaling v1.0) ----------------------------------------------------------------------


def mx_shared_exponent(amax: torch.Tensor, elem: MiniFloat = E2M1, rounding: str = "floor") -> torch.Tensor:
    """The E8M0 exponent of an MX block with largest magnitude `amax` (int32, clamped to [-127, 127]).

    "floor" (default) is the OCP MX spec v1.0 section 6.3 conversion:
        shared_exp = floor(log2(amax)) - emax_elem,   emax_elem = exponent of the element's largest normal
    (E2M1: 6 = 1.5 * 2^2, emax_elem = 2). Elements of V / 2^shared_exp then reach up to 8 > 6 and saturate: a
    block with amax in [6, 8) * 2^k has its largest elements clipped to 6 * 2^k (e.g. amax 7 -> 6).
    "ceil" is the smallest power of two X with amax / X <= max_elem, i.e. ceil(log2(amax / max_elem)): no
    element saturates, at the cost of range; it is what llm-compressor/compressed-tensors MXFP4 uses
    (`calculate_qparams`, is_mxfp4 branch: ceil(log2(amax / 6))) and cuBLAS/torchao "RCEIL".
    An all-zero block gets -127 (E8M0 code 0x00, as torchao's MX cast gives it); its codes are 0 either way.
    """
    check_choice("MX scale rounding", rounding, MX_SCALE_ROUNDINGS)
    a = amax.to(work_dtype(amax)).abs()
    emax_elem = int(floor_log2(torch.tensor(elem.max_finite)))  # E2M1: floor(log2 6) = 2
    flog2 = floor_log2(a)
    exp = flog2 - emax_elem
    if rounding == "ceil":
        # a = mant * 2^flog2 with mant in [1, 2); max_finite = m_e * 2^emax_elem (E2M1: 1.5 * 4).
        # a / 2^exp <= max_finite  iff  mant <= m_e; otherwise the next power of two.
        mant = a / pow2(flog2, a.dtype)
        exp = exp + (mant > elem.max_finite / 2.0**emax_elem).to(exp.dtype)
    exp = torch.where(a == 0, torch.full_like(exp, -127), exp)
    return exp.clamp(-127, 127)


def quantize_mxfp4(x: torch.Tensor, scale_rounding: str = "floor") -> BlockQuant:
    """MXFP4: blocks of 32 along the last dim; X = 2^shared_exp (`mx_shared_exponent`), elements =
    E2M1 round-to-nearest-even of x / X saturated to +-6 [OCP MX spec v1.0 sections 5.3.3 (E2M1), 5.4.1
    (E8M0), 6.3 (conversion); torchao prototype/mx_formats/mx_tensor.py `to_mx`, ScaleCalculationMode.FLOOR].
    x / X is exact (X is a power of two), so fp32 and fp64 inputs give the same codes for the same values.
    """
    xb = to_blocks(x, MX_BLOCK_SIZE)
    exp = mx_shared_exponent(xb.abs().amax(dim=-1), E2M1, scale_rounding)
    scale = pow2(exp, xb.dtype)
    codes = round_to_minifloat(xb / scale.unsqueeze(-1), E2M1)
    return BlockQuant(from_blocks(codes, x.shape[-1]), scale, MX_BLOCK_SIZE)


# ---- NVFP4 ----------------------------------------------------------------------------------------------


def nvfp4_global_scale(amax: torch.Tensor | float) -> torch.Tensor:
    """The per-tensor encode scale G = 448 * 6 / amax (E4M3 max times E2M1 max), so that the block with the
    tensor's amax gets the largest E4M3 block scale, 448 [compressed-tensors `generate_gparam`; vLLM
    tests/kernels/quantization/nvfp4_utils.py; ModelOpt `get_weights_scaling_factor_2` = amax / (6 * 448) = 1/G].
    amax = 0 (an all-zero tensor, whose codes are all 0 anyway) gives G = 1 instead of inf.
    """
    a = torch.as_tensor(amax)
    a = a.to(work_dtype(a) if a.is_floating_point() else torch.float32)
    return torch.where(a > 0, (E4M3.max_finite * E2M1.max_finite) / a, torch.ones_like(a))


def quantize_nvfp4(x: torch.Tensor, global_amax: torch.Tensor | float | None = None) -> BlockQuant:
    """NVFP4: blocks of 16 along the last dim, an E4M3 scale per block, a per-tensor global scale.

    The arithmetic follows vLLM's quantization kernel (`scaled_fp4_quant`, csrc/quantization/fp4) as written
    out in its reference, tests/kernels/quantization/nvfp4_utils.py `ref_nvfp4_quant`, op for op:
        G       = 448 * 6 / global_amax                         (global_amax defaults to max|x|, dynamic)
        s_b     = e4m3(min(G * (amax_block * (1/6)), 448))      the stored E4M3 block scale
        out     = 1 / (s_b * (1/G))   (0 where s_b == 0)        the multiplier x -> element domain
        codes   = e2m1(clamp(x * out, -6, 6))                   round to nearest even
        x_hat   = codes * s_b / G
    This is NVIDIA's recipe (global = amax / (448 * 6); block scale = e4m3(amax_block / 6 / global); elements
    = e2m1(x / (block_scale * global))) [ModelOpt modelopt/torch/quantization/qtensor/nvfp4_tensor.py
    NVFP4QTensor.get_weights_scaling_factor(_2), quantize]; vLLM's order differs from ModelOpt's only in which
    fp32 reciprocals are taken, i.e. in the last ulp of an intermediate.
    Conventions from vLLM's kernel rather than ModelOpt's: an all-zero block gets s_b = 0 (ModelOpt: 1.0) and
    a block whose G * amax_block / 6 rounds below E4M3's smallest subnormal 2^-9 gets s_b = 0 and is flushed
    to zero (ModelOpt clamps s_b to >= 2^-9). Either way its codes are 0 or tiny.
    Activations (W4A4): vLLM uses a static, calibrated input global scale; without calibration data pass
    `global_amax` or accept the default, the dynamic per-tensor amax of x.
    """
    xb = to_blocks(x, NVFP4_BLOCK_SIZE)
    dtype = xb.dtype
    g = nvfp4_global_scale(xb.abs().amax() if global_amax is None else torch.as_tensor(global_amax, dtype=dtype))
    amax_b = xb.abs().amax(dim=-1)
    s_b = round_to_minifloat(g * (amax_b * (1.0 / E2M1.max_finite)), E4M3)  # saturates at 448
    denom = s_b * (1.0 / g)
    out = torch.where(s_b != 0, 1.0 / torch.where(s_b != 0, denom, torch.ones_like(denom)), torch.zeros_like(denom))
    codes = round_to_minifloat(xb * out.unsqueeze(-1), E2M1)  # the clamp to +-6 is the saturation
    return BlockQuant(from_blocks(codes, x.shape[-1]), s_b, NVFP4_BLOCK_SIZE, g)


# ---- FP8 KV cache -------------------------------------------------------------------------------------


def fake_quant_kv(x: torch.Tensor, dtype: str = "fp8_e4m3", scale: float = 1.0) -> torch.Tensor:
    """K or V as read back from an FP8 KV cache: fp8(x / scale) * scale, saturating, in x's dtype.

    vLLM writes the cache with `__nv_cvt_float_to_fp8(x / scale, __NV_SATFINITE, fmt)` and reads back
    fp8 * scale [code: vllm csrc/quantization/fp8/nvidia/quant_utils.cuh scaled_vec_conversion]. Without
    k/v scales in the checkpoint, k_scale = v_scale = 1.0 [code: vllm
    model_executor/layers/quantization/kv_cache.py BaseKVCacheMethod.process_weights_after_loading, which
    warns "Using KV cache scaling factor 1.0 for fp8_e4m3"], so the default here is a plain saturating
    cast: |K| > 448 clips (e4m3), and values below 2^-9 (e4m3) / 2^-16 (e5m2) are subnormal or flushed.
    `dtype` is vLLM's kv_cache_dtype: "fp8" (= fp8_e4m3 on CUDA), "fp8_e4m3" or "fp8_e5m2".
    """
    check_choice("kv cache dtype", dtype, KV_CACHE_DTYPES)
    if not scale > 0:
        raise ValueError(f"kv cache scale must be positive, got {scale!r}")
    f = E5M2 if dtype == "fp8_e5m2" else E4M3
    xf = x.to(work_dtype(x))
    return (round_to_minifloat(xf / scale, f) * scale).to(x.dtype)
