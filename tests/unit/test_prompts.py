"""Prompts: a model's chat template when it has one and its config says so, the built-in model's plain format
otherwise; stop ids and the response budget come from the model. Tokenizers are real, built offline
(tests/chat_models.py), and loaded back from disk like a downloaded model."""

from __future__ import annotations

import os

import pytest
import torch

from bench.models.load import add_stop_tokens, context_length, load_pretrained
from bench.models.config import ModelConfig
from bench.models.tokenizer import (
    PromptFormat,
    build_char_tokenizer,
    decode_responses,
    encode_prompts,
    engine_ids,
    prompt_text,
    stop_token_ids,
    uses_chat_template,
)
from bench.rollout import build_engine
from bench.rollout.base import SamplingParams, response_budget
from bench.rollout.embedded import EmbeddedEngine, EmbeddedRolloutConfig
from bench.tasks.arithmetic import ArithmeticTaskConfig
from bench.tasks.base import build_task
from bench.tasks.countdown_tasks import CountdownTasksConfig
from bench.tasks.math_sets import Gsm8kTaskConfig
from tests.chat_models import save_chat_model

FIXTURES = os.path.normpath(os.path.join(os.path.dirname(__file__), os.pardir, "fixtures", "data"))


@pytest.fixture(scope="module")
def chat(tmp_path_factory) -> dict:
    """family -> (model, tokenizer) loaded from a saved directory."""
    return {f: load_pretrained(str(save_chat_model(f, tmp_path_factory.mktemp(f)))) for f in ("qwen2", "qwen3", "llama")}


@pytest.fixture(scope="module")
def gsm8k():
    return build_task(Gsm8kTaskConfig(source=os.path.join(FIXTURES, "gsm8k"), max_new_tokens=8))


@pytest.fixture(scope="module")
def countdown():
    return build_task(CountdownTasksConfig(source=os.path.join(FIXTURES, "countdown_tasks"), test_size=8))


def _text(tok, ids, mask) -> str:
    return tok.decode(ids[mask].tolist())


def test_qwen_prompt_is_the_chat_template_with_the_generation_prompt(chat, gsm8k):
    _, tok = chat["qwen2"]
    ex = gsm8k.examples("test")[0]
    ids, mask = encode_prompts(tok, gsm8k, [ex], PromptFormat())  # null: the tokenizer has a template, use it
    user = ex["problem"] + " Let's think step by step and output the final answer within \\boxed{}."
    assert _text(tok, ids[0], mask[0]) == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                                          f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")
    assert ids[0, mask[0]].tolist()[0] == tok.convert_tokens_to_ids("<|im_start|>")  # no BOS added in front


def test_llama_prompt_has_exactly_one_bos_from_the_template(chat, gsm8k):
    _, tok = chat["llama"]
    exs = gsm8k.examples("test")
    ids, mask = encode_prompts(tok, gsm8k, exs, PromptFormat(chat_template=True))
    for row, m in zip(ids, mask):
        real = row[m].tolist()
        assert real[0] == tok.bos_token_id and real.count(tok.bos_token_id) == 1
        assert tok.decode(real).endswith("<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")


def test_template_kwargs_reach_the_template(chat, gsm8k):
    _, tok = chat["qwen3"]
    ex = gsm8k.examples("test")[0]
    thinking, _ = prompt_text(tok, gsm8k, ex, PromptFormat(True))
    plain_answer, _ = prompt_text(tok, gsm8k, ex, PromptFormat(True, {"enable_thinking": False}))
    assert thinking.endswith("<|im_start|>assistant\n")
    assert plain_answer == thinking + "<think>\n\n</think>\n\n"


def test_system_prompt_and_response_prefix_go_where_the_papers_put_them(chat, countdown):
    _, tok = chat["qwen2"]
    ex = countdown.examples("test")[0]
    text, templated = prompt_text(tok, countdown, ex, PromptFormat())
    assert templated and text.startswith("<|im_start|>system\nYou are a helpful assistant. You first think")
    assert text.endswith("<|im_start|>assistant\nLet me solve this step by step.\n<think>")
    assert f"Using the numbers {ex['nums']}, create an equation that equals {ex['target']}." in text


def test_plain_format_when_asked_or_without_a_template(chat, gsm8k):
    _, tok = chat["qwen2"]
    ex = gsm8k.examples("test")[0]
    assert prompt_text(tok, gsm8k, ex, PromptFormat(False)) == (gsm8k.prompt(ex), False)
    forced_plain = build_task(Gsm8kTaskConfig(source=os.path.join(FIXTURES, "gsm8k"), chat_template=False))
    assert not uses_chat_template(tok, forced_plain, PromptFormat(True))  # the task's setting wins
    char = build_char_tokenizer()
    arith = build_task(ArithmeticTaskConfig(n_train=4, n_test=4))
    assert not uses_chat_template(char, arith, PromptFormat())
    ids, mask = encode_prompts(char, arith, arith.examples("test")[:1])
    assert ids[0].tolist() == [char.bos_token_id] + char(arith.prompt(arith.examples("test")[0]),
                                                         add_special_tokens=False)["input_ids"]


def test_asking_for_a_template_the_tokenizer_lacks_is_an_error():
    arith = build_task(ArithmeticTaskConfig(n_train=4, n_test=4))
    with pytest.raises(ValueError, match="model.chat_template=true but the tokenizer .* has no chat template"):
        uses_chat_template(build_char_tokenizer(), arith, PromptFormat(True))
    with pytest.raises(ValueError, match="built-in model .* character tokenizer without a chat template"):
        ModelConfig(chat_template=True).check()


def test_stop_ids_are_every_eos_of_tokenizer_and_generation_config(chat):
    model, tok = chat["llama"]
    ids = tok.convert_tokens_to_ids
    assert stop_token_ids(tok, model) == [ids("<|eot_id|>"), ids("<|end_of_text|>"), ids("<|eom_id|>")]
    engine = build_engine(EmbeddedRolloutConfig(precision="fp32"), **engine_ids(tok, model))
    assert sorted(engine.stop_ids.tolist()) == sorted(stop_token_ids(tok, model))
    assert engine.pad_id == tok.pad_token_id == ids("<|eot_id|>")


def test_stop_tokens_of_the_config_join_the_generation_config(tmp_path):
    model, tok = load_pretrained(str(save_chat_model("qwen2", tmp_path / "q")))
    gen = list(model.generation_config.eos_token_id)
    add_stop_tokens(model, tok, ["<|im_start|>", "<|im_end|>"])  # <|im_end|> is already there: not twice
    assert model.generation_config.eos_token_id == gen + [tok.convert_tokens_to_ids("<|im_start|>")]
    with pytest.raises(ValueError, match=r"\['</answer>'\] are not tokens"):
        add_stop_tokens(model, tok, ["</answer>"])


def test_generation_stops_at_any_of_several_eos_ids(chat):
    """A sampled run without stops, then the same run with one of its emitted tokens as the second stop id:
    each row ends at its first occurrence of that token (same generator, so the same tokens up to there)."""
    model, tok = chat["qwen2"]
    ids, mask = torch.randint(10, 100, (2, 5), generator=torch.Generator().manual_seed(0)), torch.ones(2, 5, dtype=torch.bool)

    def run(eos):
        engine = EmbeddedEngine("fp32", eos_id=eos, pad_id=0)
        engine.load_weights(model)
        return engine.generate(ids, mask, 2, SamplingParams(24, 1.0), torch.Generator().manual_seed(5))

    free = run(None)
    stop = int(free.response_ids[0, 3])
    stopped = run([127, stop])
    for row in range(4):
        toks = free.response_ids[row].tolist()
        end = toks.index(stop) + 1 if stop in toks else len(toks)
        assert stopped.response_mask[row].sum().item() == end
        assert stopped.response_ids[row, :end].tolist() == toks[:end]
    assert stopped.response_mask[0].sum().item() <= 4
    text = decode_responses(tok, stopped.response_ids, stopped.response_mask, stop_ids=[stop])
    first = free.response_ids[0].tolist().index(stop)
    assert text[0] == tok.decode(free.response_ids[0, :first].tolist(), skip_special_tokens=True)


def test_response_budget_fits_the_models_context(chat):
    model, _ = chat["qwen2"]
    engine = EmbeddedEngine("fp32", max_len=context_length(ModelConfig(path="x"), model))
    assert engine.max_len == 512
    assert response_budget(100, 20, engine) == 100
    assert response_budget(1000, 20, engine) == 492  # cut to the context
    with pytest.raises(ValueError, match="a prompt of 512 tokens leaves no room .* 512 tokens"):
        response_budget(10, 512, engine)
    assert response_budget(1000, 20, EmbeddedEngine("fp32")) == 1000  # no limit known
    assert context_length(ModelConfig(path="x", max_length=300), model) == 300
    with pytest.raises(ValueError, match="model.max_length=4096 exceeds the model's max_position_embeddings=512"):
        context_length(ModelConfig(path="x", max_length=4096), model)
