"""The FP8 precision benchmark on the CPU, and the sensitivity behind the CUDA engine test's ceilings.

`bench.benchmarks.fp8_precision` must tell an fp32 accumulator from a narrower one and an fp32 output from a bf16
one; on the CPU (torch's upcast fallback) it must report the fp32 side. The ceilings of
test_gpu_kernels.py::test_quantized_engine_on_cuda_agrees_with_the_cpu_emulation rest on three claims, checked
here on the CPU emulation with perturbed FP8 GEMM outputs: fp32 summation-order noise stays below 0.1 of the
quantization effect, an accumulator ~13 bits wide lands between 0.1 and 1.0, and a wrong scale layout above 1.0.
Each is a property with margins of 2x or more (measured: ~0.02, 0.22-0.45, 5.7), not one CPU's trajectory.
"""

from __future__ import annotations

import pytest
import torch

import bench.quant.fp8 as fp8
from bench.benchmarks.fp8_precision import MAX_PROBE_BITS, accumulator_bits, gemm_error_bits, main, paths_for
from bench.quant.linear import QuantLinear
from tests.unit.test_gpu_kernels import EXACT_SUM, NARROW_ACCUMULATOR, _model, engine_logp, kernel_vs_effect

CPU = torch.device("cpu")


def test_the_cpu_fallback_accumulates_in_fp32():
    assert accumulator_bits(CPU) == MAX_PROBE_BITS


@pytest.mark.parametrize("path", ["tensorwise", "rowwise", "rowwise_after"])
def test_gemm_error_tells_an_fp32_output_from_a_bf16_one(path):
    fp32 = gemm_error_bits(CPU, 512, torch.float32, path)
    bf16 = gemm_error_bits(CPU, 512, torch.bfloat16, path)
    assert fp32[0] >= 20 and fp32[1] >= 18  # fp32 sums of 512 terms: ~2^-24 x sqrt(K) at worst
    assert bf16[0] <= 17 and fp32[0] - bf16[0] >= 8  # bf16 output rounding: 2^-9 of |y|


def test_the_benchmark_lists_every_path_it_can_take():
    assert paths_for(CPU, torch.float32) == ["tensorwise", "rowwise", "rowwise_after"]
    text = main(["--device", "cpu", "--k", "64"])
    assert f"k <= {MAX_PROBE_BITS} (fp32-like" in text
    assert text.count("| float32 |") == 3 and text.count("| bfloat16 |") == 3


def _noise(rel: float, seed: int):
    """A tweak that multiplies every quantized GEMM output by (1 + u), u uniform in [-rel, rel]."""
    g = torch.Generator().manual_seed(seed)

    def tweak(engine):
        for m in engine.decoder.modules():
            if isinstance(m, QuantLinear):
                m.register_forward_hook(lambda mod, i, y: y * (1 + rel * (2 * torch.rand(y.shape, generator=g) - 1)))
    return tweak


@pytest.fixture(scope="module")
def fp8_engine():
    model = _model()
    return model, engine_logp("fp8_e4m3", model), engine_logp("fp32", model)


def _mean_ratio(model, emulated, fp32, rel):
    return sum(kernel_vs_effect(engine_logp("fp8_e4m3", model, _noise(rel, s)), emulated, fp32) for s in range(3)) / 3


def test_fp32_summation_noise_stays_under_the_exact_ceiling(fp8_engine):
    assert _mean_ratio(*fp8_engine, 2.0 ** -22) < EXACT_SUM / 2


def test_a_13_bit_accumulator_lands_between_the_ceilings(fp8_engine):
    ratio = _mean_ratio(*fp8_engine, 2.0 ** -13)
    assert 2 * EXACT_SUM < ratio < NARROW_ACCUMULATOR / 2


def test_a_wrong_scale_layout_breaks_the_narrow_accumulator_ceiling(fp8_engine, monkeypatch):
    model, emulated, fp32 = fp8_engine
    real_gemm = fp8.fp8_gemm

    def reversed_weight_scales(a, w, scale_a, scale_b, bias, out_dtype, fused_rowwise=True):
        return real_gemm(a, w, scale_a, scale_b.flip(-1).contiguous(), bias, out_dtype, fused_rowwise)

    monkeypatch.setattr(fp8, "choose_fp8_kernel", lambda *a, **k: "scaled_mm")  # the kernel's path, on the CPU
    assert kernel_vs_effect(engine_logp("fp8_e4m3", model), emulated, fp32) < 1e-6  # same codes, same sums
    monkeypatch.setattr(fp8, "fp8_gemm", reversed_weight_scales)
    assert kernel_vs_effect(engine_logp("fp8_e4m3", model), emulated, fp32) > 2 * NARROW_ACCUMULATOR
