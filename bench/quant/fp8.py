"""FP8 W8A8: e4m3 (vLLM / QuRL / FlashRL's FP8 rollouts) and e5m2 (two more exponent bits, one fewer mantissa
bit: a rung further down the severity ladder), emulated bit-exactly by fake quantization.

Q_fp8(x; s) = s * fp8_RNE( clamp(x/s, -qmax, qmax) ),  s = amax / qmax,  qmax = 448 (e4m3) / 57344 (e5m2)
(docs/arms.md §3): the clamp comes BEFORE the rounding, so nothing overflows to NaN/inf. fp32 inputs are rounded
with a bit trick, fp64 inputs (the numeric tests) in fp64 (bench.quant.minifloat: rounding fp64 through fp32
can land one grid step off next to a midpoint, -(400+2^-30) -> -384 instead of -416). Weights are quantized once
per weight sync (per channel or per tensor), activations per token (or per tensor) on every call, then an fp32
GEMM on the quantized values (`FakeQuantLinear`). FP8 rollouts on a GPU run FP8 GEMMs inside an otherwise-bf16
engine, hence act_dtype bf16.

Real FP8 GEMMs (`Fp8ScaledMMLinear`, torch._scaled_mm): chosen by `fp8_kernel` ("auto": on a CUDA GPU with FP8
tensor cores, compute capability >= 8.9, for e4m3 W8A8 layers whose dims are multiples of 16; the exact emulation
everywhere else). The operands are the same codes and scales as the emulation: e4m3 weight codes [N, K]
(row-major, so `.t()` is the column-major [K, N] the kernel requires), dynamic e4m3 activation codes, fp32
scales, accumulated in fp32 and scaled in the epilogue. torch._scaled_mm also runs on a CPU (a slow upcast +
fp32 GEMM: bit-identical to the emulation, perf-notes 3b), so every line of this path but the CUDA kernel runs
in the CPU tests; tests/unit/test_gpu_kernels.py compares the CUDA kernel with the CPU emulation.
"""

from __future__ import annotations

import torch
from torch import nn

from bench.quant.linear import FakeQuantLinear, QuantLinear, cuda_capability, pad_rows
from bench.quant.minifloat import E4M3, E5M2, MiniFloat, round_to_minifloat, work_dtype
from bench.quant.quantizers import Format, Quantizer, amax_scale
from bench.registry import FORMATS, check_choice

FP8_KERNELS = ("auto", "scaled_mm", "emulated")
#: torch._scaled_mm needs K and N to be multiples of 16 (CUDA: ScaledBlas.cpp checks).
SCALED_MM_ALIGN = 16
#: Rows (tokens) a CUDA `_scaled_mm` call is padded to, as vLLM does (cuBLASLt heuristics at M <= 16).
SCALED_MM_MIN_ROWS = 17

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

    def make_linear(self, weight, bias, quantizer: Quantizer, out_dtype, int8_kernel="auto",
                    fp8_kernel="auto") -> nn.Module:
        if choose_fp8_kernel(fp8_kernel, quantizer, tuple(weight.shape), weight.device) == "scaled_mm":
            return Fp8ScaledMMLinear(weight, bias, quantizer, out_dtype)
        return FakeQuantLinear(weight, bias, quantizer, out_dtype)


@FORMATS.register("fp8_e4m3")
class Fp8E4M3(_Fp8):
    label, element = "FP8", E4M3


@FORMATS.register("fp8_e5m2")
class Fp8E5M2(_Fp8):
    label, element = "FP8-E5M2", E5M2


# --------------------------------------------------------------------------- real FP8 GEMMs (torch._scaled_mm)
def scaled_mm_problem(quantizer: Quantizer, weight_shape: tuple[int, int], device: torch.device) -> str | None:
    """Why a layer cannot run torch._scaled_mm, or None when it can."""
    if quantizer.format != "fp8_e4m3":
        return f"{quantizer.format}: only e4m3 x e4m3 has a kernel here (cuBLASLt rejects e5m2 x e5m2)"
    if not quantizer.quantizes_activations:
        return "weight-only FP8 (act_granularity none) has bf16 activations: no FP8 x FP8 GEMM"
    n, k = weight_shape
    if n % SCALED_MM_ALIGN or k % SCALED_MM_ALIGN:
        return f"weight {n}x{k}: torch._scaled_mm needs both dims to be multiples of {SCALED_MM_ALIGN}"
    if device.type == "cuda" and cuda_capability(device) < (8, 9):
        return f"compute capability {cuda_capability(device)} has no FP8 tensor cores (needs >= 8.9: Ada, Hopper)"
    return None


def choose_fp8_kernel(kernel: str, quantizer: Quantizer, weight_shape: tuple[int, int], device: torch.device) -> str:
    """"scaled_mm" or "emulated" for one layer. auto = the real kernel on a capable CUDA GPU, else the emulation;
    "scaled_mm" forces it (a ValueError saying why where it cannot run; on a CPU it is torch's slow fallback)."""
    check_choice("fp8 kernel", kernel, FP8_KERNELS)
    if kernel == "emulated" or (kernel == "auto" and device.type != "cuda"):
        return "emulated"
    problem = scaled_mm_problem(quantizer, weight_shape, device)
    if problem is not None and kernel == "scaled_mm":
        raise ValueError(f"fp8_kernel='scaled_mm' cannot run this layer: {problem}")
    return "emulated" if problem is not None else "scaled_mm"


def scaled_mm_scales(s_x: torch.Tensor, s_w: torch.Tensor, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The scale operands torch._scaled_mm accepts for activation scales `s_x` and weight scales `s_w`.

    Both per tensor -> two fp32 scalars (tensor-wise). Otherwise row-wise, the only mixed form the kernel takes:
    scale_a [rows, 1] and scale_b [1, cols], fp32, contiguous, a per-tensor side broadcast to its rows/columns
    (per-token activations x per-tensor weights is vLLM's default FP8 recipe).
    """
    if s_x.numel() == 1 and s_w.numel() == 1:
        return s_x.reshape(()).float(), s_w.reshape(()).float()
    scale_a = s_x.float().reshape(-1, 1).expand(rows, 1).contiguous()
    scale_b = s_w.float().reshape(1, -1).expand(1, cols).contiguous()
    return scale_a, scale_b


def fp8_gemm(a: torch.Tensor, w: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
             bias: torch.Tensor | None, out_dtype: torch.dtype, fused_rowwise: bool = True) -> torch.Tensor:
    """(a * scale_a) @ (w * scale_b^T)^T + bias in `out_dtype` with e4m3 operands a [M, K], w [N, K].

    `w.t()` is the column-major [K, N] operand the kernel requires. The kernel adds a bias only to a bf16/fp16
    output; an fp32 output gets it afterwards. Row-wise scales go into the kernel's epilogue where the GPU has
    that kernel (Hopper; `fused_rowwise`), else the GEMM runs with unit scales to fp32 and is scaled after
    (vLLM's fallback for GPUs without row-wise FP8 kernels).
    """
    tensorwise = scale_a.numel() == 1 and scale_b.numel() == 1
    if not (tensorwise or fused_rowwise):
        one = torch.ones((), dtype=torch.float32, device=a.device)
        y = torch._scaled_mm(a, w.t(), scale_a=one, scale_b=one, out_dtype=torch.float32) * scale_a * scale_b
        return (y if bias is None else y + bias.float()).to(out_dtype)
    fused_bias = None if out_dtype == torch.float32 or bias is None else bias.to(out_dtype)
    y = torch._scaled_mm(a, w.t(), scale_a=scale_a, scale_b=scale_b, bias=fused_bias, out_dtype=out_dtype)
    return y if bias is None or fused_bias is not None else y + bias.float()


def fused_rowwise_ok(device_type: str, capability: tuple[int, int] | None, out_dtype: torch.dtype,
                     cuda_version: str | None) -> bool:
    """Whether torch._scaled_mm can apply row-wise scales in its epilogue for this layer.

    CUDA needs Hopper (capability >= 9.0) for row-wise FP8 kernels, and before CUDA 12.9 they write only bf16/fp16
    ("Only bf16 and fp16 high precision output types are supported for row-wise scaling"; the README's +cu128
    wheel is such a build). Where not, `fp8_gemm` runs the GEMM with unit scales to fp32 and scales after:
    the same fp32 result, without a bf16 rounding in between. The CPU fallback takes every form."""
    if device_type != "cuda":
        return True
    if capability is None or tuple(capability) < (9, 0):
        return False
    if out_dtype != torch.float32:
        return True
    major_minor = tuple(int(p) for p in (cuda_version or "0.0").split(".")[:2])
    return major_minor >= (12, 9)


class Fp8ScaledMMLinear(QuantLinear):
    """FP8 e4m3 W8A8 on the real kernel (torch._scaled_mm): the codes and scales of `FakeQuantLinear`
    (per-channel or per-tensor weights quantized once per sync, per-token or per-tensor activations per call),
    multiplied as e4m3 x e4m3 with fp32 accumulation, output in `out_dtype` (bf16 in an FP8 engine)."""

    kernel = "scaled_mm"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, quantizer: Quantizer, out_dtype: torch.dtype):
        super().__init__(weight, out_dtype)
        self.quantizer = quantizer
        codes, scale = quantizer.quantize_weight(weight.detach().float())
        self.register_buffer("weight_fp8", codes.to(torch.float8_e4m3fn))  # [out, in]; exact: codes are on the grid
        self.register_buffer("weight_scale", scale.float())  # [out, 1] per channel, [] per tensor
        # the bias as the engine stores it (in its activation dtype), as in FakeQuantLinear
        self.register_buffer("bias", None if bias is None else bias.detach().to(out_dtype).float())
        device = weight.device
        self.min_rows = SCALED_MM_MIN_ROWS if device.type == "cuda" else 1
        capability = cuda_capability(device) if device.type == "cuda" else None
        self.fused_rowwise = fused_rowwise_ok(device.type, capability, out_dtype, torch.version.cuda)

    def dequantized_weight(self) -> torch.Tensor:
        return self.weight_fp8.float() * self.weight_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features).float()
        rows = x2.shape[0]
        x2 = pad_rows(x2, self.min_rows)  # zero rows: codes 0, scale floored, sliced off below
        codes, s_x = self.quantizer.quantize_act(x2)
        scale_a, scale_b = scaled_mm_scales(s_x, self.weight_scale, x2.shape[0], self.out_features)
        y = fp8_gemm(codes.to(torch.float8_e4m3fn), self.weight_fp8, scale_a, scale_b, self.bias, self.out_dtype,
                     self.fused_rowwise)
        return y[:rows].reshape(*lead, self.out_features)
