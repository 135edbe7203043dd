"""INT8 W8A8 (QuRL's INT8 rollouts): int8 codes, exact int32 accumulation, fp32 rescale.

Q_int8(x; s) = s * clamp(round_half_even(x/s), -128, 127), s = amax/127 (methods.md 2.2). Per-channel (or
per-tensor) int8 weights, per-token (or per-tensor) dynamic int8 activations, rescale by s_x * s_w. The GEMM is
`torch._int_mm` (real int8 kernel; fast where the CPU has VNNI, perf-notes 3a) or an exact emulation: an fp32
GEMM over K-chunks of at most 1024 codes, where every partial sum (|.| <= 1024*128*128 = 2^24) is an exact fp32
integer, chunks summed in fp64. Both give the same int32 accumulator bit for bit; "auto" takes `_int_mm` only
where it is fast (without VNNI torch's `_int_mm` is a scalar loop, ~25x slower than fp32). Activations around
the GEMMs stay fp32 (perf-notes 3a: bf16 around them is slower on CPU and adds mismatch).
"""

from __future__ import annotations

import torch
from torch import nn

from bench.quant.linear import QuantLinear, fast_int_mm
from bench.quant.quantizers import FORMATS, Format, Quantizer, amax_scale, check_choice, quantize, work_dtype

INT8_QMAX = 127.0
INT8_KERNELS = ("auto", "int_mm", "emulated")
#: Largest K for which an fp32 GEMM over int8 codes is exact (|partial sums| <= 1024 * 128 * 128 = 2^24).
EXACT_FP32_K = 1024


def int8_matmul(a: torch.Tensor, b_t: torch.Tensor, kernel: str = "auto") -> torch.Tensor:
    """a [M, K] @ b_t[N, K]^T with exact integer accumulation, returned as fp32 [M, N].

    Codes may be given as int8 (for `_int_mm`) or as float tensors holding code values (emulation); each
    kernel converts what it needs. The result equals `torch._int_mm(a, b_t.T).float()` exactly.
    """
    check_choice("int8 kernel", kernel, INT8_KERNELS)
    if kernel == "int_mm" or (kernel == "auto" and fast_int_mm()):
        return torch._int_mm(a.to(torch.int8), b_t.to(torch.int8).t()).float()
    a, b_t = a.float(), b_t.float()
    K = a.shape[-1]
    if K <= EXACT_FP32_K:
        return a @ b_t.t()
    acc = torch.zeros(a.shape[0], b_t.shape[0], dtype=torch.float64)
    for k in range(0, K, EXACT_FP32_K):
        acc += (a[:, k : k + EXACT_FP32_K] @ b_t[:, k : k + EXACT_FP32_K].t()).double()
    return acc.float()


class Int8Linear(QuantLinear):
    """INT8 W8A8: int8 codes, exact int32 accumulation (`int8_matmul`), fp32 rescale, + bias.

    With act_granularity='none' it is weight-only int8 (W8A16): dequantized weights, fp32 GEMM.
    """

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        quantizer: Quantizer,
        out_dtype: torch.dtype = torch.float32,
        kernel: str = "auto",
    ):
        super().__init__(weight, out_dtype)
        if quantizer.format != "int8":
            raise ValueError(f"Int8Linear needs format int8, got {quantizer.format!r}")
        check_choice("int8 kernel", kernel, INT8_KERNELS)
        self.quantizer = quantizer
        self.kernel = ("int_mm" if fast_int_mm() else "emulated") if kernel == "auto" else kernel
        codes, scale = quantizer.quantize_weight(weight.detach().float())
        code_dtype = torch.int8 if self.kernel == "int_mm" else torch.float32
        self.register_buffer("weight_codes", codes.to(code_dtype))  # [out, in]
        self.register_buffer("weight_scale", scale)  # [out, 1] per channel, [] per tensor
        self.register_buffer("bias", None if bias is None else bias.detach().to(out_dtype).float())

    def dequantized_weight(self) -> torch.Tensor:
        return self.weight_codes.float() * self.weight_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features).float()
        s_w = self.weight_scale.reshape(1, -1)
        if self.quantizer.quantizes_activations:
            x_codes, s_x = quantize(x2, "int8", self.quantizer.act_granularity)
            y = int8_matmul(x_codes, self.weight_codes, self.kernel) * (s_x * s_w)
        else:
            y = x2 @ (self.weight_codes.float() * self.weight_scale).t()
        if self.bias is not None:
            y = y + self.bias
        return y.to(self.out_dtype).reshape(*lead, self.out_features)


@FORMATS.register("int8")
class Int8(Format):
    label, bits, act_bits = "INT8", 8, 8
    weight_granularities = ("per_channel", "per_tensor")
    act_granularities = ("per_token", "per_tensor", "none")
    act_dtype = "fp32"

    def quantize(self, x, granularity, scale=None):
        work = work_dtype(x)
        xf = x.to(work)
        scale = amax_scale(xf, INT8_QMAX, granularity) if scale is None else scale.to(work)
        return torch.round(xf / scale).clamp_(-128.0, 127.0), scale  # torch.round: half to even

    def make_linear(self, weight, bias, quantizer: Quantizer, out_dtype, int8_kernel="auto") -> nn.Module:
        return Int8Linear(weight, bias, quantizer, out_dtype, kernel=int8_kernel)
