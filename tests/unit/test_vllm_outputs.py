"""VLLMEngine's conversion of vLLM's completions into the rollout's tensors (bench.rollout.vllm_engine.completion_arrays),
on stand-ins with vLLM's FlatLogprobs layout (the real outputs go through it in tests/vllm; no vLLM needed here)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from bench.rollout.vllm_engine import completion_arrays


def completion(tokens: list[int], logprobs: list[float]) -> SimpleNamespace:
    """A CompletionOutput-like object: token ids and a FlatLogprobs-like `logprobs.logprobs` (one per position)."""
    return SimpleNamespace(token_ids=tokens, logprobs=SimpleNamespace(logprobs=logprobs))


def test_ragged_completions_are_right_padded_with_their_logprobs_in_place():
    rows = [completion([5, 6, 7], [-0.5, -1.0, -1.5]), completion([9], [-2.0]), completion([3, 4], [-0.25, -0.75])]
    tokens, logp, mask = completion_arrays(rows, pad_id=0)
    assert tokens.tolist() == [[5, 6, 7], [9, 0, 0], [3, 4, 0]]
    assert mask.tolist() == [[True, True, True], [True, False, False], [True, True, False]]
    assert logp.tolist() == [[-0.5, -1.0, -1.5], [-2.0, 0.0, 0.0], [-0.25, -0.75, 0.0]]
    assert tokens.dtype == np.int64 and logp.dtype == np.float32 and mask.dtype == bool


def test_a_logprob_count_that_is_not_one_per_token_is_an_error():
    with pytest.raises(RuntimeError, match="3 log-probs for 2 tokens.*logprobs=0, flat_logprobs=True"):
        completion_arrays([completion([1, 2], [-1.0, -2.0, -3.0])], pad_id=0)
