"""Top-p (nucleus) sampling in the embedded engine: the kept set and renormalized log-probs by hand, and the sampled
tokens stay in the nucleus. That log mu is the log-prob under the truncated distribution actually sampled from, on a
real rollout with top-p, top-k or both: tests/conformance/test_truncated_sampling.py."""

from __future__ import annotations

import math

import pytest
import torch
import transformers as tr

from bench.rollout.base import SamplingParams
from bench.rollout.embedded import EmbeddedEngine, _sample, top_p_logprobs

PROBS = [0.05, 0.5, 0.15, 0.3]  # unsorted on purpose: the nucleus is found by probability, not by index


def _logp(probs) -> torch.Tensor:
    return torch.tensor([probs], dtype=torch.float64).log().float()


@pytest.mark.parametrize("top_p, kept", [
    (1e-6, {1: 1.0}),  # only the most likely token
    (0.45, {1: 1.0}),  # the first token alone reaches 0.45: the mass before token 3 (0.5) is not below it
    (0.7, {1: 0.5 / 0.8, 3: 0.3 / 0.8}),  # 0.5 < 0.7: token 3 joins; then 0.8 >= 0.7
    (0.81, {1: 0.5 / 0.95, 3: 0.3 / 0.95, 2: 0.15 / 0.95}),
    (0.99, {1: 0.5, 3: 0.3, 2: 0.15, 0: 0.05}),
])
def test_nucleus_by_hand(top_p, kept):
    out = top_p_logprobs(_logp(PROBS), top_p)[0]
    for i in range(4):
        if i in kept:
            assert math.isclose(out[i].exp().item(), kept[i], rel_tol=1e-6), (i, out[i].exp().item())
        else:
            assert out[i].item() == float("-inf")


def _uniforms(rows: int, seed: int) -> torch.Tensor:
    """One float64 uniform per row: what the engine hands the sampler at each step."""
    return torch.rand(rows, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def test_sampled_frequencies_and_logprobs_follow_the_truncated_distribution():
    logits = _logp(PROBS).repeat(20000, 1)
    tok, lp = _sample(logits, SamplingParams(1, temperature=1.0, top_p=0.7), _uniforms(20000, 0))
    assert set(tok.tolist()) == {1, 3}
    freq = (tok == 1).float().mean().item()
    assert abs(freq - 0.625) < 0.01  # binomial sd 0.0034
    assert torch.allclose(lp[tok == 1], torch.tensor(math.log(0.625)), atol=1e-6)
    assert torch.allclose(lp[tok == 3], torch.tensor(math.log(0.375)), atol=1e-6)


def test_top_p_one_is_plain_sampling():
    logits = torch.randn(64, 50, generator=torch.Generator().manual_seed(3))
    a = _sample(logits, SamplingParams(1, 0.8), _uniforms(64, 1))
    b = _sample(logits, SamplingParams(1, 0.8, top_p=1.0), _uniforms(64, 1))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_bad_top_p_is_refused():
    engine = EmbeddedEngine("fp32")
    engine.load_weights(tr.Qwen2ForCausalLM(tr.Qwen2Config(vocab_size=16, hidden_size=32, num_hidden_layers=1,
                                                          num_attention_heads=2, num_key_value_heads=1,
                                                          intermediate_size=32)).eval())
    with pytest.raises(ValueError, match=r"top_p=0.0 must be in \(0, 1\]"):
        engine.generate(torch.ones(1, 2, dtype=torch.long), torch.ones(1, 2, dtype=torch.bool), 1,
                        SamplingParams(2, 1.0, top_p=0.0))
