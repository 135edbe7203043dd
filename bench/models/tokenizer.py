"""The built-in character tokenizer and the two tokenizer helpers the trainer uses with any tokenizer.

Characters, not subwords, because the built-in model is tiny and the tasks are digit strings: one token per
character keeps the vocabulary (and so the embedding table) small and makes every answer learnable.
It is built locally with `tokenizers` (no download) and wrapped as a transformers fast tokenizer, so that it
saves, reloads and serves exactly like a user's HF tokenizer (infra-notes section 5).

`encode_prompts` / `decode_responses` are the single place where text becomes ids and back, for the
built-in tokenizer and any HF tokenizer alike: prompts LEFT-padded (the rollout contract,
bench/rollout/base.py), BOS prepended when the tokenizer has one, pad falling back to EOS when absent.
"""

from __future__ import annotations

import string

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


def encode_prompts(tokenizer: PreTrainedTokenizerBase, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """(prompt_ids [B, P] long, prompt_mask [B, P] bool): BOS + text, LEFT-padded with the pad id.

    Special tokens are added here rather than by the tokenizer's template, so that every tokenizer gets
    exactly one BOS (if it has one) and never a trailing EOS, whatever its post-processor does.
    """
    rows = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    if tokenizer.bos_token_id is not None:
        rows = [[tokenizer.bos_token_id] + r for r in rows]
    width = max((len(r) for r in rows), default=0)
    ids = torch.full((len(rows), width), pad_id(tokenizer), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
            mask[i, width - len(r) :] = True
    return ids, mask


def decode_responses(
    tokenizer: PreTrainedTokenizerBase, response_ids: torch.Tensor, response_mask: torch.Tensor
) -> list[str]:
    """Completion text of each row: the masked-in tokens up to the first EOS, special tokens skipped."""
    eos = tokenizer.eos_token_id
    out = []
    for ids, mask in zip(response_ids.tolist(), response_mask.tolist()):
        kept = [t for t, m in zip(ids, mask) if m]
        if eos is not None and eos in kept:
            kept = kept[: kept.index(eos)]
        out.append(tokenizer.decode(kept, skip_special_tokens=True))
    return out
