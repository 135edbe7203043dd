"""The built-in character tokenizer and the two tokenizer helpers the trainer uses with any tokenizer.

Characters, not subwords, because the built-in model is tiny and the tasks are digit strings: one token per
character keeps the vocabulary (and so the embedding table) small and makes every answer learnable.
It is built locally with `tokenizers` (no download) and wrapped as a transformers fast tokenizer, so that it
saves, reloads and serves exactly like a user's HF tokenizer (infra-notes section 5).

`encode_prompts` / `decode_responses` are the single place where examples become ids and ids become text, for
the built-in tokenizer and any HF tokenizer alike: prompts LEFT-padded (the rollout contract,
bench/rollout/base.py), pad falling back to EOS when absent. A prompt is either

* chat: the task's messages ([system,] user) through the tokenizer's chat template with the generation prompt
  (`apply_chat_template(messages, add_generation_prompt=True)`, the way verl, TRL and the papers' recipes build
  prompts); the template writes any BOS itself; or
* plain: BOS (when the tokenizer has one) + the task's prompt text: the built-in character tokenizer, which has
  no template, and any model run with `model.chat_template=false`.

Either way the task's `response_prefix` (TinyZero's "Let me solve this step by step.\n<think>") follows, as
text, so that a BPE tokenizer tokenizes the whole prompt in one piece. `PromptFormat` says which form a model
uses; a task config's own `chat_template` (true/false) overrides the model's for that task.
"""

from __future__ import annotations

import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")  # ids 0, 1, 2, 3
# Every printable ASCII character but tab/CR/VT/FF: covers all tasks (and most JSONL questions) in 100 ids.
CHARS = string.digits + string.ascii_letters + string.punctuation + " \n"


def char_vocab() -> dict[str, int]:
    """token -> id of the character tokenizer; its content keys the warm-start cache."""
    return {tok: i for i, tok in enumerate(list(SPECIALS) + list(CHARS))}


def build_char_tokenizer(model_max_length: int = 128) -> PreTrainedTokenizerFast:
    """A character-level tokenizer: WordLevel over single characters, unknown characters -> <unk>.

    `tokenizer(text)` adds BOS only (no EOS): a prompt must not end the sequence. `model_max_length` is set
    explicitly because otherwise transformers saves 1e30 (infra-notes section 5).
    """
    vocab = char_vocab()
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")  # one piece per character
    tok.decoder = decoders.Fuse()  # join characters without the spaces WordLevel would insert
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", vocab["<bos>"])])
    assert len(vocab) <= 128, "the tiny model's default vocab_size is 128"
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )


def pad_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The pad id, or EOS when the tokenizer defines no pad token (common for base LMs)."""
    if tokenizer.pad_token_id is not None:
        return tokenizer.pad_token_id
    if tokenizer.eos_token_id is None:
        raise ValueError(f"tokenizer {type(tokenizer).__name__} has neither a pad nor an eos token")
    return tokenizer.eos_token_id


@dataclass(frozen=True)
class PromptFormat:
    """How one model wants its prompts: `chat_template` true / false / None (= use the tokenizer's template when
    it has one), and extra keyword arguments for the template (e.g. Qwen3's {"enable_thinking": False})."""

    chat_template: Optional[bool] = None
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_config(cls, model_cfg: Any) -> "PromptFormat":
        """The format a `model.*` config asks for (`chat_template`, `chat_template_kwargs`)."""
        kwargs = getattr(model_cfg, "chat_template_kwargs", None) or {}
        return cls(getattr(model_cfg, "chat_template", None), dict(kwargs))


def has_chat_template(tokenizer: PreTrainedTokenizerBase) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def uses_chat_template(tokenizer: PreTrainedTokenizerBase, task: Any, fmt: PromptFormat) -> bool:
    """Whether `task`'s prompts go through the chat template: the task config's `chat_template` if set, else
    the model's, else whether the tokenizer has a template. Asking for a template the tokenizer lacks is an error."""
    wanted = getattr(getattr(task, "cfg", None), "chat_template", None)
    source = "task.chat_template"
    if wanted is None:
        wanted, source = fmt.chat_template, "model.chat_template"
    if wanted is None:
        return has_chat_template(tokenizer)
    if wanted and not has_chat_template(tokenizer):
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ValueError(f"{source}=true but the tokenizer of {name!r} has no chat template; set {source}=false "
                         f"(plain prompts) or use a model whose tokenizer_config.json has a chat_template")
    return bool(wanted)


def prompt_text(tokenizer: PreTrainedTokenizerBase, task: Any, ex: dict, fmt: PromptFormat = PromptFormat()) -> tuple[str, bool]:
    """(prompt text, whether it came from the chat template) of one example, response prefix included."""
    prefix = getattr(task, "response_prefix", "") or ""
    if uses_chat_template(tokenizer, task, fmt):
        text = tokenizer.apply_chat_template(task.messages(ex), tokenize=False, add_generation_prompt=True,
                                             **dict(fmt.template_kwargs))
        return text + prefix, True
    text = task.prompt(ex)
    return (f"{text}\n{prefix}" if prefix else text), False


def prompt_token_rows(
    tokenizer: PreTrainedTokenizerBase, task: Any, examples: Sequence[dict], fmt: PromptFormat = PromptFormat()
) -> list[list[int]]:
    """Unpadded prompt ids per example. Special tokens are never added by the tokenizer's post-processor: a chat
    template writes its own, a plain prompt gets exactly one BOS (if the tokenizer has one), never an EOS."""
    rows = []
    for ex in examples:
        text, templated = prompt_text(tokenizer, task, ex, fmt)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if not templated and tokenizer.bos_token_id is not None:
            ids = [tokenizer.bos_token_id] + ids
        rows.append(ids)
    return rows


def left_pad(rows: Sequence[Sequence[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [B, P] long, mask [B, P] bool) of `rows`, LEFT-padded with `pad` to the longest row."""
    width = max((len(r) for r in rows), default=0)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r) :] = torch.tensor(list(r), dtype=torch.long)
            mask[i, width - len(r) :] = True
    return ids, mask


def encode_prompts(
    tokenizer: PreTrainedTokenizerBase, task: Any, examples: Sequence[dict], fmt: PromptFormat = PromptFormat()
) -> tuple[torch.Tensor, torch.Tensor]:
    """(prompt_ids [B, P] long, prompt_mask [B, P] bool) of `examples` of `task`: the one way examples become
    prompt ids (trainer, evaluation, warm start)."""
    return left_pad(prompt_token_rows(tokenizer, task, examples, fmt), pad_id(tokenizer))


def stop_token_ids(tokenizer: PreTrainedTokenizerBase | None, model: Any = None) -> list[int]:
    """Every token id that ends a response: the tokenizer's EOS, then the model's generation_config and config
    eos ids (an int or a list: Qwen2.5-Instruct stops at <|im_end|> and <|endoftext|>, Llama 3 at three ids).
    `model.stop_tokens` of the config are merged into generation_config by bench.models.load."""
    found: list[int] = []
    sources = [getattr(tokenizer, "eos_token_id", None)]
    for holder in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        sources.append(getattr(holder, "eos_token_id", None))
    for value in sources:
        for i in ([] if value is None else [value] if isinstance(value, int) else list(value)):
            if int(i) not in found:
                found.append(int(i))
    return found



def engine_ids(tokenizer: PreTrainedTokenizerBase | None, model: Any = None) -> dict[str, Any]:
    """The token ids a rollout engine is built with (bench.rollout.build_engine's `eos_id` and `pad_id`): the
    stop ids (one int, or the list when the model has several, None when it has none) and the tokenizer's pad id
    (None: the engine falls back to the first stop id)."""
    stops = stop_token_ids(tokenizer, model)
    return {"eos_id": stops[0] if len(stops) == 1 else (stops or None),
            "pad_id": getattr(tokenizer, "pad_token_id", None)}

def decode_responses(
    tokenizer: PreTrainedTokenizerBase, response_ids: torch.Tensor, response_mask: torch.Tensor,
    stop_ids: Sequence[int] | None = None,
) -> list[str]:
    """Completion text of each row: the masked-in tokens up to the first stop token (default: the tokenizer's
    EOS), special tokens skipped."""
    stops = set(stop_ids) if stop_ids is not None else ({tokenizer.eos_token_id} - {None})
    out = []
    for ids, mask in zip(response_ids.tolist(), response_mask.tolist()):
        kept = [t for t, m in zip(ids, mask) if m]
        cut = next((i for i, t in enumerate(kept) if t in stops), None)
        if cut is not None:
            kept = kept[:cut]
        out.append(tokenizer.decode(kept, skip_special_tokens=True))
    return out
