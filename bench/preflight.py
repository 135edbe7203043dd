"""Checks of a built run's inputs before any training: everything that would otherwise fail mid-run.

`build` (bench/train.py) loads the model and the task; what it does not touch until later steps is checked
here, so that bad input exits with code 2 and one line naming the culprit before step 0, instead of failing
at step 6 (and again on every resume):
- the task's train and test splits load and are non-empty (a lazily loaded data file is read now);
- every prompt, with BOS, plus `task.max_new_tokens` fits the model's context (`max_position_embeddings`).
"""

from __future__ import annotations

from typing import Any


def check_inputs(parts: Any) -> None:
    """Raise ValueError naming the problem; `parts` is bench.train.Parts."""
    task, tokenizer, policy = parts.task, parts.tokenizer, parts.policy
    splits = {}
    for split in ("train", "test"):
        examples = task.examples(split)
        if not examples:
            raise ValueError(f"task {task.name!r} has no {split} examples")
        splits[split] = examples
    context = getattr(getattr(policy, "config", None), "max_position_embeddings", None)
    if context:
        check_prompt_lengths(task, tokenizer, splits, int(parts.cfg.task.max_new_tokens), int(context))


def check_prompt_lengths(task: Any, tokenizer: Any, splits: dict[str, list], max_new_tokens: int, context: int) -> None:
    """Every prompt (BOS + text, as bench.models.tokenizer.encode_prompts builds it) + max_new_tokens <= context."""
    bos = 1 if tokenizer.bos_token_id is not None else 0
    budget = context - max_new_tokens
    for split, examples in splits.items():
        ids = tokenizer([task.prompt(ex) for ex in examples], add_special_tokens=False)["input_ids"]
        lengths = [bos + len(r) for r in ids]
        too_long = [i for i, n in enumerate(lengths) if n > budget]
        if too_long:
            worst = max(too_long, key=lambda i: lengths[i])
            raise ValueError(
                f"task {task.name!r}: {len(too_long)} of {len(examples)} {split} prompts do not fit the model's "
                f"context of {context} tokens with task.max_new_tokens={max_new_tokens} (the longest, {split} "
                f"example {worst}, has {lengths[worst]} prompt tokens; at most {budget} fit): shorten the prompts, "
                f"lower task.max_new_tokens or use a model with a longer context")
