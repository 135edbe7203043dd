"""The real low-precision GEMM paths of the engine (FP8 torch._scaled_mm, INT8 torch._int_mm) run on the CPU.

Both kernels exist on the CPU (slow fallbacks), so everything of the CUDA path but the CUDA kernel itself runs
here: the operand layouts the CUDA kernels require (column-major FP8 weights, a contiguous [K, N] int8 weight,
row padding to > 16 rows), the scale operands, the kernel choice by device. On most CPUs torch._scaled_mm
dequantizes and runs an fp32 GEMM, so it equals the fake-quant emulation bit for bit; where oneDNN has an FP8 GEMM
of its own it differs by fp32 summation order only (`assert_fp32_gemm_equal`); either way that pins the codes,
scales and bias handling of the kernel path to the emulation's. tests/unit/test_gpu_kernels.py repeats the
comparison against the CUDA kernels where a GPU is present.
"""

from __future__ import annotations

import pytest
import torch
import transformers as tr

from bench.quant import fp8 as fp8_mod
from bench.quant.fp8 import Fp8ScaledMMLinear, choose_fp8_kernel, fp8_gemm, scaled_mm_scales
from bench.quant import int8 as int8_mod
from bench.quant.int8 import Int8Linear, int8_matmul, int_mm_weight, resolve_int8_kernel
from bench.quant import linear as linear_mod
from bench.quant.linear import FakeQuantLinear, make_linear, onednn_available, pad_rows, use_cpu_gemm
from bench.quant.plain import Fp32Linear, HalfLinear
from bench.quant.quantizers import Quantizer
from bench.rollout import SamplingParams
from bench.rollout.embedded import EmbeddedEngine

CPU, CUDA = torch.device("cpu"), torch.device("cuda")  # a device object only: nothing is allocated on it
GRANULARITIES = [("per_channel", "per_token"), ("per_tensor", "per_token"), ("per_channel", "per_tensor"),
                 ("per_tensor", "per_tensor")]


def _layer_inputs(n=48, k=64, rows=(2, 3), seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    w[3] *= 20  # an outlier channel: per-channel and per-tensor scales differ
    bias = torch.randn(n, generator=g) * 0.1
    x = torch.randn(*rows, k, generator=g)
    x[..., 5] *= 30  # an outlier feature
    return w, bias, x


def assert_fp32_gemm_equal(y: torch.Tensor, ref: torch.Tensor) -> None:
    """Equal, or apart only by fp32 summation order. Where oneDNN has an FP8 GEMM (x86 CPUs with AVX512-FP16 and
    AMX, e.g. Sapphire Rapids) torch._scaled_mm with per-tensor scales and an fp32 output takes that path instead of
    dequantizing first: measured 173 of 288 outputs off, by at most 3.8e-6 (2e-7 of the largest output). A code or
    scale that differed would move outputs by ~1e-2 of their size."""
    if torch.equal(y, ref):
        return
    ulp = 2**-8 if y.dtype == torch.bfloat16 else 0.0  # a bf16 output of a value that moved may round the other way
    torch.testing.assert_close(y.float(), ref.float(), rtol=ulp, atol=1e-6 * ref.float().abs().max().item())


@pytest.mark.parametrize("wg, ag", GRANULARITIES)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_scaled_mm_layer_equals_the_emulation_on_cpu(wg, ag, out_dtype):
    w, bias, x = _layer_inputs()
    q = Quantizer("fp8_e4m3", wg, ag)
    emulated = FakeQuantLinear(w, bias, q, out_dtype)
    kernel = Fp8ScaledMMLinear(w, bias, q, out_dtype)
    assert kernel.weight_fp8.dtype == torch.float8_e4m3fn and kernel.weight_fp8.t().stride() == (1, 64)  # col-major
    assert torch.equal(kernel.dequantized_weight(), emulated.dequantized_weight())
    y = kernel(x)
    assert y.shape == (2, 3, 48) and y.dtype == out_dtype
    assert_fp32_gemm_equal(y, emulated(x))
    kernel.min_rows = 17  # the CUDA padding of a 6-row decode batch: same rows out
    assert_fp32_gemm_equal(kernel(x), y)
    if (wg, ag) != ("per_tensor", "per_tensor"):  # the unfused form (GPUs without row-wise FP8 kernels)
        kernel.fused_rowwise = False
        torch.testing.assert_close(kernel(x).float(), y.float(), rtol=2**-7 if out_dtype == torch.bfloat16 else 1e-6,
                                   atol=1e-6)


def test_scale_operands_have_the_layouts_the_kernel_accepts():
    s_tok, s_chan = torch.rand(5, 1) + 0.1, torch.rand(48, 1) + 0.1
    s_tensor = torch.tensor(0.5)
    a, b = scaled_mm_scales(s_tensor, torch.tensor(0.25), 5, 48)
    assert a.shape == b.shape == () and a.dtype == b.dtype == torch.float32  # tensor-wise
    a, b = scaled_mm_scales(s_tok, s_chan, 5, 48)
    assert a.shape == (5, 1) and b.shape == (1, 48) and a.is_contiguous() and b.is_contiguous()  # row-wise
    assert torch.equal(b[0], s_chan[:, 0])
    a, b = scaled_mm_scales(s_tok, s_tensor, 5, 48)  # per-token x per-tensor: the per-tensor side broadcast
    assert b.shape == (1, 48) and torch.equal(b, torch.full((1, 48), 0.5))
    a, b = scaled_mm_scales(s_tensor, s_chan, 5, 48)
    assert a.shape == (5, 1) and torch.equal(a, torch.full((5, 1), 0.5))
    # the kernel itself refuses the mixed form the helper avoids (the CPU op applies the CUDA op's scale checks)
    codes = torch.ones(5, 64).to(torch.float8_e4m3fn)
    w = torch.ones(48, 64).to(torch.float8_e4m3fn)
    with pytest.raises((RuntimeError, ValueError), match="Invalid scaling configuration"):
        torch._scaled_mm(codes, w.t(), scale_a=s_tok, scale_b=s_tensor, out_dtype=torch.bfloat16)
    y = fp8_gemm(codes, w, *scaled_mm_scales(s_tok, s_tensor, 5, 48), bias=None, out_dtype=torch.float32)
    torch.testing.assert_close(y, 64 * 0.5 * s_tok.expand(5, 48), rtol=1e-6, atol=0)


def test_fp8_kernel_choice_by_device_and_layer():
    q = Quantizer("fp8_e4m3")
    assert choose_fp8_kernel("auto", q, (48, 64), CPU) == "emulated"  # the CPU keeps its exact emulation
    assert choose_fp8_kernel("scaled_mm", q, (48, 64), CPU) == "scaled_mm"
    assert choose_fp8_kernel("emulated", q, (48, 64), CUDA) == "emulated"
    assert choose_fp8_kernel("auto", q, (48, 24), CUDA) == "emulated"  # K = 24: not a multiple of 16
    for quantizer, shape, why in [(Quantizer("fp8_e5m2"), (48, 64), "e5m2 x e5m2"),
                                  (Quantizer("fp8_e4m3", act_granularity="none"), (48, 64), "weight-only"),
                                  (q, (40, 64), "multiples of 16")]:
        assert choose_fp8_kernel("auto", quantizer, shape, CPU) == "emulated"
        with pytest.raises(ValueError, match=f"fp8_kernel='scaled_mm' cannot run this layer: .*{why}"):
            choose_fp8_kernel("scaled_mm", quantizer, shape, CPU)
    with pytest.raises(ValueError, match="unknown fp8 kernel 'cutlass'"):
        choose_fp8_kernel("cutlass", q, (48, 64), CPU)
    w, bias, _ = _layer_inputs()
    assert isinstance(make_linear(w, bias, q, torch.bfloat16), FakeQuantLinear)  # auto on a CPU weight


def test_engine_on_the_scaled_mm_path_samples_what_the_emulation_samples(monkeypatch):
    """The whole FP8 engine with every linear on torch._scaled_mm (forced, on the CPU) returns the tokens and
    log mu of the emulated engine exactly."""
    torch.manual_seed(0)
    model = tr.Qwen2ForCausalLM(tr.Qwen2Config(vocab_size=128, hidden_size=64, num_hidden_layers=2,
                                               num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                                               tie_word_embeddings=True)).eval()
    ids = torch.randint(1, 128, (3, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(3, 7, dtype=torch.bool)

    def run():
        engine = EmbeddedEngine("fp8_e4m3")
        engine.load_weights(model)
        kinds = {type(m).__name__ for m in engine.decoder.modules()}
        return kinds, engine.generate(ids, mask, 2, SamplingParams(12), torch.Generator().manual_seed(2))

    kinds, emulated = run()
    assert "FakeQuantLinear" in kinds and "Fp8ScaledMMLinear" not in kinds
    monkeypatch.setattr(fp8_mod, "choose_fp8_kernel", lambda kernel, q, shape, device: "scaled_mm")
    kinds, real = run()
    assert "Fp8ScaledMMLinear" in kinds and "FakeQuantLinear" not in kinds
    assert torch.equal(real.response_ids, emulated.response_ids)
    assert torch.equal(real.logp_mu, emulated.logp_mu)


def test_the_fp8_kernel_knob_reaches_every_linear_of_the_engine():
    """rollout.fp8_kernel: emulated keeps every FP8 linear on the emulation (what method=matched's trainer computes,
    also on a GPU with FP8 tensor cores); scaled_mm forces the real GEMM (torch's fallback on a CPU)."""
    torch.manual_seed(0)
    model = tr.Qwen2ForCausalLM(tr.Qwen2Config(vocab_size=128, hidden_size=64, num_hidden_layers=2,
                                               num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                                               tie_word_embeddings=True)).eval()
    for kernel, want in (("emulated", "FakeQuantLinear"), ("scaled_mm", "Fp8ScaledMMLinear"), ("auto", "FakeQuantLinear")):
        engine = EmbeddedEngine("fp8_e4m3", fp8_kernel=kernel)
        engine.load_weights(model)
        kinds = {type(m).__name__ for m in engine.decoder.modules()} & {"FakeQuantLinear", "Fp8ScaledMMLinear"}
        assert kinds == {want}, (kernel, kinds)
    with pytest.raises(ValueError, match=r"rollout.fp8_kernel='cutlass' is not valid; choose one of: auto, scaled_mm, "
                                         r"emulated"):
        EmbeddedEngine("fp8_e4m3", fp8_kernel="cutlass")


# ------------------------------------------------------------------------------------------------ INT8
def test_int8_weight_layout_and_row_padding():
    codes = torch.randint(-128, 128, (48, 64)).float()
    w = int_mm_weight(codes, "column_major")  # CUDA's (M2): w.t() column-major [K, N], cuBLASLt's TN case
    assert w.shape == (48, 64) and w.dtype == torch.int8 and torch.equal(w.float(), codes)
    assert w.is_contiguous() and w.t().stride() == (1, 64)
    row = int_mm_weight(codes)  # on the CPU: w.t() contiguous, the CPU kernel's fast layout
    assert row.t().is_contiguous() and torch.equal(row, w)
    assert int8_mod.int_mm_layout("cuda") == "column_major" and int8_mod.int_mm_layout("cpu") == "row_major"
    x = torch.randn(5, 64)
    padded = pad_rows(x, 17)
    assert padded.shape == (17, 64) and torch.equal(padded[:5], x) and not padded[5:].any()
    assert pad_rows(x, 3) is x


@pytest.mark.parametrize("rows, k", [(5, 64), (40, 64), (6, 2048)])
def test_int_mm_path_equals_the_exact_emulation(rows, k):
    g = torch.Generator().manual_seed(k)
    a = torch.randint(-128, 128, (rows, k), generator=g).float()
    b = torch.randint(-128, 128, (48, k), generator=g).float()
    expected = int8_matmul(a, b, "emulated")
    assert torch.equal(int8_matmul(a, int_mm_weight(b), "int_mm"), expected)
    assert torch.equal(int8_matmul(a, int_mm_weight(b, "column_major"), "int_mm"), expected)
    assert torch.equal(int8_matmul(a, b, "int_mm"), expected)  # a plain float [N, K] weight is cast first
    assert torch.equal(torch._int_mm(pad_rows(a.to(torch.int8), 17), int_mm_weight(b).t())[:rows].float(), expected)


def test_int8_kernel_choice_by_device_and_layer(monkeypatch):
    assert resolve_int8_kernel("auto", (48, 64), CUDA) == "int_mm"  # a GPU always has int8 tensor cores here
    assert resolve_int8_kernel("auto", (44, 64), CUDA) == "emulated"  # N = 44: not a multiple of 8
    with pytest.raises(ValueError, match="int8_kernel='int_mm' cannot run this layer: .*multiples of 8"):
        resolve_int8_kernel("int_mm", (44, 64), CUDA)
    assert resolve_int8_kernel("int_mm", (44, 64), CPU) == "int_mm"  # the CPU kernel takes any shape
    import bench.quant.int8 as int8_mod

    for fast in (True, False):
        monkeypatch.setattr(int8_mod, "fast_int_mm", lambda fast=fast: fast)
        assert resolve_int8_kernel("auto", (48, 64), CPU) == ("int_mm" if fast else "emulated")
    w, bias, x = _layer_inputs()
    layer = Int8Linear(w, bias, Quantizer("int8"), kernel="int_mm")
    assert layer.weight_codes.dtype == torch.int8 and layer.weight_codes.t().is_contiguous()  # the CPU's layout
    assert torch.equal(layer(x), Int8Linear(w, bias, Quantizer("int8"), kernel="emulated")(x))


# ------------------------------------------------------------------------------------------------ oneDNN fp32 GEMM
needs_onednn = pytest.mark.skipif(not onednn_available(), reason="this torch has no oneDNN")


def _fp32_layers(w: torch.Tensor, bias: torch.Tensor) -> dict[str, torch.nn.Module]:
    """One layer of each class that multiplies through `fp32_linear`: plain fp32, an FP8 fake-quant, an emulated bf16
    (fp32 storage of bf16 values: the path of a CPU without bf16 hardware)."""
    half = HalfLinear(w, bias, torch.float32)
    half.native, half.fp32_gemm = False, True
    half.weight, half.bias = w.to(torch.bfloat16).float(), bias.to(torch.bfloat16).float()
    return {"fp32": Fp32Linear(w, bias), "fp8": FakeQuantLinear(w, bias, Quantizer("fp8_e4m3"), torch.float32),
            "bf16 emulated": half}


@needs_onednn
@pytest.mark.parametrize("rows", [(1, 64), (7, 1, 64), (3, 5, 64)])
def test_onednn_packed_layers_compute_what_torch_linear_does(rows):
    """rollout.cpu_kernels: a layer with oneDNN's packed weight computes F.linear's result up to fp32 summation order
    (a wrong layout or a lost bias moves outputs by their own size), on 2-D and 3-D inputs, bias included."""
    w, bias, _ = _layer_inputs(n=96, k=64)
    x = torch.randn(*rows, generator=torch.Generator().manual_seed(1))
    for name, layer in _fp32_layers(w, bias).items():
        plain = layer(x)
        assert use_cpu_gemm([layer], "onednn") == 1 and layer.packed is not None, name
        packed = layer(x)
        assert packed.shape == plain.shape == (*rows[:-1], 96), name
        assert_fp32_gemm_equal(packed, plain)
        layer.bias = None
        assert (layer(x) - packed).abs().max() > 1e-3  # the bias was in the packed path's result


@needs_onednn
def test_onednn_rows_do_not_depend_on_the_other_rows_or_the_threads():
    """What compaction's exactness needs of a GEMM (bench.rollout.embedded.COMPACT_MIN_ROWS): from 2 rows up a row's
    result is the same whatever rows share the call, and with 1 thread or 2."""
    torch.manual_seed(0)
    w, b = torch.randn(512, 256) * 0.02, torch.randn(512) * 0.02
    layer = Fp32Linear(w, b)
    use_cpu_gemm([layer], "onednn")
    x = torch.randn(24, 256)
    full = layer(x)
    for rows in (2, 3, 8, 9, 17):
        assert torch.equal(layer(x[:rows]), full[:rows]), rows
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(layer(x), full)
    finally:
        torch.set_num_threads(threads)


def test_which_layers_take_onednn():
    """auto packs the fp32-GEMM weights of ONEDNN_MIN_WEIGHT+ elements, onednn every one, plain none; an INT8 layer
    (its own integer GEMM) and a layer on bf16 weights never; a bad choice names the valid ones."""
    big, small = torch.randn(1024, 256), torch.randn(64, 64)
    assert big.numel() >= linear_mod.ONEDNN_MIN_WEIGHT > small.numel()

    def layers():
        return [Fp32Linear(big, None), Fp32Linear(small, None), Int8Linear(big, None, Quantizer("int8")),
                HalfLinear(big.to(torch.bfloat16), None, torch.bfloat16)]

    for choice, want in (("plain", [False] * 4), ("auto", [True, False, False, False]),
                         ("onednn", [True, True, False, False])):
        if choice != "plain" and not onednn_available():
            continue
        ls = layers()
        ls[3].native, ls[3].fp32_gemm = True, False  # a native bf16 GEMM (bf16 storage), whatever this CPU has
        ls[3].weight = ls[3].weight.to(torch.bfloat16)
        assert use_cpu_gemm(ls, choice) == sum(want), choice
        assert [layer.packed is not None for layer in ls] == want, choice
    with pytest.raises(ValueError, match=r"unknown rollout.cpu_kernels 'mkl'; valid choices: auto, onednn, plain"):
        use_cpu_gemm(layers(), "mkl")


def test_onednn_is_refused_where_torch_has_none(monkeypatch):
    monkeypatch.setattr(linear_mod, "onednn_available", lambda: False)
    layer = Fp32Linear(torch.randn(1024, 256), None)
    assert use_cpu_gemm([layer], "auto") == 0 and layer.packed is None  # auto falls back to torch's GEMM
    with pytest.raises(ValueError, match="rollout.cpu_kernels=onednn: this torch has no oneDNN"):
        use_cpu_gemm([layer], "onednn")
