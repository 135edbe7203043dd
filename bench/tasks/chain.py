"""Chain: a running value updated by a list of labelled steps, every intermediate result written out.

The long-answer task. Answers of the other synthetic tasks are ~3 tokens, so the sequence-level importance
ratio of a low-precision rollout never compounds the way it does in long reasoning chains; here the correct
completion is a worked chain of 50-200 tokens (default config: 8-16 steps = 58-114 characters + EOS;
`max_steps` up to 52 for longer ones).

    prompt      "17:a+7b-3c+9d-2="            start value 17, then step a: +7, b: -3, c: +9, d: -2
    completion  "a+7=24;b-3=21;c+9=30;d-2=28#28"

Why this shape:
* Each step is locally easy for a ~1M model: the label is the previous label + 1 (a..z then A..Z); op and
  operand are copied from the prompt right after that label (an induction-head lookup, no counting); the
  value is the previous value (a fixed number of characters back: every field is zero-padded to a fixed
  width) plus or minus one small operand, and it stays in [0, 10**value_digits - 1] (the generator only
  draws steps that keep it there), so there is never a sign or a growing number of digits.
* A wrong token anywhere breaks the chain: a wrong label or operand is a wrong step, and a wrong value
  propagates to every later value and to the final answer.
* Length is controlled by the number of steps (`min_steps`..`max_steps`); the step width by `value_digits`
  and `max_operand`.
Measured alternatives that the tiny model did NOT learn within 800-1500 SFT steps (loss stuck at the
marginal-entropy plateau): the same chain without the operator ("17:a7b5=" -> "a7=24;b5=29", modulo 100),
and a Fibonacci-style chain that adds the two previous terms ("17,25:e=" -> "a42;b67;c09;..."), which needs
no lookup but has no partial solution to learn first. Here the next value is mostly the previous one
(tens digit copied, units digit shifted), which gives SFT a gradual path.

Reward (`reward_mode`), all verifiable by string comparison with the unique canonical chain (no parsing of
expressions, nothing is ever evaluated):
* `exact` (default): 1 iff the whole completion is the correct chain: every step right (label, operand,
  value) and the final answer right. This is step-by-step checking; it is stricter than the final value
  alone, which a wrong chain can hit by chance (two compensating errors, or a guess: 1 in 100 for 2 digits),
  and it makes every token of the answer matter, which is the point of a long-answer task.
* `final`: 1 iff the text after the single "#" is the correct final value (zero-padded); the chain before it
  is not checked. The outcome-only reward of GSM8K-style RL, for comparison.
* `prefix`: partial credit k/(n+1) for the k leading steps that are right (up to the first wrong or
  malformed one), 1.0 only for the exact chain. Why: with long chains an exactly right chain can be rare,
  and a group whose rewards are all 0 carries no GRPO signal; prefix credit ranks the failures by how far
  they got. Steps after the first error are not credited even when they are right relative to the wrong
  value before them: they are not steps of the correct chain.
`reward/accuracy` and the eval accuracy count reward >= 1, i.e. exact chains, in every mode.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass
from typing import Any

from bench.domains import num
from bench.tasks.base import Example, GeneratedTask, GeneratedTaskConfig
from bench.registry import TASKS

LABELS = string.ascii_lowercase + string.ascii_uppercase  # step labels, in order: at most 52 steps
REWARD_MODES = ("exact", "final", "prefix")
STEP_SEP, FINAL_SEP = ";", "#"


@dataclass
class ChainTaskConfig(GeneratedTaskConfig):
    """`task.*` of task=chain: a worked chain of min_steps..max_steps steps."""

    max_new_tokens: int = 120  # a 16-step chain is 114 characters + EOS
    min_steps: int = num(8, "[1, inf)")  # (<= max_steps <= the number of step labels: `check`)
    max_steps: int = num(16, "[1, inf)")
    value_digits: int = num(2, "[1, 9]")  # running value in [0, 99], zero-padded
    max_operand: int = num(9, "[1, inf)")  # (<= the largest running value: `check`)
    reward_mode: str = "exact"  # exact | final | prefix

    def check(self) -> None:
        super().check()
        if self.max_steps > len(LABELS):
            raise ValueError(f"task.max_steps={self.max_steps} must be <= {len(LABELS)} (the step labels a..Z)")
        if self.min_steps > self.max_steps:
            raise ValueError(f"task.min_steps={self.min_steps} must be <= task.max_steps={self.max_steps}")
        max_value = 10**self.value_digits - 1
        if not 1 <= self.max_operand <= max_value:
            raise ValueError(f"task.max_operand={self.max_operand} must be in [1, {max_value}] "
                             f"(the largest running value at task.value_digits={self.value_digits})")
        if self.reward_mode not in REWARD_MODES:
            raise ValueError(f"task.reward_mode={self.reward_mode!r} is not valid; choose one of: {', '.join(REWARD_MODES)}")
        need = chain_length(self.max_steps, len(str(self.max_operand)), self.value_digits) + 1  # + EOS
        if self.max_new_tokens < need:
            raise ValueError(f"task.max_new_tokens={self.max_new_tokens} is too small: a {self.max_steps}-step chain "
                             f"needs {need} tokens (with EOS) at one character per token")


def chain_length(n_steps: int, operand_digits: int, value_digits: int) -> int:
    """Characters of a correct n-step completion (without EOS): n steps (label, op, operand, '=', value), n-1 ';',
    '#' and the final value."""
    step = 1 + 1 + operand_digits + 1 + value_digits
    return n_steps * step + (n_steps - 1) + 1 + value_digits


@TASKS.register("chain", schema=ChainTaskConfig)
class ChainTask(GeneratedTask):

    def __init__(self, cfg: Any):
        super().__init__(cfg)
        # Plain copies of what every draw reads: attribute access on an OmegaConf node is ~100x slower.
        self.steps = (int(cfg.min_steps), int(cfg.max_steps))
        self.value_digits = int(cfg.value_digits)
        self.max_operand = int(cfg.max_operand)
        self.reward_mode = str(cfg.reward_mode)
        self.max_value = 10**self.value_digits - 1
        self.operand_digits = len(str(self.max_operand))

    def target_length(self, n_steps: int) -> int:
        """Characters of a correct n-step completion (without EOS)."""
        return chain_length(n_steps, self.operand_digits, self.value_digits)

    # ---- data -------------------------------------------------------------------------------------
    def _make(self, rng: random.Random) -> Example:
        value = rng.randint(0, self.max_value)
        ex: Example = {"start": value, "ops": [], "values": []}
        for _ in range(rng.randint(*self.steps)):
            ops = [op for op, ok in (("+", value < self.max_value), ("-", value > 0)) if ok]
            op = rng.choice(ops)
            room = self.max_value - value if op == "+" else value
            k = rng.randint(1, min(self.max_operand, room))
            value = value + k if op == "+" else value - k
            ex["ops"].append((op, k))
            ex["values"].append(value)
        ex["answer"] = value
        return ex


    # ---- format -----------------------------------------------------------------------------------
    def _value(self, v: int) -> str:
        return f"{v:0{self.value_digits}d}"

    def _op(self, i: int, op: str, k: int) -> str:
        return f"{LABELS[i]}{op}{k:0{self.operand_digits}d}"

    def prompt(self, ex: Example) -> str:
        return self._value(ex["start"]) + ":" + "".join(self._op(i, op, k) for i, (op, k) in enumerate(ex["ops"])) + "="

    def step_texts(self, ex: Example) -> list[str]:
        """The correct steps, in order, e.g. ["a+7=24", "b-3=21"]."""
        return [f"{self._op(i, op, k)}={self._value(v)}" for i, ((op, k), v) in enumerate(zip(ex["ops"], ex["values"]))]

    def target(self, ex: Example) -> str:
        return STEP_SEP.join(self.step_texts(ex)) + FINAL_SEP + self._value(ex["answer"])

    # ---- reward -----------------------------------------------------------------------------------
    def correct_prefix(self, ex: Example, completion: str) -> int:
        """How many leading steps of `completion` are the correct steps (0 .. n), up to the first wrong one."""
        expected = self.step_texts(ex)
        body = completion.strip().split(FINAL_SEP, 1)[0]
        k = 0
        for got, want in zip(body.split(STEP_SEP), expected):
            if got != want:
                break
            k += 1
        return k

    def reward(self, ex: Example, completion: str) -> float:
        if not isinstance(completion, str) or len(completion) > 2 * self.target_length(self.steps[1]) + 16:
            return 0.0  # overlong: malformed whatever it holds (also bounds the work on garbage)
        text = completion.strip()
        exact = text == self.target(ex)
        if self.reward_mode == "exact" or exact:
            return float(exact)
        if self.reward_mode == "final":
            parts = text.split(FINAL_SEP)
            return float(len(parts) == 2 and parts[1] == self._value(ex["answer"]))
        return self.correct_prefix(ex, text) / (len(ex["ops"]) + 1)  # prefix, not exact
