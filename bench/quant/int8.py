"""INT8 W8A8 (QuRL's INT8 rollouts): int8 codes, exact int32 accumulation, fp32 rescale.

Q_int8(x; s) = s * clamp(round_half_even(x/s), -128, 127), s = amax/127 (docs/arms.md §3). Per-channel (or
per-tensor) int8 weights, per-token (or per-tensor) dynamic int8 activations, rescale by s_x * s_w. The GEMM is
`torch._int_mm` (real int8 kernel; fast where the CPU has VNNI, perf-notes 3a) or an exact emulation: an fp32
GEMM over K-chunks of at most 1024 codes, where every partial sum (|.| <= 1024*128*128 = 2^24) is an exact fp32
integer, chunks summed in fp64. Both give the same int32 accumulator bit for bit; "auto" takes `_int_mm` only
where it is fast (without VNNI torch's `_int_mm` is a scalar loop, ~25x slower than fp32). Activations around
the GEMMs stay fp32 (perf-notes 3a: bf16 around them is slower on CPU and adds mismatch).

On a CUDA GPU "auto" takes `_int_mm` (cuBLASLt int8 tensor cores) for layers whose dims are multiples of 8, and
the engine runs everything around these GEMMs in bf16 (`Int8.cuda_act_dtype`), as QuRL/FlashRL's INT8 GEMMs run
inside a bf16 engine; on the CPU the activations stay fp32 (perf-notes 3a: bf16 around them is slower on CPU and
adds mismatch). Operand layout (`int_mm_layout`): on CUDA the weight codes are stored contiguous [N, K]
(nn.Linear's layout) and passed as `w.t()`, a column-major [K, N] second operand, with the activations row-major
[M, K]. torch hands cuBLASLt the transposed problem C^T = W A^T, so this is cuBLASLt's "TN" case (A transposed, B
not), the only ordering its regular-layout IMMA (int8 tensor-core) kernels document; a row-major [K, N] operand
makes it "NN" (a third-party A100 measurement: 35.2 ms against 6.4 ms for 28672x5376 at 8192 tokens). The CPU keeps
the layout perf-notes measured its int8 speed-ups with (`w.t()` contiguous): timed on the shared 2-core machine
(bench.benchmarks.int8_layout, 1.5B shapes at 17-256 tokens) the two layouts came out 0.45-1.7x of each other
either way, within that machine's noise, so nothing justified changing it. `scripts/gpu_check.sh` times both layouts on the
GPU; a measurement there that contradicts the documentation changes `INT_MM_LAYOUTS_BY_DEVICE`, nothing else. The
first operand needs more than 16 rows, so a CUDA call pads small decode batches with zero rows (`pad_rows`).
The emulation relies on exact fp32 GEMMs: on a GPU keep TF32 off (torch's default,
torch.backends.cuda.matmul.allow_tf32 = False), or it is no longer exact.
"""

from __future__ import annotations

import torch
from torch import nn

from bench.quant.linear import QuantLinear, fast_int_mm, pad_rows
from bench.quant.minifloat import work_dtype
from bench.quant.quantizers import Format, Quantizer, amax_scale, quantize
from bench.registry import FORMATS, check_choice

INT8_QMAX = 127.0
INT8_KERNELS = ("auto", "int_mm", "emulated")
#: Largest K for which an fp32 GEMM over int8 codes is exact (|partial sums| <= 1024 * 128 * 128 = 2^24).
EXACT_FP32_K = 1024
#: torch._int_mm on CUDA: more than 16 rows; K and N multiples of 8 (cuda/Blas.cpp _int_mm_out_cuda).
INT_MM_MIN_ROWS = 17
INT_MM_ALIGN = 8
#: How the weight codes are stored for torch._int_mm (module docstring): "column_major" = contiguous [N, K], the
#: second operand w.t() is column-major [K, N] (cuBLASLt's TN case); "row_major" = w.t() contiguous [K, N].
INT_MM_LAYOUTS = ("column_major", "row_major")
INT_MM_LAYOUTS_BY_DEVICE = {"cuda": "column_major", "cpu": "row_major"}


def int_mm_layout(device: torch.device | str) -> str:
    """The weight layout torch._int_mm is fastest with on `device` (module docstring)."""
    return INT_MM_LAYOUTS_BY_DEVICE.get(torch.device(device).type, "row_major")


def int_mm_problem(weight_shape: tuple[int, int], device: torch.device) -> str | None:
    """Why `torch._int_mm` cannot serve a weight [N, K] on `device`, or None."""
    n, k = weight_shape
    if device.type == "cuda" and (n % INT_MM_ALIGN or k % INT_MM_ALIGN):
        return f"weight {n}x{k}: torch._int_mm on CUDA needs both dims to be multiples of {INT_MM_ALIGN}"
    return None


def resolve_int8_kernel(kernel: str, weight_shape: tuple[int, int], device: torch.device) -> str:
    """"int_mm" or "emulated": auto = the real kernel on CUDA and on a CPU with VNNI, else the emulation."""
    check_choice("int8 kernel", kernel, INT8_KERNELS)
    problem = int_mm_problem(weight_shape, device)
    if kernel == "int_mm" and problem is not None:
        raise ValueError(f"int8_kernel='int_mm' cannot run this layer: {problem}")
    if kernel == "auto":
        fast = device.type == "cuda" or (device.type == "cpu" and fast_int_mm())
        return "int_mm" if fast and problem is None else "emulated"
    return kernel


def int_mm_weight(codes: torch.Tensor, layout: str | None = None) -> torch.Tensor:
    """int8 weight codes [N, K] stored for torch._int_mm's second operand `.t()` in `layout` (INT_MM_LAYOUTS;
    None: the codes' device's, `int_mm_layout`)."""
    layout = layout or int_mm_layout(codes.device)
    check_choice("int8 weight layout", layout, INT_MM_LAYOUTS)
    codes = codes.to(torch.int8)
    return codes.contiguous() if layout == "column_major" else codes.t().contiguous().t()


def int8_matmul(a: torch.Tensor, b_t: torch.Tensor, kernel: str = "auto") -> torch.Tensor:
    """a [M, K] @ b_t[N, K]^T with exact integer accumulation, returned as fp32 [M, N].

    Codes may be given as int8 (for `_int_mm`) or as float tensors holding code values (emulation); each
    kernel converts what it needs. The result equals `torch._int_mm(a, b_t.T).float()` exactly.
    """
    check_choice("int8 kernel", kernel, INT8_KERNELS)
    if kernel == "auto":
        kernel = resolve_int8_kernel(kernel, tuple(b_t.shape), a.device)
    if kernel == "int_mm":
        rows = a.shape[0]
        b = b_t.to(torch.int8)
        if not (b.is_contiguous() or b.t().is_contiguous()):  # stored by int_mm_weight: one of its two layouts
            b = b.contiguous()
        a8 = pad_rows(a.to(torch.int8), INT_MM_MIN_ROWS if a.is_cuda else 1)
        return torch._int_mm(a8.contiguous(), b.t())[:rows].float()
    a, b_t = a.float(), b_t.float()
    K = a.shape[-1]
    if K <= EXACT_FP32_K:
        return a @ b_t.t()
    acc = torch.zeros(a.shape[0], b_t.shape[0], dtype=torch.float64, device=a.device)
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
        self.kernel = resolve_int8_kernel(kernel, tuple(weight.shape), weight.device)
        codes, scale = quantizer.quantize_weight(weight.detach().float())
        # [out, in]; int8 in the kernel's layout on this device (int_mm_layout, module docstring)
        self.register_buffer("weight_codes", int_mm_weight(codes) if self.kernel == "int_mm" else codes)
        self.register_buffer("weight_scale", scale)  # [out, 1] per channel, [] per tensor
        self.register_buffer("bias", None if bias is None else bias.detach().to(out_dtype).float())

    def dequantized_weight(self) -> torch.Tensor:
        return self.weight_codes.float() * self.weight_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features).float()
        s_w = self.weight_scale.reshape(1, -1)
        if self.quantizer.quantizes_activations:
            x_codes, s_x = self.quantizer.quantize_act(x2)  # the engine may swap in a fused (compiled) one
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
    cuda_act_dtype = "bf16"  # on a GPU the int8 GEMMs run inside a bf16 engine (module docstring)

    def quantize(self, x, granularity, scale=None):
        work = work_dtype(x)
        xf = x.to(work)
        scale = amax_scale(xf, INT8_QMAX, granularity) if scale is None else scale.to(work)
        return torch.round(xf / scale).clamp_(-128.0, 127.0), scale  # torch.round: half to even

    def make_linear(self, weight, bias, quantizer: Quantizer, out_dtype, int8_kernel="auto",
                    fp8_kernel="auto") -> nn.Module:
        return Int8Linear(weight, bias, quantizer, out_dtype, kernel=int8_kernel)
