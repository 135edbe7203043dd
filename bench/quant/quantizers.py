"""Amax-scaled quantizers (methods.md section 2.2): format x granularity, as fake quantization.

Every low-precision rollout in the suite is defined by these few lines, so they follow the kernels they
emulate exactly: FP8 clamps to +-448 *before* the e4m3 cast (a float -> e4m3fn cast is not guaranteed to
saturate: in the e4m3fn encoding an overflow is NaN; torch 2.13 on CPU happens to saturate), rounds to nearest
even; INT8 rounds half to even and clamps to [-128, 127].
Scales are amax / qmax per tensor, per output row of a weight [out, in] ("per_channel"), or per row of an
activation along its last dim ("per_token", dynamic: recomputed on every call).

Codes are returned as a float tensor holding the code values (448., 128., -22., ...) so that tests and the
emulated GEMMs can use them directly; `Int8Linear` casts them to torch.int8 for the real kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bench.config import ACT_GRANULARITIES, PRECISIONS, WEIGHT_GRANULARITIES

#: Formats: the rollout precisions. fp32/bf16 have no scale (scale 1): fp32 is the identity, bf16 a rounding.
FORMATS = PRECISIONS
#: Every granularity `quantize` accepts; `Quantizer` restricts weights and activations further.
GRANULARITIES = ("per_tensor", "per_channel", "per_token")
QMAX = {"fp8_e4m3": 448.0, "int8": 127.0}
SCALED_FORMATS = tuple(QMAX)


def check_choice(what: str, value: object, valid: tuple) -> None:
    """ValueError naming the bad value and listing the valid ones."""
    if value not in valid:
        raise ValueError(f"unknown {what} {value!r}; valid choices: {', '.join(map(str, valid))}")


def _work_dtype(x: torch.Tensor) -> torch.dtype:
    """fp32, or fp64 when given fp64 (the numeric tests): never compute a scale in bf16."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _amax_scale(xf: torch.Tensor, qmax: float, granularity: str) -> torch.Tensor:
    """amax / qmax per tensor, or per row (last dim reduced, kept as size 1 for broadcasting): per_channel
    (rows of W [out, in]) and per_token (rows of X [..., in]) reduce the same axis.

    All-zero rows would give s = 0 and 0/0 codes; the scale is floored at the dtype's smallest normal, which
    keeps their codes at 0 and their dequantized values exactly 0.
    """
    amax = xf.abs().amax() if granularity == "per_tensor" else xf.abs().amax(dim=-1, keepdim=True)
    return amax.div_(qmax).clamp_(min=torch.finfo(xf.dtype).tiny)


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


def quantize(
    x: torch.Tensor, fmt: str, granularity: str, scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, scale) with x ~= codes * scale. Codes are float values on the format's grid.

    `scale` defaults to the amax scale of `granularity`; a given (static, e.g. stale) scale can put x / s
    outside the format's range, which the clamp maps to the largest code instead of NaN.
    fp32 returns (x, 1); bf16 returns (x rounded to bf16, 1): the unscaled formats share the interface so a
    precision string can be handed to any of these functions.
    """
    check_choice("quantization format", fmt, FORMATS)
    check_choice("granularity", granularity, GRANULARITIES)
    work = _work_dtype(x)
    xf = x.to(work)
    if fmt not in SCALED_FORMATS:
        codes = xf if fmt == "fp32" else xf.to(torch.bfloat16).to(work)
        return codes, torch.ones((), dtype=work)
    scale = _amax_scale(xf, QMAX[fmt], granularity) if scale is None else scale.to(work)
    y = xf / scale
    if fmt == "fp8_e4m3":
        y.clamp_(-448.0, 448.0)
        codes = round_e4m3(y) if work == torch.float32 else y.to(torch.float8_e4m3fn).to(work)
    else:  # int8; torch.round is round-half-to-even
        codes = torch.round(y).clamp_(-128.0, 127.0)
    return codes, scale


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

    `act_granularity="none"` is weight-only quantization. For fp32/bf16 both granularities are ignored.
    """

    format: str
    weight_granularity: str = "per_channel"
    act_granularity: str = "per_token"

    def __post_init__(self) -> None:
        check_choice("quantization format", self.format, FORMATS)
        check_choice("weight granularity", self.weight_granularity, WEIGHT_GRANULARITIES)
        check_choice("activation granularity", self.act_granularity, ACT_GRANULARITIES)

    @property
    def is_scaled(self) -> bool:
        """True for the 8-bit formats (the ones with codes, scales and W8A8 GEMMs)."""
        return self.format in SCALED_FORMATS

    @property
    def quantizes_activations(self) -> bool:
        return self.is_scaled and self.act_granularity != "none"

    def quantize_weight(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return quantize(w, self.format, self.weight_granularity)

    def fake_quant_weight(self, w: torch.Tensor) -> torch.Tensor:
        return fake_quant(w, self.format, self.weight_granularity)

    def quantize_act(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return quantize(x, self.format, self.act_granularity)

    def fake_quant_act(self, x: torch.Tensor) -> torch.Tensor:
        """Dynamic activation fake quant; the identity for weight-only and unscaled formats."""
        if not self.quantizes_activations:
            return x
        return fake_quant(x, self.format, self.act_granularity)

    def weight_error(self, w: torch.Tensor) -> float:
        return normalized_quant_error(w, self.format, self.weight_granularity)
