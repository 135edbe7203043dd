"""Reward scorers on right, wrong, malformed and adversarial completions; the time limit on slow ones."""

from __future__ import annotations

import threading
import time

import pytest

from bench.rewards import (
    Reward,
    clean_text,
    gsm8k_gold,
    last_answer_tag,
    last_boxed,
    normalize_final_answer,
    score_countdown,
    score_countdown_all,
    score_dapo,
    score_gsm8k_strict,
    score_math_verify,
)
from bench.registry import ANSWER_FORMATS, SCORERS

HUGE = "1" + "0" * 10_000  # 10**10000 as text: more digits than int() converts by default
NESTED = "\\boxed{" + "{" * 3000 + "42" + "}" * 3000 + "}"  # takes sympy/latex2sympy well over 5 s
LIMIT_S = 1.0
# No test here bounds the wall time of a scoring call (issue 32 F8: a loaded machine stretches any such bound).
# That the limit acted is an event: the scorer's timeout count, and a result only a cut call gives (NESTED alone
# takes ~50 s, measured on an EPYC); a call that hangs trips the hang guard (pyproject.toml: pytest-timeout).
# The limit of the tests that check answers, not the timer: generous, because a first \sqrt or \pi after the
# warm-up took 1.1 s on a loaded 2-core machine (0.1 s idle), and a right answer cut by the timer scores 0.
SCORE_LIMIT_S = 60.0


def scored(reward: Reward, completion, gold):
    """The score and the wall time of one call (a lower bound on it holds on any machine; no upper bound does)."""
    t0 = time.monotonic()
    value = reward(completion, gold)
    return value, time.monotonic() - t0


@pytest.fixture(scope="module")
def math_reward() -> Reward:
    """For tests of the scores (right, wrong, malformed)."""
    return Reward("math_verify", time_limit_s=SCORE_LIMIT_S)


@pytest.fixture(scope="module")
def limited_reward() -> Reward:
    """For tests of the time limit: slow completions are cut after LIMIT_S."""
    return Reward("math_verify", time_limit_s=LIMIT_S)


# ---- helpers -----------------------------------------------------------------------------------------


def test_clean_text_handles_bytes_surrogates_and_none():
    assert clean_text(b"\\boxed{4\xff2}") == "\\boxed{4\ufffd2}"
    assert clean_text("ok \udcff\ud800 end") == "ok ?? end"
    assert clean_text(None) == "" and clean_text("plain") == "plain"


def test_last_boxed_is_balanced_and_takes_the_last():
    assert last_boxed("a \\boxed{1} b \\boxed{\\frac{1}{2}} c") == "\\frac{1}{2}"
    assert last_boxed("\\fbox{7}") == "7"
    assert last_boxed("\\boxed{1") is None and last_boxed("no box") is None
    assert last_boxed("\\boxed{" * 5000) is None  # unbalanced spam: linear scan, no answer


def test_last_answer_tag():
    assert last_answer_tag("<answer>1</answer> <answer> 2+3 </answer>") == " 2+3 "
    assert last_answer_tag("<answer>1") is None and last_answer_tag("1</answer>") is None
    assert last_answer_tag("<answer>" * 20_000 + "</answer>") == ""


# ---- math_verify -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "completion, gold",
    [
        ("Adding up, the total is $\\boxed{42}$.", "42"),
        ("so the answer is \\boxed{\\frac{1}{2}}", "\\frac12"),
        ("so the answer is \\boxed{0.5}", "\\frac{1}{2}"),
        ("The final answer is 1/2", "\\frac{1}{2}"),  # plain-expression extraction, no LaTeX
        ("\\boxed{\\dfrac{14}{3}}", "\\frac{14}{3}"),
        ("We get \\boxed{(3, \\frac{\\pi}{2})}", "\\left( 3, \\frac{\\pi}{2} \\right)"),  # a MATH-500 answer
        ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}"),
        ("Therefore $x = \\boxed{5}$", "5"),
        ("The answer is \\boxed{142}", 142.0),  # AMC golds are float64 in the hub file
    ],
)
def test_math_verify_right(math_reward, completion, gold):
    assert math_reward(completion, gold) == 1.0
    assert score_math_verify(completion, gold) == 1.0


@pytest.mark.parametrize(
    "completion, gold",
    [
        ("\\boxed{41}", "42"),
        ("\\boxed{\\frac{1}{3}}", "\\frac12"),
        ("\\boxed{41} or maybe \\boxed{42}", "42"),  # two different answers: a set, not the gold
        ("first \\boxed{41}, no: \\boxed{41+1}", "42"),  # a revision keeps both boxes: still a set
        ("The answer is x", "42"),
    ],
)
def test_math_verify_wrong(math_reward, completion, gold):
    assert math_reward(completion, gold) == 0.0


@pytest.mark.parametrize(
    "completion",
    ["", "   ", "no numbers here at all", "\\boxed{", "\\boxed{}", "}}}{{{", "\\frac{", "$$$$", "\x00\x01\x02"],
)
def test_math_verify_malformed_is_zero(math_reward, completion):
    assert math_reward(completion, "42") == 0.0


def test_math_verify_non_utf8_and_surrogates(math_reward):
    assert math_reward(b"\xff\xfe the answer is \\boxed{42} \x80", "42") == 1.0
    assert math_reward("\udcff\ud800 the answer is \\boxed{42}", "42") == 1.0
    assert math_reward("\udcff" * 1000, "42") == 0.0


def test_math_verify_huge_number(limited_reward):
    assert limited_reward(f"\\boxed{{{HUGE}}}", "42") == 0.0
    assert limited_reward(f"The answer is {HUGE}", HUGE) in (0.0, 1.0)  # no exception either way


def test_math_verify_boxed_spam(limited_reward):
    empty_spam = "\\boxed{}" * 5000
    assert limited_reward(empty_spam, "42") == 0.0
    hedge = "".join(f"\\boxed{{{i}}}" for i in range(2000))  # every answer from 0 to 1999, 42 among them
    assert limited_reward(hedge, "42") == 0.0


def test_math_verify_slow_completion_is_cut_by_the_time_limit(limited_reward):
    """Deeply nested braces take latex2sympy ~50 s; the limit cuts the call: counted as a timeout (the event that
    says the limit acted), scored 0, and not before the limit (a lower bound holds under any load)."""
    before = limited_reward.stats["timeouts"]
    value, wall = scored(limited_reward, NESTED, "42")
    assert value == 0.0 and wall >= LIMIT_S * 0.9
    assert limited_reward.stats["timeouts"] == before + 1
    assert limited_reward("\\boxed{42}", "42") == 1.0  # and scoring carries on normally


@pytest.mark.parametrize("tower", ["\\boxed{10^{10^{10}}}", "\\boxed{9^{9^{9}}}", "\\boxed{(10^{100000})!}"])
def test_math_verify_power_towers_are_bounded(limited_reward, tower):
    assert limited_reward(tower, "42") == 0.0  # bounded: a tower evaluated in full would trip the hang guard


def test_math_verify_limit_holds_in_a_worker_thread():
    """Outside the main thread the scorer runs in the helper process (bench/run/timelimit.py)."""
    reward = Reward("math_verify", time_limit_s=LIMIT_S)
    out: dict = {}

    def run():
        out["right"] = reward("\\boxed{\\frac{84}{2}}", "42")
        out["slow"] = reward(NESTED, "42")

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert out["right"] == 1.0
    assert out["slow"] == 0.0 and reward.stats["timeouts"] == 1  # cut: NESTED in full takes ~50 s


# ---- gsm8k_strict ------------------------------------------------------------------------------------


def test_gsm8k_gold():
    assert gsm8k_gold("Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 1,072") == "1072"
    assert gsm8k_gold(" 18 ") == "18"


@pytest.mark.parametrize(
    "completion, ok",
    [
        ("She earns 9 * 2 = 18 dollars.\n#### 18", True),
        ("#### 18.0", True),
        ("#### $18", True),
        ("####18", True),
        ("first #### 17, correcting: #### 18", True),  # the last one counts
        ("#### 1,8", True),  # commas are dropped, as in the gold
        ("#### 17", False),
        ("#### 18\nno wait #### 19", False),
        ("The answer is 18", False),  # strict: no '####', no credit
        ("\\boxed{18}", False),
        ("", False),
        ("#### ", False),
        ("#### -18", False),
        (f"#### {HUGE}", False),
        ("####" * 10_000, False),
    ],
)
def test_gsm8k_strict(completion, ok):
    assert score_gsm8k_strict(completion, "Reasoning... #### 18") == float(ok)


def test_gsm8k_strict_thousands_and_negatives():
    assert score_gsm8k_strict("#### 1,072", "#### 1,072") == 1.0
    assert score_gsm8k_strict("#### -3", "-3") == 1.0
    assert score_gsm8k_strict(b"#### 18 \xff", "18") == 1.0


# ---- dapo --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "completion, gold, ok",
    [
        ("Step 1 ... so the result is 34.\nAnswer: 34", "34", True),
        ("...\nanswer: 34", "34", True),  # case-insensitive
        ("...\nAnswer: $34$", "34", True),
        ("...\nAnswer: \\boxed{34}", "34", True),
        ("...\nAnswer: 1,000", "1000", True),
        ("...\nAnswer: x = 5", "5", True),  # the part after '='
        ("...\nAnswer: \\dfrac{1}{2}", "\\frac{1}{2}", True),
        ("...\nAnswer: \\frac12", "\\frac{1}{2}", True),
        ("...\nAnswer: 12 degrees", "12", True),
        ("Answer: 33\nAnswer: 34", "34", True),  # the last line counts
        ("...\nAnswer: 35", "34", False),
        ("no answer line, but \\boxed{34}", "34", True),  # verl's \boxed{} fallback
        ("no answer line, no box: 34", "34", False),
        ("", "34", False),
        ("Answer:", "34", False),
        ("Answer:   34   \n", "34", True),
        ("Answer: 34 is what I get", "34", False),  # Minerva matching is exact after normalisation
        ("Answer: 34\n" + "x" * 400, "34", False),  # outside the last 300 characters
        (f"Answer: {HUGE}", "34", False),
    ],
)
def test_dapo(completion, gold, ok):
    assert score_dapo(completion, gold) == float(ok)


def test_normalize_final_answer():
    assert normalize_final_answer("\\$1,000.") == "1000"
    assert normalize_final_answer("\\text{(B)}") == "(B)"
    assert normalize_final_answer("The answer is $42$ dollars") == "42"
    assert normalize_final_answer("\\tfrac{3}{4}") == "\\frac{3}{4}"
    assert normalize_final_answer("\\sqrt2") == "\\sqrt{2}"
    assert normalize_final_answer("90^\\circ") == "90"


# ---- countdown ---------------------------------------------------------------------------------------

GOLD = {"target": 24, "nums": [3, 4, 6]}


@pytest.mark.parametrize(
    "completion, ok",
    [
        ("<think>4*6 = 24</think>\n<answer>4*6</answer>", True),  # a subset is fine: each at most once
        ("<answer> (6 - 3) * 4 * 2 </answer>", False),  # 2 is not given
        ("<answer>(6/3)*4*3</answer>", False),  # 3 used twice
        ("<answer>6*4</answer>", True),
        ("<answer>3*(4+6)-6</answer>", False),
        ("<answer>24</answer>", False),  # 24 is not a given number
        ("4*6", False),  # no tags
        ("<answer>4*6", False),
        ("<answer>4*6 = 24</answer>", False),
        ("<answer>__import__('os').system('true')</answer>", False),
        ("<answer>4**6</answer>", False),
        ("<answer>6/(4-4)</answer>", False),
        (f"<answer>{HUGE}</answer>", False),
        ("<answer>" + "(" * 5000 + "4*6" + ")" * 5000 + "</answer>", False),
        ("<answer>1</answer><answer>4*6</answer>", True),  # the last answer counts
        ("<answer>" * 10_000, False),
        ("", False),
    ],
)
def test_countdown(completion, ok):
    assert score_countdown(completion, GOLD) == float(ok)


def test_countdown_accepts_the_numbers_key_and_all_numbers_variant():
    assert score_countdown("<answer>4*6</answer>", {"target": 24, "numbers": [3, 4, 6]}) == 1.0
    assert score_countdown_all("<answer>4*6</answer>", GOLD) == 0.0  # TinyZero: every number exactly once
    assert score_countdown_all("<answer>(6-3+1)*6</answer>", {"target": 24, "nums": [6, 3, 1, 6]}) == 1.0
    assert score_countdown_all("<answer>6*4*(6/6)</answer>", GOLD) == 0.0


# ---- Reward: format bonus, registry, never raising ----------------------------------------------------


def test_format_weight_scores_wrong_but_well_formatted_answers():
    reward = Reward("math_verify", format_weight=0.1, time_limit_s=SCORE_LIMIT_S)
    assert reward("\\boxed{42}", "42") == 1.0
    assert reward("\\boxed{41}", "42") == pytest.approx(0.1)
    assert reward("41", "42") == 0.0
    assert reward("\\boxed{}", "42") == 0.0  # an empty box is not an answer
    countdown = Reward("countdown", format_weight=0.1)
    assert countdown("<answer>4+6</answer>", GOLD) == pytest.approx(0.1)
    assert countdown("<answer>4*6</answer>", GOLD) == 1.0 and countdown("4*6", GOLD) == 0.0
    gsm = Reward("gsm8k_strict", format_weight=0.2)
    assert gsm("#### 17", "18") == pytest.approx(0.2) and gsm("17", "18") == 0.0
    dapo = Reward("dapo", format_weight=0.2)
    assert dapo("Answer: 1", "2") == pytest.approx(0.2) and dapo("1", "2") == 0.0
    assert Reward("math_verify", format="answer_tags", format_weight=0.5)("<answer>1</answer>", "2") == 0.5


def test_reward_config_errors_name_the_valid_choices():
    with pytest.raises(ValueError, match="countdown, countdown_all, dapo, gsm8k_strict, math_verify"):
        Reward("gsm9k")
    with pytest.raises(ValueError, match="answer_line, answer_tags, boxed, gsm8k"):
        Reward("dapo", format="xml")
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        Reward("dapo", format_weight=1.0)
    with pytest.raises(ValueError, match="auto, process"):
        Reward("dapo", time_limit_mode="thread")
    assert set(SCORERS.names()) == {"math_verify", "gsm8k_strict", "dapo", "countdown", "countdown_all"}
    assert set(ANSWER_FORMATS.names()) == {"boxed", "gsm8k", "answer_line", "answer_tags"}
    # each scorer declares its answer format, which is a registered one
    assert all(e.meta["answer_format"] in ANSWER_FORMATS for e in SCORERS.entries())


def test_reward_never_raises_on_a_bad_gold():
    reward = Reward("countdown")
    assert reward("<answer>4*6</answer>", "not a mapping") == 0.0
    assert reward("<answer>4*6</answer>", {"target": "x", "nums": [4, 6]}) == 0.0
    assert reward.stats["errors"] == 2 and reward.stats["calls"] == 2


@pytest.mark.parametrize("name", SCORERS.names())
def test_every_scorer_survives_hostile_text(name):
    gold = GOLD if name.startswith("countdown") else "42"
    reward = Reward(name, format_weight=0.1, time_limit_s=LIMIT_S)
    for completion in ["", b"\xff\xfe\x00", "\udcff" * 50, "\\boxed{}" * 2000, "{" * 5000, f"#### {HUGE}",
                       "<answer>" * 2000, "Answer: " * 2000, "\n" * 10_000]:
        assert reward(completion, gold) in (0.0, 0.1), (name, completion[:20])
