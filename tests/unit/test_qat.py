"""The trainer at the rollout's precision (bench/rollout/qat.py, the `matched` control): its teacher-forced log pi equals
the embedded engine's log mu up to float summation order at every registered precision, its gradients are the
straight-through ones into the fp32 master weights, and what it cannot reproduce is refused."""

from __future__ import annotations

import pytest
import torch
import transformers as tr

from bench.registry import METHODS
from bench.mismatch import mismatch_metrics
from bench.models.logprobs import token_logprobs
from bench.rollout.qat import QATLinear, quantize_trainer, unsupported
from bench.quant.quantizers import Quantizer, get_format, precisions
from bench.rollout import SamplingParams
from bench.rollout.embedded import EmbeddedEngine

SMALL = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=128, initializer_range=0.02, max_position_embeddings=128)
#: what "pi_old = mu up to float noise" means here (issue 35): KL(mu || pi_old) per token, k3
FLOAT_NOISE_KL = 1e-6


def _model(kind: str = "qwen2") -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "llama":  # untied lm_head
        return tr.LlamaForCausalLM(tr.LlamaConfig(**SMALL)).eval()
    if kind == "qwen3":  # q/k norms
        return tr.Qwen3ForCausalLM(tr.Qwen3Config(**SMALL, head_dim=16)).eval()
    return tr.Qwen2ForCausalLM(tr.Qwen2Config(**SMALL, tie_word_embeddings=True)).eval()  # qkv bias, tied


def _kl(kind: str, precision: str, **engine_kw) -> tuple[float, float]:
    """(KL(mu || pi_old) of the trainer at the engine's precision, the same of the plain fp32 trainer) on 12 sampled
    responses of 20 tokens to left-padded prompts."""
    model = _model(kind)
    engine = EmbeddedEngine(precision, eos_id=None, **engine_kw)
    engine.load_weights(model)
    g = torch.Generator().manual_seed(123)
    ids, mask = torch.randint(1, 128, (3, 7), generator=g), torch.ones(3, 7, dtype=torch.bool)
    mask[1, :3], mask[2, :5] = False, False
    r = engine.generate(ids.masked_fill(~mask, 0), mask, 4, SamplingParams(max_new_tokens=20),
                        torch.Generator().manual_seed(0))
    plain = token_logprobs(model, r, 1.0, "fp32")[0]
    quantize_trainer(model, engine.quantizer, engine.act_dtype, kv_cache_dtype=engine_kw.get("kv_cache_dtype"))
    matched = token_logprobs(model, r, 1.0, "fp32")[0]
    kl = [mismatch_metrics(lp, r.logp_mu, r.response_mask)["mismatch/kl_k3"] for lp in (matched, plain)]
    return kl[0], kl[1]


def _supported(precision: str) -> dict:
    """The engine settings of `precision` the trainer reproduces: its defaults, or weight-only where its default
    activation scale spans the tensor (NVFP4's global scale)."""
    return {} if unsupported(Quantizer(precision)) is None else {"act_granularity": "none"}


@pytest.mark.parametrize("precision", precisions())
def test_pi_old_is_mu_at_every_registered_precision(precision):
    kl, plain = _kl("qwen2", precision, **_supported(precision))
    assert kl <= FLOAT_NOISE_KL, (precision, kl)
    if Quantizer(precision).is_scaled:  # the plain trainer is measurably off-policy: the test can fail
        assert plain > 100 * max(kl, 1e-12), (precision, kl, plain)


@pytest.mark.parametrize("kind, precision, kw", [
    ("llama", "mxfp4", {}),  # untied lm_head
    ("qwen3", "fp8_e4m3", {}),  # q/k norms
    ("qwen2", "int8", {"weight_granularity": "per_tensor"}),  # one scale over the fused q/k/v and gate/up weights
    ("qwen2", "fp8_e4m3", {"kv_cache_dtype": "fp8_e4m3"}),  # K and V rounded as an FP8 cache holds them
])
def test_pi_old_is_mu_across_families_and_options(kind, precision, kw):
    kl, _ = _kl(kind, precision, **kw)
    assert kl <= FLOAT_NOISE_KL, (kind, precision, kw, kl)


def test_tensor_wide_activation_scales_are_refused():
    assert unsupported(Quantizer("int8", act_granularity="per_tensor"))
    assert unsupported(Quantizer("nvfp4"))  # its global activation scale is the amax of the whole tensor
    assert unsupported(Quantizer("nvfp4", act_granularity="none")) is None
    assert not get_format("nvfp4").act_scales_per_token("per_block") and get_format("mxfp4").act_scales_per_token("per_block")
    with pytest.raises(ValueError, match="act_granularity=per_tensor"):
        quantize_trainer(_model(), Quantizer("fp8_e4m3", act_granularity="per_tensor"), torch.bfloat16)


def test_swap_keeps_the_master_parameters_and_their_ties():
    model = _model("qwen2")
    before = dict(model.named_parameters())
    keys = list(model.state_dict())
    n = quantize_trainer(model, Quantizer("mxfp4"), torch.bfloat16)
    assert n == 2 * 7  # q k v o gate up down per layer; the lm_head stays in the activation dtype
    after = dict(model.named_parameters())
    assert after.keys() == before.keys() and all(after[k] is before[k] for k in before)  # the optimizer's tensors
    assert list(model.state_dict()) == keys
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_straight_through_gradient_lands_on_the_master_weight():
    torch.manual_seed(1)
    lin = torch.nn.Linear(64, 8)
    q = Quantizer("int8")  # per-channel weights, per-token activations, fp32 around them
    layer = QATLinear(lin, q, torch.float32)
    x = torch.randn(5, 64, requires_grad=True)
    g = torch.randn(5, 8)
    (layer(x) * g).sum().backward()
    wq, xq = q.fake_quant_weight(lin.weight.detach()), q.fake_quant_act(x.detach())
    torch.testing.assert_close(layer(x.detach()), xq @ wq.t() + lin.bias.detach(), rtol=0, atol=1e-5)
    torch.testing.assert_close(lin.weight.grad, g.t() @ xq, rtol=1e-6, atol=1e-6)  # d/dW at the quantized input
    torch.testing.assert_close(x.grad, g @ wq, rtol=1e-6, atol=1e-6)  # d/dx through the quantized weight
    torch.testing.assert_close(lin.bias.grad, g.sum(0))
    assert not torch.equal(wq, lin.weight.detach())  # the rounding is real, the gradient passes it


def test_matched_arm_refuses_what_it_cannot_reproduce():
    from omegaconf import OmegaConf

    cls = METHODS.get("matched")
    good = OmegaConf.create({"rollout": {"engine": "embedded", "precision": "mxfp4"}, "train": {"dtype": "fp32"}})
    cls.check_run(good)
    for key, value, match in [("train.dtype", "bf16", "train.dtype=fp32"), ("rollout.engine", "vllm", "rollout=vllm"),
                              ("rollout.precision", "nvfp4", "nvfp4")]:
        bad = good.copy()
        OmegaConf.update(bad, key, value)
        with pytest.raises(ValueError, match=match):
            cls.check_run(bad)


def test_matched_at_fp8_refuses_an_engine_on_torch_scaled_mm():
    """On a GPU with FP8 tensor cores the engine's `auto` kernel is torch._scaled_mm, whose accumulation the
    trainer's emulated arithmetic does not reproduce (pi_old != mu): the control refuses it at build, naming
    rollout.fp8_kernel=emulated. Forced here on the CPU, where `auto` is the emulation and passes."""
    from omegaconf import OmegaConf

    from bench.methods.base import make_method

    rollout = OmegaConf.create({"engine": "embedded", "precision": "fp8_e4m3", "fp8_kernel": "scaled_mm"})
    with pytest.raises(ValueError, match=r"matched at rollout.precision=fp8_e4m3 on cpu: the engine would run "
                                         r"torch._scaled_mm \(rollout.fp8_kernel=scaled_mm\).*rollout.fp8_kernel=emulated"):
        make_method("matched").setup_trainer(_model(), rollout)
    for kernel in ("auto", "emulated"):
        model = _model()
        make_method("matched").setup_trainer(model, OmegaConf.merge(rollout, {"fp8_kernel": kernel}))
        assert any(isinstance(m, QATLinear) for m in model.modules())

