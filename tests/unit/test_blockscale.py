"""Block-scaled and FP8 fake quantization (bench/quant/blockscale.py).

Every expected value is worked out by hand from the format's definition; the arithmetic is in the comments.
E2M1 grid: 0, 0.5, 1, 1.5, 2, 3, 4, 6 (ties go to the even code: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2,
3.5->4, 5->4). E4M3 spacing: 2^(e-3) in [2^e, 2^(e+1)), e.g. 4 in [32, 64), 16 in [128, 256).
"""

import math

import pytest
import torch

from bench.quant.blockscale import (
    from_blocks,
    to_blocks,
    fake_quant_kv,
    mx_shared_exponent,
    nvfp4_global_scale,
    quantize_int4,
    quantize_mxfp4,
    quantize_nvfp4,
)
from bench.quant.quantizers import Quantizer, fake_quant, normalized_quant_error, quantize
from bench.quant.minifloat import E2M1

f64 = dict(dtype=torch.float64)


def _row(values, width, **kw) -> torch.Tensor:
    """`values` followed by zeros up to `width`."""
    return torch.tensor(list(values) + [0.0] * (width - len(values)), **kw)


# ---- int4 (symmetric, scale = amax / 7.5, codes -8..7) ---------------------------------------------------


def test_int4_group_codes_by_hand():
    # amax 7.5 -> scale 1: 7.5 -> clamp 7; -7.5 -> tie of -8 (even) and -7 -> -8; 3.25 -> 3;
    # 0.5 -> 0 (even); 1.5 -> 2; 2.5 -> 2 (even); -0.5 -> -0
    w = torch.tensor([[7.5, -7.5, 3.25, 0.5, 1.5, 2.5, -0.5, 0.0]], **f64)
    q = quantize_int4(w, group_size=8)
    assert q.scales.tolist() == [[1.0]]
    assert q.codes.tolist() == [[7.0, -8.0, 3.0, 0.0, 2.0, 2.0, 0.0, 0.0]]
    assert q.dequantize().tolist() == [[7.0, -8.0, 3.0, 0.0, 2.0, 2.0, 0.0, 0.0]]


def test_int4_two_groups_per_row():
    # group 1 amax 3.75 -> scale 0.5: [3.75, -1.25, 0.75, 0.2] / 0.5 = [7.5, -2.5, 1.5, 0.4] -> [7, -2, 2, 0]
    # group 2 amax 15 -> scale 2: [15, 1, -2, 3] / 2 = [7.5, 0.5, -1, 1.5] -> [7, 0, -1, 2]
    w = torch.tensor([[3.75, -1.25, 0.75, 0.2, 15.0, 1.0, -2.0, 3.0]], **f64)
    q = quantize_int4(w, group_size=4)
    assert q.scales.tolist() == [[0.5, 2.0]]
    assert q.codes.tolist() == [[7.0, -2.0, 2.0, 0.0, 7.0, 0.0, -1.0, 2.0]]
    assert q.dequantize().tolist() == [[3.5, -1.0, 1.0, 0.0, 14.0, 0.0, -2.0, 4.0]]


def test_int4_ragged_last_group_is_zero_padding():
    # in = 10, group 4 -> groups of 4, 4, 2; last group [1.0, -3.75]: scale 0.5 -> [2, -7.5 -> -8]
    w = torch.tensor([[3.75, 0, 0, 0, 7.5, 0, 0, 0, 1.0, -3.75]], **f64)
    q = quantize_int4(w, group_size=4)
    assert q.scales.tolist() == [[0.5, 1.0, 0.5]]
    assert q.codes[0, 8:].tolist() == [2.0, -8.0]
    assert q.dequantize()[0, 8:].tolist() == [1.0, -4.0]
    padded = torch.nn.functional.pad(w, (0, 2))
    assert torch.equal(quantize_int4(padded, group_size=4).dequantize()[:, :10], q.dequantize())
    assert q.dequantize().shape == (1, 10)


def test_int4_zero_and_all_equal_groups():
    # all-zero group: scale floored at fp32 eps (2^-23, as compressed-tensors does), codes 0, no NaN
    # all-equal +3.75: 3.75 / 0.5 = 7.5 -> 7 -> 3.5 (= 14/15 of amax); -3.75 -> -7.5 -> -8 -> -4 (= 16/15)
    w = torch.tensor([[0.0] * 4, [3.75] * 4, [-3.75] * 4], **f64)
    q = quantize_int4(w, group_size=4)
    assert q.scales[:, 0].tolist() == [2.0**-23, 0.5, 0.5]
    assert q.dequantize().tolist() == [[0.0] * 4, [3.5] * 4, [-4.0] * 4]


def test_int4_default_group_and_bad_group_sizes():
    w = torch.randn(3, 300)
    q = quantize_int4(w)
    assert q.block_size == 128 and q.scales.shape == (3, 3)  # ceil(300 / 128)
    assert q.codes.min() >= -8 and q.codes.max() <= 7 and torch.equal(q.codes, q.codes.round())
    for bad in (0, -4, 1.5, True):
        with pytest.raises(ValueError, match="positive int"):
            quantize_int4(w, group_size=bad)
    with pytest.raises(ValueError, match="scalar"):
        quantize_int4(torch.tensor(1.0))


# ---- MXFP4 (OCP MX v1.0: block 32, X = 2^(floor(log2 amax) - 2), E2M1 elements) ------------------------


def test_mx_scale_selection_by_hand():
    # emax_elem of E2M1 = floor(log2 6) = 2.
    # amax 5:   floor(log2 5) = 2     -> 2 - 2 = 0  -> X = 2^0 = 1
    # amax 8:   floor(log2 8) = 3     -> 1          -> X = 2 (power-of-two amax: 8 / 2 = 4, exact)
    # amax 6:   floor(log2 6) = 2     -> 0          -> X = 1 (6 exact)
    # amax 7:   2 -> 0 -> X = 1, and 7 saturates to 6 ("ceil": ceil(log2(7/6)) = 1 -> X = 2)
    # amax 0.1: 0.1 = 1.6 * 2^-4      -> -4 - 2 = -6 -> X = 2^-6
    # amax 0:   no log -> -127 (E8M0 code 0x00)
    amax = torch.tensor([5.0, 8.0, 6.0, 7.0, 0.1, 0.0])
    assert mx_shared_exponent(amax).tolist() == [0, 1, 0, 0, -6, -127]
    # ceil = smallest X with amax / X <= 6: 5/6 -> 0; 8/6 -> 1; 6/6 -> 0; 7/6 -> 1; 0.1/6 = 1.07*2^-6 -> -5
    assert mx_shared_exponent(amax, E2M1, "ceil").tolist() == [0, 1, 0, 1, -5, -127]
    with pytest.raises(ValueError, match=r"'round'.*valid choices: floor, ceil"):
        mx_shared_exponent(amax, E2M1, "round")


def test_mxfp4_blocks_by_hand():
    x = torch.stack([
        _row([5.0, 1.0, -2.5, 0.3, 3.5, -0.2], 32),  # X = 1: 5 -> 4 (tie), -2.5 -> -2, 0.3 -> 0.5, 3.5 -> 4
        _row([8.0, -1.0, 0.7], 32),  # X = 2: [4, -0.5, 0.35 -> 0.5] -> dequant [8, -1, 1]
        _row([7.0, -6.5], 32),  # X = 1: both saturate to +-6
        _row([0.1, 0.03, -0.01], 32),  # X = 1/64: [6.4 -> 6, 1.92 -> 2, -0.64 -> -0.5]
        _row([], 32),  # zero block
    ])
    q = quantize_mxfp4(x)
    assert q.scales[:, 0].tolist() == [1.0, 2.0, 1.0, 2.0**-6, 2.0**-127]
    assert q.codes[:, :6].tolist() == [
        [4.0, 1.0, -2.0, 0.5, 4.0, 0.0],
        [4.0, -0.5, 0.5, 0.0, 0.0, 0.0],
        [6.0, -6.0, 0.0, 0.0, 0.0, 0.0],
        [6.0, 2.0, -0.5, 0.0, 0.0, 0.0],
        [0.0] * 6,
    ]
    deq = q.dequantize()
    assert deq[1, :3].tolist() == [8.0, -1.0, 1.0]
    assert deq[3, :3].tolist() == [6 / 64, 2 / 64, -0.5 / 64]
    assert deq[4].tolist() == [0.0] * 32 and torch.isfinite(deq).all()


def test_mxfp4_ceil_scale_does_not_saturate():
    # amax 7 with "ceil": X = 2 -> 7/2 = 3.5 -> 4 (tie, even) -> 8; -6.5/2 = -3.25 -> -3 -> -6
    q = quantize_mxfp4(_row([7.0, -6.5], 32).unsqueeze(0), scale_rounding="ceil")
    assert q.scales.tolist() == [[2.0]] and q.dequantize()[0, :2].tolist() == [8.0, -6.0]


def test_mxfp4_all_equal_blocks_are_exact_when_on_the_grid():
    # [1]*32: floor(log2 1) = 0 -> X = 2^-2 -> 4 -> exact; [-3]*32: floor(log2 3) = 1 -> X = 2^-1 -> -6 -> exact
    x = torch.tensor([[1.0] * 32, [-3.0] * 32])
    q = quantize_mxfp4(x)
    assert q.scales[:, 0].tolist() == [0.25, 0.5] and q.codes[:, 0].tolist() == [4.0, -6.0]
    assert torch.equal(q.dequantize(), x)


def test_mxfp4_per_row_blocks_of_an_activation_and_ragged_tail():
    x = torch.randn(2, 3, 40)  # blocks of 32 + 8 along the last dim, per row
    q = quantize_mxfp4(x)
    assert q.scales.shape == (2, 3, 2) and q.codes.shape == (2, 3, 40)
    amax_tail = x[..., 32:].abs().amax(-1)
    assert torch.equal(q.scales[..., 1], torch.exp2(torch.floor(torch.log2(amax_tail)) - 2))
    assert torch.equal(q.dequantize(), quantize_mxfp4(torch.nn.functional.pad(x, (0, 24))).dequantize()[..., :40])


def test_mxfp4_fp32_and_fp64_give_the_same_codes():
    x = torch.randn(16, 64)
    q32, q64 = quantize_mxfp4(x), quantize_mxfp4(x.double())
    assert q64.codes.dtype == torch.float64
    assert torch.equal(q32.codes.double(), q64.codes) and torch.equal(q32.scales.double(), q64.scales)


# ---- NVFP4 (block 16, E4M3 block scale, G = 448*6/amax_tensor) ------------------------------------------


def test_nvfp4_global_scale_one():
    # amax_tensor 2688 = 448 * 6 -> G = 1.
    # block 1, amax 2688: s = e4m3(2688 / 6) = 448; x / 448: 2688 -> 6, 448 -> 1, 1000 -> 2.23 -> 2 (896),
    #   -1300 -> -2.90 -> -3 (-1344)
    # block 2, amax 6: s = e4m3(1) = 1; 6 -> 6, 2.5 -> 2 (tie), 0.3 -> 0.5, -0.3 -> -0.5
    x = torch.cat([_row([2688.0, 448.0, 1000.0, -1300.0], 16), _row([6.0, 2.5, 0.3, -0.3], 16)]).unsqueeze(0)
    q = quantize_nvfp4(x)
    assert q.global_scale.item() == 1.0 and q.scales.tolist() == [[448.0, 1.0]]
    assert q.codes[0, :4].tolist() == [6.0, 1.0, 2.0, -3.0] and q.codes[0, 16:20].tolist() == [6.0, 2.0, 0.5, -0.5]
    assert q.dequantize()[0, :4].tolist() == [2688.0, 448.0, 896.0, -1344.0]
    assert q.dequantize()[0, 16:20].tolist() == [6.0, 2.0, 0.5, -0.5]


def test_nvfp4_global_scale_and_block_scale_rounding():
    # amax_tensor 1 -> G = 2688.
    # block 1, amax 1:   s = e4m3(2688 * 1 / 6 = 448) = 448; effective scale 448 / 2688 = 1/6:
    #   1 -> 6, 0.5 -> 3, 0.25 -> 1.5, -0.4 -> -2.4 -> -2 (dequant -1/3)
    # block 2, amax 0.1: 2688 * 0.1 / 6 = 44.8 -> e4m3 (spacing 4 in [32, 64): 11.2 -> 11) = 44;
    #   effective 44 / 2688: 0.1 -> 6.11 -> 6 (saturates: the block scale was rounded down),
    #   0.05 -> 3.05 -> 3, -0.02 -> -1.22 -> -1
    x = torch.cat([_row([1.0, 0.5, 0.25, -0.4], 16), _row([0.1, 0.05, -0.02], 16)]).unsqueeze(0)
    q = quantize_nvfp4(x)
    assert q.global_scale.item() == 2688.0 and q.scales.tolist() == [[448.0, 44.0]]
    assert q.codes[0, :4].tolist() == [6.0, 3.0, 1.5, -2.0] and q.codes[0, 16:19].tolist() == [6.0, 3.0, -1.0]
    expected = [1.0, 0.5, 0.25, -1 / 3] + [0.0] * 12 + [6 * 44 / 2688, 3 * 44 / 2688, -44 / 2688] + [0.0] * 13
    assert torch.allclose(q.dequantize()[0], torch.tensor(expected), rtol=1e-6, atol=0)
    assert torch.allclose(q.block_scales(), torch.tensor([[1 / 6, 44 / 2688]]), rtol=1e-6)


def test_nvfp4_static_global_amax():
    x = _row([1.0, 0.5, 0.25], 16).unsqueeze(0)
    # calibrated amax 2 -> G = 1344; s = e4m3(1344 / 6 = 224) = 224 (on the grid: 14 * 16); effective 1/6 again
    q = quantize_nvfp4(x, global_amax=2.0)
    assert q.global_scale.item() == 1344.0 and q.scales.tolist() == [[224.0]]
    assert q.codes[0, :3].tolist() == [6.0, 3.0, 1.5]
    # under-calibrated amax 0.5 -> G = 5376; 5376 / 6 = 896 saturates to 448; effective 448 / 5376 = 1/12:
    # 1 -> 12 -> 6 (0.5), 0.5 -> 6 (0.5), 0.25 -> 3 (0.25): values above the calibrated range clip
    q = quantize_nvfp4(x, global_amax=0.5)
    assert q.scales.tolist() == [[448.0]] and q.codes[0, :3].tolist() == [6.0, 6.0, 3.0]
    assert torch.allclose(q.dequantize()[0, :3], torch.tensor([0.5, 0.5, 0.25]), rtol=1e-6)


def test_nvfp4_zero_tiny_and_all_equal_blocks():
    x = torch.cat([
        _row([1.0], 16),  # sets amax_tensor = 1 -> G = 2688
        _row([], 16),  # zero block: s = 0, codes 0 (vLLM: output scale 0)
        _row([1e-6], 16),  # 2688e-6 / 6 = 4.5e-4 < 2^-10 (half the smallest e4m3 subnormal) -> s = 0: flushed
        torch.full((16,), 0.3),  # 2688 * 0.3 / 6 = 134.4 -> e4m3 (spacing 16) 128; 0.3 * 2688/128 = 6.3 -> 6
        torch.full((16,), -1.0),  # the amax block itself: s = 448, codes -6, dequant -1
    ]).unsqueeze(0)
    q = quantize_nvfp4(x)
    assert q.scales.tolist() == [[448.0, 0.0, 0.0, 128.0, 448.0]]
    deq = q.dequantize()[0]
    assert torch.isfinite(deq).all() and deq[16:48].tolist() == [0.0] * 32
    assert torch.allclose(deq[48:64], torch.full((16,), 6 * 128 / 2688), rtol=1e-6)
    assert torch.allclose(deq[64:], torch.full((16,), -1.0), rtol=1e-6)
    # an all-zero tensor: G = 1 instead of 448*6/0 = inf
    z = quantize_nvfp4(torch.zeros(2, 16))
    assert z.global_scale.item() == 1.0 and z.dequantize().tolist() == [[0.0] * 16] * 2
    assert nvfp4_global_scale(0.0).item() == 1.0 and nvfp4_global_scale(2688.0).item() == 1.0


def test_nvfp4_per_row_activation_blocks():
    x = torch.randn(2, 3, 40)  # blocks of 16, 16, 8 along the last dim; one global scale for the tensor
    q = quantize_nvfp4(x)
    assert q.scales.shape == (2, 3, 3) and q.global_scale.shape == ()
    assert torch.allclose(q.global_scale, 2688 / x.abs().amax())
    assert q.codes.abs().max() <= 6
    rel = (q.dequantize() - x).norm() / x.norm()
    assert 0.03 < rel < 0.2
    # fp64: the same recipe in fp64; codes could differ from fp32's only where an intermediate lands within an
    # ulp of a tie (none do here)
    q64 = quantize_nvfp4(x.double())
    assert (q64.codes == q.codes.double()).float().mean() > 0.99


# ---- amax-scaled FP8: e5m2 (qmax 57344) and e4m3 with fp64 rounding ---------------------------------------


def test_fp8_e5m2_per_tensor_by_hand():
    # s = 1 / 57344; W / s = [57344, 17203.2, -2867.2]
    # 17203.2 in [2^14, 2^15): spacing 2^(14-2) = 4096 -> 4.2 -> 4 -> 16384
    # 2867.2 in [2^11, 2^12): spacing 512 -> 5.6 -> 6 -> 3072
    w = torch.tensor([1.0, 0.3, -0.05], **f64)
    codes, scale = quantize(w, "fp8_e5m2", "per_tensor")
    assert scale.item() == pytest.approx(1 / 57344, rel=1e-15)
    assert codes.tolist() == [57344.0, 16384.0, -3072.0]
    assert torch.allclose(codes * scale, torch.tensor([1.0, 0.285714, -0.053571], **f64), atol=1e-6)


def test_fp8_e5m2_per_channel_by_hand():
    # row 1: s = 2 / 57344; 0.7 / s = 20070.4 -> / 4096 = 4.9 -> 5 -> 20480 -> 0.714286
    # row 2: s = 0.01 / 57344; -0.003 / s = -17203.2 -> -16384 -> -0.002857
    w = torch.tensor([[2.0, 0.7], [0.01, -0.003]], **f64)
    codes, scale = quantize(w, "fp8_e5m2", "per_channel")
    assert codes.tolist() == [[57344.0, 20480.0], [57344.0, -16384.0]]
    assert torch.allclose(codes * scale, torch.tensor([[2.0, 0.714286], [0.01, -0.002857]], **f64), atol=1e-6)


def test_fp8_e4m3_matches_methods_q1_q2():
    codes, _ = quantize(torch.tensor([1.0, 0.3, -0.05], **f64), "fp8_e4m3", "per_tensor")
    assert codes.tolist() == [448.0, 128.0, -22.0]  # docs/arms.md §6
    codes, _ = quantize(torch.tensor([[2.0, 0.7], [0.01, -0.003]], **f64), "fp8_e4m3", "per_channel")
    assert codes.tolist() == [[448.0, 160.0], [448.0, -128.0]]  # docs/arms.md §6


def test_fp8_e4m3_rounds_fp64_in_fp64():
    # issue 13 item 8: amax 448 -> s = 1; -(400 + 2^-30) is past the 384/416 midpoint -> -416 in fp64
    x = torch.tensor([448.0, -(400 + 2**-30)], **f64)
    assert quantize(x, "fp8_e4m3", "per_tensor")[0].tolist() == [448.0, -416.0]
    assert quantize(x.float(), "fp8_e4m3", "per_tensor")[0].tolist() == [448.0, -384.0]  # fp32: a real tie


def test_fp8_static_scale_saturates_and_zero_rows():
    codes, _ = quantize(torch.tensor([1e6, -1e6, 3.0]), "fp8_e5m2", "per_tensor", scale=torch.tensor(1.0))
    assert codes.tolist() == [57344.0, -57344.0, 3.0]
    codes, scale = quantize(torch.tensor([[0.0, 0.0], [1.0, -2.0]]), "fp8_e5m2", "per_channel")
    assert (scale > 0).all() and (codes * scale)[0].tolist() == [0.0, 0.0]
    x = torch.randn(2, 3, 8)
    _, scale = quantize(x, "fp8_e5m2", "per_token")
    assert scale.shape == (2, 3, 1) and torch.allclose(scale, x.abs().amax(-1, keepdim=True) / 57344)


# ---- FP8 KV cache (vLLM without calibrated scales: k_scale = v_scale = 1) ----------------------------------


def test_fake_quant_kv_is_a_saturating_cast_by_hand():
    # e4m3: 500 -> 448 (saturate); 0.3 in [0.25, 0.5) spacing 2^-5: 9.6 -> 10 -> 0.3125;
    # 1e-3 = 0.512 * 2^-9 -> 2^-9; 2^-10 -> 0 (tie); -3.3 in [2, 4) spacing 0.25: 13.2 -> 13 -> -3.25
    x = torch.tensor([500.0, -1000.0, 0.3, 1e-3, 2.0**-10, -3.3])
    expected = [448.0, -448.0, 0.3125, 2.0**-9, 0.0, -3.25]
    assert fake_quant_kv(x, "fp8").tolist() == expected
    assert fake_quant_kv(x, "fp8_e4m3").tolist() == expected
    # e5m2: 60000 -> 57344; 0.3 spacing 2^-4: 4.8 -> 5 -> 0.3125; 1e-5 = 0.66 * 2^-16 -> 2^-16
    y = torch.tensor([60000.0, 1e5, 0.3, 1e-5])
    assert fake_quant_kv(y, "fp8_e5m2").tolist() == [57344.0, 57344.0, 0.3125, 2.0**-16]
    # a calibrated scale: 1000 / 2 = 500 -> 448 -> 896
    assert fake_quant_kv(torch.tensor([1000.0]), "fp8", scale=2.0).tolist() == [896.0]
    assert fake_quant_kv(x.bfloat16(), "fp8").dtype == torch.bfloat16


def test_fake_quant_kv_bad_inputs():
    with pytest.raises(ValueError, match=r"'int8'.*valid choices: fp8, fp8_e4m3, fp8_e5m2"):
        fake_quant_kv(torch.ones(2), "int8")
    with pytest.raises(ValueError, match="positive"):
        fake_quant_kv(torch.ones(2), "fp8", scale=0.0)


# ---- the registered formats (rollout.precision=...) ---------------------------------------------------------


def test_registered_block_formats_are_these_functions():
    x = torch.randn(4, 256)
    assert torch.equal(fake_quant(x, "int4", "per_group"), quantize_int4(x, 128).dequantize())
    assert torch.equal(fake_quant(x, "mxfp4", "per_block"), quantize_mxfp4(x).dequantize())
    assert torch.equal(fake_quant(x, "nvfp4", "per_block"), quantize_nvfp4(x).dequantize())
    codes, scale = quantize(x, "fp8_e5m2", "per_tensor")
    assert torch.equal(fake_quant(x, "fp8_e5m2", "per_tensor"), codes * scale)
    assert fake_quant(x.bfloat16(), "nvfp4", "per_block").dtype == torch.bfloat16
    with pytest.raises(ValueError, match=r"'fp4'.*valid choices: .*int4, int8, mxfp4, nvfp4"):
        fake_quant(x, "fp4", "per_block")
    with pytest.raises(ValueError, match=r"'per_row'.*valid choices"):
        fake_quant(x, "fp8_e4m3", "per_row")
    assert normalized_quant_error(torch.zeros(3, 32), "mxfp4", "per_block") == 0.0


def test_block_formats_granularities_and_weight_only():
    assert Quantizer("int4").weight_granularity == "per_group" and not Quantizer("int4").quantizes_activations
    assert Quantizer("nvfp4").act_granularity == "per_block" and Quantizer("nvfp4").quantizes_activations
    assert not Quantizer("mxfp4", act_granularity="none").quantizes_activations
    with pytest.raises(ValueError, match=r"'per_channel'.*valid choices: per_group"):
        Quantizer("int4", weight_granularity="per_channel")
    assert Quantizer("int4").describe() | {} == {"name": "int4", "label": "INT4", "weight_bits": 4, "act_bits": None,
                                                  "weight_granularity": "per_group", "act_granularity": "none"}


def test_severity_ordering_on_a_gaussian_weight():
    """The ladder's order on N(0,1) 512x512 (measured, not a spec value): 8-bit < 4-bit, e4m3 < e5m2,
    nvfp4 (16-blocks, fp8 scales) < int4 g128 < mxfp4 (power-of-two scales)."""
    w = torch.randn(512, 512, generator=torch.Generator().manual_seed(0))
    grans = {"fp8_e4m3": "per_channel", "fp8_e5m2": "per_channel", "int4": "per_group", "mxfp4": "per_block",
             "nvfp4": "per_block"}
    err = {f: normalized_quant_error(w, f, g) for f, g in grans.items()}
    assert err["fp8_e4m3"] < err["fp8_e5m2"] < err["nvfp4"] < err["int4"] < err["mxfp4"]
    assert all(math.isfinite(e) and e < 0.05 for e in err.values())


def test_to_blocks_pads_the_last_block_with_zeros_and_from_blocks_undoes_it():
    # the public layout a new block precision builds on: [..., K] -> [..., ceil(K / B), B] and back
    x = torch.arange(1.0, 2 * 5 + 1).reshape(2, 5)
    xb = to_blocks(x, 4)
    assert xb.shape == (2, 2, 4) and xb.dtype == torch.float32
    assert torch.equal(xb[:, 1, 1:], torch.zeros(2, 3))  # K = 5: the second block holds 1 value and 3 zeros
    assert torch.equal(from_blocks(xb, 5), x)
    assert to_blocks(x.double(), 4).dtype == torch.float64  # fp64 stays fp64 (the tests' reference precision)
