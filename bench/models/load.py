"""`load_policy`: the one entry point that turns a model config into (model, tokenizer).

The built-in tiny model (`model.path: null`) is warm-started and cached (bench/models/warmstart.py); its cache
directory is an ordinary HF model directory, so from there on it goes through exactly the code that loads a
user's model (a local directory or a hub id). Runs are offline, so a model that is neither a local directory
nor in the HF cache must fail at once with a message naming it, not with a network stack trace.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from bench.tasks.base import Task


@dataclass
class ModelConfig:
    """`model.*`. `path: null` = the built-in tiny model (built from this config, warm-started, cached);
    otherwise a local directory or hub id loaded through transformers (same code path for any model)."""

    name: str = "tiny"
    path: Optional[str] = None
    arch: str = "qwen2"  # built-in only: qwen2 | llama
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 512
    max_position_embeddings: int = 128
    vocab_size: int = 128  # built-in only: embedding rows (>= the 100-token character tokenizer)
    warmstart_seed: int = 0  # built-in only: init + SFT data order of the warm start
    warmstart_steps: int = 4000  # built-in only: SFT step budget of the cosine schedule (stops at warmstart_target_acc)
    warmstart_lr: float = 1e-3
    warmstart_batch: int = 16  # small batches: at this size progress is per update, not per example
    warmstart_target_acc: Optional[float] = 0.45  # stop SFT once greedy accuracy on train examples reaches it
    cache_dir: str = "${oc.env:QRL_BENCH_CACHE,'~/.cache/qrl-bench'}"


def load_policy(model_cfg: Any, task: Task) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """(fp32 model in eval mode, tokenizer) for `model_cfg`; the caller switches to train mode.

    fp32 because the trainer keeps fp32 master weights (bf16 is an autocast choice, not a storage one).
    """
    if model_cfg.path is None:
        from bench.models.warmstart import warm_start_dir

        return load_pretrained(str(warm_start_dir(model_cfg, task)))
    return load_pretrained(str(model_cfg.path))


def _looks_local(path: str) -> bool:
    """Paths that cannot be hub ids ("org/name"): absolute, ./ ../ or ~ prefixed, or with several slashes."""
    return path.startswith(("/", "./", "../", "~")) or path.count("/") > 1 or os.path.isabs(path)


def _load_tokenizer(source: str) -> PreTrainedTokenizerBase:
    """AutoTokenizer, except for a tokenizer saved as a self-describing `tokenizers` pipeline.

    transformers 5 quirk: for some model types (qwen2 among them) AutoTokenizer ignores the saved
    `"tokenizer_class": "TokenizersBackend"` and rebuilds the model type's own tokenizer around the vocab;
    for the built-in character tokenizer that means a byte-level BPE which silently DROPS spaces and
    newlines ("3 5 7>22:" -> "357>22:"). Such a tokenizer is loaded with its own class instead.
    """
    from transformers import PreTrainedTokenizerFast
    from transformers.models.auto.tokenization_auto import get_tokenizer_config

    if get_tokenizer_config(source).get("tokenizer_class") == "TokenizersBackend":
        return PreTrainedTokenizerFast.from_pretrained(source)
    return AutoTokenizer.from_pretrained(source)


def load_pretrained(path: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A causal LM + its tokenizer from a local directory or a hub id (the same calls for both).

    The tokenizer's pad token falls back to EOS when it has none (GRPO batches need padding).
    """
    local = os.path.expanduser(path)
    if _looks_local(path) and not os.path.isdir(local):
        raise FileNotFoundError(f"model '{path}' not found: no such local directory ({os.path.abspath(local)})")
    if os.path.isdir(local) and not os.path.isfile(os.path.join(local, "config.json")):
        what = "is empty" if not os.listdir(local) else "has no config.json"
        raise FileNotFoundError(f"model directory {os.path.abspath(local)} {what}: a model directory holds "
                                "config.json, the weights and the tokenizer (save_pretrained)")
    source = local if os.path.isdir(local) else path
    try:
        tokenizer = _load_tokenizer(source)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    except (OSError, ConnectionError) as e:  # ConnectionError is an OSError; named for the reader
        offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")
        why = "the hub is offline (HF_HUB_OFFLINE=1)" if offline else "it could not be fetched from the hub"
        raise OSError(
            f"model '{path}' not found locally and {why}: pass a local directory holding config.json, "
            f"the weights and the tokenizer, or pre-download it into the HF cache (cause: {e})"
        ) from e
    if tokenizer.pad_token_id is None and tokenizer.eos_token_id is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.float().eval(), tokenizer
