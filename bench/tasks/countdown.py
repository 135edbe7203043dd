"""Countdown: reach a target from a few given numbers with + - * / and parentheses.

Prompt "3 5 7>22:" (numbers sorted ascending, then ">" target ":"), completion an expression such as
"3*5+7". The numbers of a prompt are a multiset; a completion may use each given number AT MOST ONCE
(a subset is fine, as in the TV game): rewarding any correct expression is what makes this a search task
where RL can improve on the supervised warm start, rather than imitation of one reference answer.

Every generated instance is solvable: it is built from a random expression over all its numbers whose
intermediate results are positive integers (the classic rules), and that expression is kept as `target`.
The checker is more permissive than the generator: any exact rational arithmetic that hits the target counts.

The checker never evaluates text as code: a tiny recursive-descent parser over integers, + - * / and
parentheses, with exact `Fraction` arithmetic. Anything else (unary minus, names, calls, other operators,
numbers not in the prompt, numbers used too often, division by zero) gives reward 0.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Union

from bench.tasks.base import TASKS, Example, Task, GeneratedTaskConfig, stable_seed, unique_examples

MAX_COMPLETION_CHARS = 200  # longer is malformed: bounds the parser's work on garbage completions
MAX_DEPTH = 32  # parenthesis nesting; bounds recursion

_TOKEN = re.compile(r"\s*(?:(0|[1-9][0-9]*)|([-+*/()]))")
_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}


class Malformed(ValueError):
    """The completion is not an expression of the allowed grammar."""


# ---- checker ---------------------------------------------------------------------------------------


def _tokenize(text: str) -> list[str]:
    tokens, pos, end = [], 0, len(text.rstrip())
    while pos < end:
        m = _TOKEN.match(text, pos)
        if m is None:
            raise Malformed(f"unexpected character at {pos}: {text[pos:pos + 10]!r}")
        tokens.append(m.group(1) or m.group(2))
        pos = m.end()
    return tokens


class _Parser:
    """expr := term (("+"|"-") term)* ; term := factor (("*"|"/") factor)* ; factor := INT | "(" expr ")" """

    def __init__(self, tokens: list[str]):
        self.tokens, self.i, self.numbers = tokens, 0, []

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise Malformed("unexpected end of expression")
        self.i += 1
        return tok

    def expr(self, depth: int) -> Fraction:
        value = self.term(depth)
        while self.peek() in ("+", "-"):
            op, rhs = self.take(), self.term(depth)
            value = value + rhs if op == "+" else value - rhs
        return value

    def term(self, depth: int) -> Fraction:
        value = self.factor(depth)
        while self.peek() in ("*", "/"):
            op, rhs = self.take(), self.factor(depth)
            if op == "/" and rhs == 0:
                raise ZeroDivisionError
            value = value * rhs if op == "*" else value / rhs
        return value

    def factor(self, depth: int) -> Fraction:
        tok = self.take()
        if tok == "(":
            if depth >= MAX_DEPTH:
                raise Malformed("parentheses nested too deep")
            value = self.expr(depth + 1)
            if self.take() != ")":
                raise Malformed("missing ')'")
            return value
        if tok.isdigit():
            self.numbers.append(int(tok))
            return Fraction(int(tok))
        raise Malformed(f"unexpected token {tok!r}")


def evaluate(text: str) -> tuple[Fraction, list[int]]:
    """Value of the expression in `text` and the numbers it uses, in order.

    Raises Malformed for anything outside the grammar and ZeroDivisionError for a division by zero.
    """
    if len(text) > MAX_COMPLETION_CHARS:
        raise Malformed("completion too long")
    parser = _Parser(_tokenize(text))
    value = parser.expr(0)
    if parser.peek() is not None:
        raise Malformed(f"trailing token {parser.peek()!r}")
    return value, parser.numbers


def check(numbers: list[int], target: int, completion: str) -> bool:
    """True iff `completion` is an expression over a sub-multiset of `numbers` equal to `target`."""
    try:
        value, used = evaluate(completion)
    except (Malformed, ZeroDivisionError):
        return False
    if Counter(used) - Counter(numbers):  # some number unlisted or used more often than given
        return False
    return value == target


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
    n_numbers: int = 3
    max_number: int = 9


@TASKS.register("countdown", schema=CountdownTaskConfig)
class CountdownTask(Task):

    def __init__(self, cfg: Any):
        super().__init__(cfg)
        # Plain copies of what every draw reads: attribute access on an OmegaConf node is ~100x slower.
        self.n_numbers, self.max_number = int(cfg.n_numbers), int(cfg.max_number)
        if self.n_numbers < 2 or self.max_number < 1:
            raise ValueError(f"countdown needs n_numbers >= 2 and max_number >= 1, got ({self.n_numbers}, {self.max_number})")

    def _make(self, rng: random.Random) -> Example:
        while True:  # rejection sampling: most random trees satisfy the classic rules
            leaves = [rng.randint(1, self.max_number) for _ in range(self.n_numbers)]
            tree = _random_tree(leaves, rng)
            value = _value(tree)
            if value is not None:
                return {"numbers": sorted(leaves), "target": value, "solution": format_tree(tree)}

    def _build_splits(self) -> dict[str, list[Example]]:
        rng = random.Random(stable_seed(self.name, self.cfg.data_seed))
        seen: set = set()
        test = unique_examples(self._make, self.prompt, self.cfg.n_test, rng, seen)
        train = unique_examples(self._make, self.prompt, self.cfg.n_train, rng, seen)
        return {"train": train, "test": test}

    def prompt(self, ex: Example) -> str:
        return " ".join(map(str, ex["numbers"])) + f">{ex['target']}:"

    def target(self, ex: Example) -> str:
        return ex["solution"]

    def reward(self, ex: Example, completion: str) -> float:
        return float(check(ex["numbers"], ex["target"], completion))
