"""Greedy evaluation: the one definition of a policy's accuracy, used by the trainer's periodic evaluation and
by the warm start's stopping rule.

The policy is copied into an fp32 engine (the trainer's policy itself, not its quantized rollout copy) and
decoded greedily; accuracy is the fraction of completions with reward >= 1 (a correct answer), reward_mean the
mean reward (they differ only when a task gives partial or format credit).
"""

from __future__ import annotations

from typing import Any

import torch

from bench.models.tokenizer import decode_responses, encode_prompts
from bench.rollout.base import RolloutEngine, SamplingParams
from bench.tasks.base import Example, Task


@torch.no_grad()
def greedy_eval(
    engine: RolloutEngine, model: torch.nn.Module, tokenizer: Any, task: Task, examples: list[Example],
    max_new_tokens: int | None = None,
) -> dict[str, float]:
    """{eval/accuracy, eval/reward_mean, eval/response_length} of greedy completions on `examples`."""
    if not examples:
        raise ValueError(f"task {task.name!r}: no examples to evaluate on")
    engine.load_weights(model)
    prompt_ids, prompt_mask = encode_prompts(tokenizer, [task.prompt(e) for e in examples])
    sampling = SamplingParams(max_new_tokens or task.max_new_tokens, greedy=True)
    rollout = engine.generate(prompt_ids, prompt_mask, 1, sampling)
    completions = decode_responses(tokenizer, rollout.response_ids, rollout.response_mask)
    rewards = torch.tensor([task.reward(ex, c) for ex, c in zip(examples, completions)])
    return {"eval/accuracy": (rewards >= 1.0).float().mean().item(),
            "eval/reward_mean": rewards.mean().item(),
            "eval/response_length": rollout.response_mask.sum(1).float().mean().item()}
