"""Evaluation (bench/evaluation.py): greedy / avg@k / pass@k metrics by hand, the eval config's checks, eval sets
as registered tasks, and an end-to-end evaluation whose answers are known in advance.

The end-to-end model is a real Qwen2 through the real engine whose weights make its output known: every layer's
output projections are zero (the residual stream stays the input token's embedding), embeddings are one-hot
and the untied lm_head maps the last token to the next: after "=" the tokens "7" and "8" have equal logits
(+20, all others 0), after anything else <eos> does. So a greedy completion of "q=" is "7" (argmax takes the
lower id of a tie) and a sampled one is "7" or "8" with probability 1/2 each (up to 1e-6).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import transformers as tr

from bench.domains import check_schema
from bench.eval_config import EvalConfig, set_config
from bench.evaluation import build_eval_sets, evaluate_policy, evaluate_set, greedy_eval, pass_ks, set_metrics
from bench.models.tokenizer import PromptFormat, build_char_tokenizer
from bench.rollout.embedded import EmbeddedEngine
from bench.tasks.base import build_task
from bench.tasks.jsonl import JsonlTaskConfig

AIME24 = str(Path(__file__).parents[1] / "fixtures" / "data" / "aime24")  # a local copy: the check wants one that exists


# ---- metrics by hand -------------------------------------------------------------------------------------

# 3 problems x 4 samples; 0.1 = format credit (wrong answer): counts as reward, never as correct
REWARDS = torch.tensor([[1.0, 0.1, 0.0, 1.0], [0.0, 0.0, 0.1, 0.0], [1.0, 1.0, 1.0, 1.0]])
LENGTHS = torch.tensor([[2.0, 4.0, 6.0, 8.0], [1.0, 1.0, 1.0, 1.0], [3.0, 3.0, 3.0, 3.0]])


def test_pass_at_k_metrics_by_hand():
    m = set_metrics(REWARDS, LENGTHS, EvalConfig(mode="pass@k", k=2, n=4))
    assert set(m) == {"pass@1", "pass@2", "reward_mean", "response_length"}
    assert math.isclose(m["pass@1"], (2 / 4 + 0 + 1) / 3)
    # problem 1: 1 - C(2, 2) / C(4, 2) = 5/6; problem 2: 0; problem 3: 1
    assert math.isclose(m["pass@2"], (5 / 6 + 0 + 1) / 3)
    assert math.isclose(m["reward_mean"], (2.1 + 0.1 + 4) / 12, rel_tol=1e-6)  # fp32 mean
    assert math.isclose(m["response_length"], (20 + 4 + 12) / 12)


def test_avg_at_k_and_greedy_metrics_by_hand():
    m = set_metrics(REWARDS, LENGTHS, EvalConfig(mode="avg@k", k=4))
    assert set(m) == {"avg@4", "reward_mean", "response_length"}
    assert math.isclose(m["avg@4"], (0.5 + 0 + 1) / 3)
    g = set_metrics(REWARDS[:, :1], LENGTHS[:, :1], EvalConfig())
    assert g == pytest.approx({"accuracy": 2 / 3, "reward_mean": 2 / 3, "response_length": 2.0}, rel=1e-6)  # fp32


def test_reported_pass_ks():
    assert pass_ks(1) == [1] and pass_ks(2) == [1, 2] and pass_ks(6) == [1, 2, 4, 6]
    assert pass_ks(16) == [1, 2, 4, 8, 16]


def test_samples_per_problem():
    assert EvalConfig().samples == 1 and EvalConfig(mode="greedy", k=8).samples == 1
    assert EvalConfig(mode="avg@k", k=32).samples == 32
    assert EvalConfig(mode="pass@k", k=4).samples == 4 and EvalConfig(mode="pass@k", k=4, n=16).samples == 16


# ---- config checks -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, message", [
    (dict(mode="pass@5"), r"eval.mode='pass@5' is not valid; choose one of: greedy, avg@k, pass@k"),
    (dict(mode="pass@k", k=8, n=4), r"eval.n=4 must be >= eval.k=8"),
    (dict(k=0), r"eval.k=0 is out of range; allowed: \[1, inf\)"),
    (dict(top_p=0.0), r"eval.top_p=0 is out of range; allowed: \(0, 1\]"),
    (dict(top_p=1.5), r"eval.top_p=1.5 is out of range; allowed: \(0, 1\]"),
    (dict(temperature=0.0), r"eval.temperature=0 is out of range; allowed: \(0, 10\]"),
    (dict(temperature=float("inf")), r"eval.temperature=inf is out of range; allowed: \(0, 10\]"),
    (dict(sets=["aime2024"]), r"eval.sets: 'aime2024' not a registered task; choose from: .*aime24"),
    (dict(sets=["aime24", "aime24"]), r"names a set twice"),
    (dict(sets=["aime24"], overrides={"amc23": {"max_test": 3}}), r"eval.overrides has 'amc23', which eval.sets"),
    (dict(sets=["aime24"], overrides={"aime24": {"max_tests": 3}}), r"eval.overrides.aime24: unknown key\(s\) max_tests"),
    (dict(sets=["aime24"], overrides={"aime24": {"max_test": 0}}), r"task.max_test=0 is out of range; allowed: \[1, inf\)"),
])
def test_bad_eval_config_names_the_key(kwargs, message):
    with pytest.raises(ValueError, match=message):
        check_schema(EvalConfig(**kwargs), "eval")


def test_good_eval_config_passes():
    EvalConfig(mode="pass@k", k=4, n=16, temperature=0.6, top_p=0.95, sets=["aime24", "amc23", "math500"],
               overrides={"aime24": {"source": AIME24}}).check()


def test_an_eval_set_whose_local_copy_is_missing_is_refused_by_the_check_naming_the_set(tmp_path):
    with pytest.raises(ValueError, match=f"eval set 'aime24': task.source '{tmp_path}/none': no such file or folder"):
        EvalConfig(sets=["aime24"], overrides={"aime24": {"source": str(tmp_path / "none")}}).check()


def test_eval_config_from_the_command_line(tmp_path):
    """`eval.*` is part of the root config: '@' parses in an override value, and validate runs its checks."""
    from bench.launch.config import validate
    from tests.helpers import make_cfg

    cfg = make_cfg(tmp_path, "eval.mode=pass@k", "eval.k=4", "eval.n=8", "eval.sets=[aime24,amc23]",
                   f"+eval.overrides.aime24.source={AIME24}")
    validate(cfg)
    assert (cfg.eval.mode, list(cfg.eval.sets), cfg.eval.overrides.aime24.source) == ("pass@k", ["aime24", "amc23"],
                                                                                      AIME24)
    with pytest.raises(ValueError, match="eval.n=2 must be >= eval.k=4"):
        validate(make_cfg(tmp_path, "eval.mode=pass@k", "eval.k=4", "eval.n=2"))


def test_set_config_is_the_task_schema_with_overrides():
    cfg = set_config("math500", {"max_test": 7})
    assert (cfg.name, cfg.source, cfg.max_test, cfg.test_split) == ("math500", "HuggingFaceH4/MATH-500", 7, "test")


# ---- end to end -----------------------------------------------------------------------------------------


def known_model(tok) -> torch.nn.Module:
    """See the module docstring: '=' -> '7' or '8' (tie), anything else -> <eos>."""
    V = H = 128
    model = tr.Qwen2ForCausalLM(tr.Qwen2Config(vocab_size=V, hidden_size=H, num_hidden_layers=1, num_attention_heads=4,
                                               num_key_value_heads=2, intermediate_size=64, tie_word_embeddings=False,
                                               max_position_embeddings=64)).eval()
    ids = tok.convert_tokens_to_ids
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.copy_(torch.eye(V))
        head = torch.zeros(V, H)
        scale = 20.0 / math.sqrt(H)  # the final RMSNorm scales a one-hot vector by sqrt(H)
        head[ids("<eos>"), :] = scale
        head[ids("<eos>"), ids("=")] = 0.0
        head[ids("7"), ids("=")] = head[ids("8"), ids("=")] = scale
        model.lm_head.weight.copy_(head)
    return model


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tok = build_char_tokenizer()
    d = tmp_path_factory.mktemp("qa")
    rows = [{"question": "a", "answer": 7}, {"question": "b", "answer": 8}, {"question": "c", "answer": 9}]
    for split in ("train", "test"):
        (d / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    files = {"train_file": str(d / "train.jsonl"), "test_file": str(d / "test.jsonl")}
    task = build_task(JsonlTaskConfig(**files, max_new_tokens=4))
    engine = EmbeddedEngine("fp32", eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    model = known_model(tok)
    engine.load_weights(model)
    return tok, task, engine, model, files


def test_greedy_eval_of_the_known_model(setup):
    tok, task, engine, model, _ = setup
    m = greedy_eval(engine, model, tok, task, task.examples("test"))
    assert m == pytest.approx({"eval/accuracy": 1 / 3, "eval/reward_mean": 1 / 3, "eval/response_length": 2.0},
                              rel=1e-6)  # "7" + <eos>; fp32 means
    assert greedy_eval(engine, model, tok, task, task.examples("test"), batch_size=1) == m


def test_pass_at_k_of_the_known_model(setup):
    tok, task, engine, _, _ = setup
    cfg = EvalConfig(mode="pass@k", k=16, n=16, sets=["jsonl"], batch_size=16)  # one problem per generate call
    rng = torch.get_rng_state()
    m = evaluate_set(engine, tok, "jsonl", task, cfg, PromptFormat(), seed=0, step=3)
    assert torch.equal(rng, torch.get_rng_state())  # its own generator: the global stream is untouched
    assert set(m) == {f"eval/jsonl/pass@{j}" for j in (1, 2, 4, 8, 16)} | {"eval/jsonl/reward_mean",
                                                                            "eval/jsonl/response_length"}
    assert m["eval/jsonl/pass@16"] == pytest.approx(2 / 3)  # a and b are each answered right in some of 16 samples, c never
    assert 0.15 < m["eval/jsonl/pass@1"] < 0.5
    assert math.isclose(m["eval/jsonl/pass@1"], m["eval/jsonl/reward_mean"], rel_tol=1e-6)  # fp32 mean
    values = [m[f"eval/jsonl/pass@{j}"] for j in (1, 2, 4, 8, 16)]
    assert values == sorted(values)
    assert m["eval/jsonl/response_length"] == 2.0
    assert evaluate_set(engine, tok, "jsonl", task, cfg, PromptFormat(), seed=0, step=3) == m  # seeded by step


def test_avg_at_k_with_top_p_is_deterministic_when_the_nucleus_is_one_token(setup):
    """top_p = 0.4 keeps one of the two tied answers: every sample of a problem is the same."""
    tok, task, engine, _, _ = setup
    cfg = EvalConfig(mode="avg@k", k=8, top_p=0.4, sets=["jsonl"])
    m = evaluate_set(engine, tok, "jsonl", task, cfg, PromptFormat(), seed=0, step=0)
    assert m["eval/jsonl/avg@8"] == pytest.approx(1 / 3, rel=1e-6)  # '7' or '8' every time: one of a, b right, c wrong


def test_evaluate_policy_logs_the_training_task_and_each_set(setup):
    tok, task, engine, model, files = setup
    cfg = EvalConfig(mode="avg@k", k=4, sets=["jsonl", "arithmetic"], overrides={"arithmetic": {"n_test": 5}})
    sets = build_eval_sets(cfg, task)
    assert sets["jsonl"] is task and sets["arithmetic"].cfg.n_test == 5
    out = evaluate_policy(engine, model, tok, task, sets, cfg, PromptFormat(), seed=0, step=0)
    assert engine.decoder is None  # its fp32 policy copy is released for the training step (rebuilt at the next eval)
    engine.load_weights(model)
    assert out["eval/accuracy"] == pytest.approx(1 / 3, rel=1e-6)  # the training task: greedy, as before
    assert {"eval/jsonl/avg@4", "eval/arithmetic/avg@4"} <= set(out)
    answerable = sum(ex["answer"] in (7, 8) for ex in sets["arithmetic"].examples("test"))
    assert out["eval/arithmetic/avg@4"] <= answerable / 5  # the model only ever answers 7 or 8
    other = build_eval_sets(EvalConfig(sets=["jsonl"], overrides={"jsonl": {**files, "n_test": 2}}), task)
    assert other["jsonl"] is not task and len(other["jsonl"].examples("test")) == 2


class OnDevice:
    """The real engine, reporting that it samples on `device` (a GPU cannot be had here; issue H1)."""

    def __init__(self, engine, device):
        self.engine, self.sampling_device, self.max_len, self.seen = engine, torch.device(device), None, []

    def generate(self, *args):
        self.seen.append(args[-1])
        return self.engine.generate(*args)


def test_sampled_eval_makes_its_generator_on_the_engines_device(setup, monkeypatch):
    """A CPU generator handed to an engine on a GPU stopped every avg@k / pass@k run at step 0 (H1)."""
    import bench.evaluation as ev

    tok, task, engine, _, _ = setup
    made = []

    def make_generator(device, seed):  # a generator on `meta` cannot be built: record the device asked for
        made.append(torch.device(device))
        return torch.Generator().manual_seed(seed)

    monkeypatch.setattr(ev, "make_generator", make_generator)
    stub = OnDevice(engine, "meta")
    evaluate_set(stub, tok, "jsonl", task, EvalConfig(mode="avg@k", k=2, sets=["jsonl"]), PromptFormat(), 0, 0)
    assert made == [torch.device("meta")]
    assert stub.seen and all(g is not None and g.device.type == "cpu" for g in stub.seen)
    assert engine.sampling_device == torch.device("cpu")  # the embedded engine's: its weights' device
