"""`load_policy`: the one entry point that turns a model config into (model, tokenizer).

The built-in tiny model (`model.path: null`) is warm-started and cached by the caller (bench/warmstart.py:
`policy_path`); its cache directory is an ordinary HF model directory, so from there on it goes through exactly
the code that loads a user's model (a local directory or a hub id). Runs are offline, so a model that is neither a local directory
nor in the HF cache must fail at once with a message naming it, not with a network stack trace.

The model presets (conf/model/<name>.yaml: qwen2.5-0.5b-instruct, qwen3-8b, ...) are ModelConfigs whose `path` is
a hub id; `model.path=/local/copy` points the same preset at a downloaded copy (a directory holding config.json,
the weights and the tokenizer, e.g. `huggingface-cli download <id> --local-dir /local/copy`), through the same
code. The settings that differ between real models are here: the trainer's weight dtype, the context length
(`max_length`), whether prompts go through the chat template, and extra stop tokens.
"""

from __future__ import annotations

import os
from typing import Any

from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from bench.device import DTYPES
from bench.models.config import MODEL_DTYPES


#: model.dtype -> the torch dtype the trainer's weights are loaded and kept in
LOAD_DTYPES = {name: DTYPES[name] for name in MODEL_DTYPES}


def load_policy(model_cfg: Any, path: str | None = None) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """(model in eval mode, tokenizer) for `model_cfg`, read from `path` (default `model.path`); the caller
    switches to train mode. The built-in model's path is its warm-start directory, which the caller resolves
    (bench.warmstart.policy_path): loading needs no task. A loaded model's config takes `config_overrides(model_cfg)`
    before the model is built; every engine reads that config (vLLM's is saved from it), so they all see the override.

    fp32 by default because the trainer keeps fp32 master weights (bf16 is an autocast choice, not a storage
    one); `model.dtype=bf16` keeps the weights themselves in bf16. `model.stop_tokens` are added to the model's
    generation_config eos ids, where every engine reads its stop tokens (bench.models.tokenizer.stop_token_ids).
    """
    path = path if path is not None else model_cfg.path
    if path is None:
        raise ValueError("model.path=null is the built-in model: pass its warm-start directory "
                         "(bench.warmstart.policy_path)")
    model, tokenizer = load_pretrained(str(path), getattr(model_cfg, "dtype", "fp32"), config_overrides(model_cfg))
    add_stop_tokens(model, tokenizer, list(getattr(model_cfg, "stop_tokens", None) or []))
    context_length(model_cfg, model)  # fails now, naming the key, if model.max_length exceeds the model
    return model, tokenizer


def add_stop_tokens(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, tokens: list[str]) -> None:
    """Append the ids of `tokens` (each one token of the vocabulary) to model.generation_config.eos_token_id."""
    if not tokens:
        return
    vocab = tokenizer.get_vocab()
    missing = [t for t in tokens if t not in vocab]
    if missing:
        raise ValueError(f"model.stop_tokens: {missing} are not tokens of the tokenizer of "
                         f"{getattr(tokenizer, 'name_or_path', '?')!r} (each entry must be one vocabulary token)")
    current = model.generation_config.eos_token_id
    ids = [] if current is None else [current] if isinstance(current, int) else list(current)
    ids += [vocab[t] for t in tokens if vocab[t] not in ids]
    model.generation_config.eos_token_id = ids


def config_overrides(model_cfg: Any) -> dict[str, Any]:
    """The config.json fields a loaded model's config takes from `model.*` (`model.max_position_embeddings` when
    set); nothing for the built-in model, which is built from its config. Recorded in run.json (bench/train.py)."""
    if getattr(model_cfg, "path", None) is None or getattr(model_cfg, "max_position_embeddings", None) is None:
        return {}
    return {"max_position_embeddings": int(model_cfg.max_position_embeddings)}


def apply_overrides(config: Any, overrides: dict[str, Any]) -> Any:
    """`config` (a transformers PretrainedConfig) with `overrides` set, e.g. a longer context."""
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


def context_length(model_cfg: Any, model: PreTrainedModel) -> int | None:
    """Prompt + response tokens the model may use: `model.max_length`, else its max_position_embeddings."""
    limit = getattr(model.config, "max_position_embeddings", None)
    wanted = getattr(model_cfg, "max_length", None)
    if wanted is None:
        return limit
    if limit is not None and wanted > limit:
        hint = "" if getattr(model_cfg, "path", None) is None else (
            f"; to run it past its trained context, set model.max_position_embeddings={wanted} (its config then says "
            "so to every engine, as verl's override_config does)")
        raise ValueError(f"model.max_length={wanted} exceeds the model's max_position_embeddings={limit} "
                         f"({getattr(model_cfg, 'path', None) or 'built-in model'}){hint}")
    return int(wanted)


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


def load_pretrained(path: str, dtype: str = "fp32", overrides: dict[str, Any] | None = None
                    ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A causal LM + its tokenizer from a local directory or a hub id (the same calls for both), its weights in
    `dtype` (a LOAD_DTYPES name), its config with `overrides` set before the model is built (`config_overrides`).

    The tokenizer's pad token falls back to EOS when it has none (GRPO batches need padding).
    """
    if dtype not in LOAD_DTYPES:
        raise ValueError(f"dtype {dtype!r} is not valid; choose one of: {', '.join(LOAD_DTYPES)}")
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
        config = apply_overrides(AutoConfig.from_pretrained(source), overrides or {})
        model = AutoModelForCausalLM.from_pretrained(source, config=config, dtype=LOAD_DTYPES[dtype])
    except (OSError, ConnectionError) as e:  # ConnectionError is an OSError; named for the reader
        offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")
        why = "the hub is offline (HF_HUB_OFFLINE=1)" if offline else "it could not be fetched from the hub"
        raise OSError(
            f"model '{path}' not found locally and {why}: pass a local directory holding config.json, "
            f"the weights and the tokenizer, or pre-download it into the HF cache (cause: {e})"
        ) from e
    if tokenizer.pad_token_id is None and tokenizer.eos_token_id is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.to(LOAD_DTYPES[dtype]).eval(), tokenizer
