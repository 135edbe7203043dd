"""The engine's linear layers: shared plumbing, CPU capability probes, and the swap into HF models.

Precision is a property of the engine, not of the model code: the engine builds every matmul of the policy
through `make_linear(weight, bias, quantizer, out_dtype)`, which asks the quantizer's format for its layer
(bench/quant/<format>.py), and the modelling code only ever calls the module. Weights are quantized once, at
construction (= at every weight sync, with fresh scales); activations of the W8A8 formats are quantized
dynamically on every forward. Every layer can return the weight it actually computes with
(`dequantized_weight`), from which the engine reports its quantization error (QuRL Eq. 14).
"""

from __future__ import annotations

import functools
from abc import abstractmethod
from collections.abc import Iterable
from typing import Any, Callable, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from bench.quant.quantizers import Format, Quantizer
from bench.registry import check_choice


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


def cuda_capability(device: torch.device) -> tuple[int, int]:
    """(major, minor) compute capability of a CUDA device: 8.0 A100, 8.9 L4/L40/RTX 40xx, 9.0 H100/H200."""
    return tuple(torch.cuda.get_device_capability(device))  # type: ignore[return-value]


def pad_rows(x: torch.Tensor, min_rows: int) -> torch.Tensor:
    """x [M, K] with zero rows appended up to `min_rows` (unchanged when M >= min_rows).

    The CUDA int8/FP8 GEMMs want more than 16 rows (torch._int_mm refuses M <= 16; vLLM pads FP8 GEMMs to 17);
    a decode step of a small batch has fewer. The caller slices the first M rows of the result.
    """
    missing = min_rows - x.shape[0]
    return x if missing <= 0 else torch.cat([x, x.new_zeros(missing, *x.shape[1:])])


#: `rollout.cpu_kernels`, the kernels of the embedded engine's decode on a CPU (a GPU ignores the key): `plain` torch's
#: `F.linear` (MKL's sgemm on x86) for every fp32 GEMM and SDPA for the attention, the engine before the key; `auto`
#: oneDNN's GEMM on a weight packed once per sync into its blocked layout for the weights of at least
#: ONEDNN_MIN_WEIGHT elements (sgemm for the rest) and a decode step's attention as two batched matmuls
#: (bench.rollout.embedded.decode_attention); `onednn` as auto with every fp32 weight packed.
CPU_KERNELS = ("auto", "onednn", "plain")
#: `auto` packs a weight of at least this many elements (1 MiB in fp32). Measured on a 2-core AVX-512 machine with 24
#: weights of one shape cycled (a model's weights do not stay in cache between decode steps): oneDNN's packed GEMM
#: took 0.36-0.72x sgemm's time from 2^18 elements up at 1-64 rows (the 10m preset's MLP, every layer of Qwen2.5-0.5B),
#: 0.36-0.75x at 2^17, and up to 2.7x sgemm's time at 2^16 and a single row (its ~20 us call cost). Below it stay every
#: weight of the tiny models the quickstart and the tests run: their weights stay in cache, where packing them gained
#: nothing in the rollout benchmark (1m preset, every weight packed: 0.80-0.99x).
ONEDNN_MIN_WEIGHT = 2**18


def onednn_available() -> bool:
    """Whether this torch has oneDNN's packed fp32 linear (the ops Inductor's CPU weight prepacking emits)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class QuantLinear(nn.Module):
    """Shared shape bookkeeping of the engine's linears: [..., in] -> [..., out] in `out_dtype`.

    A subclass whose forward multiplies fp32 activations by an fp32 `weight` does so through `fp32_linear` and sets
    `fp32_gemm`; `use_cpu_gemm` may then give it oneDNN's packed copy of the weight (`packed`)."""

    fp32_gemm = False  # whether forward multiplies through `fp32_linear` (a class or an instance sets it)
    packed: torch.Tensor | None = None  # oneDNN's blocked copy of `weight` (use_cpu_gemm), not state: rebuilt per sync

    def __init__(self, weight: torch.Tensor, out_dtype: torch.dtype):
        super().__init__()
        self.in_features = weight.shape[1]
        self.out_features = weight.shape[0]
        self.out_dtype = out_dtype

    def fp32_linear(self, x: torch.Tensor) -> torch.Tensor:
        """fp32 `x` [..., in] times the fp32 `weight`, plus `bias`: torch's GEMM, or oneDNN's on the packed weight.
        oneDNN's result for a row does not depend on the other rows of the call from two rows up, nor on the
        thread count (tests/unit/test_gemm_kernels.py), so a compacted decode batch computes what the whole one does."""
        if self.packed is None:
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def dequantized_weight(self) -> torch.Tensor:
        """The weight [out, in] this layer multiplies by, as fp32 values."""
        return self.weight.float()

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, out_dtype={self.out_dtype}"


class FakeQuantLinear(QuantLinear):
    """W{n}A{n} (or weight-only, act_granularity 'none') by fake quantization: the weight quantized and
    dequantized once per sync, activations on every call, then an fp32 GEMM on the rounded values, the
    result cast to `out_dtype`. Bit-identical to a kernel that multiplies the same codes and scales with fp32
    accumulation (perf-notes 3b for FP8: identical to the CPU `torch._scaled_mm` path, and 3-10x faster), and
    the way every format without a fast CPU kernel runs here (FP8 e4m3/e5m2, MXFP4, NVFP4, INT4 W4A16)."""

    fp32_gemm = True

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, quantizer: Quantizer, out_dtype: torch.dtype):
        super().__init__(weight, out_dtype)
        self.quantizer = quantizer
        codes, scale = quantizer.quantize_weight(weight.detach().float())
        self.register_buffer("weight", codes * scale)
        self.register_buffer("weight_scale", scale)  # kept to show that every sync computes fresh scales
        # the bias as the engine would store it (in its activation dtype), added in fp32
        self.register_buffer("bias", None if bias is None else bias.detach().to(out_dtype).float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xq = self.quantizer.fake_quant_act(x.float())
        return self.fp32_linear(xq).to(self.out_dtype)



class BlockFormat(Format):
    """A format whose scales are recomputed from every tensor in blocks or groups (mxfp4, nvfp4, int4), emulated
    with FakeQuantLinear: a subclass sets the class attributes of Format and `block_quantize`, nothing else."""

    act_dtype = "bf16"
    scale_kind: ClassVar[str] = "block"  # "block" | "group": how the error below names the scales

    @abstractmethod
    def block_quantize(self, x: torch.Tensor) -> Any:
        """The blockscale.py result of `x` (its `codes` and `element_scales()`)."""

    def quantize(self, x: torch.Tensor, granularity: str, scale: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        if scale is not None:
            raise ValueError(f"{self.name}: {self.scale_kind} scales are always recomputed (no static scale)")
        q = self.block_quantize(x)
        return q.codes, q.element_scales()

    def make_linear(self, weight: torch.Tensor, bias: torch.Tensor | None, quantizer: Quantizer,
                    out_dtype: torch.dtype, int8_kernel: str = "auto", fp8_kernel: str = "auto") -> nn.Module:
        return FakeQuantLinear(weight, bias, quantizer, out_dtype)

def make_linear(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    quantizer: Quantizer,
    out_dtype: torch.dtype,
    int8_kernel: str = "auto",
    fp8_kernel: str = "auto",
) -> nn.Module:
    """The linear layer of `quantizer`'s format; weight is [out, in] as in nn.Linear. The kernel choices are the
    engine's knobs (rollout.int8_kernel, rollout.fp8_kernel); a format uses the one of its kind."""
    return quantizer.fmt.make_linear(weight, bias, quantizer, out_dtype, int8_kernel, fp8_kernel)


def use_cpu_gemm(modules: Iterable[nn.Module], choice: str) -> int:
    """Give the fp32-GEMM linears among `modules` whose weights are on a CPU oneDNN's packed copy of their weight,
    as `choice` (CPU_KERNELS) says; returns how many. `onednn` where this torch lacks oneDNN is refused."""
    check_choice("rollout.cpu_kernels", choice, CPU_KERNELS)
    if choice == "plain":
        return 0
    if not onednn_available():
        if choice == "onednn":
            raise ValueError("rollout.cpu_kernels=onednn: this torch has no oneDNN (torch.backends.mkldnn is "
                             "unavailable); use rollout.cpu_kernels=auto or plain")
        return 0
    count = 0
    for m in modules:
        if not (isinstance(m, QuantLinear) and m.fp32_gemm):
            continue
        w = m.weight
        if w.device.type != "cpu" or w.dtype != torch.float32 or (choice == "auto" and w.numel() < ONEDNN_MIN_WEIGHT):
            continue
        m.packed = torch.ops.mkldnn._reorder_linear_weight(w)
        count += 1
    return count


def swap_linears(
    root: nn.Module,
    quantizer: Quantizer,
    out_dtype: torch.dtype,
    overrides: dict[nn.Module, Quantizer] | None = None,
    int8_kernel: str = "auto",
    fp8_kernel: str = "auto",
    on_build: Callable[[str, torch.Tensor, nn.Module], None] | None = None,
) -> int:
    """Replace every nn.Linear under `root` in place, built from its current weights; `overrides` maps
    particular modules (e.g. the lm_head) to another quantizer. Returns how many got `quantizer`.
    `on_build(name, original weight, new layer)` sees each replacement (the engine's error accounting).

    Used by the generic HF fallback: the model's own forward then runs the engine's precision. The new
    layers keep their tensors in buffers, so casting the model's parameters afterwards leaves them alone.
    """
    overrides = overrides or {}
    count = 0
    for parent_name, parent in list(root.named_modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                q = overrides.get(child, quantizer)
                layer = make_linear(child.weight, child.bias, q, out_dtype, int8_kernel, fp8_kernel)
                if on_build is not None and child not in overrides:
                    on_build(f"{parent_name}.{name}" if parent_name else name, child.weight.detach(), layer)
                setattr(parent, name, layer)
                count += child not in overrides
    return count
