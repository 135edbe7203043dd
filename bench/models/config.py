"""The `model` config: which model a run trains (the built-in tiny one or a transformers model) and how it is held.

Torch-free, apart from the loading it configures (bench/models/load.py), so that the configuration
(bench/launch/config.py) imports neither torch nor transformers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from bench.domains import num

#: model.dtype: the dtypes the trainer's weights are loaded and kept in (bench/models/load.py LOAD_DTYPES)
MODEL_DTYPES = ("fp32", "bf16")

#: model presets whose name the user gives (model=hf model.path=... model.name=short-name); they need a path
USER_NAMED_MODELS = ("hf",)


@dataclass
class ModelConfig:
    """`model.*`. `path: null` = the built-in tiny model (built from this config, warm-started, cached);
    otherwise a local directory or hub id loaded through transformers (same code path for any model)."""

    name: str = "tiny"
    path: Optional[str] = None
    arch: str = "qwen2"  # built-in only: qwen2 | llama | qwen3
    # built-in only: the architecture (hidden_size a multiple of num_heads, num_heads of num_kv_heads)
    hidden_size: int = num(128, "[1, inf)")
    num_layers: int = num(4, "[1, inf)")
    num_heads: int = num(4, "[1, inf)")
    num_kv_heads: int = num(2, "[1, inf)")
    intermediate_size: int = num(512, "[1, inf)")
    # the model's context (positions): the built-in model is built with it; a loaded model's config.json value is
    # replaced by it when set (as verl's `override_config`: qurl_table2 raises Qwen2.5-Math-7B's 4,096 to 32,768);
    # the presets of loaded models set null
    max_position_embeddings: Optional[int] = num(128, "[2, inf)", {
        None: "a loaded model's own (config.json); the built-in model needs a value"})
    vocab_size: int = num(128, "[1, inf)")  # built-in only: embedding rows (>= the 100-token character tokenizer)
    warmstart_seed: int = num(0, "[0, inf)")  # built-in only: init + SFT data order of the warm start
    # built-in only: SFT step budget of the cosine schedule (stops at warmstart_target_acc)
    warmstart_steps: int = num(4000, "[0, inf)", {0: "no SFT: the random init, built and saved (model=mini_*)"})
    warmstart_lr: float = num(1e-3, "(0, 1]")
    warmstart_batch: int = num(16, "[1, inf)")  # small batches: at this size progress is per update, not per example
    # stop SFT once greedy accuracy on train examples reaches it
    warmstart_target_acc: Optional[float] = num(0.45, "(0, 1]", {None: "no target: train all warmstart_steps"})
    # built-in only: torch threads of the SFT, fixed here (not the caller's) so the weights are too
    warmstart_threads: int = num(1, "[1, 1024]")
    cache_dir: str = "${oc.env:QRL_BENCH_CACHE,'~/.cache/qrl-bench'}"
    # any model (built-in or loaded):
    dtype: str = "fp32"  # the trainer's weights: fp32 (master weights; bf16 compute is train.dtype) | bf16 (half the memory, no fp32 master copy)
    # prompt + response tokens (KV cache, positions): a prompt token and a response token at least
    max_length: Optional[int] = num(None, "[2, inf)", {None: "the model config's max_position_embeddings"})
    chat_template: Optional[bool] = None  # prompts through the tokenizer's chat template; null: when it has one
    chat_template_kwargs: Dict[str, Any] = field(default_factory=dict)  # e.g. {enable_thinking: false} for Qwen3
    stop_tokens: List[str] = field(default_factory=list)  # tokens that end a response besides the model's EOS ids

    def check(self) -> None:
        if self.path is None and self.name in USER_NAMED_MODELS:
            raise ValueError(f"model={self.name} loads a transformers model: give model.path=DIR_OR_HUB_ID (a local "
                             f"folder or a hub id), and model.name=SHORT_NAME to name its runs")
        if self.dtype not in MODEL_DTYPES:
            raise ValueError(f"model.dtype={self.dtype!r} is not valid; choose one of: {', '.join(MODEL_DTYPES)}")
        if self.path is None and (self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads):
            raise ValueError(f"model.hidden_size={self.hidden_size}, model.num_heads={self.num_heads}, model.num_kv_heads="
                             f"{self.num_kv_heads}: the hidden size must be a multiple of the heads, and the heads of "
                             "the key/value heads")
        if self.path is None and self.max_position_embeddings is None:
            raise ValueError("model.max_position_embeddings=null is for loaded models; the built-in model "
                             "(model.path=null) is built with that many positions (e.g. 128)")
        if self.path is None and self.chat_template:
            raise ValueError("model.chat_template=true, but the built-in model (model.path=null) uses a character "
                             "tokenizer without a chat template; leave it null or false")
        if self.path is None and self.stop_tokens:
            raise ValueError(f"model.stop_tokens={list(self.stop_tokens)} is for loaded models; the built-in model stops at <eos>")
        if not all(isinstance(t, str) and t for t in self.stop_tokens):
            raise ValueError(f"model.stop_tokens must be non-empty token strings, got {list(self.stop_tokens)}")
