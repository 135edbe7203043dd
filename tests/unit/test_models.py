"""Tokenizer, tiny model and model loading: round trips, padding conventions, offline errors."""

from __future__ import annotations

import json

import pytest
import torch

from bench.models.config import ModelConfig
from bench.tasks.arithmetic import ArithmeticTaskConfig
from bench.tasks.jsonl import JsonlTaskConfig
from bench.models.load import load_pretrained
from bench.models.tiny import build_tiny_model
from bench.models.tokenizer import (
    CHARS,
    build_char_tokenizer,
    decode_responses,
    encode_prompts,
    pad_id,
)
from bench.tasks.base import build_task
from bench.tasks.jsonl import JsonlTask


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer(model_max_length=128)


ARITH = build_task(ArithmeticTaskConfig(n_train=10, n_test=10))


def arith(*texts: str) -> list[dict]:
    """Arithmetic examples whose prompts are `texts` ("37+5=" -> a=37, op=+, b=5)."""
    out = []
    for t in texts:
        op = "+" if "+" in t else "-"
        a, b = t.rstrip("=").split(op)
        out.append({"a": int(a), "op": op, "b": int(b), "answer": 0})
    assert [ARITH.prompt(ex) for ex in out] == list(texts)
    return out


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def saved_tiny(request, tmp_path_factory, tok):
    """A tiny model saved with its tokenizer like a user's model directory."""
    d = tmp_path_factory.mktemp(request.param)
    model = build_tiny_model(ModelConfig(arch=request.param, num_layers=2), tok, seed=3)
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d, model


# ---- tokenizer ---------------------------------------------------------------------------------------


def test_char_tokenizer_layout(tok):
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert len(tok) == 4 + len(CHARS) <= 128
    assert tok.model_max_length == 128


@pytest.mark.parametrize("text", ["37+5=", "3 5 7>22:", "(3+5)*7-34", "Hi, 42!\nx  y", " lead"])
def test_char_tokenizer_round_trip(tok, text):
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text) and tok.unk_token_id not in ids
    assert tok.decode(ids) == text
    assert tok(text)["input_ids"] == [tok.bos_token_id] + ids  # template adds BOS only, never EOS


def test_unknown_characters_map_to_unk(tok):
    assert tok("é", add_special_tokens=False)["input_ids"] == [tok.unk_token_id]


def test_encode_prompts_left_pads_and_prepends_bos(tok):
    ids, mask = encode_prompts(tok, ARITH, arith("37+5=", "1+1="))
    assert ids.dtype == torch.long and mask.dtype == torch.bool and ids.shape == mask.shape == (2, 6)
    assert ids[0].tolist() == [1] + tok("37+5=", add_special_tokens=False)["input_ids"]
    assert ids[1, 0].item() == tok.pad_token_id and not mask[1, 0] and mask[1, 1:].all()
    assert ids[1, 1].item() == tok.bos_token_id


def test_decode_responses_uses_mask_and_stops_at_eos(tok):
    digits = tok("42", add_special_tokens=False)["input_ids"]
    resp = torch.tensor([digits + [2, 0], digits + [5, 5]])  # EOS then pad; no EOS (ran out of tokens)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    assert decode_responses(tok, resp, mask) == ["42", "4211"]  # id 5 is "1"
    assert decode_responses(tok, resp, torch.zeros_like(mask)) == ["", ""]


def test_helpers_work_with_a_tokenizer_without_pad_or_bos(tmp_path, tok):
    """HF base-model tokenizers often have no pad (Qwen2 has no BOS either): pad falls back to EOS."""
    from transformers import PreTrainedTokenizerFast

    bare = PreTrainedTokenizerFast(tokenizer_object=tok.backend_tokenizer, eos_token="<eos>")
    assert bare.pad_token_id is None and bare.bos_token_id is None
    assert pad_id(bare) == bare.eos_token_id
    ids, mask = encode_prompts(bare, ARITH, arith("10+2=", "1-1="))
    assert ids[1, 0].item() == bare.eos_token_id and mask.tolist() == [[True] * 5, [False] + [True] * 4]
    assert decode_responses(bare, ids, mask) == ["10+2=", "1-1="]


# ---- tiny model --------------------------------------------------------------------------------------


def test_default_tiny_model_is_about_1m_params_and_deterministic(tok):
    model = build_tiny_model(ModelConfig(), tok, seed=0)
    n = sum(p.numel() for p in model.parameters())
    assert 0.9e6 < n < 1.1e6, n
    assert type(model).__name__ == "Qwen2ForCausalLM" and model.config.tie_word_embeddings
    assert model.dtype == torch.float32
    again = build_tiny_model(ModelConfig(), tok, seed=0)
    other = build_tiny_model(ModelConfig(), tok, seed=1)
    w = model.model.embed_tokens.weight
    assert torch.equal(w, again.model.embed_tokens.weight) and not torch.equal(w, other.model.embed_tokens.weight)


def test_tiny_model_rejects_bad_arch_and_small_vocab(tok):
    with pytest.raises(ValueError, match="qwen2, llama"):
        build_tiny_model(ModelConfig(arch="gpt2"), tok)
    with pytest.raises(ValueError, match="vocab_size"):
        build_tiny_model(ModelConfig(vocab_size=64), tok)


def test_save_and_reload_offline_gives_identical_logits(saved_tiny, tok):
    d, model = saved_tiny
    loaded, loaded_tok = load_pretrained(str(d))
    assert type(loaded) is type(model) and loaded.dtype == torch.float32 and not loaded.training
    from bench.tasks.countdown import CountdownTaskConfig

    countdown = build_task(CountdownTaskConfig(n_train=10, n_test=10))  # spaces in prompts: see load._load_tokenizer
    exs = countdown.examples("test")[:3]
    ids, mask = encode_prompts(loaded_tok, countdown, exs)
    assert torch.equal(ids, encode_prompts(tok, countdown, exs)[0])
    assert loaded_tok.decode(ids[1], skip_special_tokens=True) == countdown.prompt(exs[1])
    assert " " in countdown.prompt(exs[1])
    with torch.no_grad():
        a = model.eval()(input_ids=ids, attention_mask=mask.long()).logits
        b = loaded(input_ids=ids, attention_mask=mask.long()).logits
    assert torch.equal(a, b)
    assert loaded_tok.model_max_length == 128 and loaded_tok.pad_token_id == 0


def test_missing_local_model_names_the_path(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(OSError, match="no-such-model"):
        load_pretrained(str(missing))


def test_hub_id_offline_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OSError, match="model 'qrl-bench-test/not-a-model' not found locally and the hub is offline"):
        load_pretrained("qrl-bench-test/not-a-model")


# ---- datasets-backed task (loads through datasets) -----------------------------------------------------


def test_jsonl_task_loads_local_files_through_datasets(tmp_path):
    rows = [{"question": f"{i}*2", "answer": 2 * i} for i in range(12)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:10]))
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[10:]))
    task = build_task(JsonlTaskConfig(train_file=str(tmp_path / "train.jsonl"), test_file=str(tmp_path / "test.jsonl"), n_train=4))
    assert isinstance(task, JsonlTask)
    assert [ex["question"] for ex in task.examples("test")] == ["10*2", "11*2"]
    assert len(task.examples("train")) == 4  # n_train caps the split
    assert task.fingerprint()["files_sha256"]["train"] != task.fingerprint()["files_sha256"]["test"]


def test_jsonl_task_missing_file_names_it(tmp_path):
    (tmp_path / "train.jsonl").write_text('{"question": "1+1", "answer": 2}\n')
    with pytest.raises(ValueError, match="task.test_file.*nope.jsonl.*not found"):
        build_task(JsonlTaskConfig(train_file=str(tmp_path / "train.jsonl"), test_file=str(tmp_path / "nope.jsonl")))


def test_jsonl_task_missing_field_names_the_columns(tmp_path):
    (tmp_path / "t.jsonl").write_text('{"q": "1+1", "a": 2}\n')
    task = build_task(JsonlTaskConfig(train_file=str(tmp_path / "t.jsonl"), test_file=str(tmp_path / "t.jsonl")))
    with pytest.raises(ValueError, match=r"line 1: no field 'question', 'answer' \(its fields: 'q', 'a'"):
        task.examples("test")  # a ValueError (exit 2 with one line), not a KeyError (exit 1, traceback)


def test_tiny_model_generates_from_left_padded_prompts(tok):
    """Left padding must not change a row's greedy output (positions count real tokens only), so the greedy
    accuracy of a batch (bench.evaluation) is the accuracy of its examples one by one."""
    from bench.models.tokenizer import decode_responses, encode_prompts
    from bench.rollout.base import SamplingParams
    from bench.rollout.embedded import EmbeddedEngine

    model = build_tiny_model(ModelConfig(num_layers=1), tok, seed=0).eval()
    task = build_task(ArithmeticTaskConfig(n_train=10, n_test=10))
    examples = task.examples("test")[:4]
    assert len({len(task.prompt(ex)) for ex in examples}) > 1  # rows of different lengths: some are left-padded
    engine = EmbeddedEngine("fp32", eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    engine.load_weights(model)

    def greedy(exs):
        r = engine.generate(*encode_prompts(tok, task, exs), 1, SamplingParams(max_new_tokens=4, greedy=True))
        return decode_responses(tok, r.response_ids, r.response_mask)

    assert greedy(examples) == [greedy([ex])[0] for ex in examples]
