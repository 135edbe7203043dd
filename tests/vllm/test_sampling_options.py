"""The vLLM engine with the sampling options of issue 10: top-p and top-k (evaluation) and several stop ids (chat
models).

top_p < 1 or top_k > 0: vLLM's processed log-probs must be those of the renormalized truncated distribution,
exactly what the embedded engine reports (bench.rollout.embedded.top_k_logprobs, top_p_logprobs), so that log mu
means the same on both engines.
"""

from __future__ import annotations

import gc

import pytest
import torch

from bench.models.logprobs import sequence_inputs
from bench.rollout.base import SamplingParams
from bench.rollout.embedded import top_k_logprobs, top_p_logprobs
from bench.rollout.vllm_engine import VLLMEngine
from tests.vllm.helpers import generate, prompts, tiny_qwen2

pytestmark = pytest.mark.vllm
TOL = 1e-4


@pytest.fixture(scope="module")
def setup():
    model = tiny_qwen2(0)
    engine = VLLMEngine("fp32", eos_id=None, pad_id=0, max_len=256)
    engine.load_weights(model)
    yield engine, model
    engine.close()
    gc.collect()


@pytest.mark.parametrize("top_p, top_k", [(0.6, 0), (1.0, 5), (0.8, 8)])
def test_truncated_logprobs_are_the_renormalized_distribution(setup, top_p, top_k):
    """top_p and/or top_k: log mu is the sampled token's log-prob in the renormalized truncated distribution (vLLM's
    processed log-probs), what the embedded engine reports; the untruncated one is off by log S (docs/arms.md §1)."""
    engine, model = setup
    ids, mask = prompts()
    r = engine.generate(ids, mask, 4, SamplingParams(12, temperature=0.8, top_p=top_p, top_k=top_k),
                        torch.Generator().manual_seed(0))
    inp, attn, pos = sequence_inputs(r)
    with torch.no_grad():
        logits = model(input_ids=inp, attention_mask=attn, position_ids=pos).logits[:, ids.shape[1] - 1:] / 0.8
    full = torch.log_softmax(logits.float(), -1)
    flat = full.reshape(-1, full.shape[-1])
    flat = top_k_logprobs(flat, top_k) if top_k else flat
    nucleus = (top_p_logprobs(flat, top_p) if top_p < 1 else flat).reshape(full.shape)
    picked = nucleus.gather(-1, r.response_ids[..., None]).squeeze(-1)[r.response_mask]
    assert torch.isfinite(picked).all()  # every sampled token is inside the nucleus
    assert (picked - r.logp_mu[r.response_mask]).abs().max() < TOL
    untruncated = full.gather(-1, r.response_ids[..., None]).squeeze(-1)[r.response_mask]
    assert (picked - untruncated).max() > 0.05  # the truncation is visible: this is not the plain distribution


def test_any_of_several_stop_ids_ends_a_row(setup):
    engine, _ = setup
    first = generate(engine, seed=3)
    a, b = int(first.response_ids[0, 2]), int(first.response_ids[1, 4])
    engine.eos_id = [a, b]
    try:
        r = generate(engine, seed=3)
    finally:
        engine.eos_id = None
    for row in range(r.batch_size):
        toks = first.response_ids[row].tolist()
        hits = [i for i, t in enumerate(toks) if t in (a, b)]
        end = hits[0] + 1 if hits else len(toks)
        assert int(r.response_mask[row].sum()) == end
        assert r.response_ids[row, :end].tolist() == toks[:end]
