"""Top-k and top-p sampling: log mu must come from the renormalized truncated distribution the token was drawn from.

The trainer's log pi is never truncated, so for a kept token rho = pi/mu = p / (p / S) = S, the kept mass, exactly:
taking mu's log-probs from the untruncated distribution instead (vLLM's default raw_logprobs, TRL #6789) gives
rho = 1, off by exactly log S, and hides the truncation from every correction. The embedded engine returns the
processed (truncated, renormalized) log-probs; the vLLM engine asks vLLM for `processed_logprobs` (tests/vllm/
test_sampling_options.py checks both truncations there)."""

from __future__ import annotations

import math

import pytest
import torch
import transformers as tr

from bench.models.logprobs import token_logprobs
from bench.rollout.base import SamplingParams
from bench.rollout.embedded import EmbeddedEngine, _sample, top_k_logprobs, top_p_logprobs

PROBS = [0.5, 0.3, 0.15, 0.05]


def logp_row() -> torch.Tensor:
    return torch.log(torch.tensor([PROBS], dtype=torch.float32))


@pytest.mark.parametrize("top_k, top_p, kept_mass", [
    (2, 1.0, 0.8),    # the two most likely tokens
    (0, 0.7, 0.8),    # nucleus: mass before each token [0, 0.5, 0.8, 0.95] < 0.7 keeps two
    (0, 0.9, 0.95),   # ... < 0.9 keeps three
    (3, 0.7, 0.8),    # top-3 renormalized to [0.526, 0.316, 0.158], then its nucleus at 0.7: two
    (4, 1.0, 1.0),    # k = V keeps everything
])
def test_kept_tokens_carry_log_p_minus_log_s(top_k, top_p, kept_mass):
    logits = logp_row().repeat(4000, 1)  # T = 1: logits = log p
    uniforms = torch.rand(4000, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    tok, lp = _sample(logits, SamplingParams(1, 1.0, top_p=top_p, top_k=top_k), uniforms)
    kept = torch.tensor([int(sum(PROBS[:i + 1]) <= kept_mass + 1e-9) for i in range(4)], dtype=torch.bool)
    assert kept[tok].all()  # never a truncated token
    p_tok = torch.tensor(PROBS)[tok]
    torch.testing.assert_close(lp, torch.log(p_tok) - math.log(kept_mass), atol=1e-6, rtol=0)
    # rho = pi / mu with the trainer's untruncated pi: exactly the kept mass S for every token
    rho = torch.exp(torch.log(p_tok) - lp)
    torch.testing.assert_close(rho, torch.full_like(rho, kept_mass), atol=1e-6, rtol=0)
    # the uncorrected form (mu's untruncated log-prob) gives rho = 1: off by exactly log S
    assert torch.log(p_tok / p_tok).abs().max() == 0 and abs(math.log(kept_mass) - (lp - torch.log(p_tok)).mean()
                                                            * -1) < 1e-6
    # and the frequencies are the renormalized distribution's
    freq = torch.bincount(tok, minlength=4).double() / tok.numel()
    torch.testing.assert_close(freq[kept], torch.tensor(PROBS, dtype=torch.float64)[kept] / kept_mass, atol=0.03, rtol=0)


def test_top_k_logprobs_by_hand():
    out = top_k_logprobs(logp_row(), 2)[0]
    torch.testing.assert_close(out[:2].exp(), torch.tensor([0.625, 0.375]), atol=1e-6, rtol=0)
    assert torch.isinf(out[2:]).all()
    both = top_p_logprobs(top_k_logprobs(logp_row(), 3), 0.7)[0]  # the engine's order: top-k, then top-p
    torch.testing.assert_close(both[:2].exp(), torch.tensor([0.625, 0.375]), atol=1e-6, rtol=0)


@pytest.mark.parametrize("top_k, top_p", [(0, 0.6), (5, 1.0), (8, 0.7)])
def test_engine_log_mu_is_the_truncated_teacher_forced_logprob(top_k, top_p):
    """Rollout on a random Qwen2 at T=0.8 with top-p, top-k or both: every token is inside the truncated support of
    the teacher-forced distribution at its position, log mu is that distribution's renormalized log-prob, and
    log mu - log pi_T = -log S_t with S_t the mass the truncation kept at that position."""
    torch.manual_seed(0)
    model = tr.Qwen2ForCausalLM(tr.Qwen2Config(
        vocab_size=64, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, initializer_range=0.2, max_position_embeddings=128)).eval()
    engine = EmbeddedEngine("fp32")
    engine.load_weights(model)
    ids = torch.randint(1, 64, (3, 6), generator=torch.Generator().manual_seed(1))
    r = engine.generate(ids, torch.ones(3, 6, dtype=torch.bool), 4, SamplingParams(10, 0.8, top_p=top_p, top_k=top_k),
                        torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits = model(input_ids=torch.cat([r.prompt_ids, r.response_ids], 1)[:, :-1]).logits[:, 5:] / 0.8
    full = torch.log_softmax(logits.float(), -1).reshape(-1, 64)
    truncated = top_k_logprobs(full, top_k) if top_k else full
    truncated = top_p_logprobs(truncated, top_p) if top_p < 1 else truncated
    tok = r.response_ids.reshape(-1, 1)
    picked = truncated.gather(-1, tok).reshape(r.response_ids.shape)
    assert torch.isfinite(picked).all()
    torch.testing.assert_close(r.logp_mu, picked, atol=1e-4, rtol=0)
    kept_mass = (full.exp() * torch.isfinite(truncated)).sum(-1).reshape(r.response_ids.shape)
    untruncated = token_logprobs(model, r, 0.8)[0].detach()
    torch.testing.assert_close(r.logp_mu - untruncated, -torch.log(kept_mass), atol=1e-4, rtol=0)
    assert (kept_mass < 0.999).float().mean() > 0.5  # the truncation bit at most positions


def test_bad_top_k_is_refused():
    engine = EmbeddedEngine("fp32")
    engine.load_weights(tr.Qwen2ForCausalLM(tr.Qwen2Config(vocab_size=16, hidden_size=32, num_hidden_layers=1,
                                                          num_attention_heads=2, num_key_value_heads=1,
                                                          intermediate_size=32)).eval())
    with pytest.raises(ValueError, match=r"top_k=-1 must be >= 0"):
        engine.generate(torch.ones(1, 2, dtype=torch.long), torch.ones(1, 2, dtype=torch.bool), 1,
                        SamplingParams(2, 1.0, top_k=-1))
