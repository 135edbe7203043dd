"""Multi-digit integer arithmetic: "37+5=" -> "42".

The simplest task with a verifiable reward that a ~1M-parameter model can partly learn in seconds, which is
what a CPU benchmark of RL algorithms needs: rewards that are neither all 0 nor all 1 at step 0.

Operands: the number of digits is drawn uniformly from [min_digits, max_digits], then the value uniformly
among numbers with exactly that many digits (so short operands are not drowned out by long ones).
Subtraction puts the larger operand first: answers are never negative, so the answer format is just digits.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any

from bench.domains import num
from bench.tasks.base import Example, GeneratedTask, GeneratedTaskConfig
from bench.registry import TASKS

OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}

# Canonical integers only: no sign on zero, no leading zeros, no "+" sign, no spaces inside.
_INT = re.compile(r"(?:0|-?[1-9][0-9]*)")


def parse_int(text: str) -> int | None:
    """The integer written in `text` (surrounding whitespace allowed), or None if it is anything else."""
    s = text.strip()
    return int(s) if _INT.fullmatch(s) else None


@dataclass
class ArithmeticTaskConfig(GeneratedTaskConfig):
    max_new_tokens: int = 6
    min_digits: int = num(1, "[1, 18]")  # (<= max_digits: `check`)
    max_digits: int = num(2, "[1, 18]")
    ops: list[str] = field(default_factory=lambda: ["+", "-"])

    def check(self) -> None:
        super().check()
        if not self.ops or any(op not in OPS for op in self.ops):
            raise ValueError(f"task.ops={list(self.ops)!r}: valid ops are {', '.join(OPS)}")
        if self.min_digits > self.max_digits:
            raise ValueError(f"task.min_digits={self.min_digits} must be <= task.max_digits={self.max_digits}")


@TASKS.register("arithmetic", schema=ArithmeticTaskConfig)
class ArithmeticTask(GeneratedTask):

    def __init__(self, cfg: Any):
        super().__init__(cfg)
        # Plain copies of what every draw reads: attribute access on an OmegaConf node is ~100x slower.
        self.ops = list(cfg.ops)
        self.digits = (int(cfg.min_digits), int(cfg.max_digits))

    def _operand(self, rng: random.Random) -> int:
        d = rng.randint(*self.digits)
        lo = 0 if d == 1 else 10 ** (d - 1)
        return rng.randint(lo, 10**d - 1)

    def _make(self, rng: random.Random) -> Example:
        op = rng.choice(self.ops)
        a, b = self._operand(rng), self._operand(rng)
        if op == "-" and a < b:
            a, b = b, a
        return {"a": a, "b": b, "op": op, "answer": OPS[op](a, b)}


    def prompt(self, ex: Example) -> str:
        return f"{ex['a']}{ex['op']}{ex['b']}="

    def target(self, ex: Example) -> str:
        return str(ex["answer"])

    def reward(self, ex: Example, completion: str) -> float:
        value = parse_int(completion)
        return float(value is not None and value == ex["answer"])
