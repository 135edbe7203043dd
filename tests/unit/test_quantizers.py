"""Quantizers (docs/arms.md §3, tests Q1-Q4 of 2.4) and the quantized linear layers built on them."""

import pytest
import torch

from bench.quant.fp8 import round_e4m3
from bench.quant.linear import FakeQuantLinear
from bench.quant.int8 import Int8Linear, int8_matmul
from bench.quant.linear import make_linear, swap_linears
from bench.quant.plain import Bf16Linear
from bench.quant.quantizers import Quantizer, dequantize, fake_quant, normalized_quant_error, quantize

f64 = dict(dtype=torch.float64)
Q1_W = torch.tensor([1.0, 0.3, -0.05], **f64)
Q3_W = torch.tensor([[0.5, -1.27, 0.01], [1.0, 0.3, 0.0]], **f64)


def test_q1_fp8_per_tensor():
    codes, scale = quantize(Q1_W, "fp8_e4m3", "per_tensor")
    assert float(scale) == pytest.approx(1 / 448, abs=1e-12)
    assert torch.allclose(Q1_W / scale, torch.tensor([448, 134.4, -22.4], **f64), atol=1e-9)
    assert codes.tolist() == [448.0, 128.0, -22.0]
    assert torch.allclose(dequantize(codes, scale), torch.tensor([1.0, 0.285714, -0.049107], **f64), atol=1e-6)


def test_q2_fp8_per_channel():
    w = torch.tensor([[2.0, 0.7], [0.01, -0.003]], **f64)
    codes, scale = quantize(w, "fp8_e4m3", "per_channel")
    assert codes.tolist() == [[448.0, 160.0], [448.0, -128.0]]
    expected = torch.tensor([[2.0, 0.714286], [0.01, -0.002857]], **f64)
    assert torch.allclose(dequantize(codes, scale), expected, atol=1e-6)


def test_q3_int8_per_channel():
    codes, scale = quantize(Q3_W, "int8", "per_channel")
    assert codes.tolist() == [[50.0, -127.0, 1.0], [127.0, 38.0, 0.0]]
    expected = torch.tensor([[0.5, -1.27, 0.01], [1.0, 0.299213, 0.0]], **f64)
    assert torch.allclose(dequantize(codes, scale), expected, atol=1e-6)


@pytest.mark.parametrize("w, fmt, gran", [(Q1_W, "fp8_e4m3", "per_tensor"), (Q3_W, "int8", "per_channel")])
def test_q4_scale_equivariance(w, fmt, gran):
    s = 1.5
    codes, _ = quantize(w, fmt, gran)
    codes_s, _ = quantize(w / s, fmt, gran)
    assert torch.equal(codes, codes_s)
    q, q_s = fake_quant(w, fmt, gran), fake_quant(w / s, fmt, gran)
    assert torch.allclose(q_s, q / s, atol=1e-6)


def test_fp32_inputs_give_the_same_codes_as_fp64():
    """The engine quantizes in fp32 (fast e4m3 rounding); the spec cases hold there too."""
    assert quantize(Q1_W.float(), "fp8_e4m3", "per_tensor")[0].tolist() == [448.0, 128.0, -22.0]
    assert quantize(Q3_W.float(), "int8", "per_channel")[0].tolist() == [[50.0, -127.0, 1.0], [127.0, 38.0, 0.0]]


def test_fp8_clamps_before_the_cast():
    """x / s beyond +-448 (a static or stale scale) maps to the largest code, in fp32 and in fp64."""
    for dtype in (torch.float32, torch.float64):
        x = torch.tensor([1000.0, -1000.0, 460.0, 10.0], dtype=dtype)
        codes, _ = quantize(x, "fp8_e4m3", "per_tensor", scale=torch.tensor(1.0))
        assert codes.tolist() == [448.0, -448.0, 448.0, 10.0]


def test_int8_clamps_and_rounds_half_to_even():
    x = torch.tensor([300.0, -300.0, 0.5, 1.5, 2.5, -2.5])
    codes, _ = quantize(x, "int8", "per_tensor", scale=torch.tensor(1.0))
    assert codes.tolist() == [127.0, -128.0, 0.0, 2.0, 2.0, -2.0]


def _e4m3_grid() -> torch.Tensor:
    vals = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float()
    return vals[~vals.isnan()].unique()


def test_round_e4m3_is_the_e4m3_cast():
    """Every grid value, every midpoint (ties) and the floats right next to them, plus random values over
    the whole range including subnormals: the fast rounding equals torch's e4m3fn cast bit for bit."""
    grid = _e4m3_grid()
    assert grid.numel() == 253 and float(grid.max()) == 448.0  # 2*126 finite nonzero magnitudes + zero
    mids = (grid[1:] + grid[:-1]) / 2
    up, down = torch.full_like(mids, 1e9), torch.full_like(mids, -1e9)
    g = torch.Generator().manual_seed(0)
    rand = torch.cat([torch.randn(20000, generator=g) * s for s in (1e-5, 1e-3, 0.1, 10.0, 300.0)])
    y = torch.cat([grid, mids, torch.nextafter(mids, up), torch.nextafter(mids, down), rand]).clamp(-448, 448)
    expected = y.to(torch.float8_e4m3fn).float()
    assert torch.equal(round_e4m3(y.clone()), expected)


def test_all_zero_rows_are_guarded():
    w = torch.tensor([[0.0, 0.0], [1.0, -2.0]])
    for fmt in ("fp8_e4m3", "int8"):
        codes, scale = quantize(w, fmt, "per_channel")
        assert torch.isfinite(scale).all() and (scale > 0).all()
        assert torch.equal(dequantize(codes, scale)[0], torch.zeros(2))
        assert normalized_quant_error(torch.zeros(3, 3), fmt, "per_tensor") == 0.0


def test_per_token_scales_each_row_of_an_activation():
    x = torch.randn(2, 3, 8)
    _, scale = quantize(x, "int8", "per_token")
    assert scale.shape == (2, 3, 1)
    assert torch.allclose(scale, x.abs().amax(-1, keepdim=True) / 127)


def test_unscaled_formats():
    x = torch.tensor([1.0 + 2**-10, -3.0])
    assert torch.equal(fake_quant(x, "fp32", "per_tensor"), x)
    assert fake_quant(x, "bf16", "per_tensor").tolist() == [1.0, -3.0]


def test_normalized_quant_error_matches_q1():
    dq = torch.tensor([1.0, 128 / 448, -22 / 448], **f64)
    expected = float(((dq - Q1_W) ** 2).sum() / (Q1_W**2).sum())
    assert normalized_quant_error(Q1_W, "fp8_e4m3", "per_tensor") == pytest.approx(expected, rel=1e-9)
    assert normalized_quant_error(Q1_W, "fp32", "per_tensor") == 0.0


@pytest.mark.parametrize(
    "call, named",
    [
        (lambda: quantize(Q1_W, "fp4", "per_tensor"), "'fp4'"),
        (lambda: quantize(Q1_W, "int8", "per_row"), "'per_row'"),
        (lambda: fake_quant(Q1_W, "e5m2", "per_tensor"), "'e5m2'"),
        (lambda: normalized_quant_error(Q1_W, "int3", "per_tensor"), "'int3'"),
        (lambda: Quantizer("int8", weight_granularity="per_token"), "'per_token'"),
        (lambda: Quantizer("fp8_e4m3", act_granularity="per_channel"), "'per_channel'"),
        (lambda: Quantizer("fp3"), "'fp3'"),
    ],
)
def test_bad_inputs_name_the_value_and_the_choices(call, named):
    with pytest.raises(ValueError) as err:
        call()
    assert named in str(err.value) and "valid choices" in str(err.value)


def test_quantizer_dataclass():
    q = Quantizer("fp8_e4m3", "per_tensor", "none")
    w = torch.randn(4, 6)
    x = torch.randn(3, 6)
    assert q.is_scaled and not q.quantizes_activations
    assert torch.equal(q.fake_quant_act(x), x)  # weight-only
    assert torch.equal(q.fake_quant_weight(w), fake_quant(w, "fp8_e4m3", "per_tensor"))
    assert q.weight_error(w) == normalized_quant_error(w, "fp8_e4m3", "per_tensor")
    assert not Quantizer("bf16").quantizes_activations


# ---- quantized linear layers -------------------------------------------------------------------------------


def _wxb(out=24, inp=40, m=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(out, inp, generator=g), torch.randn(m, inp, generator=g), torch.randn(out, generator=g)


def test_int8_matmul_kernels_agree_exactly():
    """Real torch._int_mm and the fp32 emulation give the same int32 accumulator, also with K > 1024
    (the emulation sums exact chunks) and with the largest codes."""
    g = torch.Generator().manual_seed(0)
    for M, K, N in [(1, 16, 8), (7, 64, 96), (3, 2500, 5)]:
        a = torch.randint(-128, 128, (M, K), generator=g, dtype=torch.int8)
        b = torch.randint(-128, 128, (N, K), generator=g, dtype=torch.int8)
        ref = torch._int_mm(a, b.t())
        assert torch.equal(int8_matmul(a, b, "emulated"), ref.float())
        assert torch.equal(int8_matmul(a.float(), b.float(), "emulated"), ref.float())
        assert torch.equal(int8_matmul(a, b, "int_mm"), ref.float())
    full = torch.full((2, 2048), -128, dtype=torch.int8)
    assert torch.equal(int8_matmul(full, full, "emulated"), torch._int_mm(full, full.t()).float())
    with pytest.raises(ValueError, match="'cuda'"):
        int8_matmul(full, full, "cuda")


@pytest.mark.parametrize("wg, ag", [("per_channel", "per_token"), ("per_tensor", "per_tensor")])
def test_int8_linear_is_w8a8(wg, ag):
    w, x, b = _wxb()
    q = Quantizer("int8", wg, ag)
    ref = fake_quant(x, "int8", ag) @ fake_quant(w, "int8", wg).t() + b
    outs = [Int8Linear(w, b, q, kernel=k)(x) for k in ("int_mm", "emulated")]
    assert torch.equal(outs[0], outs[1])
    assert torch.allclose(outs[0], ref, atol=1e-5)
    assert not torch.allclose(outs[0], x @ w.t() + b, atol=1e-3)  # it is quantized
    assert outs[0].dtype == torch.float32


def test_int8_linear_keeps_leading_dims_and_weight_only_mode():
    w, x, b = _wxb()
    layer = Int8Linear(w, None, Quantizer("int8"))
    assert torch.equal(layer(x.view(5, 1, 40)).view(5, 24), layer(x))
    wo = Int8Linear(w, b, Quantizer("int8", act_granularity="none"))
    assert torch.allclose(wo(x), x @ fake_quant(w, "int8", "per_channel").t() + b, atol=1e-5)


def test_fp8_linear_is_fake_quant_w8a8():
    w, x, b = _wxb()
    layer = FakeQuantLinear(w, b, Quantizer("fp8_e4m3"), torch.float32)
    xq, wq = fake_quant(x, "fp8_e4m3", "per_token"), fake_quant(w, "fp8_e4m3", "per_channel")
    ref = torch.nn.functional.linear(xq, wq, b)
    assert torch.allclose(layer(x), ref, atol=1e-6)
    assert torch.equal(layer.weight_scale, w.abs().amax(1, keepdim=True) / 448)
    assert layer(x.bfloat16()).dtype == torch.float32
    assert FakeQuantLinear(w, b, Quantizer("fp8_e4m3"), torch.bfloat16)(x).dtype == torch.bfloat16


def test_bf16_linear_is_a_bf16_gemm():
    w, x, b = _wxb()
    y = Bf16Linear(w, b)(x)
    assert y.dtype == torch.bfloat16
    ref = torch.nn.functional.linear(x.bfloat16().double(), w.bfloat16().double(), b.bfloat16().double())
    assert torch.allclose(y.double(), ref, rtol=2**-7, atol=1e-2)  # one bf16 rounding of the exact result


def test_swap_linears_replaces_every_linear_with_overrides():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    head = net[2]
    x = torch.randn(3, 8)
    n = swap_linears(net, Quantizer("int8"), torch.float32, overrides={head: Quantizer("fp32")})
    assert n == 1 and isinstance(net[0], Int8Linear) and type(net[2]).__name__ == "Fp32Linear"
    assert net(x).shape == (3, 4)
    assert isinstance(make_linear(head.weight, None, Quantizer("fp8_e4m3"), torch.float32), FakeQuantLinear)
