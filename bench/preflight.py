"""Checks of a run's inputs before any work: everything that would otherwise fail mid-run, or in the warm start.

Two stages, both before the run directory is touched, so that bad input exits with code 2 and one line naming
the culprit instead of failing at step 0 or 6 (and again on every resume):

* `check_data`, called by `build` (bench/train.py) after the tasks are made and before the model is loaded:
  the built-in model's warm start trains on the task's data, so the warm start must not be its first reader
  (an 801-character prompt cost 324 s of SFT before being refused; a 5 MB line made it allocate 42 GB).
  - the task's train and test splits and every `eval.sets` test split load (a lazily loaded file or hub
    dataset is read now: a missing, empty, non-UTF-8 or column-less file, or a hub id offline) and are
    non-empty;
  - for the built-in model, whose character tokenizer and context are known from the config: every prompt fits.
* `check_inputs`, after `build`, for a loaded model (its tokenizer, chat template and context come with it):
  every prompt fits.

"Fits": a training-task prompt (BOS or chat template included) plus `task.max_new_tokens` is within the model's
context (`model.max_length`, else `max_position_embeddings`); an eval-set prompt leaves room for at least one
response token (the engine cuts each set's response budget to the room left, bench.rollout.base.response_budget).
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from bench.models.tokenizer import PromptFormat, prompt_text
from bench.tasks.base import Task

#: a prompt is tokenized in full only up to this many characters per token of its budget: beyond, a prefix that
#: already exceeds the budget proves it too long without tokenizing megabytes (a 5 MB line: ~30 s)
CHARS_PER_TOKEN_CAP = 32


def check_data(cfg: Any, task: Any, eval_sets: dict[str, Any]) -> None:
    """Load every split the run reads and, for the built-in model, check the prompts' lengths; ValueError or
    OSError (a hub dataset offline) naming the problem."""
    splits = load_splits(task, eval_sets)
    if cfg.model.path is None:  # the built-in model: its tokenizer is the character tokenizer of its warm start
        from bench.models.tokenizer import build_char_tokenizer

        tokenizer = build_char_tokenizer(int(cfg.model.max_position_embeddings))
        context = int(cfg.model.max_length or cfg.model.max_position_embeddings)
        check_all_prompts(task, eval_sets, splits, tokenizer, PromptFormat(), int(cfg.task.max_new_tokens), context)


def load_splits(task: Any, eval_sets: dict[str, Any]) -> dict[tuple[str, str], list]:
    """{(set name, split): examples}: the task's train and test splits and each eval set's test split."""
    splits = {}
    for split in ("train", "test"):
        examples = task.examples(split)
        if not examples:
            raise ValueError(f"task {task.name!r} has no {split} examples")
        splits[(task.name, split)] = examples
    for name, set_task in eval_sets.items():
        try:
            examples = set_task.examples("test")
        except (ValueError, OSError) as e:  # name the set: the message of its task says task.source
            raise type(e)(f"eval set {name!r}: {e} (an eval set's source is +eval.overrides.{name}.source=...)") from None
        if not examples:
            raise ValueError(f"eval.sets: {name!r} has no test examples (its test split is empty)")
        splits[(f"eval set {name}", "test")] = examples
    return splits


def check_inputs(cfg: DictConfig, task: Task, eval_sets: dict[str, Task], policy: PreTrainedModel,
                 tokenizer: PreTrainedTokenizerBase, fmt: PromptFormat) -> None:
    """After `build` (bench.train.Parts holds every argument): the prompts' lengths for a loaded model (the
    built-in one was checked by `check_data`)."""
    if cfg.model.path is None:
        return
    context = getattr(getattr(policy, "config", None), "max_position_embeddings", None)
    if cfg.model.get("max_length"):
        context = int(cfg.model.max_length)
    if context:
        splits = load_splits(task, eval_sets)  # cached on the tasks: no second read
        check_all_prompts(task, eval_sets, splits, tokenizer, fmt, int(cfg.task.max_new_tokens), int(context))


def check_all_prompts(task: Any, eval_sets: dict[str, Any], splits: dict[tuple[str, str], list], tokenizer: Any,
                      fmt: PromptFormat, max_new_tokens: int, context: int) -> None:
    """Every training-task prompt leaves `max_new_tokens` of the context, every eval-set prompt one token."""
    for (name, split), examples in splits.items():
        if name == task.name:
            check_prompt_lengths(task, tokenizer, examples, split, context, max_new_tokens, fmt)
        else:
            check_prompt_lengths(eval_sets[name.removeprefix("eval set ")], tokenizer, examples, split, context,
                                 None, fmt, label=name)


def prompt_length(tokenizer: Any, task: Any, ex: dict, fmt: PromptFormat, budget: int) -> tuple[int, bool]:
    """(prompt tokens, exact): BOS or chat template included. A prompt of more than CHARS_PER_TOKEN_CAP
    characters per token of `budget` is tokenized only as far as that cap; (its prefix's tokens, False) when
    the prefix alone exceeds the budget."""
    text, templated = prompt_text(tokenizer, task, ex, fmt)
    bos = 0 if templated or tokenizer.bos_token_id is None else 1
    cap = CHARS_PER_TOKEN_CAP * (max(budget, 0) + 1)
    if len(text) > cap:
        n = bos + len(tokenizer(text[:cap], add_special_tokens=False, verbose=False)["input_ids"])
        if n > budget:
            return n, False
    return bos + len(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]), True


def check_prompt_lengths(task: Any, tokenizer: Any, examples: list, split: str, context: int,
                         max_new_tokens: int | None, fmt: PromptFormat = PromptFormat(), label: str | None = None) -> None:
    """ValueError naming how many prompts of `split` do not fit `context` with `max_new_tokens` (None: an eval
    set, whose response budget is cut to the room left: one token must fit), and the longest."""
    budget = context - (1 if max_new_tokens is None else max_new_tokens)
    if budget < 1:  # not a prompt's fault: the response alone fills the context ("at most -72 fit")
        raise ValueError(f"{label or f'task {task.name!r}'}: task.max_new_tokens={max_new_tokens} leaves no room for a "
                         f"prompt in the model's context of {context} tokens: lower task.max_new_tokens or use a "
                         "model with a longer context")
    lengths = [prompt_length(tokenizer, task, ex, fmt, budget) for ex in examples]
    too_long = [i for i, (n, _) in enumerate(lengths) if n > budget]
    if not too_long:
        return
    worst = max(too_long, key=lambda i: lengths[i][0])
    n, exact = lengths[worst]
    room = " and leave room for a response" if max_new_tokens is None else f" with task.max_new_tokens={max_new_tokens}"
    raise ValueError(
        f"{label or f'task {task.name!r}'}: {len(too_long)} of {len(examples)} {split} prompts do not fit the "
        f"model's context of {context} tokens{room} (the longest, {split} example {worst}, has "
        f"{'' if exact else 'more than '}{n} prompt tokens; at most {budget} fit): shorten the prompts, "
        + ("" if max_new_tokens is None else "lower task.max_new_tokens or ")
        + "use a model with a longer context")
