"""Offline stand-ins for the preset models: random-init Qwen2 / Qwen3 / Llama models of the same config shape as
the hub checkpoints (tiny dims), saved with a tokenizer that has a chat template, like a downloaded model directory.

The tokenizer is character-level (every printable ASCII character) plus each family's special tokens, built
with `tokenizers` and wrapped as a transformers fast tokenizer; its chat template is a Jinja string written for
the test in the shape of the family's template (Qwen's <|im_start|>role ... <|im_end|> turns with a default
system turn, Qwen3's `enable_thinking` switch, Llama 3's BOS + header turns). The configs copy what matters
from the hub configs: Qwen2 qkv bias, tied embeddings, rope_theta 1e6 and a (disabled) sliding window; Qwen3
q/k norms and an explicit head_dim; Llama llama3 RoPE scaling; several EOS ids in generation_config.

`python -m tests.chat_models OUT_DIR` writes the three directories, e.g. to try a preset offline:
`qrl-bench model=qwen3-1.7b model.path=OUT_DIR/qwen3 ...`.
"""

from __future__ import annotations

import string
import sys
from pathlib import Path

import torch
import transformers as tr
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

CHARS = string.digits + string.ascii_letters + string.punctuation + " \n"

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LLAMA_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                  "<|eom_id|>"]

QWEN_TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for m in messages %}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
QWEN3_TEMPLATE = (  # no default system turn; thinking is on unless enable_thinking=false
    "{%- for m in messages %}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)
LLAMA_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for m in messages %}"
    "{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             initializer_range=0.02)
VOCAB = 128  # >= the 98 characters + specials


def chat_tokenizer(family: str) -> tr.PreTrainedTokenizerFast:
    """A character tokenizer with `family`'s special tokens and chat template (qwen2 | qwen3 | llama)."""
    specials = LLAMA_SPECIALS if family == "llama" else QWEN_SPECIALS
    vocab = {tok: i for i, tok in enumerate(specials + ["<unk>"] + list(CHARS))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    if family == "llama":
        kw = dict(bos_token="<|begin_of_text|>", eos_token="<|eot_id|>", chat_template=LLAMA_TEMPLATE,
                  additional_special_tokens=[t for t in specials if t not in ("<|begin_of_text|>", "<|eot_id|>")])
    else:
        kw = dict(eos_token="<|im_end|>", pad_token="<|endoftext|>",
                  chat_template=QWEN3_TEMPLATE if family == "qwen3" else QWEN_TEMPLATE,
                  additional_special_tokens=["<|im_start|>"])
    out = tr.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", model_max_length=VOCAB * 4,
                                     clean_up_tokenization_spaces=False, **kw)
    assert len(out) <= VOCAB
    return out


def chat_model(family: str, tokenizer: tr.PreTrainedTokenizerBase, max_positions: int = 512, seed: int = 0):
    """A random-init model of `family`'s hub config shape with tiny dims; generation_config lists its EOS ids."""
    ids = tokenizer.convert_tokens_to_ids
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if family == "qwen2":  # Qwen2.5: qkv bias, tied embeddings, rope_theta 1e6, sliding window off
            eos = [ids("<|im_end|>"), ids("<|endoftext|>")]
            model = tr.Qwen2ForCausalLM(tr.Qwen2Config(
                **SMALL, vocab_size=VOCAB, max_position_embeddings=max_positions, tie_word_embeddings=True,
                rope_parameters={"rope_type": "default", "rope_theta": 1e6}, use_sliding_window=False,
                sliding_window=max_positions, bos_token_id=ids("<|endoftext|>"), eos_token_id=eos[1]))
        elif family == "qwen3":  # Qwen3: q/k norms, explicit head_dim, no qkv bias, tied embeddings
            eos = [ids("<|im_end|>"), ids("<|endoftext|>")]
            model = tr.Qwen3ForCausalLM(tr.Qwen3Config(
                **SMALL, head_dim=32, vocab_size=VOCAB, max_position_embeddings=max_positions, tie_word_embeddings=True,
                rope_parameters={"rope_type": "default", "rope_theta": 1e6}, bos_token_id=eos[1], eos_token_id=eos[0]))
        elif family == "llama":  # Llama 3.2: llama3 RoPE scaling, tied embeddings, three EOS ids
            eos = [ids("<|end_of_text|>"), ids("<|eom_id|>"), ids("<|eot_id|>")]
            rope = {"rope_type": "llama3", "rope_theta": 5e5, "factor": 32.0, "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0, "original_max_position_embeddings": 128}
            model = tr.LlamaForCausalLM(tr.LlamaConfig(
                **SMALL, vocab_size=VOCAB, max_position_embeddings=max_positions, tie_word_embeddings=True,
                rope_parameters=rope, bos_token_id=ids("<|begin_of_text|>"), eos_token_id=eos))
        else:
            raise ValueError(f"unknown family {family!r}")
    model.generation_config = tr.GenerationConfig(eos_token_id=eos, bos_token_id=model.config.bos_token_id)
    return model.eval()


def save_chat_model(family: str, out: Path, max_positions: int = 512, seed: int = 0) -> Path:
    """Write `family`'s model + tokenizer to `out` (a local model directory) and return it."""
    tokenizer = chat_tokenizer(family)
    chat_model(family, tokenizer, max_positions, seed).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


if __name__ == "__main__":
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "chat-models")
    for fam in ("qwen2", "qwen3", "llama"):
        print(save_chat_model(fam, root / fam))
