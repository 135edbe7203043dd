"""Tasks: reward functions on right, wrong and malformed completions; deterministic, disjoint splits."""

from __future__ import annotations

import dataclasses
import json

import pytest

from bench.tasks.arithmetic import ArithmeticTaskConfig
from bench.tasks.countdown import CountdownTaskConfig
from bench.tasks.jsonl import JsonlTaskConfig
from bench.tasks.arithmetic import ArithmeticTask
from bench.tasks.base import GeneratedTask, build_task
from bench.registry import TASKS
from bench.rewards import countdown_check as check, countdown_evaluate as evaluate
from bench.tasks.countdown import CountdownTask, format_tree
from bench.tasks.jsonl import JsonlTask

SMALL = dict(n_train=300, n_test=50)


def arithmetic(**kw) -> ArithmeticTask:
    return ArithmeticTask(ArithmeticTaskConfig(**{**SMALL, **kw}))


def countdown(**kw) -> CountdownTask:
    return CountdownTask(CountdownTaskConfig(**{**SMALL, **kw}))


#: every registered synthetic task: a new one gets the split and reward properties below without editing a list
GENERATED = [n for n in TASKS.names() if issubclass(TASKS.get(n), GeneratedTask)]


def generated(name: str, **kw) -> GeneratedTask:
    return build_task(TASKS.schema(name)(name=name, **{**SMALL, **kw}))


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture
def jsonl_task(tmp_path) -> JsonlTask:
    train = write_jsonl(tmp_path / "train.jsonl", [{"question": f"{i}+1", "answer": i + 1} for i in range(20)])
    test = write_jsonl(tmp_path / "test.jsonl", [{"question": "7+1", "answer": "8"}, {"question": "x", "answer": "#### 1,000"}])
    return JsonlTask(JsonlTaskConfig(train_file=train, test_file=test))


# ---- registry ----------------------------------------------------------------------------------------


def test_build_task_by_name_and_unknown_name_lists_valid_ones():
    assert isinstance(build_task(ArithmeticTaskConfig(**SMALL)), ArithmeticTask)
    assert isinstance(build_task(CountdownTaskConfig(**SMALL)), CountdownTask)
    with pytest.raises(ValueError, match="arithmetic.*countdown.*jsonl"):
        build_task(dataclasses.replace(ArithmeticTaskConfig(), name="gsm9k"))


def test_build_task_accepts_omegaconf_nodes():
    from omegaconf import OmegaConf

    task = build_task(OmegaConf.structured(ArithmeticTaskConfig(**SMALL)))
    assert len(task.examples("test")) == 50 and task.fingerprint()["cfg"]["ops"] == ["+", "-"]


# ---- arithmetic --------------------------------------------------------------------------------------


def test_arithmetic_format_and_reward():
    task = arithmetic()
    ex = {"a": 37, "b": 5, "op": "+", "answer": 42}
    assert task.prompt(ex) == "37+5=" and task.target(ex) == "42"
    assert task.reward(ex, "42") == 1.0
    assert task.reward(ex, "  42\n") == 1.0  # surrounding whitespace is fine
    for wrong in ["41", "-42", "0"]:
        assert task.reward(ex, wrong) == 0.0
    for malformed in ["", "4 2", "42.0", "042", "+42", "42=", "forty-two", "42<eos>", "4\u0662"]:
        assert task.reward(ex, malformed) == 0.0, malformed


def test_arithmetic_negative_and_zero_answers_parse_canonically():
    task = arithmetic(ops=["*"])
    assert task.reward({"answer": 0}, "0") == 1.0 and task.reward({"answer": 0}, "-0") == 0.0
    assert task.reward({"answer": -7}, "-7") == 1.0


def test_arithmetic_examples_respect_config_and_targets_are_correct():
    task = arithmetic(min_digits=2, max_digits=3, ops=["*", "-"])
    for ex in task.examples("train") + task.examples("test"):
        assert 10 <= ex["a"] <= 999 and 10 <= ex["b"] <= 999 and ex["op"] in ("*", "-")
        assert task.reward(ex, task.target(ex)) == 1.0
        if ex["op"] == "-":
            assert ex["answer"] >= 0  # larger operand first
    assert {ex["op"] for ex in task.examples("train")} == {"*", "-"}


def test_arithmetic_rejects_unknown_ops():
    with pytest.raises(ValueError, match="valid ops"):
        arithmetic(ops=["^"])


# ---- countdown checker -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "completion, ok",
    [
        ("3*5+7", True),
        (" 7+3*5 \n", True),
        ("(3+5)*7-34", False),  # 34 is not a given number
        ("5*3+7", True),
        ("7*3+5", False),  # = 26
        ("3*5+7+7", False),  # 7 used twice but given once
        ("7+15", False),  # 15 is not given (no concatenating digits)
        ("5*(7-3)+6", False),
        ("(((3*5)))+7", True),
        ("3 * 5 + 7", True),
        ("", False),
        ("3*5+", False),
        ("3*5+7)", False),
        ("(3*5+7", False),
        ("3**5", False),
        ("-3+5*5", False),  # no unary minus; 5 twice anyway
        ("3*5+7=22", False),
        ("22", False),
        ("3.0*5+7", False),
        ("03*5+7", False),
        ("__import__('os').system('true')", False),
        ("eval('3*5+7')", False),
        ("[3,5,7]", False),
        ("3*5+7#", False),
    ],
)
def test_countdown_check(completion, ok):
    assert check([3, 5, 7], 22, completion) is ok


def test_countdown_division_is_exact_rational():
    assert check([4, 6, 8], 3, "(6+8)/4") is False  # 3.5
    assert check([4, 6, 8], 12, "6/4*8") is True  # 1.5 * 8: fractions are exact
    assert check([2, 3, 9], 6, "9/3*2") is True
    assert check([1, 3, 3], 1, "3/3") is True  # a subset of the numbers is fine


def test_countdown_division_by_zero_is_zero_reward_not_an_error():
    assert check([2, 2, 5], 5, "5/(2-2)") is False
    task = countdown()
    assert task.reward({"numbers": [2, 2, 5], "target": 5, "solution": "x"}, "5/(2-2)") == 0.0


def test_countdown_repeated_numbers_count_as_a_multiset():
    assert check([2, 2, 5], 20, "2*2*5") is True
    assert check([2, 5, 7], 20, "2*2*5") is False


def test_countdown_parser_is_bounded_on_hostile_input():
    assert check([1, 2], 1, "(" * 5000 + "1" + ")" * 5000) is False  # too long, no RecursionError
    assert check([1, 2], 1, "(" * 40 + "1" + ")" * 40) is False  # too deep
    value, used = evaluate("(" * 10 + "1" + ")" * 10)
    assert value == 1 and used == [1]


def test_format_tree_uses_only_needed_parentheses():
    assert format_tree(("-", 9, ("-", 5, 2))) == "9-(5-2)"
    assert format_tree(("-", ("-", 9, 5), 2)) == "9-5-2"
    assert format_tree(("*", ("+", 1, 2), 3)) == "(1+2)*3"
    assert format_tree(("/", 8, ("*", 2, 2))) == "8/(2*2)"
    assert format_tree(("+", 1, ("*", 2, 3))) == "1+2*3"


def test_countdown_instances_are_solvable_with_their_reference():
    task = countdown(n_numbers=4, max_number=12)
    for ex in task.examples("train") + task.examples("test"):
        assert len(ex["numbers"]) == 4 and all(1 <= n <= 12 for n in ex["numbers"]) and ex["target"] > 0
        assert task.reward(ex, task.target(ex)) == 1.0
        assert task.prompt(ex) == " ".join(map(str, ex["numbers"])) + f">{ex['target']}:"


def test_small_problem_space_gives_a_smaller_split_instead_of_hanging():
    task = countdown(n_numbers=2, max_number=3, n_train=10_000, n_test=5)
    train = task.examples("train")
    assert len(task.examples("test")) == 5 and 0 < len(train) < 100


# ---- jsonl -------------------------------------------------------------------------------------------


def test_jsonl_numeric_exact_match(jsonl_task):
    ex, gsm = jsonl_task.examples("test")
    assert jsonl_task.prompt(ex) == "7+1=" and jsonl_task.target(ex) == "8"
    assert jsonl_task.reward(ex, "8") == jsonl_task.reward(ex, " 8.0 ") == 1.0
    for bad in ["9", "8 apples", "", "eight", "8/1"]:
        assert jsonl_task.reward(ex, bad) == 0.0
    assert jsonl_task.target(gsm) == "1000" and jsonl_task.reward(gsm, "1000") == 1.0


def test_jsonl_train_excludes_test_questions(tmp_path):
    train = write_jsonl(tmp_path / "a.jsonl", [{"q": "1+1", "a": 2}, {"q": "2+2", "a": 4}])
    test = write_jsonl(tmp_path / "b.jsonl", [{"q": "2+2", "a": 4}])
    task = JsonlTask(JsonlTaskConfig(train_file=train, test_file=test, question_field="q", answer_field="a"))
    assert [ex["question"] for ex in task.examples("train")] == ["1+1"]


def test_jsonl_non_numeric_answer_is_a_clear_error(tmp_path):
    train = write_jsonl(tmp_path / "a.jsonl", [{"question": "capital of France", "answer": "Paris"}])
    task = JsonlTask(JsonlTaskConfig(train_file=train, test_file=train))
    with pytest.raises(ValueError, match="not a number"):
        task.examples("test")


# ---- splits and sampling (all tasks) -----------------------------------------------------------------


@pytest.fixture(params=[*GENERATED, "jsonl"])
def any_task(request, jsonl_task):
    return jsonl_task if request.param == "jsonl" else generated(request.param)


def test_right_answer_gets_one_and_garbage_gets_zero(any_task):
    for ex in any_task.examples("test"):
        assert any_task.reward(ex, any_task.target(ex)) == 1.0
        assert any_task.reward(ex, "?!") == 0.0


def test_train_and_test_are_disjoint(any_task):
    train = {any_task.prompt(ex) for ex in any_task.examples("train")}
    test = [any_task.prompt(ex) for ex in any_task.examples("test")]
    assert train and test and not train & set(test)
    assert len(test) == len(set(test))


def test_the_synthetic_tasks_are_found_in_the_registry():
    assert {"arithmetic", "chain", "countdown"} <= set(GENERATED) and "jsonl" not in GENERATED


@pytest.mark.parametrize("name", GENERATED)
def test_splits_are_a_function_of_data_seed(name):
    a, b, c = generated(name), generated(name), generated(name, data_seed=99)
    assert a.examples("train") == b.examples("train") and a.examples("test") == b.examples("test")
    assert a.examples("test") != c.examples("test")


@pytest.mark.parametrize("name", GENERATED)
def test_test_split_does_not_depend_on_n_train(name):
    assert generated(name, n_train=100).examples("test") == generated(name, n_train=200).examples("test")


def test_sample_is_a_pure_function_of_seed_and_step(any_task):
    n = min(8, len(any_task.examples("train")))
    first = any_task.sample(step=3, n_prompts=n, seed=0)
    assert any_task.sample(step=3, n_prompts=n, seed=0) == first
    fresh = type(any_task)(any_task.cfg)  # a resumed run builds a new task object
    assert fresh.sample(step=3, n_prompts=n, seed=0) == first
    train_prompts = {any_task.prompt(ex) for ex in any_task.examples("train")}
    assert all(any_task.prompt(ex) in train_prompts for ex in first)


def test_sample_varies_with_step_and_seed_and_has_no_repeats_within_a_step():
    task = arithmetic()
    s = task.sample(step=0, n_prompts=16, seed=0)
    assert s != task.sample(step=1, n_prompts=16, seed=0) and s != task.sample(step=0, n_prompts=16, seed=1)
    assert len({task.prompt(ex) for ex in s}) == 16
    assert len(task.sample(step=0, n_prompts=1000, seed=0)) == 1000  # more than the split: with replacement


def test_unknown_split_is_an_error():
    with pytest.raises(ValueError, match="train, test"):
        arithmetic().examples("validation")
