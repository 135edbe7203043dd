"""Minifloat rounding (bench/quant/minifloat.py): grids, ties-to-even, saturation, subnormals, signed zero, fp64.

Expected values are written by hand from the formats' definitions (OCP OFP8 v1.0 for E4M3/E5M2, OCP MX v1.0
section 5.3.3 for E2M1, 5.4.1 for E8M0), or come from torch's own fp8 casts (an independent implementation),
or from a brute-force nearest-even search over a grid written by hand.
"""

import math

import pytest
import torch

from bench.quant.minifloat import (
    E2M1,
    E4M3,
    E5M2,
    MiniFloat,
    e8m0_exponent,
    get_minifloat,
    round_e8m0,
    round_to_minifloat,
)

f64 = torch.float64
# E2M1 by hand: codes 0b0000..0b0111 -> 0, 0.5 (subnormal), 1, 1.5, 2, 3, 4, 6
E2M1_GRID = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def _rnd(values, fmt, dtype=f64) -> list[float]:
    return round_to_minifloat(torch.tensor(values, dtype=dtype), fmt).tolist()


# ---- grids ----------------------------------------------------------------------------------------------


def test_e2m1_grid_is_the_spec_table():
    assert E2M1.representable_values() == E2M1_GRID
    assert _rnd(E2M1_GRID, "e2m1") == E2M1_GRID
    assert _rnd([-v for v in E2M1_GRID], "e2m1") == [-v for v in E2M1_GRID]


def test_e4m3_and_e5m2_grids_by_hand():
    # E4M3: exponent codes 1..15 x 8 mantissas = 120 normals, minus S.1111.111 (NaN) = 119; 7 subnormals; zero
    g = E4M3.representable_values()
    assert len(g) == 1 + 7 + 119
    assert g[1] == 2.0**-9 and g[7] == 7 * 2.0**-9 and g[8] == 2.0**-6  # min/max subnormal, min normal
    assert g[-1] == 448.0 and g[-2] == 416.0 and g[-3] == 384.0  # 1.75, 1.625, 1.5 * 2^8
    assert [v for v in g if 128 <= v < 256] == [128.0 + 16 * i for i in range(8)]  # spacing 2^(7-3) = 16
    # E5M2: exponent codes 1..30 (31 = inf/NaN) x 4 mantissas = 120 normals; 3 subnormals; zero
    g = E5M2.representable_values()
    assert len(g) == 1 + 3 + 120
    assert g[1] == 2.0**-16 and g[4] == 2.0**-14 and g[-1] == 57344.0 and g[-2] == 49152.0
    for f, lo, sub in ((E4M3, 2.0**-6, 2.0**-9), (E5M2, 2.0**-14, 2.0**-16), (E2M1, 1.0, 0.5)):
        assert (f.min_normal, f.min_subnormal) == (lo, sub)


def _torch_grid(dtype: torch.dtype) -> torch.Tensor:
    vals = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype).float()
    return vals[torch.isfinite(vals)].unique()


@pytest.mark.parametrize("fmt, tdtype, top", [(E4M3, torch.float8_e4m3fn, 448.0), (E5M2, torch.float8_e5m2, 57344.0)])
def test_bit_identical_to_torch_fp8_casts(fmt, tdtype, top):
    """Every grid value, every midpoint (a tie), the fp32 neighbours of each midpoint, and random values over the
    whole range including subnormals: identical to torch's cast, sign of zero included (fp32 inputs in range;
    torch's e5m2 cast overflows to inf from 61440 on, which `test_saturation` covers)."""
    grid = _torch_grid(tdtype)
    assert grid.tolist() == sorted({-v for v in fmt.representable_values()} | set(fmt.representable_values()))
    mids = (grid[1:] + grid[:-1]) / 2
    up, down = torch.full_like(mids, math.inf), torch.full_like(mids, -math.inf)
    g = torch.Generator().manual_seed(0)
    scales = (1e-6, 1e-4, 1e-2, 1.0, 30.0, top / 3)
    rand = torch.cat([torch.randn(20000, generator=g) * s for s in scales]).clamp(-top, top)
    y = torch.cat([grid, mids, torch.nextafter(mids, up), torch.nextafter(mids, down), rand])
    expected = y.to(tdtype).float()
    got = round_to_minifloat(y, fmt)
    assert got.dtype == torch.float32
    assert torch.equal(got, expected)
    assert torch.equal(torch.signbit(got), torch.signbit(expected))


def _nearest_even(x: float, grid: list[float]) -> float:
    """Brute force: the nearest value of +-grid; on a tie the one with the even code (even index in grid)."""
    mag = abs(x)
    best = min(range(len(grid)), key=lambda i: (abs(grid[i] - mag), i % 2))
    return math.copysign(grid[best], x)


def test_e2m1_ties_to_even_by_hand():
    # midpoints of consecutive grid values and where ties-to-even sends them (even code = even index):
    #   0.25 -> 0 | 0.75 -> 1 | 1.25 -> 1 | 1.75 -> 2 | 2.5 -> 2 | 3.5 -> 4 | 5 -> 4
    mids = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    assert _rnd(mids, "e2m1") == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    assert _rnd([-m for m in mids], "e2m1") == [-0.0, -1.0, -1.0, -2.0, -2.0, -4.0, -4.0]
    # just off the midpoints the nearer value wins
    eps = 2.0**-20
    assert _rnd([m + eps for m in mids], "e2m1") == [0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    assert _rnd([m - eps for m in mids], "e2m1") == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0]
    assert _rnd([0.3, 2.9, 4.9, 5.1], "e2m1") == [0.5, 3.0, 4.0, 6.0]


def test_e2m1_matches_a_brute_force_nearest_even_search():
    """torch.float4_e2m1fn_x2 has no CPU cast kernel in torch 2.13, so the reference is a search over the
    hand-written grid, on random values, all midpoints and their fp32 neighbours."""
    g = torch.Generator().manual_seed(1)
    mids = torch.tensor([(a + b) / 2 for a, b in zip(E2M1_GRID, E2M1_GRID[1:])])
    x = torch.cat([torch.randn(3000, generator=g) * 3, mids, -mids, torch.nextafter(mids, mids + 1),
                   torch.nextafter(mids, mids - 1)])
    x = x.clamp(-6, 6)
    got = round_to_minifloat(x, E2M1).tolist()
    assert got == [_nearest_even(v, E2M1_GRID) for v in x.tolist()]


# ---- fp64: rounded once, in fp64 (issue 13 item 8) -----------------------------------------------------------


def test_fp64_rounds_in_fp64():
    # e4m3 in [256, 512): spacing 32; grid ... 384 (1.5*2^8, mantissa 100, even), 416 (101, odd), 448
    # -400 is the midpoint of 384 and 416 -> even -> -384; -(400 + 2^-30) is past it -> -416.
    # torch's cast rounds fp64 through fp32 (400 + 2^-30 -> 400) and gives -384 for both.
    x = [-(400 + 2**-30), -400.0, 400 + 2**-30, 400.0]
    assert _rnd(x, "e4m3") == [-416.0, -384.0, 416.0, 384.0]
    assert torch.tensor(x[:1], dtype=f64).to(torch.float8_e4m3fn).item() == -384.0  # the double rounding
    assert _rnd(x, "e4m3", torch.float32) == [-384.0, -384.0, 384.0, 384.0]  # fp32 inputs: ties really are ties
    # e5m2 in [256, 512): spacing 64; 416 is the midpoint of 384 (even) and 448 (odd)
    assert _rnd([416.0, 416 + 2**-30], "e5m2") == [384.0, 448.0]
    # e2m1: 2.5 ties to 2, 2.5 + 2^-40 (not an fp32 number) rounds to 3
    assert _rnd([2.5, 2.5 + 2**-40, 5 - 2**-40], "e2m1") == [2.0, 3.0, 4.0]
    assert round_to_minifloat(torch.tensor([1.0], dtype=f64), E4M3).dtype == f64


def test_fp64_matches_brute_force_near_every_e4m3_midpoint():
    grid = E4M3.representable_values()
    mids = [(a + b) / 2 for a, b in zip(grid, grid[1:])]
    x = [m * (1 + d) for m in mids for d in (2.0**-40, -(2.0**-40), 0.0)] + [-m * (1 + 2.0**-40) for m in mids]
    assert _rnd(x, "e4m3") == [_nearest_even(v, grid) for v in x]


def test_fp32_and_fp64_agree_away_from_midpoints():
    g = torch.Generator().manual_seed(2)
    for fmt, top in ((E4M3, 448.0), (E5M2, 57344.0), (E2M1, 6.0)):
        x32 = torch.cat([torch.randn(20000, generator=g) * s for s in (top / 1000, top / 10, top)])
        # every fp32 value, midpoints included, rounds the same in fp64 (it is the same number)
        assert torch.equal(round_to_minifloat(x32, fmt).double(), round_to_minifloat(x32.double(), fmt))
        # fp64 values that are not fp32 numbers: same result unless the fp32 rounding crossed a midpoint
        x64 = x32.double() * (1 + 1e-12)
        grid = torch.tensor(fmt.representable_values(), dtype=f64)
        mids = (grid[1:] + grid[:-1]) / 2
        dist = (x64.abs().unsqueeze(1) - mids).abs().min(dim=1).values
        away = dist > 1e-6 * x64.abs()
        assert away.float().mean() > 0.99
        assert torch.equal(round_to_minifloat(x64[away].float(), fmt).double(), round_to_minifloat(x64[away], fmt))


# ---- saturation, subnormals, zero, NaN -------------------------------------------------------------------


def test_saturation_never_inf_or_nan():
    big = [449.0, 464.0, 1e6, 1e30, math.inf]  # 464 = midpoint of 448 and the (absent) 480
    assert _rnd(big, "e4m3") == [448.0] * 5
    assert _rnd([-v for v in big], "e4m3") == [-448.0] * 5
    # e5m2 has inf, but we saturate: 61440 (midpoint of 57344 and 2^16) and beyond -> 57344
    assert _rnd([61440.0, 65536.0, 1e9, math.inf, -math.inf], "e5m2") == [57344.0] * 4 + [-57344.0]
    assert torch.tensor([61440.0]).to(torch.float8_e5m2).float().item() == math.inf  # what torch would do
    assert _rnd([6.5, 7.0, 100.0, -math.inf], "e2m1") == [6.0, 6.0, 6.0, -6.0]
    for dtype in (torch.float32, f64):
        assert _rnd([1e38, -1e38], "e4m3", dtype) == [448.0, -448.0]


def test_subnormals_by_hand():
    # e4m3: subnormal spacing 2^-9. 2^-10 is the midpoint of 0 and 2^-9 -> 0 (even);
    # 3*2^-11 = 0.75 * 2^-9 -> 2^-9; 3*2^-10 = 1.5 * 2^-9 is a tie of 2^-9 (odd) and 2^-8 (even) -> 2^-8;
    # 5*2^-10 = 2.5 * 2^-9 -> 2 * 2^-9 = 2^-8; 15*2^-10 = 7.5*2^-9 -> 8*2^-9 = 2^-6 (the smallest normal)
    x = [2.0**-10, 3 * 2.0**-11, 3 * 2.0**-10, 5 * 2.0**-10, 15 * 2.0**-10, 1e-30]
    assert _rnd(x, "e4m3") == [0.0, 2.0**-9, 2.0**-8, 2.0**-8, 2.0**-6, 0.0]
    # e5m2: subnormal spacing 2^-16; 2^-17 -> 0; 3 * 2^-17 -> 2^-15 (even); 7 * 2^-17 = 3.5 * 2^-16 -> 4*2^-16
    assert _rnd([2.0**-17, 3 * 2.0**-17, 7 * 2.0**-17], "e5m2") == [0.0, 2.0**-15, 2.0**-14]
    # e2m1: the only subnormal is 0.5; 0.25 -> 0, 0.26 -> 0.5
    assert _rnd([0.25, 0.26, 0.74], "e2m1") == [0.0, 0.5, 0.5]
    # fp32 subnormal inputs
    assert _rnd([1e-45, -1e-45], "e4m3", torch.float32) == [0.0, -0.0]


def test_signed_zero_and_nan():
    out = round_to_minifloat(torch.tensor([-1e-9, -0.0, 0.0, 1e-9]), E4M3)
    assert out.tolist() == [0.0] * 4 and torch.signbit(out).tolist() == [True, True, False, False]
    out = round_to_minifloat(torch.tensor([-0.2, 0.2, -0.25]), E2M1)
    assert out.tolist() == [0.0, 0.0, 0.0] and torch.signbit(out).tolist() == [True, False, True]
    assert torch.isnan(round_to_minifloat(torch.tensor([math.nan]), E2M1)).all()


def test_dtypes_and_shapes():
    x = torch.tensor([[1.1, -2.2], [3.3, 500.0]], dtype=torch.bfloat16)
    out = round_to_minifloat(x, "e4m3")
    assert out.dtype == torch.float32 and out.shape == (2, 2)
    assert out.tolist() == [[1.125, -2.25], [3.25, 448.0]]  # bf16(1.1)=1.1015625 -> 1.125 (spacing 0.125)
    assert round_to_minifloat(torch.empty(0), E5M2).numel() == 0


def test_bad_format_names_and_definitions():
    with pytest.raises(ValueError, match=r"'fp4'.*valid choices: e4m3, e5m2, e2m1"):
        get_minifloat("fp4")
    with pytest.raises(ValueError, match="not a grid value"):
        MiniFloat("bad", exp_bits=4, man_bits=3, bias=7, max_finite=450.0, has_inf=False)
    with pytest.raises(ValueError, match="outside"):
        MiniFloat("bad", exp_bits=5, man_bits=2, bias=15, max_finite=65536.0, has_inf=True)  # 2^16 is inf
    assert get_minifloat(E2M1) is E2M1


# ---- E8M0 ---------------------------------------------------------------------------------------------------


def test_e8m0_floor_and_ceil_by_hand():
    x = torch.tensor([1.0, 5.0, 0.3, 8.0, -6.0, 0.0, 2.0**-130, 1.5 * 2.0**127, math.inf])
    # floor(log2): 1 -> 0, 5 = 1.25*2^2 -> 2, 0.3 = 1.2*2^-2 -> -2, 8 -> 3, |-6| -> 2,
    # 0 -> -127 (no zero in E8M0), 2^-130 -> clamp -127, 1.5*2^127 -> 127, inf -> saturate 127
    assert e8m0_exponent(x).tolist() == [0, 2, -2, 3, 2, -127, -127, 127, 127]
    # ceil(log2): exact powers of two stay (1 -> 0, 8 -> 3); 5 -> 3, 0.3 -> -1, 6 -> 3; 1.5*2^127 -> clamp 127
    assert e8m0_exponent(x, "ceil").tolist() == [0, 3, -1, 3, 3, -127, -127, 127, 127]
    assert round_e8m0(x).tolist() == [1.0, 4.0, 0.25, 8.0, 4.0, 2.0**-127, 2.0**-127, 2.0**127, 2.0**127]
    assert round_e8m0(torch.tensor([5.0], dtype=f64), "ceil").tolist() == [8.0]
    assert torch.isnan(round_e8m0(torch.tensor([math.nan]))).all()
    with pytest.raises(ValueError, match=r"'nearest'.*valid choices: floor, ceil"):
        e8m0_exponent(x, "nearest")
