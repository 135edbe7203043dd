"""Teacher-forced log-probs (bench.models.logprobs): micro-batched passes are bit-identical to one pass, with or
without autograd."""

from __future__ import annotations

import pytest
import torch
import transformers as tr

from bench.models.logprobs import rows_per_chunk, token_logprobs
from bench.rollout.base import Rollout

B, P, T = 12, 9, 40  # rows, prompt width, response length: 48 tokens per row in the pass


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return tr.Qwen2ForCausalLM(tr.Qwen2Config(
        vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, max_position_embeddings=256, tie_word_embeddings=True)).eval()


@pytest.fixture(scope="module")
def rollout() -> Rollout:
    """Left-padded prompts of 5..9 tokens, responses with a masked tail on some rows."""
    g = torch.Generator().manual_seed(1)
    prompt_mask = torch.ones(B, P, dtype=torch.bool)
    for i in range(B):
        prompt_mask[i, : i % 5] = False
    prompt_ids = torch.randint(1, 128, (B, P), generator=g).masked_fill(~prompt_mask, 0)
    response_mask = torch.ones(B, T, dtype=torch.bool)
    response_mask[::3, 30:] = False
    response_ids = torch.randint(1, 128, (B, T), generator=g).masked_fill(~response_mask, 0)
    return Rollout(prompt_ids, prompt_mask, response_ids, response_mask, torch.zeros(B, T))


def test_rows_per_chunk_by_hand(rollout):
    assert rows_per_chunk(rollout, None) == B
    assert rows_per_chunk(rollout, 1) == 1  # at least one row, however small the budget
    assert rows_per_chunk(rollout, 100) == 2  # 100 // 48
    assert rows_per_chunk(rollout, 48 * 5 + 47) == 5
    assert rows_per_chunk(rollout, 10**6) == 10**6 // 48
    with pytest.raises(ValueError, match="micro_batch_tokens=0 must be positive"):
        rows_per_chunk(rollout, 0)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("budget", [1, 100, 48 * 5, 48 * 12])  # 1 row, 2 rows, 5 rows (uneven last chunk), all
def test_chunked_pass_is_bit_identical(model, rollout, dtype, budget):
    with torch.no_grad():
        full, full_ent = token_logprobs(model, rollout, 0.7, dtype, with_entropy=True)
        chunked, chunked_ent = token_logprobs(model, rollout, 0.7, dtype, with_entropy=True, micro_batch_tokens=budget)
    assert chunked.shape == (B, T) and chunked.dtype == torch.float32
    assert torch.equal(full, chunked) and torch.equal(full_ent, chunked_ent)


def test_logprobs_are_the_full_forwards_response_positions(model, rollout):
    """log_softmax(logits / 0.7) of the full forward at the response positions, gathered at the response tokens."""
    ids = torch.cat([rollout.prompt_ids, rollout.response_ids], 1)[:, :-1]
    attn = torch.cat([rollout.prompt_mask, torch.ones_like(rollout.response_mask)], 1)[:, :-1]
    pos = (attn.long().cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logp, _ = token_logprobs(model, rollout, 0.7, micro_batch_tokens=100)
        full = model(input_ids=ids, attention_mask=attn.long(), position_ids=pos).logits[:, P - 1:] / 0.7
    want = torch.log_softmax(full, -1).gather(-1, rollout.response_ids[..., None]).squeeze(-1)
    assert torch.allclose(logp, want, atol=1e-6, rtol=0)


def test_no_grad_chunks_equal_the_grad_pass(model, rollout):
    """The recompute pass (no grad, chunked) gives exactly the training pass's log-probs at the same weights
    (grad, one chunk): the on-policy ratio exp(log pi_theta - log pi_old) is exactly 1 at the first minibatch."""
    with torch.no_grad():
        old, _ = token_logprobs(model, rollout, 1.0, "bf16", micro_batch_tokens=100)
    theta, _ = token_logprobs(model, rollout, 1.0, "bf16", with_entropy=True)
    assert theta.requires_grad and torch.equal(old, theta.detach())


def test_chunked_pass_keeps_gradients(model, rollout):
    """With grad enabled the chunks' graphs join: the same loss gives the same gradient as one pass, up to
    the order of the sum over rows."""
    grads = []
    for budget in (None, 100):
        model.zero_grad(set_to_none=True)
        logp, _ = token_logprobs(model, rollout, 1.0, micro_batch_tokens=budget)
        (logp * rollout.response_mask).sum().backward()
        grads.append(model.model.embed_tokens.weight.grad.clone())
    # the weight gradient sums over rows in another order (measured: 4e-6 of entries up to 13)
    assert torch.allclose(grads[0], grads[1], atol=2e-5, rtol=0)


def test_trainer_compute_cuts_each_micro_batch_by_tokens(model, rollout):
    """The trainer's no-grad passes (bench/compute.py): rows in train.micro_batch_size micro-batches, each cut to
    train.micro_batch_tokens per forward; the log-probs are those of one whole-batch pass, bit for bit."""
    from bench.compute import TrainerCompute

    rows = []
    hook = model.register_forward_hook(lambda m, args, kwargs, out: rows.append(kwargs["input_ids"].shape[0]),
                                       with_kwargs=True)
    try:
        cut = TrainerCompute(torch.device("cpu"), "bf16", 0.7, micro_batch_size=5, micro_batch_tokens=100)
        logp, _ = cut.logprobs(model, rollout)
    finally:
        hook.remove()
    assert rows == [2, 2, 1, 2, 2, 1, 2]  # micro-batches of 5, 5, 2 rows; 100 // 48 = 2 rows per forward
    whole, _ = TrainerCompute(torch.device("cpu"), "bf16", 0.7).logprobs(model, rollout)
    assert torch.equal(logp, whole)
