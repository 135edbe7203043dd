"""Teacher-forced log-probs (bench.models.logprobs) through the chunked lm_head, and the trainer's micro-batches cut
to their rows' extent (bench/compute.py): both equal the plain computation (full logits, the rollout's padded width)
to 1e-6, and the recompute pass (no grad) equals the training pass (grad) bit for bit."""

from __future__ import annotations

import pytest
import torch
import transformers as tr

from bench.compute import TrainerCompute, cut, micro_batches, row_extents
from bench.models import logprobs
from bench.models.logprobs import emulated_weights, sequence_inputs, token_logprobs
from bench.rollout.base import Rollout

B, P, T = 12, 9, 40  # rows, prompt width, response width


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return tr.Qwen2ForCausalLM(tr.Qwen2Config(
        vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, max_position_embeddings=256, tie_word_embeddings=True)).eval()


@pytest.fixture(scope="module")
def rollout() -> Rollout:
    """Left-padded prompts of 5..9 tokens; responses of 40 tokens, or 30 on every third row, or 8 on row 4."""
    g = torch.Generator().manual_seed(1)
    prompt_mask = torch.ones(B, P, dtype=torch.bool)
    for i in range(B):
        prompt_mask[i, : i % 5] = False
    prompt_ids = torch.randint(1, 128, (B, P), generator=g).masked_fill(~prompt_mask, 0)
    response_mask = torch.ones(B, T, dtype=torch.bool)
    response_mask[::3, 30:] = False
    response_mask[4, 8:] = False
    response_ids = torch.randint(1, 128, (B, T), generator=g).masked_fill(~response_mask, 0)
    return Rollout(prompt_ids, prompt_mask, response_ids, response_mask, torch.zeros(B, T))


def full_logits_logprobs(model, rollout, temperature, dtype="fp32"):
    """The computation before chunking: every position's logits at once, log_softmax, gathered (and entropy)."""
    ids, attn, pos = sequence_inputs(rollout)
    with emulated_weights(model, dtype):
        logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, P - 1:].float() / temperature
    logp_all = torch.log_softmax(logits, -1)
    return logp_all.gather(-1, rollout.response_ids[..., None]).squeeze(-1), -(logp_all.exp() * logp_all).sum(-1)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("chunk", [7, 100, 10**6])  # slices of 7 and 100 positions (uneven last), and one slice
def test_chunked_head_equals_the_full_logits(model, rollout, dtype, chunk, monkeypatch):
    monkeypatch.setattr(logprobs, "HEAD_CHUNK_TOKENS", chunk)
    with torch.no_grad():
        want, want_ent = full_logits_logprobs(model, rollout, 0.7, dtype)
        logp, ent = token_logprobs(model, rollout, 0.7, dtype, with_entropy=True)
    assert logp.shape == ent.shape == (B, T) and logp.dtype == torch.float32
    assert torch.allclose(logp, want, atol=1e-6, rtol=1e-6) and torch.allclose(ent, want_ent, atol=1e-6, rtol=1e-6)
    assert want.abs().max() > 3  # log-probs of a 128-token vocabulary: the tolerance is ~1e-7 relative


def test_chunked_head_gradient_equals_the_full_logits_gradient(model, rollout, monkeypatch):
    """Per-slice checkpointing: the same gradient as the full logits' (1e-6 of each parameter's largest entry)."""
    monkeypatch.setattr(logprobs, "HEAD_CHUNK_TOKENS", 7)
    grads = []
    for fn in (lambda: full_logits_logprobs(model, rollout, 0.7)[0], lambda: token_logprobs(model, rollout, 0.7)[0]):
        model.zero_grad(set_to_none=True)
        (fn() * rollout.response_mask).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name, g in grads[0].items():
        assert torch.allclose(grads[1][name], g, atol=1e-6 * g.abs().max().item(), rtol=0), name


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_no_grad_pass_equals_the_grad_pass(model, rollout, dtype, monkeypatch):
    """The recompute pass (no grad) gives exactly the training pass's log-probs at the same weights (grad): the
    on-policy ratio exp(log pi_theta - log pi_old) is exactly 1."""
    monkeypatch.setattr(logprobs, "HEAD_CHUNK_TOKENS", 100)
    with emulated_weights(model, dtype):
        with torch.no_grad():
            old, old_ent = token_logprobs(model, rollout, 1.0, dtype, with_entropy=True)
        theta, ent = token_logprobs(model, rollout, 1.0, dtype, with_entropy=True)
    assert theta.requires_grad and not ent.requires_grad
    assert torch.equal(old, theta.detach()) and torch.equal(old_ent, ent)


def test_the_log_probs_are_a_tensor_of_their_own(model, rollout):
    """They are the model's output, which FSDP2 hooks for its backward: a view of another tensor (the slices' cat)
    made it warn on every 2-rank step that an in-place op on it would skip the pre-backward all-gather."""
    logp, _ = token_logprobs(model, rollout)
    assert logp.requires_grad and logp._base is None


def test_a_model_that_transforms_its_logits_is_refused(rollout):
    """Logit soft-capping after the lm_head (Gemma 2) would not be in the chunked log-probs: refused, not wrong."""
    class Capped(tr.Qwen2ForCausalLM):
        def forward(self, **kw):
            out = super().forward(**kw)
            out.logits = torch.tanh(out.logits / 30) * 30
            return out

    capped = Capped(tr.Qwen2Config(vocab_size=128, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                   num_key_value_heads=1, intermediate_size=64)).eval()
    with pytest.raises(ValueError, match="transforms its lm_head output"):
        token_logprobs(capped, rollout)
    assert "forward" not in vars(capped.lm_head)  # the swap is undone


def test_row_extents_and_cut_by_hand(rollout):
    prompt, response = row_extents(rollout)
    assert prompt.tolist() == [P - i % 5 for i in range(B)]
    assert response.tolist() == [30 if i % 3 == 0 else 8 if i == 4 else 40 for i in range(B)]
    part = cut(rollout.select(torch.tensor([0, 4, 9])))  # prompts 9, 8, 5; responses 30, 8, 30
    assert part.prompt_ids.shape == (3, 9) and part.response_ids.shape == (3, 30)
    part = cut(rollout.select(torch.tensor([3, 4])))  # prompts 6, 5; responses 30, 8
    assert part.prompt_ids.shape == (2, 6) and part.response_ids.shape == (2, 30)
    assert torch.equal(part.prompt_ids, rollout.prompt_ids[[3, 4], 3:])  # only left padding is dropped


def test_micro_batches_by_hand():
    """Minibatches of the update, rows sorted by length, capped by rows and by tokens (rows x cut length)."""
    prompt = torch.tensor([5, 5, 5, 5, 5, 5])
    response = torch.tensor([10, 40, 20, 30, 40, 1])  # lengths 15, 45, 25, 35, 45, 6
    flat = lambda plan: [[r.tolist() for r in parts] for parts in plan]  # noqa: E731
    assert flat(micro_batches(prompt, response, 1, None, None)) == [[[1, 4, 3, 2, 0, 5]]]
    assert flat(micro_batches(prompt, response, 1, 2, None)) == [[[1, 4]], [[3, 2]], [[0, 5]]]
    assert flat(micro_batches(prompt, response, 2, None, None)) == [[[1, 2, 0]], [[4, 3, 5]]]  # minibatches kept
    # tokens: 2 x 44 = 88 <= 90; 3 rows at 44 would be 132; then 34 + 24 + 14 (x 3 = 102 > 90 -> 2 rows)
    assert flat(micro_batches(prompt, response, 1, None, 90)) == [[[1, 4]], [[3, 2]], [[0, 5]]]
    assert flat(micro_batches(prompt, response, 1, None, 1)) == [[[i]] for i in [1, 4, 3, 2, 0, 5]]  # >= 1 row
    # several ranks: contiguous parts of the sorted rows, each rank's part capped; with the rows cap dividing the
    # minibatch, the parts are one process's micro-batches
    assert flat(micro_batches(prompt, response, 1, 1, None, world=2)) == [[[1], [4]], [[3], [2]], [[0], [5]]]
    assert flat(micro_batches(prompt, response, 1, 2, None, world=3)) == [[[1, 4], [3, 2], [0, 5]]]
    assert flat(micro_batches(prompt, response, 1, None, None, world=4)) == [[[1, 4], [3, 2], [0, 5], []]]


@pytest.mark.parametrize("micro, tokens", [(None, None), (5, 100), (2, None), (None, 60)])
def test_cut_micro_batches_equal_the_uncut_pass(model, rollout, micro, tokens):
    """The trainer's no-grad pass (bench/compute.py) with micro-batches cut to their rows: every row's log-prob and
    entropy as at the padded width (1e-6), with fewer tokens processed (train/pad_fraction)."""
    shapes = []
    hook = model.register_forward_hook(lambda m, a, kw, out: shapes.append(tuple(kw["input_ids"].shape)),
                                       with_kwargs=True)
    try:
        fast = TrainerCompute(torch.device("cpu"), "bf16", 0.7, micro, micro_batch_tokens=tokens)
        logp, ent = fast.logprobs(model, rollout, with_entropy=True)
    finally:
        hook.remove()
    slow = TrainerCompute(torch.device("cpu"), "bf16", 0.7, micro, micro_batch_tokens=tokens, cut=False)
    want, want_ent = slow.logprobs(model, rollout, with_entropy=True)
    mask = rollout.response_mask
    assert torch.allclose(logp[mask], want[mask], atol=1e-6, rtol=1e-6)
    assert torch.allclose(ent[mask], want_ent[mask], atol=1e-6, rtol=1e-6)
    assert all(rows * width <= (tokens or 10**9) or rows == 1 for rows, width in shapes)
    assert max(width for _, width in shapes) == P + T - 1  # the micro-batch of the longest rows
    if micro is None and tokens is None:  # one micro-batch: the whole batch's extent
        assert fast.metrics() == slow.metrics()
    else:
        assert min(width for _, width in shapes) < P + T - 1
        assert fast.metrics()["pad_fraction"] < slow.metrics()["pad_fraction"]
