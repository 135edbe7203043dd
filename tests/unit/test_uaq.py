"""UAQ invariant scaling (docs/arms.md §4.6, tests U1-U3): output invariance, gradient scaling, quantizer codes."""

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from bench.quant.quantizers import dequantize, quantize
from bench.quant.uaq import apply_uaq

D = torch.float64
S = 1.5


class _Attn(torch.nn.Module):
    def __init__(self, w: torch.Tensor, bias: bool = False) -> None:
        super().__init__()
        for name in ("q_proj", "k_proj", "v_proj"):
            lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=bias, dtype=w.dtype)
            lin.weight.data.copy_(w)
            setattr(self, name, lin)


class _Layer(torch.nn.Module):
    def __init__(self, norm: torch.nn.Module, w: torch.Tensor, bias: bool = False) -> None:
        super().__init__()
        self.input_layernorm = norm
        self.self_attn = _Attn(w, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.input_layernorm(x)
        return torch.stack([self.self_attn.q_proj(h), self.self_attn.k_proj(h), self.self_attn.v_proj(h)])


class _Inner(torch.nn.Module):
    def __init__(self, layer: torch.nn.Module) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([layer])


class _Model(torch.nn.Module):
    """The HF shape model.model.layers[i] with one decoder layer reduced to norm -> q/k/v."""

    def __init__(self, layer: torch.nn.Module) -> None:
        super().__init__()
        self.model = _Inner(layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.layers[0](x)


U1_W = [[1.0, 0.0], [0.5, -1.0]]


def u1_model(dtype=torch.float32) -> _Model:
    norm = LlamaRMSNorm(2, eps=0.0).to(dtype)
    return _Model(_Layer(norm, torch.tensor(U1_W, dtype=dtype)))


def test_u1_rmsnorm_qkv_output_unchanged():
    x = torch.tensor([[1.0, 2.0]])
    model = u1_model()
    y = model(x)
    torch.testing.assert_close(model.model.layers[0].input_layernorm(x), torch.tensor([[0.632456, 1.264911]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(y[0], torch.tensor([[0.632456, -0.948683]]), atol=1e-6, rtol=0)
    info = apply_uaq(model, S)
    assert info == {"uaq_scale": 1.5, "uaq_layers": 1.0, "uaq_tensors": 4.0}
    layer = model.model.layers[0]
    torch.testing.assert_close(layer.input_layernorm.weight.data, torch.tensor([1.5, 1.5]))
    for name in ("q_proj", "k_proj", "v_proj"):
        torch.testing.assert_close(getattr(layer.self_attn, name).weight.data, torch.tensor(U1_W) / S)
    torch.testing.assert_close(model(x), y, atol=1e-6, rtol=0)


def test_u1_bf16_storage():
    x = torch.tensor([[1.0, 2.0]])
    y = u1_model()(x)
    model = u1_model(torch.bfloat16)
    apply_uaq(model, S)
    torch.testing.assert_close(model(x.bfloat16()).float(), y, atol=1e-2, rtol=0)


def test_layernorm_bias_is_scaled_and_output_unchanged():
    torch.manual_seed(0)
    norm = torch.nn.LayerNorm(4, dtype=D)
    norm.weight.data.uniform_(0.5, 1.5)
    norm.bias.data.uniform_(-0.5, 0.5)
    model = _Model(_Layer(norm, torch.randn(3, 4, dtype=D), bias=True))
    proj_bias = model.model.layers[0].self_attn.q_proj.bias.detach().clone()
    beta = norm.bias.detach().clone()
    x = torch.randn(5, 4, dtype=D)
    y = model(x)
    apply_uaq(model, S)
    torch.testing.assert_close(norm.bias.data, S * beta)
    torch.testing.assert_close(model.model.layers[0].self_attn.q_proj.bias.data, proj_bias)  # bias unchanged
    torch.testing.assert_close(model(x), y, atol=1e-12, rtol=0)


def _tiny(cls, cfg_cls, **extra):
    torch.manual_seed(0)
    cfg = cfg_cls(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, max_position_embeddings=16, **extra)
    model = cls(cfg).to(D).eval()
    with torch.no_grad():  # non-trivial norm gains so that the scaling is visible
        for layer in model.model.layers:
            layer.input_layernorm.weight.uniform_(0.5, 1.5)
    return model


HF_MODELS = [
    (LlamaForCausalLM, LlamaConfig, {}),
    (Qwen2ForCausalLM, Qwen2Config, {}),
    (Qwen3ForCausalLM, Qwen3Config, {"head_dim": 8}),
]


@pytest.mark.parametrize("cls,cfg_cls,extra", HF_MODELS, ids=lambda v: getattr(v, "__name__", ""))
def test_u1_hf_models_logits_unchanged(cls, cfg_cls, extra):
    model = _tiny(cls, cfg_cls, **extra)
    ids = torch.tensor([[1, 5, 7, 2, 9]])
    ref = model(ids).logits
    gamma = model.model.layers[1].input_layernorm.weight.detach().clone()
    wq = model.model.layers[1].self_attn.q_proj.weight.detach().clone()
    info = apply_uaq(model, S)
    assert info["uaq_layers"] == 2.0
    torch.testing.assert_close(model.model.layers[1].input_layernorm.weight.data, S * gamma)
    torch.testing.assert_close(model.model.layers[1].self_attn.q_proj.weight.data, wq / S)
    torch.testing.assert_close(model(ids).logits, ref, atol=1e-10, rtol=0)


def test_mlp_group_is_supported_and_output_unchanged():
    model = _tiny(LlamaForCausalLM, LlamaConfig)
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    ref = model(ids).logits
    info = apply_uaq(model, S, ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"))
    assert info["uaq_tensors"] == 2 * (4 + 3)
    torch.testing.assert_close(model(ids).logits, ref, atol=1e-10, rtol=0)


def test_u2_gradient_scales_by_s():
    x = torch.tensor([[1.0, 2.0], [-0.3, 0.7]], dtype=D)

    def grad_q(model):
        y = model(x)
        (torch.sin(y) * torch.arange(1, 5, dtype=D).view(1, 2, 2)).sum().backward()
        return model.model.layers[0].self_attn.q_proj.weight.grad

    g0 = grad_q(u1_model(D))
    model = u1_model(D)
    apply_uaq(model, S)
    torch.testing.assert_close(grad_q(model), S * g0, atol=1e-12, rtol=0)


def test_u2_hf_model_gradient_scales_by_s():
    ids = torch.tensor([[1, 5, 7, 2, 9]])

    def grads(model):
        model.zero_grad()
        model(ids).logits.pow(2).sum().backward()
        return [model.model.layers[i].self_attn.v_proj.weight.grad.clone() for i in range(2)]

    model = _tiny(Qwen2ForCausalLM, Qwen2Config)
    g0 = grads(model)
    apply_uaq(model, S)
    for g, g_ref in zip(grads(model), g0):
        torch.testing.assert_close(g, S * g_ref, atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize(
    "w,fmt,gran",
    [
        ([1.0, 0.3, -0.05], "fp8_e4m3", "per_tensor"),  # Q1 input
        ([[0.5, -1.27, 0.01], [1.0, 0.3, 0.0]], "int8", "per_channel"),  # Q3 input
        ([[2.0, 0.7], [0.01, -0.003]], "fp8_e4m3", "per_channel"),  # Q2 input
    ],
)
def test_u3_codes_invariant_error_scales(w, fmt, gran):
    w = torch.tensor(w, dtype=D)
    codes, scale = quantize(w, fmt, gran)
    codes_s, scale_s = quantize(w / S, fmt, gran)
    assert torch.equal(codes_s, codes)
    err = dequantize(codes, scale) - w
    err_s = dequantize(codes_s, scale_s) - w / S
    torch.testing.assert_close(err_s, err / S, atol=1e-15, rtol=1e-12)
    assert math.isclose(float(err_s.norm() / err.norm()), 1 / S, rel_tol=1e-12)


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "int8"])
def test_u3_uaq_model_has_identical_codes(fmt):
    model = _tiny(LlamaForCausalLM, LlamaConfig)
    before = [quantize(layer.self_attn.k_proj.weight.detach(), fmt, "per_channel")[0] for layer in model.model.layers]
    apply_uaq(model, S)
    after = [quantize(layer.self_attn.k_proj.weight.detach(), fmt, "per_channel")[0] for layer in model.model.layers]
    for a, b in zip(after, before):
        assert torch.equal(a, b)


def test_unknown_structure_names_the_class():
    with pytest.raises(ValueError, match="Linear"):
        apply_uaq(torch.nn.Linear(2, 2))


def test_partial_or_unknown_targets_rejected():
    with pytest.raises(ValueError, match="part of"):
        apply_uaq(u1_model(), S, ("q_proj",))
    with pytest.raises(ValueError, match="unknown targets"):
        apply_uaq(u1_model(), S, ("q_proj", "k_proj", "v_proj", "o_proj"))
    with pytest.raises(ValueError, match="positive"):
        apply_uaq(u1_model(), 0.0)


def test_acr_uaq_setup_model_applies_scaling_only_when_configured():
    from bench.methods.base import make_method

    model = u1_model()
    assert make_method("acr").setup_model(model) == {}
    torch.testing.assert_close(model.model.layers[0].input_layernorm.weight.data, torch.tensor([1.0, 1.0]))
    info = make_method("acr_uaq", uaq_scale=1.5).setup_model(model)
    assert info["uaq_scale"] == 1.5
    torch.testing.assert_close(model.model.layers[0].input_layernorm.weight.data, torch.tensor([1.5, 1.5]))
