"""The long-answer chain task: format, reward on right / wrong / malformed chains, determinism, lengths."""

from __future__ import annotations

import pytest

from bench.tasks.base import build_task
from bench.tasks.chain import ChainTask, ChainTaskConfig

SMALL = dict(n_train=300, n_test=50)
# The docstring example: start 17, then a: +7 -> 24, b: -3 -> 21, c: +9 -> 30, d: -2 -> 28.
EX = {"start": 17, "ops": [("+", 7), ("-", 3), ("+", 9), ("-", 2)], "values": [24, 21, 30, 28], "answer": 28}
RIGHT = "a+7=24;b-3=21;c+9=30;d-2=28#28"


def chain(**kw) -> ChainTask:
    return ChainTask(ChainTaskConfig(**{**SMALL, **kw}))


def test_registered_and_accepts_omegaconf_nodes():
    from omegaconf import OmegaConf

    assert isinstance(build_task(ChainTaskConfig(**SMALL)), ChainTask)
    task = build_task(OmegaConf.structured(ChainTaskConfig(**SMALL)))
    assert len(task.examples("test")) == 50 and task.fingerprint()["cfg"]["max_steps"] == 16


def test_prompt_and_target_format():
    task = chain()
    assert task.prompt(EX) == "17:a+7b-3c+9d-2="
    assert task.target(EX) == RIGHT
    assert task.step_texts(EX) == ["a+7=24", "b-3=21", "c+9=30", "d-2=28"]
    assert len(RIGHT) == task.target_length(4) == 4 * 6 + 3 + 1 + 2  # 4 steps, 3 ';', '#', 2 digits


def test_fields_are_zero_padded_to_fixed_width():
    task = chain(value_digits=3, max_operand=25, max_new_tokens=300)
    ex = {"start": 5, "ops": [("+", 7), ("+", 20)], "values": [12, 32], "answer": 32}
    assert task.prompt(ex) == "005:a+07b+20="
    assert task.target(ex) == "a+07=012;b+20=032#032"
    assert task.reward(ex, "a+07=012;b+20=032#032") == 1.0
    assert task.reward(ex, "a+7=12;b+20=32#32") == 0.0  # unpadded is not the canonical chain


@pytest.mark.parametrize("mode", ["exact", "final", "prefix"])
def test_right_chain_scores_one_in_every_mode(mode):
    task = chain(reward_mode=mode)
    assert task.reward(EX, RIGHT) == 1.0
    assert task.reward(EX, "  " + RIGHT + "\n") == 1.0  # surrounding whitespace is fine


# (completion, exact, final, prefix): prefix = leading right steps / (4 steps + 1)
CASES = [
    # wrong intermediate value, propagated consistently: final wrong too
    ("a+7=24;b-3=22;c+9=31;d-2=29#29", 0.0, 0.0, 1 / 5),
    # wrong intermediate, but the final value right (compensating error): only the outcome reward is fooled
    ("a+7=24;b-3=22;c+9=30;d-2=28#28", 0.0, 1.0, 1 / 5),
    # every step right, wrong final value
    ("a+7=24;b-3=21;c+9=30;d-2=28#27", 0.0, 0.0, 4 / 5),
    # every step right, final missing (e.g. EOS too early)
    ("a+7=24;b-3=21;c+9=30;d-2=28", 0.0, 0.0, 4 / 5),
    # wrong operand copied from the prompt (value consistent with the wrong operand)
    ("a+7=24;b-4=20;c+9=29;d-2=27#27", 0.0, 0.0, 1 / 5),
    # wrong label
    ("a+7=24;c-3=21;c+9=30;d-2=28#28", 0.0, 1.0, 1 / 5),
    # wrong first value
    ("a+7=25;b-3=22;c+9=31;d-2=29#29", 0.0, 0.0, 0.0),
    # a step skipped
    ("a+7=24;c+9=33;d-2=31#31", 0.0, 0.0, 1 / 5),
    # an extra step after the correct ones
    ("a+7=24;b-3=21;c+9=30;d-2=28;e+1=29#29", 0.0, 0.0, 4 / 5),
]


@pytest.mark.parametrize("completion, exact, final, prefix", CASES)
def test_wrong_chains(completion, exact, final, prefix):
    for mode, want in (("exact", exact), ("final", final), ("prefix", prefix)):
        assert chain(reward_mode=mode).reward(EX, completion) == pytest.approx(want), mode


MALFORMED = [
    "",
    "#28",  # the answer without the chain
    "28",
    "a+7=24;b-3=21;c+9=30;d-2=28#28#28",  # two answers
    "a+7=24;b-3=21;c+9=30;d-2=28# 28",
    "a+7=24 ;b-3=21;c+9=30;d-2=28#28",
    "a+7=24;b-3=21;c+9=30;d-2=028#028",
    "a+7=24;b-3=21;c+9=30;d-2=28#28.0",
    "a+07=24;b-3=21;c+9=30;d-2=28#28",
    "a + 7 = 24; b - 3 = 21; c + 9 = 30; d - 2 = 28 #28",
    "a+7=24;b-3=21;c+9",  # truncated mid-step (max_new_tokens hit)
    "a+7=24;b-3=21;c+9=30;d-2=28#2",  # truncated answer
    "a+7=24\nb-3=21\nc+9=30\nd-2=28#28",
    "__import__('os').system('true')#28",
    "eval('24')",
    "a+7=24;b-3=21;c+9=30;d-2=28#28<eos>",
    "a+7=24;b-3=21;c+9=30;d-2=28#\u0662\u0668",  # Arabic-Indic digits
    ";;;;#",
]


@pytest.mark.parametrize("completion", MALFORMED)
def test_malformed_chains_score_zero_exact(completion):
    assert chain().reward(EX, completion) == 0.0


def test_malformed_chains_get_at_most_their_right_prefix():
    task = chain(reward_mode="prefix")
    assert task.reward(EX, "a+7=24;b-3=21;c+9") == 2 / 5  # truncated after two right steps
    assert task.reward(EX, "garbage") == 0.0
    assert task.reward(EX, "a+7=24;b-3=21;c+9=30;d-2=28#28#28") == 4 / 5  # steps right, answer malformed
    assert task.reward(EX, "a+7=24 ;b-3=21;c+9=30;d-2=28#28") == 0.0  # first step not exactly right


def test_overlong_completion_is_zero_even_if_it_starts_right():
    task = chain(reward_mode="prefix")
    long = RIGHT + ";" + "a+1=01;" * 100
    assert task.reward(EX, long) == 0.0
    assert task.reward(EX, "(" * 100_000) == 0.0


def test_examples_are_correct_chains_within_range():
    task = chain(min_steps=3, max_steps=6, max_operand=5)
    for ex in task.examples("train") + task.examples("test"):
        assert 3 <= len(ex["ops"]) <= 6 and 0 <= ex["start"] <= 99
        value = ex["start"]
        for (op, k), v in zip(ex["ops"], ex["values"]):
            assert op in "+-" and 1 <= k <= 5
            value = value + k if op == "+" else value - k
            assert v == value and 0 <= v <= 99
        assert ex["answer"] == value
        assert task.reward(ex, task.target(ex)) == 1.0


def test_splits_are_deterministic_and_disjoint():
    a, b = chain(), chain()
    assert [a.prompt(e) for e in a.examples("train")] == [b.prompt(e) for e in b.examples("train")]
    test = {a.prompt(e) for e in a.examples("test")}
    assert len(test) == 50 and not test & {a.prompt(e) for e in a.examples("train")}
    other = chain(data_seed=7)
    assert [a.prompt(e) for e in a.examples("test")] != [other.prompt(e) for e in other.examples("test")]
    assert a.sample(3, 8, seed=0) == b.sample(3, 8, seed=0) != a.sample(4, 8, seed=0)


def test_test_split_is_stable_when_n_train_changes():
    assert chain().examples("test") == chain(n_train=100).examples("test")


def test_default_response_length_is_50_to_200_tokens():
    """One character per token (the built-in tokenizer) + EOS: the defaults give 59-115 tokens."""
    task = ChainTask(ChainTaskConfig())
    lengths = [len(task.target(ex)) + 1 for ex in task.examples("train") + task.examples("test")]
    assert min(lengths) == task.target_length(8) + 1 == 8 * 7 + 2 + 1 == 59
    assert max(lengths) == task.target_length(16) + 1 == 115 <= ChainTaskConfig().max_new_tokens
    assert sorted(lengths)[len(lengths) // 2] == 12 * 7 + 3  # steps uniform in 8..16: median 12 steps


def test_length_is_controlled_by_the_number_of_steps():
    task = chain(min_steps=20, max_steps=20, max_new_tokens=143)
    assert {len(task.target(ex)) for ex in task.examples("train")} == {20 * 7 + 2}
    with pytest.raises(ValueError, match="max_new_tokens"):
        chain(min_steps=20, max_steps=20)  # the default budget (120) is for 16 steps


def test_bad_configs_fail_naming_the_key():
    with pytest.raises(ValueError, match="min_steps"):
        chain(min_steps=5, max_steps=4)
    with pytest.raises(ValueError, match="max_steps"):
        chain(max_steps=53, max_new_tokens=1000)
    with pytest.raises(ValueError, match="max_operand"):
        chain(max_operand=100)
    with pytest.raises(ValueError, match="reward_mode"):
        chain(reward_mode="partial")
    with pytest.raises(ValueError, match="max_new_tokens"):
        chain(max_new_tokens=114)  # a 16-step chain is 114 characters + EOS
    chain(max_new_tokens=115)  # exactly enough
