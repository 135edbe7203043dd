"""Countdown: reach a target from a few given numbers with + - * / and parentheses.

Prompt "3 5 7>22:" (numbers sorted ascending, then ">" target ":"), completion an expression such as
"3*5+7". The numbers of a prompt are a multiset; a completion may use each given number AT MOST ONCE
(a subset is fine, as in the TV game): rewarding any correct expression is what makes this a search task
where RL can improve on the supervised warm start, rather than imitation of one reference answer.

Every generated instance is solvable: it is built from a random expression over all its numbers whose
intermediate results are positive integers (the classic rules), and that expression is kept as `target`.
The checker is more permissive than the generator: any exact rational arithmetic that hits the target counts.

The checker is the countdown reward's (bench/rewards.py: `countdown_check`), which never evaluates text as code.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Union

from bench.domains import num
from bench.rewards import countdown_check
from bench.tasks.base import Example, GeneratedTask, GeneratedTaskConfig
from bench.registry import TASKS

_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}  # the generator's printer: operator precedence

# ---- generator -------------------------------------------------------------------------------------

Tree = Union[int, tuple[str, "Tree", "Tree"]]


def _random_tree(leaves: list[int], rng: random.Random) -> Tree:
    if len(leaves) == 1:
        return leaves[0]
    k = rng.randint(1, len(leaves) - 1)
    return (rng.choice("+-*/"), _random_tree(leaves[:k], rng), _random_tree(leaves[k:], rng))


def _value(tree: Tree) -> int | None:
    """Value under the classic rules (every intermediate a positive integer), else None."""
    if isinstance(tree, int):
        return tree
    op, left, right = tree
    a, b = _value(left), _value(right)
    if a is None or b is None:
        return None
    if op == "+":
        v = a + b
    elif op == "-":
        v = a - b
    elif op == "*":
        v = a * b
    else:
        v = a // b if a % b == 0 else 0
    return v if v > 0 else None


def format_tree(tree: Tree) -> str:
    """Infix text with only the parentheses that precedence and left-associativity require."""
    if isinstance(tree, int):
        return str(tree)
    op, left, right = tree

    def side(child: Tree, is_right: bool) -> str:
        text = format_tree(child)
        if isinstance(child, int):
            return text
        p_child, p_op = _PREC[child[0]], _PREC[op]
        needs = p_child < p_op or (is_right and p_child == p_op and op in "-/")
        return f"({text})" if needs else text

    return f"{side(left, False)}{op}{side(right, True)}"



@dataclass
class CountdownTaskConfig(GeneratedTaskConfig):
    max_new_tokens: int = 12
    n_numbers: int = num(3, "[2, inf)")  # leaves of the expression tree
    max_number: int = num(9, "[1, inf)")


@TASKS.register("countdown", schema=CountdownTaskConfig)
class CountdownTask(GeneratedTask):

    def __init__(self, cfg: Any):
        super().__init__(cfg)
        # Plain copies of what every draw reads: attribute access on an OmegaConf node is ~100x slower.
        self.n_numbers, self.max_number = int(cfg.n_numbers), int(cfg.max_number)

    def _make(self, rng: random.Random) -> Example:
        while True:  # rejection sampling: most random trees satisfy the classic rules
            leaves = [rng.randint(1, self.max_number) for _ in range(self.n_numbers)]
            tree = _random_tree(leaves, rng)
            value = _value(tree)
            if value is not None:
                return {"numbers": sorted(leaves), "target": value, "solution": format_tree(tree)}


    def prompt(self, ex: Example) -> str:
        return " ".join(map(str, ex["numbers"])) + f">{ex['target']}:"

    def target(self, ex: Example) -> str:
        return ex["solution"]

    def reward(self, ex: Example, completion: str) -> float:
        return float(countdown_check(ex["numbers"], ex["target"], completion))
