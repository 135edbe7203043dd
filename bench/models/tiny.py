"""The built-in tiny policy: a real Qwen2 (default) or Llama model from `transformers`, built from config.

Qwen3 (q/k norms, no qkv bias) is there for the paper recipes' mini variants (Qwen3-8B's family).
A real HF architecture rather than a toy module, so that the trainer, the rollout engines (including vLLM)
and the quantizers exercise exactly the code path a user's model takes; only the size is tiny, so that a
benchmark run fits on a CPU in minutes (perf-notes: ~1M params is what the full sweep can afford).

Presets (conf/model/*.yaml), with the 100-token character tokenizer in a vocab of 128:
  tiny   (~1.0M params): hidden 128, 4 layers, 4 heads / 2 kv heads (head dim 32), intermediate 512
  tiny10m (~9.5M params): hidden 256, 6 layers, 4 heads / 2 kv heads (head dim 64), intermediate 1792
  mini_qwen2 / mini_qwen3 (~0.1M params, random init: no warm-start steps): hidden 64, 2 layers, 4 / 2 heads,
          intermediate 128, 1024 positions (the paper recipes' CPU variants)
Embeddings are tied (at this size the output matrix would otherwise be a large share of the parameters).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import (LlamaConfig, LlamaForCausalLM, PreTrainedModel, PreTrainedTokenizerBase, Qwen2Config,
                          Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

from bench.models.tokenizer import pad_id

ARCHS = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM),
         "qwen3": (Qwen3Config, Qwen3ForCausalLM)}


def tiny_config(model_cfg: Any, tokenizer: PreTrainedTokenizerBase):
    """The HF config of the built-in model; special token ids come from the tokenizer."""
    if model_cfg.arch not in ARCHS:
        raise ValueError(f"model.arch={model_cfg.arch!r} is not a built-in architecture; valid: {', '.join(ARCHS)}")
    if len(tokenizer) > model_cfg.vocab_size:
        raise ValueError(f"model.vocab_size={model_cfg.vocab_size} is smaller than the tokenizer ({len(tokenizer)} tokens)")
    config_cls, _ = ARCHS[model_cfg.arch]
    # Qwen3 sets head_dim on its own (default 128); the others derive it as hidden / heads
    extra = {"head_dim": model_cfg.hidden_size // model_cfg.num_heads} if model_cfg.arch == "qwen3" else {}
    return config_cls(
        **extra,
        vocab_size=model_cfg.vocab_size,
        hidden_size=model_cfg.hidden_size,
        intermediate_size=model_cfg.intermediate_size,
        num_hidden_layers=model_cfg.num_layers,
        num_attention_heads=model_cfg.num_heads,
        num_key_value_heads=model_cfg.num_kv_heads,
        max_position_embeddings=model_cfg.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=pad_id(tokenizer),
    )


def build_tiny_model(model_cfg: Any, tokenizer: PreTrainedTokenizerBase, seed: int = 0) -> PreTrainedModel:
    """A freshly initialised fp32 model; the init depends only on (config, seed), not on global RNG state."""
    config = tiny_config(model_cfg, tokenizer)
    _, model_cls = ARCHS[model_cfg.arch]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config)
    return model.float()
