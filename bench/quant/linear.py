"""Linear layers of the rollout engine, one per precision, swapped in for `nn.Linear`.

Precision is a property of the engine, not of the model code: the engine builds every matmul of the policy
through `make_linear(weight, bias, quantizer, out_dtype)`, and the modelling code only ever calls the module.
Weights are quantized once, at construction (= at every weight sync, with fresh scales); activations of the
W8A8 formats are quantized dynamically on every forward.

What each layer computes, and why it is built that way on a CPU:

* `Fp32Linear`  plain fp32 GEMM.
* `Bf16Linear`  bf16 operands, fp32 accumulation, bf16 result - what a bf16 GEMM computes. On CPUs without
  native bf16 matmul (no AVX512-BF16/AMX, e.g. Zen3) torch's bf16 GEMM is a slow fallback (8-13x slower than
  fp32 here), so the same numbers are produced by an fp32 GEMM on the bf16 values: products of two bf16 numbers
  are exact in fp32, so only the summation order differs, as between any two bf16 kernels.
* `Fp8Linear`   FP8 e4m3 W8A8 emulated by fake quantization: weights quantize-dequantized once, activations
  per token (or per tensor) on every call, then an fp32 GEMM, result cast to `out_dtype`. perf-notes 3b: this is
  bit-identical to the CPU `torch._scaled_mm` path and 3-10x faster; CPUs have no fast FP8 GEMM without AMX.
* `Int8Linear`  INT8 W8A8 with an int32-accumulating GEMM on the int8 codes: per-channel (or per-tensor) int8
  weights, per-token (or per-tensor) dynamic int8 activations, rescale by s_x * s_w. The GEMM is
  `torch._int_mm` (real int8 kernel; fast where the CPU has VNNI, perf-notes 3a) or an exact emulation: an fp32
  GEMM over K-chunks of at most 1024 codes, where every partial sum (|.| <= 1024*128*128 = 2^24) is an exact
  fp32 integer, chunks summed in fp64. Both give the same int32 accumulator bit for bit; "auto" takes
  `_int_mm` only where it is fast (without VNNI torch's `_int_mm` is a scalar loop, ~25x slower than fp32).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from bench.quant.quantizers import Quantizer, check_choice, quantize

INT8_KERNELS = ("auto", "int_mm", "emulated")
#: Largest K for which an fp32 GEMM over int8 codes is exact (|partial sums| <= 1024 * 128 * 128 = 2^24).
EXACT_FP32_K = 1024


def _cpu_has(feature: str) -> bool:
    probe = getattr(torch.cpu, f"_is_{feature}_supported", None)  # private torch probes; absent = unknown
    return bool(probe()) if probe is not None else False


@functools.cache
def native_bf16_matmul() -> bool:
    """True where torch's CPU bf16 GEMM runs on bf16 hardware (AVX512-BF16 or AMX)."""
    return _cpu_has("avx512_bf16") or _cpu_has("amx_tile")


@functools.cache
def fast_int_mm() -> bool:
    """True where torch._int_mm on CPU uses VNNI int8 dot products (perf-notes: ~2x bf16, ~4.5x fp32)."""
    return _cpu_has("vnni") or _cpu_has("amx_tile")


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


class _Linear(nn.Module):
    """Shared shape bookkeeping: [..., in] -> [..., out] in `out_dtype`."""

    def __init__(self, weight: torch.Tensor, out_dtype: torch.dtype):
        super().__init__()
        self.in_features = weight.shape[1]
        self.out_features = weight.shape[0]
        self.out_dtype = out_dtype

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, out_dtype={self.out_dtype}"


class Fp32Linear(_Linear):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype = torch.float32):
        super().__init__(weight, out_dtype)
        self.register_buffer("weight", weight.detach().float().clone())
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.float(), self.weight, self.bias).to(self.out_dtype)


class Bf16Linear(_Linear):
    """bf16 weights and inputs, fp32 accumulation, bf16-rounded result (native kernel or exact emulation)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype = torch.bfloat16):
        super().__init__(weight, out_dtype)
        self.native = native_bf16_matmul()
        store = torch.bfloat16 if self.native else torch.float32  # fp32 storage holds bf16 values exactly
        self.register_buffer("weight", weight.detach().to(torch.bfloat16).to(store))
        self.register_buffer("bias", None if bias is None else bias.detach().to(torch.bfloat16).to(store))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(torch.bfloat16)
        y = F.linear(x, self.weight, self.bias) if self.native else F.linear(x.float(), self.weight, self.bias)
        return y.to(torch.bfloat16).to(self.out_dtype)


class Fp8Linear(_Linear):
    """FP8 e4m3 W8A8 (or W8A16 with act_granularity='none') by fake quantization, fp32 GEMM."""

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None, quantizer: Quantizer, out_dtype: torch.dtype
    ):
        super().__init__(weight, out_dtype)
        if quantizer.format != "fp8_e4m3":
            raise ValueError(f"Fp8Linear needs format fp8_e4m3, got {quantizer.format!r}")
        self.quantizer = quantizer
        codes, scale = quantizer.quantize_weight(weight.detach().float())
        self.register_buffer("weight", codes * scale)
        self.register_buffer("weight_scale", scale)
        # the bias as the engine would store it (in its activation dtype), added in fp32
        self.register_buffer("bias", None if bias is None else bias.detach().to(out_dtype).float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xq = self.quantizer.fake_quant_act(x.float())
        return F.linear(xq, self.weight, self.bias).to(self.out_dtype)


class Int8Linear(_Linear):
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


def make_linear(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    quantizer: Quantizer,
    out_dtype: torch.dtype,
    int8_kernel: str = "auto",
) -> nn.Module:
    """The linear layer for `quantizer.format`; weight is [out, in] as in nn.Linear."""
    fmt = quantizer.format
    if fmt == "fp32":
        return Fp32Linear(weight, bias, out_dtype)
    if fmt == "bf16":
        return Bf16Linear(weight, bias, out_dtype)
    if fmt == "fp8_e4m3":
        return Fp8Linear(weight, bias, quantizer, out_dtype)
    return Int8Linear(weight, bias, quantizer, out_dtype, kernel=int8_kernel)


def swap_linears(
    root: nn.Module,
    quantizer: Quantizer,
    out_dtype: torch.dtype,
    overrides: dict[nn.Module, Quantizer] | None = None,
    int8_kernel: str = "auto",
) -> int:
    """Replace every nn.Linear under `root` in place, built from its current weights; `overrides` maps
    particular modules (e.g. the lm_head) to another quantizer. Returns how many got `quantizer`.

    Used by the generic HF fallback: the model's own forward then runs the engine's precision. The new
    layers keep their tensors in buffers, so casting the model's parameters afterwards leaves them alone.
    """
    overrides = overrides or {}
    count = 0
    for parent in list(root.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                q = overrides.get(child, quantizer)
                setattr(parent, name, make_linear(child.weight, child.bias, q, out_dtype, int8_kernel))
                count += child not in overrides
    return count
