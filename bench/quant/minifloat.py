"""Bit-exact emulation of the small floating-point formats used by low-precision rollouts.

One generic rounding, `round_to_minifloat`, covers every element format of the suite: FP8 E4M3 and E5M2 (OCP
OFP8 spec v1.0, the formats of `torch.float8_e4m3fn` / `torch.float8_e5m2`) and FP4 E2M1 (OCP Microscaling
(MX) spec v1.0 section 5.3.3, the element of MXFP4 and NVFP4). A format is described by its bit fields
(`MiniFloat`); the value grid follows from them:

    normal    (-1)^s * 2^(E - bias) * (1 + M / 2^m)      E = 1 .. top exponent
    subnormal (-1)^s * 2^(1 - bias) * (M / 2^m)          E = 0
    => in the binade [2^e, 2^(e+1)) the spacing is 2^(e - m) for e >= 1 - bias, and 2^(1 - bias - m) below
       (the subnormal range shares the spacing of the first normal binade).

Rounding is round-to-nearest, ties-to-even on that grid, and **saturating**: anything beyond the largest
finite value (including +-inf) becomes +-max_finite, never inf or NaN. This is what the kernels a rollout
engine runs do: vLLM's FP8 casts use `__nv_cvt_float_to_fp8(x, __NV_SATFINITE, ...)`
[code: vllm csrc/quantization/fp8/nvidia/quant_utils.cuh, scaled_vec_conversion], FP4 quantizers clamp to
+-6 before rounding [code: vllm tests/kernels/quantization/nvfp4_utils.py ref_nvfp4_quant; OCP MX spec
section 6.3]. E5M2 has infinities, but torch's non-saturating cast maps |x| >= 61440 to inf; we saturate.

Why not just `x.to(torch.float8_e4m3fn)`?
* fp64 inputs: torch converts fp64 -> fp32 -> fp8, rounding twice. A value just past a midpoint can be
  rounded onto the midpoint by the first step and then tied to even by the second:
  -(400 + 2^-30) becomes -400 in fp32, then -384, while the correctly rounded e4m3 value is -416
  (issue 13 item 8). Here fp64 inputs are rounded in fp64, once.
* speed: the fp8 casts are scalar loops on CPU; the bit trick below is vectorised.
* E2M1 has no usable torch cast (`torch.float4_e2m1fn_x2` exists as a dtype but torch 2.13 on CPU has no copy
  kernel for it), and e5m2's cast does not saturate.

Signed zero: a value that rounds to zero keeps its sign (-1e-9 -> -0.0), as the hardware casts and torch's
fp8 casts do (every format here has a -0 encoding). -0.0 == 0.0 compares equal, so this only shows in
`torch.signbit` or in 1/x. NaN inputs stay NaN (no format of the suite can be asked to encode one silently).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from bench.registry import check_choice

__all__ = [
    "MiniFloat",
    "E4M3",
    "E5M2",
    "E2M1",
    "MINIFLOATS",
    "get_minifloat",
    "round_to_minifloat",
    "E8M0_MIN_EXP",
    "E8M0_MAX_EXP",
    "E8M0_ROUNDINGS",
    "e8m0_exponent",
    "round_e8m0",
    "pow2",
    "floor_log2",
    "work_dtype",
]


@dataclass(frozen=True)
class MiniFloat:
    """A sign-magnitude binary floating-point format with `exp_bits` exponent and `man_bits` mantissa bits.

    `has_inf`: the top exponent code is reserved for inf/NaN (IEEE-style, e.g. E5M2). Formats without it
    (E4M3 "fn": only S.1111.111 is NaN; E2M1: no special values) use the top exponent for finite values.
    `max_finite` is given explicitly because the encodings differ in what the top codes mean (E4M3:
    1.75 * 2^8 = 448, not 1.875 * 2^8); it is checked against the grid.
    """

    name: str
    exp_bits: int
    man_bits: int
    bias: int
    max_finite: float
    has_inf: bool

    def __post_init__(self) -> None:
        if self.exp_bits < 1 or self.man_bits < 0:
            raise ValueError(f"{self.name}: need exp_bits >= 1 and man_bits >= 0, got {self.exp_bits}, {self.man_bits}")
        top = 2**self.exp_bits - (2 if self.has_inf else 1)  # largest exponent code of finite values
        largest = 2.0 ** (top - self.bias) * (2 - 2.0**-self.man_bits)
        if not 0 < self.max_finite <= largest:
            raise ValueError(f"{self.name}: max_finite={self.max_finite} outside (0, {largest}]")
        mant, _ = math.frexp(self.max_finite)  # max_finite = mant * 2^e, mant in [0.5, 1)
        if not (mant * 2 ** (self.man_bits + 1)).is_integer():
            raise ValueError(f"{self.name}: max_finite={self.max_finite} is not a grid value")

    @property
    def min_normal_exp(self) -> int:
        """Exponent of the smallest normal number, 1 - bias."""
        return 1 - self.bias

    @property
    def min_normal(self) -> float:
        return 2.0**self.min_normal_exp

    @property
    def min_subnormal(self) -> float:
        """The smallest positive value, and the spacing of the grid below the smallest normal."""
        return 2.0 ** (self.min_normal_exp - self.man_bits)

    def representable_values(self) -> list[float]:
        """Every non-negative finite value of the format, ascending, enumerated from the bit fields."""
        values = {self.min_subnormal * m for m in range(2**self.man_bits)}  # E = 0 (zero and subnormals)
        for e in range(1, 2**self.exp_bits):
            for m in range(2**self.man_bits):
                v = 2.0 ** (e - self.bias) * (1 + m / 2**self.man_bits)
                if v <= self.max_finite:
                    values.add(v)
        return sorted(values)


#: FP8 E4M3 ("fn": finite, no inf; NaN = S.1111.111): bias 7, max 1.75 * 2^8 = 448, min normal 2^-6,
#: min subnormal 2^-9 [OCP OFP8 spec v1.0, table 1; torch.float8_e4m3fn].
E4M3 = MiniFloat("e4m3", exp_bits=4, man_bits=3, bias=7, max_finite=448.0, has_inf=False)
#: FP8 E5M2 (IEEE-like, with inf and NaN): bias 15, max 1.75 * 2^15 = 57344, min normal 2^-14, min subnormal
#: 2^-16 [OCP OFP8 spec v1.0, table 1; torch.float8_e5m2].
E5M2 = MiniFloat("e5m2", exp_bits=5, man_bits=2, bias=15, max_finite=57344.0, has_inf=True)
#: FP4 E2M1 (no inf/NaN): bias 1, values {0, 0.5, 1, 1.5, 2, 3, 4, 6}, max 6, min normal 1, subnormal 0.5
#: [OCP MX spec v1.0 section 5.3.3].
E2M1 = MiniFloat("e2m1", exp_bits=2, man_bits=1, bias=1, max_finite=6.0, has_inf=False)

MINIFLOATS: dict[str, MiniFloat] = {f.name: f for f in (E4M3, E5M2, E2M1)}


def get_minifloat(fmt: MiniFloat | str) -> MiniFloat:
    """The format itself, or the named one; ValueError naming the valid names otherwise."""
    if isinstance(fmt, MiniFloat):
        return fmt
    check_choice("minifloat format", fmt, tuple(MINIFLOATS))
    return MINIFLOATS[fmt]


def work_dtype(x: torch.Tensor) -> torch.dtype:
    """fp64 for fp64 inputs, fp32 for everything else: never round in a narrower type than the input."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


# Exponent-field masks: `bits & mask` reinterpreted as a float is 2^floor(log2|y|) for normal y (0 for 0 and
# input-subnormals, which lie far below every format's smallest normal and are clamped up to it).
_EXP_MASK = {
    torch.float32: (torch.int32, torch.tensor(0x7F800000, dtype=torch.int32)),
    torch.float64: (torch.int64, torch.tensor(0x7FF0000000000000, dtype=torch.int64)),
}


def round_to_minifloat(x: torch.Tensor, fmt: MiniFloat | str) -> torch.Tensor:
    """Round to the nearest value of `fmt`, ties to even, saturating at +-max_finite.

    Returned as a float tensor of the grid values, in fp64 for fp64 inputs and fp32 otherwise (the grids of
    E4M3/E5M2/E2M1 are exact in both). fp32 results are bit-identical to `x.to(torch.float8_e4m3fn)` and, on
    values the cast does not overflow (|x| < 61440), to `x.to(torch.float8_e5m2)`; fp64 results are the
    correctly rounded ones (torch's casts round fp64 inputs through fp32, see the module docstring).

    How: after the clamp, |y| <= max_finite. 2^floor(log2|y|) is y's exponent field alone (sign and mantissa
    masked off); the grid spacing is that power of two (raised to 2^(1-bias) in the subnormal range) times
    2^-man_bits. y / spacing and the product back are exact (powers of two), and torch.round rounds half to
    even, so the only rounding is the intended one, in the input's own precision.
    """
    f = get_minifloat(fmt)
    dtype = work_dtype(x)
    y = x.to(dtype).clamp(-f.max_finite, f.max_finite)
    int_dtype, mask = _EXP_MASK[dtype]
    pow2 = torch.bitwise_and(y.view(int_dtype), mask).view(dtype)
    step = pow2.clamp_(min=f.min_normal).mul_(2.0**-f.man_bits)
    return torch.round(y / step).mul_(step)


# ---- E8M0: the MX shared scale -------------------------------------------------------------------------

#: E8M0 (OCP MX spec v1.0 section 5.4.1): an unsigned power of two 2^(E - 127), E = 0..254, so exponents
#: -127..127; E = 255 is NaN; no zero, no infinity, no sign.
E8M0_MIN_EXP = -127
E8M0_MAX_EXP = 127
E8M0_ROUNDINGS = ("floor", "ceil")


def pow2(exp: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """2^exp for an integer tensor exp in [-1022, 1023], exactly: built from fp64 bits, then cast (2^-127, an
    fp32 subnormal, is exact in fp32; no libm exp2/ldexp involved)."""
    return torch.bitwise_left_shift(exp.to(torch.int64) + 1023, 52).view(torch.float64).to(dtype)


def floor_log2(x: torch.Tensor) -> torch.Tensor:
    """floor(log2|x|) as int32, exactly (frexp: x = m * 2^e with m in [0.5, 1)), for finite nonzero x,
    subnormals included. Meaningless for 0, inf and NaN: callers mask those."""
    return torch.frexp(x.to(work_dtype(x)))[1] - 1


def e8m0_exponent(x: torch.Tensor, rounding: str = "floor") -> torch.Tensor:
    """The E8M0 exponent (int32) of |x|: floor(log2|x|) ("floor") or ceil(log2|x|) ("ceil"), clamped to
    [-127, 127].

    "floor" is the power-of-two rounding of the MX spec's conversion (section 6.3: X = 2^(floor(log2 amax) -
    emax_elem)); "ceil" (round up to a power of two) is what cuBLAS/torchao "RCEIL" and llm-compressor's MXFP4
    scales apply to amax / max_elem. Exact (no log2). 0 has no logarithm and no E8M0 encoding; it maps to the
    smallest exponent, -127 (as torchao's MX cast gives it); +-inf saturates to 127. The sign of x is ignored
    (E8M0 is unsigned). NaN gives -127 here: `round_e8m0` turns it back into NaN (the spec's 0xFF).
    """
    if rounding not in E8M0_ROUNDINGS:
        raise ValueError(f"unknown e8m0 rounding {rounding!r}; valid choices: {', '.join(E8M0_ROUNDINGS)}")
    a = x.to(work_dtype(x)).abs()
    mant, exp = torch.frexp(a)
    exp = exp - 1  # floor(log2 a) for finite a > 0
    if rounding == "ceil":
        exp = exp + (mant != 0.5).to(exp.dtype)  # not an exact power of two: round up
    exp = torch.where(a == 0, torch.full_like(exp, E8M0_MIN_EXP), exp)
    exp = torch.where(torch.isinf(a), torch.full_like(exp, E8M0_MAX_EXP), exp)
    return exp.clamp(E8M0_MIN_EXP, E8M0_MAX_EXP)


def round_e8m0(x: torch.Tensor, rounding: str = "floor") -> torch.Tensor:
    """2^e8m0_exponent(x) as a float tensor (fp64 for fp64 inputs, else fp32). NaN inputs give NaN.

    Not torch's `x.to(torch.float8_e8m0fnu)`: that cast rounds to the *nearest* power of two (3.0 -> 4.0,
    0.3 -> 0.25), which is neither the MX spec's floor nor RCEIL.
    """
    dtype = work_dtype(x)
    out = pow2(e8m0_exponent(x, rounding), dtype)
    return torch.where(torch.isnan(x.to(dtype)), torch.full_like(out, float("nan")), out)
