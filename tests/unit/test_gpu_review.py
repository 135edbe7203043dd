"""The GPU review's fixes (issue 22: M1, M2 in test_gemm_kernels.py, M4, the low items), tested on the CPU: each
test would fail on the code as the review found it. No GPU runs here; scripts/gpu_check.sh runs the CUDA side."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import transformers as tr

from bench.quant import int8 as int8_mod
from bench.quant.fp8 import fused_rowwise_ok
from bench.quant.quantizers import Quantizer
from bench.rollout.embedded import EmbeddedEngine, grouped_attention
from bench.rollout.vllm_engine import GPU_MEMORY_UTILIZATION, VLLMEngine, VLLMRolloutConfig, vllm_settings


def _model(tied: bool = True) -> torch.nn.Module:
    torch.manual_seed(0)
    return tr.Qwen2ForCausalLM(tr.Qwen2Config(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                              num_key_value_heads=2, intermediate_size=128,
                                              tie_word_embeddings=tied)).eval()


def test_int8_runs_inside_a_bf16_engine_on_cuda_and_fp32_on_cpu():
    """M1: QuRL/FlashRL's INT8 GEMMs sit in a bf16 engine on a GPU; only the CPU keeps fp32 around them."""
    fmt = Quantizer("int8").fmt
    assert fmt.act_dtype_on("cuda") == "bf16" and fmt.act_dtype_on("cpu") == "fp32"
    for other, dtype in (("fp8_e4m3", "bf16"), ("fp32", "fp32"), ("bf16", "bf16")):
        f = Quantizer(other).fmt
        assert f.act_dtype_on("cuda") == f.act_dtype_on("cpu") == dtype


def test_the_engine_takes_the_activation_dtype_of_the_weights_device(monkeypatch):
    model = _model()
    engine = EmbeddedEngine("int8")
    engine.load_weights(model)
    assert engine.decoder.act == torch.float32  # CPU
    seen = []
    fmt_cls = type(Quantizer("int8").fmt)
    monkeypatch.setattr(fmt_cls, "act_dtype_on", lambda self, device: seen.append(device) or "bf16")
    engine.load_weights(model)  # the device is read at every load: a policy moved to cuda gets bf16
    assert seen == ["cpu"] and engine.decoder.act == torch.bfloat16
    explicit = EmbeddedEngine("int8", act_dtype="fp32")
    explicit.load_weights(model)
    assert explicit.decoder.act == torch.float32  # an explicit rollout.act_dtype wins


def test_fp8_rowwise_output_dtype_by_cuda_version():
    """M4: row-wise scales with an fp32 output need CUDA >= 12.9; before that the unfused fp32 path is taken."""
    fp32, bf16 = torch.float32, torch.bfloat16
    assert fused_rowwise_ok("cuda", (9, 0), bf16, "12.8")
    assert not fused_rowwise_ok("cuda", (9, 0), fp32, "12.8")
    assert fused_rowwise_ok("cuda", (9, 0), fp32, "12.9") and fused_rowwise_ok("cuda", (9, 0), fp32, "13.0")
    assert not fused_rowwise_ok("cuda", (8, 9), bf16, "13.0")  # Ada: no row-wise FP8 kernel
    assert fused_rowwise_ok("cpu", None, fp32, None)


def test_vllm_per_tensor_fp8_uses_the_032_name():
    assert vllm_settings("fp8_e4m3", "per_tensor", "per_token", "gpu")["quantization"] == "fp8_per_tensor"


@pytest.mark.parametrize("keys, match", [
    (dict(precision="int8"), "precision 'int8' is not supported: vLLM has no online dense INT8"),
    (dict(precision="mxfp4"), "precision 'mxfp4' is not supported; it serves fp32, bf16, fp8_e4m3"),
    (dict(precision="fp8_e4m3", act_granularity="per_tensor"), "act_granularity='per_tensor' is not offered"),
])
def test_vllm_settings_no_platform_serves_are_refused_by_the_schema(keys, match):
    """At the config check, before vLLM is imported (and whether or not it is installed): a sweep's dry run and the
    command line's quick check name them, instead of the engine's construction after the model has loaded."""
    with pytest.raises(ValueError, match=match):
        VLLMRolloutConfig(**keys).check()
    fp8 = VLLMRolloutConfig(precision="fp8_e4m3", weight_granularity="per_tensor")  # a GPU serves it: not refused here
    assert fp8.granularities() == ("per_tensor", "per_token")
    assert VLLMRolloutConfig(precision="fp8_e4m3").granularities() == ("per_channel", "per_token")
    assert vllm_settings("fp8_e4m3", *fp8.granularities(), "gpu")["quantization"] == "fp8_per_tensor"


def test_vllm_default_leaves_the_trainer_its_share():
    assert VLLMRolloutConfig(precision="bf16").gpu_memory_utilization == GPU_MEMORY_UTILIZATION <= 0.4


def test_vllm_close_shuts_the_gpu_engine_down():
    """tests/vllm and the benchmark build several engines in one process: each must give its GPU memory back."""
    calls = []

    class Core:
        def shutdown(self):
            calls.append("shutdown")

    class LLM:
        llm_engine = type("E", (), {"engine_core": Core()})()

    engine = object.__new__(VLLMEngine)  # no vLLM here: the engine's state only
    engine.llm, engine._dir, engine.device, engine._asleep = LLM(), None, "gpu", False
    engine.close()
    assert calls == ["shutdown"] and engine.llm is None
    engine.llm, engine.device = LLM(), "cpu"
    engine.close()
    assert calls == ["shutdown"] and engine.llm is None  # CPU: dropped, not shut down (engines are rebuilt in-process)


@pytest.mark.parametrize("S, L", [(1, 9), (5, 5), (3, 12)])
def test_grouped_attention_equals_sdpa_with_gqa(S, L):
    """Low: the folded GQA form gives SDPA's enable_gqa result without its math-kernel fallback on CUDA."""
    g = torch.Generator().manual_seed(S * 100 + L)
    B, H, Hkv, D = 3, 8, 2, 16
    q, k, v = (torch.randn(B, h, n, D, generator=g) for h, n in ((H, S), (Hkv, L), (Hkv, L)))
    mask = torch.rand(B, 1, S, L, generator=g) > 0.3
    mask[..., -1] = True  # no empty row
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=D**-0.5, enable_gqa=True)
    out = grouped_attention(q, k, v, mask, D**-0.5)
    assert out.shape == ref.shape and (out - ref).abs().max() < 1e-5


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_engine_owns_its_embedding(precision):
    """Low: an fp32 (or int8: fp32 activations) engine aliased the policy's embedding storage; a trainer step or
    a sharded (FSDP) policy then changed or freed the engine's copy under it."""
    model = _model()
    engine = EmbeddedEngine(precision)
    engine.load_weights(model)
    before = engine.decoder.embed.clone()
    assert engine.decoder.embed.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    with torch.no_grad():
        model.model.embed_tokens.weight.add_(1.0)
    assert torch.equal(engine.decoder.embed, before)


def test_int_mm_layout_choice_is_checked():
    with pytest.raises(ValueError, match="int8 weight layout"):
        int8_mod.int_mm_weight(torch.zeros(8, 8), "diagonal")
