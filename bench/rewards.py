"""Verifiable rewards for the real tasks: scorers `(completion, gold) -> float` that never raise.

Scorers (the `SCORERS` registry, bench/registry.py; each returns 1.0 for a correct answer and 0.0 otherwise):

* `math_verify`: HuggingFace math-verify (the checker of open-r1, lighteval and verl's math_verify option).
  The gold answer is parsed first (wrapped in `\\boxed{}` unless it already has one, as verl does), the
  completion with math-verify's LaTeX and plain-expression extraction (`\\boxed{}` has priority), and
  `verify(gold, prediction)` in that order (the math-verify README: the comparison is not symmetric).
  Several different boxed answers parse as a set and so do not match a single gold value: hedging is wrong.
* `gsm8k_strict`: the last `#### <number>` in the completion, the format of the GSM8K reference solutions and
  of verl's strict GSM8K reward (verl/utils/reward_score/gsm8k.py) and lm-evaluation-harness's "strict-match".
  Numbers compare as exact rationals after removing thousands commas ("1,000" = "1000.0").
* `dapo`: the DAPO recipe's reward. The last `Answer: ...` line (case-insensitive) in the final 300 characters
  (DAPO's prompt asks for "Answer: $Answer" on the last line; verl/utils/reward_score/math_dapo.py looks at
  the last 300 characters), normalised as in Minerva (Lewkowycz et al. 2022, appendix D) and compared as
  strings with the normalised gold. As verl does today, a completion without an `Answer:` line falls back to
  its last `\\boxed{}`. DAPO itself uses +1/-1 rewards; this returns 1/0 like the other scorers (group
  normalisation in GRPO makes the two equivalent when advantages are divided by the group std).
* `countdown`: the expression inside the last `<answer>...</answer>` (TinyZero's format), checked with the
  project's safe parser (`countdown_check` below: no eval, exact rational arithmetic); each given number
  may be used at most once. `countdown_all` additionally requires every number to be used exactly once, as
  TinyZero's reward (verl/utils/reward_score/countdown.py in Jiayi-Pan/TinyZero) does. The gold is a mapping
  {"target": int, "nums": [int, ...]} ("numbers" is accepted for "nums").

A format reward (the `ANSWER_FORMATS` registry: `\\boxed{}` present, `#### n` present, an `Answer:` line,
`<answer>` tags) can be mixed in by `Reward(format_weight=w)`: a correct answer scores 1, a wrong but
well-formatted one w, anything else 0 (TinyZero's 1 / 0.1 / 0 scheme, verl's `format_score`). Correct answers
stay exactly 1.0, so the trainer's accuracy (`reward >= 1`) is unchanged by shaping.

`Reward` runs the scorer under a wall-clock limit (bench/run/timelimit.py; the docstring there says how it works
and where it does not hold). A scorer that times out or raises scores 0; `Reward.stats` counts both so they
can be logged: the trainer logs them per step as `reward/scorer_timeouts` / `reward/scorer_errors` and per
evaluation as `eval/[<set>/]scorer_timeouts` / `scorer_errors` (`scorer_metrics`). Completions may be any
text: bytes are decoded as UTF-8 with replacement, and lone surrogates (e.g. from `errors="surrogateescape"`
decoding) are replaced, before any scorer sees them.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Mapping
from fractions import Fraction
from functools import lru_cache
from typing import Any, Callable

from bench.registry import ANSWER_FORMATS, SCORERS
from bench.run.timelimit import MODES, ScoreTimeout, TimeLimitUnavailable, call_with_time_limit

Scorer = Callable[[str, Any], float]

DAPO_TAIL_CHARS = 300  # DAPO / verl: the answer line is at the end
BOXED_TAIL_CHARS = 100  # verl's strict-box fallback looks at the last 100 characters


# ---- text hygiene -----------------------------------------------------------------------------------


def clean_text(completion: Any) -> str:
    """The completion as a str every scorer can handle: bytes decoded leniently, lone surrogates replaced."""
    if isinstance(completion, (bytes, bytearray)):
        return bytes(completion).decode("utf-8", errors="replace")
    if not isinstance(completion, str):
        return "" if completion is None else str(completion)
    try:
        completion.encode("utf-8")
        return completion
    except UnicodeEncodeError:  # lone surrogates: not valid text for regex-to-sympy round trips or logging
        return completion.encode("utf-8", errors="replace").decode("utf-8")


def gold_text(gold: Any) -> str:
    """A gold answer as text; integral floats (AMC answers are stored as float64) lose their '.0'."""
    if isinstance(gold, float) and gold.is_integer():
        return str(int(gold))
    return str(gold).strip()


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`) with balanced braces, or None. Linear time."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start)
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1:j]
    return None


def last_answer_tag(text: str) -> str | None:
    """Content of the last `<answer>...</answer>`, or None. rfind-based: linear even on tag spam."""
    end = text.rfind("</answer>")
    if end < 0:
        return None
    start = text.rfind("<answer>", 0, end)
    if start < 0:
        return None
    return text[start + len("<answer>"):end]


# ---- math-verify -------------------------------------------------------------------------------------


class _DropTimeoutDisabledWarning(logging.Filter):
    """math-verify warns once that its own timeout is off; that is deliberate here (bench/run/timelimit.py)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


def _math_verify():
    import math_verify  # noqa: PLC0415 - imported on first use: it pulls in sympy and antlr

    for name in ("math_verify.parser", "math_verify.grader"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropTimeoutDisabledWarning) for f in logger.filters):
            logger.addFilter(_DropTimeoutDisabledWarning())
    return math_verify


@lru_cache(maxsize=4096)
def _parse_gold(gold: str) -> tuple:
    """Parsed gold answer; cached because every completion of a group shares its gold."""
    mv = _math_verify()
    text = gold if ("\\boxed" in gold or "$" in gold) else "\\boxed{" + gold + "}"
    parsed = mv.parse(text, extraction_config=[mv.LatexExtractionConfig(), mv.ExprExtractionConfig()],
                      parsing_timeout=None)
    return tuple(parsed)


def warm_up_math_verify() -> None:
    """Import math-verify (sympy, antlr) and build its parsers once; runs outside the time limit."""
    _parse_gold("1")


@SCORERS.register("math_verify", answer_format="boxed", setup=warm_up_math_verify)
def score_math_verify(completion: str, gold: Any) -> float:
    """1.0 iff math-verify finds the completion's final answer equal to the gold answer."""
    mv = _math_verify()
    gold_parsed = _parse_gold(gold_text(gold))
    if not gold_parsed:
        return 0.0
    pred = mv.parse(clean_text(completion), extraction_config=[mv.LatexExtractionConfig(), mv.ExprExtractionConfig()],
                    parsing_timeout=None)
    if not pred:
        return 0.0
    return float(mv.verify(list(gold_parsed), pred, timeout_seconds=None))


# ---- GSM8K strict ------------------------------------------------------------------------------------

_GSM8K_ANSWER = re.compile(r"#### ?\$?(-?[0-9][0-9,]*(?:\.[0-9]+)?)")


def _exact_number(text: str) -> Fraction | None:
    try:
        return Fraction(text.replace(",", "").rstrip("."))
    except (ValueError, ZeroDivisionError):  # also: more digits than int() accepts (sys.int_info limit)
        return None


def gsm8k_gold(answer: Any) -> str:
    """GSM8K's gold: the text after the last '#### ' of the reference solution, commas removed."""
    text = str(answer)
    if "####" in text:
        text = text.rsplit("####", 1)[1]
    return text.strip().replace(",", "")


@SCORERS.register("gsm8k_strict", answer_format="gsm8k")
def score_gsm8k_strict(completion: str, gold: Any) -> float:
    """1.0 iff the completion's last `#### <number>` equals the gold number."""
    matches = _GSM8K_ANSWER.findall(clean_text(completion))
    if not matches:
        return 0.0
    pred, want = _exact_number(matches[-1]), _exact_number(gsm8k_gold(gold))
    return float(pred is not None and want is not None and pred == want)


# ---- DAPO (Minerva-normalised "Answer:" line) -------------------------------------------------------

_ANSWER_LINE = re.compile(r"(?i)answer\s*:\s*([^\n]+)")
_UNWRAP = re.compile(r"\\(?:text|textbf|mathrm|mathbf|overline|boxed)\{([^{}]*)\}")
_UNITS = (  # answer decorations that carry no value (after Minerva's normalisation list)
    "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "sue", "points", "feet",
    "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals", "edges", "students",
    "childrentickets", "multiples",
)
_NOISE = ("\\ldots", "\\dots", "\\left", "\\right", "^\\circ", "^{\\circ}", "\\!", "\\,", "\\;", "\\ ", "{,}", '"',
          "\\$", "$")


def normalize_final_answer(answer: str) -> str:
    """Minerva-style normalisation of a final answer, so '\\$1,000.' and '1000' compare equal as strings.

    Keeps the part after the last '=', unwraps \\text{}/\\boxed{}-like wrappers, drops units, spacing and
    dollar signs, expands shorthand \\frac12 and \\sqrt2, maps \\dfrac/\\tfrac to \\frac, removes thousands
    commas from plain integers and a trailing period.
    """
    s = answer.split("=")[-1].strip()
    math = re.search(r"\$([^$]*)\$", s)  # "is $42$ dollars" -> "42"
    if math:
        s = math.group(1)
    for _ in range(4):  # nested wrappers, innermost first; bounded
        s, n = _UNWRAP.subn(r"\1", s)
        if not n:
            break
    for noise in _NOISE:
        s = s.replace(noise, "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"\s+", "", s)
    for unit in _UNITS:
        s = re.sub(rf"(?<=[0-9}}]){unit}(?:es|s)?$", "", s)
    s = re.sub(r"\\frac([0-9a-zA-Z])([0-9a-zA-Z])", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\sqrt([0-9a-zA-Z])", r"\\sqrt{\1}", s)
    s = s.rstrip(".")
    if re.fullmatch(r"-?[0-9]{1,3}(?:,[0-9]{3})+", s):
        s = s.replace(",", "")
    return s


@SCORERS.register("dapo", answer_format="answer_line")
def score_dapo(completion: str, gold: Any) -> float:
    """1.0 iff the last `Answer:` line (or, failing that, the last \\boxed{}) matches the gold after normalisation."""
    text = clean_text(completion)
    matches = _ANSWER_LINE.findall(text[-DAPO_TAIL_CHARS:])
    if matches:
        pred = matches[-1]
    else:
        pred = last_boxed(text[-BOXED_TAIL_CHARS:])
        if pred is None:
            return 0.0
    want = normalize_final_answer(gold_text(gold))
    return float(bool(want) and normalize_final_answer(pred) == want)


# ---- Countdown ---------------------------------------------------------------------------------------
# The one countdown checker (the countdown task's reward and the hub countdown scorers): a tiny recursive-descent
# parser over integers, + - * / and parentheses with exact `Fraction` arithmetic; it never evaluates text as code.
# Anything else (unary minus, names, calls, other operators, numbers not given, numbers used too often, division
# by zero) scores 0.

MAX_EXPRESSION_CHARS = 200  # longer is malformed: bounds the parser's work on garbage completions
MAX_EXPRESSION_DEPTH = 32  # parenthesis nesting; bounds recursion

_TOKEN = re.compile(r"\s*(?:(0|[1-9][0-9]*)|([-+*/()]))")


class Malformed(ValueError):
    """The completion is not an expression of the allowed grammar."""


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
            if depth >= MAX_EXPRESSION_DEPTH:
                raise Malformed("parentheses nested too deep")
            value = self.expr(depth + 1)
            if self.take() != ")":
                raise Malformed("missing ')'")
            return value
        if tok.isdigit():
            self.numbers.append(int(tok))
            return Fraction(int(tok))
        raise Malformed(f"unexpected token {tok!r}")


def countdown_evaluate(text: str) -> tuple[Fraction, list[int]]:
    """Value of the expression in `text` and the numbers it uses, in order.

    Raises Malformed for anything outside the grammar and ZeroDivisionError for a division by zero.
    """
    if len(text) > MAX_EXPRESSION_CHARS:
        raise Malformed("completion too long")
    parser = _Parser(_tokenize(text))
    value = parser.expr(0)
    if parser.peek() is not None:
        raise Malformed(f"trailing token {parser.peek()!r}")
    return value, parser.numbers


def countdown_check(numbers: list[int], target: int, completion: str) -> bool:
    """True iff `completion` is an expression over a sub-multiset of `numbers` equal to `target`."""
    try:
        value, used = countdown_evaluate(completion)
    except (Malformed, ZeroDivisionError):
        return False
    if Counter(used) - Counter(numbers):  # some number unlisted or used more often than given
        return False
    return value == target



def _countdown_gold(gold: Any) -> tuple[list[int], int]:
    if not isinstance(gold, Mapping):
        raise TypeError(f"countdown gold must be a mapping with 'target' and 'nums', got {type(gold).__name__}")
    nums = gold["nums"] if "nums" in gold else gold["numbers"]
    return [int(n) for n in nums], int(gold["target"])


def countdown_expression(completion: str) -> str | None:
    """The expression inside the last <answer></answer> pair, stripped; None if absent."""
    inner = last_answer_tag(clean_text(completion))
    return None if inner is None else inner.strip()


@SCORERS.register("countdown", answer_format="answer_tags")
def score_countdown(completion: str, gold: Any) -> float:
    """1.0 iff the <answer> expression hits the target using each given number at most once."""
    nums, target = _countdown_gold(gold)
    expr = countdown_expression(completion)
    if expr is None or len(expr) > MAX_EXPRESSION_CHARS:
        return 0.0
    return float(countdown_check(nums, target, expr))


@SCORERS.register("countdown_all", answer_format="answer_tags")
def score_countdown_all(completion: str, gold: Any) -> float:
    """1.0 iff the <answer> expression hits the target using every given number exactly once (TinyZero)."""
    nums, target = _countdown_gold(gold)
    expr = countdown_expression(completion)
    if expr is None or len(expr) > MAX_EXPRESSION_CHARS:
        return 0.0
    try:
        value, used = countdown_evaluate(expr)
    except (Malformed, ZeroDivisionError):
        return 0.0
    return float(Counter(used) == Counter(nums) and value == target)


# ---- format checks -----------------------------------------------------------------------------------


@ANSWER_FORMATS.register("boxed")
def has_boxed(completion: str) -> bool:
    return bool((last_boxed(clean_text(completion)) or "").strip())


@ANSWER_FORMATS.register("gsm8k")
def has_gsm8k_answer(completion: str) -> bool:
    return _GSM8K_ANSWER.search(clean_text(completion)) is not None


@ANSWER_FORMATS.register("answer_line")
def has_answer_line(completion: str) -> bool:
    return _ANSWER_LINE.search(clean_text(completion)[-DAPO_TAIL_CHARS:]) is not None


@ANSWER_FORMATS.register("answer_tags")
def has_answer_tags(completion: str) -> bool:
    return last_answer_tag(clean_text(completion)) is not None


class Reward:
    """A scorer with a time limit and an optional format bonus: what a task calls per completion.

    `correct(completion, gold)` is the verdict (accuracy, pass@k); `__call__` is the training reward:
    1.0 if correct, else `format_weight` if the completion has the expected format, else 0.0.
    """

    def __init__(self, scorer: str = "math_verify", *, format_weight: float = 0.0, format: str | None = None,
                 time_limit_s: float | None = 5.0, time_limit_mode: str = "auto"):
        entry = SCORERS.entry(scorer)  # a bad name: ValueError naming it and the valid choices
        fmt = entry.meta["answer_format"] if format is None else format
        self.format_check = ANSWER_FORMATS.get(fmt)
        if not 0.0 <= float(format_weight) < 1.0:
            raise ValueError(f"format_weight must be in [0, 1) so a correct answer (1.0) outranks format alone, "
                             f"got {format_weight}")
        if time_limit_mode not in MODES:
            raise ValueError(f"unknown time_limit_mode {time_limit_mode!r}; valid: {', '.join(MODES)}")
        self.scorer_name, self.format_name = scorer, fmt
        self.scorer, self.setup = entry.obj, entry.meta.get("setup")
        self.format_weight = float(format_weight)
        self.time_limit_s = time_limit_s
        self.time_limit_mode = time_limit_mode
        self.stats: Counter[str] = Counter()  # calls, timeouts, errors: for logging

    def __repr__(self) -> str:
        return (f"Reward({self.scorer_name!r}, format_weight={self.format_weight}, format={self.format_name!r}, "
                f"time_limit_s={self.time_limit_s})")

    def correct(self, completion: Any, gold: Any) -> bool:
        """Whether the completion's answer is right. Never raises: a timeout or a scorer error is 'wrong'."""
        self.stats["calls"] += 1
        text = clean_text(completion)
        try:
            value = call_with_time_limit(self.scorer, text, gold, seconds=self.time_limit_s,
                                         mode=self.time_limit_mode, setup=self.setup)
        except ScoreTimeout:
            self.stats["timeouts"] += 1
            return False
        except TimeLimitUnavailable:  # the machinery, not the completion, failed: say so
            raise
        except Exception:  # a scorer bug or a malformed gold must not stop a training run
            self.stats["errors"] += 1
            logging.getLogger(__name__).debug("reward scorer %s raised", self.scorer_name, exc_info=True)
            return False
        return value >= 1.0

    def __call__(self, completion: Any, gold: Any) -> float:
        if self.correct(completion, gold):
            return 1.0
        if self.format_weight > 0.0 and self.format_check(clean_text(completion)):
            return self.format_weight
        return 0.0

    def take_stats(self) -> Counter[str]:
        """The counts (calls, timeouts, errors) since the last call, and start counting afresh."""
        stats, self.stats = self.stats, Counter()
        return stats


def scorer_metrics(task: Any, prefix: str) -> dict[str, float]:
    """`<prefix>/scorer_timeouts` and `<prefix>/scorer_errors`: completions the task's scorer gave up on (time
    limit) or failed on since the last call, scored 0 either way. Empty for tasks without a `Reward` (the
    synthetic tasks' checkers are linear-time and cannot time out)."""
    rewarder = getattr(task, "rewarder", None)
    if not isinstance(rewarder, Reward):
        return {}
    stats = rewarder.take_stats()
    return {f"{prefix}/scorer_timeouts": float(stats["timeouts"]), f"{prefix}/scorer_errors": float(stats["errors"])}
