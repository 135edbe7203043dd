"""Countdown-Tasks-3to4 (Jiayi-Pan/Countdown-Tasks-3to4): TinyZero's Countdown, with the published problems.

The hub set has one split, "train" (columns `target` int64, `nums` list of int64; 3 or 4 numbers each, about
490k rows, `data/train-00000-of-00001.parquet`). TinyZero (examples/data_preprocess/countdown.py) takes the
first rows for training and the next ones for testing; here `test_size` rows are held out by `data_seed`
instead (bench/tasks/hub_task.py), so the test split does not depend on the training-set size.

Prompt: TinyZero's instruction, "Using the numbers [..], create an equation that equals T. ... return the final
answer in <answer> </answer> tags", with its system message; TinyZero also starts the response with
"Let me solve this step by step.\\n<think>", given here as `response_prefix` for the caller to place after the
chat template's generation prompt. Reward: `countdown` (each number at most once, bench/rewards.py) or
`countdown_all` (every number exactly once, TinyZero's rule).

The hub rows carry no solution, so `target()` (the reference completion for the SFT warm start) searches for
one: all ways of combining the numbers pairwise with + - * /, a few thousand expressions for 4 numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any, Optional

from bench.tasks.base import Example
from bench.registry import TASKS
from bench.tasks.hub_task import HubTask, HubTaskConfig

COUNTDOWN_SYSTEM = ("You are a helpful assistant. You first think about the reasoning process in the mind and then "
                    "provide the user with the answer.")
COUNTDOWN_PROMPT = ("Using the numbers {nums}, create an equation that equals {target}. You can use basic arithmetic "
                    "operations (+, -, *, /) and each number can only be used once. Show your work in <think> </think> "
                    "tags. And return the final answer in <answer> </answer> tags, for example <answer> (1 + 2) / 3 "
                    "</answer>.")
COUNTDOWN_RESPONSE_PREFIX = "Let me solve this step by step.\n<think>"


@dataclass
class CountdownTasksConfig(HubTaskConfig):
    source: str = "Jiayi-Pan/Countdown-Tasks-3to4"
    test_split: Optional[str] = None
    test_size: int = 1024
    reward: str = "countdown"
    system_prompt: Optional[str] = COUNTDOWN_SYSTEM
    response_prefix: Optional[str] = COUNTDOWN_RESPONSE_PREFIX
    max_new_tokens: int = 1024


@TASKS.register("countdown_tasks", schema=CountdownTasksConfig)
class CountdownTasksTask(HubTask):
    config_class = CountdownTasksConfig
    required_columns = ("target", "nums")
    default_templates = {"countdown": COUNTDOWN_PROMPT, "countdown_all": COUNTDOWN_PROMPT}
    placeholders = ("nums", "target")

    def adapt(self, row: dict[str, Any], index: int, split: str) -> Example:
        nums, target = row["nums"], row["target"]
        if not isinstance(nums, list) or not nums or not all(isinstance(n, int) and n >= 0 for n in nums):
            raise ValueError(f"'nums' must be a non-empty list of non-negative integers, got {nums!r:.80}")
        if not isinstance(target, int):
            raise ValueError(f"'target' must be an integer, got {target!r:.80}")
        return {"id": f"{split}-{index}", "nums": list(nums), "target": target,
                "answer": {"target": target, "nums": list(nums)}}

    def key(self, ex: Example) -> Any:
        return tuple(sorted(ex["nums"])), ex["target"]

    @property
    def response_prefix(self) -> str:
        """Text the response starts with (TinyZero), to put after the chat template's generation prompt."""
        return getattr(self.cfg, "response_prefix", None) or ""

    def final_line(self, ex: Example) -> str:
        expr = solve(tuple(ex["nums"]), ex["target"])
        return f"<answer>{expr if expr is not None else ''}</answer>"

    def target(self, ex: Example) -> str:
        """A reference response after TinyZero's "<think>" prefix: the equation, then the answer tags."""
        expr = solve(tuple(ex["nums"]), ex["target"]) or ""
        return f"{expr} = {ex['target']}</think>\n<answer>{expr}</answer>"


@lru_cache(maxsize=65536)
def solve(nums: tuple[int, ...], target: int) -> str | None:
    """An expression over a sub-multiset of `nums` equal to `target` (exact arithmetic), or None.

    Prefers an expression that uses every number (what `countdown_all` requires); failing that, returns one
    over fewer numbers (enough for `countdown`). Exhaustive: a few thousand expressions for 4 numbers.
    """
    partial: list[str] = []

    def search(items: list[tuple[Fraction, str]]) -> str | None:
        if not partial:
            partial.extend(text for value, text in items if value == target)
        if len(items) == 1:
            return items[0][1] if items[0][0] == target else None
        for i in range(len(items)):
            for j in range(i + 1, len(items)):
                (a, ta), (b, tb) = items[i], items[j]
                rest = items[:i] + items[i + 1:j] + items[j + 1:]
                options = [(a + b, f"({ta}+{tb})"), (a * b, f"({ta}*{tb})"), (a - b, f"({ta}-{tb})"),
                           (b - a, f"({tb}-{ta})")]
                if b != 0:
                    options.append((a / b, f"({ta}/{tb})"))
                if a != 0:
                    options.append((b / a, f"({tb}/{ta})"))
                for value, text in options:
                    found = search(rest + [(value, text)])
                    if found is not None:
                        return found
        return None

    expr = search([(Fraction(n), str(n)) for n in nums])
    if expr is None and partial:
        expr = partial[0]
    return None if expr is None else _strip_outer(expr)


def _strip_outer(expr: str) -> str:
    """Drop one pair of parentheses around the whole expression, when they enclose all of it."""
    if expr.startswith("(") and expr.endswith(")"):
        depth = 0
        for i, ch in enumerate(expr):
            depth += (ch == "(") - (ch == ")")
            if depth == 0 and i < len(expr) - 1:
                return expr
        return expr[1:-1]
    return expr
