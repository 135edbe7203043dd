"""Rollout precisions: the `Format` contract and the amax-scaled quantizers (docs/arms.md §3).

A precision (`rollout.precision=<name>`) is one `Format` subclass registered under its name in FORMATS
(bench/registry.py) by a module of bench/quant/ (plain.py holds the unquantized ones, fp8.py both FP8s, the others
a module each; an unknown `rollout.precision` is refused with the list of them). The format owns its whole
vocabulary: how a tensor is rounded (`quantize`), which weight / activation granularities it supports, its label and bit
widths for tables, the activation dtype an engine should run around it, and the linear layer that computes
with it. Nothing outside bench/quant/ branches on a precision's name.

Every low-precision rollout in the suite is defined by these few lines, so they follow the kernels they
emulate exactly. Scales are amax / qmax per tensor, per output row of a weight [out, in] ("per_channel"), or per
row of an activation along its last dim ("per_token", dynamic: recomputed on every call); the 4-bit formats
scale per group / block of the last dim ("per_group", "per_block"). Codes are returned as a float tensor holding
the code values (448., 128., -22., ...) and the scale broadcasts against them (block formats return it per
element), so that x_hat = codes * scale for every format.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from bench.registry import FORMATS, check_choice

#: Every granularity `quantize` accepts; each format declares which it supports for weights and activations.
GRANULARITIES = ("per_tensor", "per_channel", "per_token", "per_group", "per_block")
NO_ACT_QUANT = "none"  # act_granularity of a weight-only format / setting (W8A16)


def amax_scale(xf: torch.Tensor, qmax: float, granularity: str) -> torch.Tensor:
    """amax / qmax per tensor, or per row (last dim reduced, kept as size 1 for broadcasting): per_channel
    (rows of W [out, in]) and per_token (rows of X [..., in]) reduce the same axis.

    All-zero rows would give s = 0 and 0/0 codes; the scale is floored at the dtype's smallest normal, which
    keeps their codes at 0 and their dequantized values exactly 0.

    qmax is divided as a tensor on xf's device, not as a Python number: CUDA turns `t / number` into
    `t * (1 / number)`, which misses the correctly rounded quotient by an ulp for some amax (seen on an H100:
    scales, hence FP8 codes and INT8 outputs, differed from the CPU's), while tensor / tensor divides exactly
    on every device.
    """
    amax = xf.abs().amax() if granularity == "per_tensor" else xf.abs().amax(dim=-1, keepdim=True)
    return amax.div_(torch.full_like(amax, qmax)).clamp_(min=torch.finfo(xf.dtype).tiny)


class Format(ABC):
    """One rollout precision. Subclasses set the class attributes and implement `quantize` and `make_linear`.

    label                 name in tables ("FP8", "INT8", "BF16")
    bits, act_bits        weight bits; bits of dynamically quantized activations (None: not quantized)
    weight_granularities  supported weight scale granularities, the first is the default; () = unscaled
                          (fp32/bf16: a rounding at most, no scales, no quantization-error metrics)
    act_granularities     supported activation granularities, the first is the default ("none" = weight-only)
    act_dtype             dtype of everything around the linears (residual stream, attention, KV cache)
    cuda_act_dtype        the same on a CUDA device where it differs (INT8: bf16 on a GPU, fp32 on a CPU)
    """

    label: ClassVar[str]
    bits: ClassVar[int]
    act_bits: ClassVar[int | None] = None
    weight_granularities: ClassVar[tuple[str, ...]] = ()
    act_granularities: ClassVar[tuple[str, ...]] = (NO_ACT_QUANT,)
    act_dtype: ClassVar[str] = "fp32"
    cuda_act_dtype: ClassVar[str | None] = None  # the activation dtype on a CUDA device; None: act_dtype

    def __init__(self, name: str) -> None:
        self.name = name

    def act_dtype_on(self, device_type: str) -> str:
        """The activation dtype of an engine computing on `device_type` ("cpu", "cuda", ...)."""
        return self.cuda_act_dtype if device_type == "cuda" and self.cuda_act_dtype else self.act_dtype

    def act_scales_per_token(self, granularity: str) -> bool:
        """True when a dynamic activation scale at `granularity` depends on one token's row alone (per_token,
        per_block), so a teacher-forced pass over any batch reproduces it; False when it spans the tensor."""
        return granularity != "per_tensor"

    @property
    def scaled(self) -> bool:
        """True for formats with codes and scales (quantized weights, quantization-error metrics)."""
        return bool(self.weight_granularities)

    @abstractmethod
    def quantize(
        self, x: torch.Tensor, granularity: str, scale: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(codes, scale) with x ~= codes * scale, computed in fp32 (fp64 for fp64 input)."""

    @abstractmethod
    def make_linear(
        self, weight: torch.Tensor, bias: torch.Tensor | None, quantizer: "Quantizer", out_dtype: torch.dtype,
        int8_kernel: str = "auto", fp8_kernel: str = "auto",
    ) -> nn.Module:
        """The engine's linear layer for a weight [out, in] in this format (quantized once, here)."""


_INSTANCES: dict[str, Format] = {}


def get_format(name: str) -> Format:
    """The registered Format `name`; ValueError listing the valid precisions."""
    if name not in _INSTANCES:
        _INSTANCES[name] = FORMATS.get(name)(name)
    return _INSTANCES[name]


def precisions() -> list[str]:
    return FORMATS.names()


def quantize(
    x: torch.Tensor, fmt: str, granularity: str, scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, scale) with x ~= codes * scale. Codes are float values on the format's grid.

    `scale` defaults to the amax scale of `granularity`; a given (static, e.g. stale) scale can put x / s
    outside the format's range, which the format's clamp maps to its largest code instead of NaN.
    Unscaled formats return (x rounded, 1), so a precision string can be handed to any of these functions.
    """
    check_choice("granularity", granularity, GRANULARITIES)
    return get_format(fmt).quantize(x, granularity, scale)


def dequantize(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return codes * scale


def fake_quant(x: torch.Tensor, fmt: str, granularity: str) -> torch.Tensor:
    """Q(x) = dequantize(quantize(x)), returned in x's dtype (the arithmetic itself is fp32)."""
    return dequantize(*quantize(x, fmt, granularity)).to(x.dtype)


def normalized_quant_error(w: torch.Tensor, fmt: str, granularity: str) -> float:
    """||Q(w) - w||^2 / ||w||^2 (QuRL Eq. 14), in fp64; 0.0 for an all-zero tensor."""
    w64 = w.detach().to(torch.float64)
    denom = float(w64.pow(2).sum())
    if denom == 0.0:
        return 0.0
    err = dequantize(*quantize(w64, fmt, granularity)) - w64
    return float(err.pow(2).sum()) / denom


@dataclass(frozen=True)
class Quantizer:
    """A rollout precision as data: format, weight granularity, activation granularity.

    A granularity left as None takes the format's default; an unsupported one raises, naming the format's
    choices. This is the one place a precision setting is validated (the config boundary builds one).
    """

    format: str
    weight_granularity: str | None = None
    act_granularity: str | None = None

    def __post_init__(self) -> None:
        fmt = get_format(self.format)
        if fmt.scaled:
            wg = self.weight_granularity or fmt.weight_granularities[0]
            ag = self.act_granularity or fmt.act_granularities[0]
            check_choice(f"weight granularity for {self.format}", wg, fmt.weight_granularities)
            check_choice(f"activation granularity for {self.format}", ag, fmt.act_granularities)
        else:  # fp32 / bf16: nothing is scaled, the granularities are moot
            wg, ag = None, NO_ACT_QUANT
        object.__setattr__(self, "weight_granularity", wg)
        object.__setattr__(self, "act_granularity", ag)

    @property
    def fmt(self) -> Format:
        return get_format(self.format)

    @property
    def is_scaled(self) -> bool:
        """True for the formats with codes, scales and low-precision GEMMs."""
        return self.fmt.scaled

    @property
    def quantizes_activations(self) -> bool:
        return self.is_scaled and self.act_granularity != NO_ACT_QUANT

    def quantize_weight(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.fmt.quantize(w, self.weight_granularity or "per_tensor")

    def fake_quant_weight(self, w: torch.Tensor) -> torch.Tensor:
        return dequantize(*self.quantize_weight(w)).to(w.dtype)

    def quantize_act(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.fmt.quantize(x, self.act_granularity)

    def fake_quant_act(self, x: torch.Tensor) -> torch.Tensor:
        """Dynamic activation fake quant; the identity for weight-only and unscaled formats."""
        if not self.quantizes_activations:
            return x
        return dequantize(*self.quantize_act(x)).to(x.dtype)

    def weight_error(self, w: torch.Tensor) -> float:
        return normalized_quant_error(w, self.format, self.weight_granularity or "per_tensor")

    def describe(self) -> dict[str, Any]:
        """The precision as the reports name it (recorded in run.json): label, bit widths, granularities."""
        fmt = self.fmt
        return {"name": self.format, "label": fmt.label, "weight_bits": fmt.bits,
                "act_bits": fmt.act_bits if self.quantizes_activations else None,
                "weight_granularity": self.weight_granularity, "act_granularity": self.act_granularity}
