"""(b) A quantized vLLM engine (online fp8_per_channel, bf16) re-quantizes with FRESH scales at every sync.

New weights = another random model with its linears doubled, so the previous weights' scales are about half
the right ones: under stale scales every weight above ~half its row's amax would be clipped. Two checks:
* the engine's qkv weight scales after the sync equal amax/448 of the new bf16 weights exactly;
* its log mu is close to an fp32 emulation of fp8 W8A8 with the new weights' scales (measured mean 0.17:
  bf16 activations in vLLM vs fp32 in the emulation) and far from the same emulation with the old scales
  (measured mean 1.58).
"""

from __future__ import annotations

import gc

import pytest
import torch

from bench.rollout.vllm_engine import VLLMEngine
from tests.vllm.helpers import emulated_fp8_model, fp8_channel_scale, gap, generate, scaled_linears, tiny_qwen2

pytestmark = pytest.mark.vllm


def _qkv_weight(model: torch.nn.Module, layer: int) -> torch.Tensor:
    at = model.model.layers[layer].self_attn
    return torch.cat([at.q_proj.weight, at.k_proj.weight, at.v_proj.weight]).detach()


def _engine_scales(engine: VLLMEngine, layer: int) -> torch.Tensor:
    return engine.apply_model(lambda m: m.model.layers[layer].self_attn.qkv_proj.weight_scale.detach().clone())


@pytest.fixture(scope="module")
def engine():
    engine = VLLMEngine("fp8_e4m3", weight_granularity="per_channel", max_len=256)
    assert engine.settings == {"dtype": "bfloat16", "quantization": "fp8_per_channel"}
    yield engine
    engine.close()
    gc.collect()


def test_sync_recomputes_fp8_scales(engine):
    old, new = tiny_qwen2(0), scaled_linears(tiny_qwen2(1), 2.0)
    engine.load_weights(old)
    assert torch.equal(_engine_scales(engine, 0).flatten(), fp8_channel_scale(_qkv_weight(old, 0)).flatten())
    generate(engine)
    engine.load_weights(new)
    for layer in (0, 1):
        scales = _engine_scales(engine, layer).flatten()
        assert torch.equal(scales, fp8_channel_scale(_qkv_weight(new, layer)).flatten())
        assert (scales / fp8_channel_scale(_qkv_weight(old, layer)).flatten()).median() > 1.5  # really moved

    rollouts = [generate(engine, seed=s, new=24) for s in range(4)]
    fresh = torch.cat([gap(emulated_fp8_model(new), r) for r in rollouts])
    stale = torch.cat([gap(emulated_fp8_model(new, scales_from=old), r) for r in rollouts])
    assert fresh.mean() < 0.3, fresh.mean()
    assert stale.mean() > 1.0, stale.mean()
    assert fresh.mean() < stale.mean() / 4


def test_quantized_engine_is_really_fp8(engine):
    """The same weights unquantized are measurably further away than the fp8 emulation: fp8 is applied."""
    model = tiny_qwen2(2)
    engine.load_weights(model)
    rollouts = [generate(engine, seed=s, new=24) for s in range(4)]
    vs_fp32 = torch.cat([gap(model, r) for r in rollouts])
    vs_fp8 = torch.cat([gap(emulated_fp8_model(model), r) for r in rollouts])
    assert vs_fp8.mean() < vs_fp32.mean()
    assert vs_fp32.mean() > 0.05  # far above the bf16-only error of test_engine_bf16 (mean 0.02)
