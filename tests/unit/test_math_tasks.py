"""The benchmark tasks (math sets, Countdown-Tasks) on their hub-schema fixtures: loading, prompts, rewards, splits."""

from __future__ import annotations

import dataclasses
import os
import shutil

import pytest

from bench.tasks.base import build_task
from bench.tasks.countdown_tasks import (
    COUNTDOWN_RESPONSE_PREFIX,
    COUNTDOWN_SYSTEM,
    CountdownTasksConfig,
    CountdownTasksTask,
    solve,
)
from bench.tasks.hub_task import HubTask, fill
from bench.tasks.math_sets import (
    BOXED_PROMPT,
    DAPO_PREFIX,
    Aime24Task,
    Aime25Task,
    Aime26Task,
    Amc23Task,
    DapoMathTask,
    DeepScaleRTask,
    Gsm8kTask,
    Math500Task,
    MinervaTask,
    OlympiadBenchTask,
    olympiad_answer,
)
from bench.tasks.sources import DataSourceError, HubUnavailableError

FIXTURES = os.path.normpath(os.path.join(os.path.dirname(__file__), os.pardir, "fixtures", "data"))
ALL_TASKS: dict[str, type[HubTask]] = {
    t.name: t for t in (Gsm8kTask, Math500Task, DapoMathTask, DeepScaleRTask, Aime24Task, Aime25Task, Aime26Task, Amc23Task,
                        MinervaTask, OlympiadBenchTask, CountdownTasksTask)
}

# Per task: the fixture file (file form), overrides that make the fixture a sensible size, train/test sizes.
CASES = {
    "gsm8k": ("main/train-00000-of-00001.parquet", {}, 12, 4),
    "math500": ("test.jsonl", {}, 0, 5),
    "dapo_math": ("data/dapo-math-17k.parquet", {"test_size": 2}, 6, 2),
    "deepscaler": ("deepscaler.json", {"test_size": 3}, 9, 3),
    "aime24": ("data/train-00000-of-00001.parquet", {}, 0, 4),
    "aime25": ("test.jsonl", {}, 0, 4),
    "aime26": ("data/train-00000-of-00001.parquet", {}, 0, 4),
    "amc23": ("data/train-00000-of-00001.parquet", {}, 0, 4),
    "minerva": ("test.jsonl", {}, 0, 4),
    "olympiadbench": ("test.jsonl", {}, 0, 4),
    "countdown_tasks": ("data/train-00000-of-00001.parquet", {"test_size": 8}, 32, 8),
}


def make(name: str, **overrides) -> HubTask:
    cls = ALL_TASKS[name]
    rel, defaults, _, _ = CASES[name]
    cfg = cls.config_class(**{"source": os.path.join(FIXTURES, name), "reward_time_limit_s": 5.0,
                              **defaults, **overrides})
    return cls(cfg)


def test_every_hub_task_has_a_case():
    assert set(CASES) == set(ALL_TASKS) == {"gsm8k", "math500", "dapo_math", "deepscaler", "aime24", "aime25",
                                            "aime26", "amc23", "minerva", "olympiadbench", "countdown_tasks"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_loads_from_the_fixture_folder(name):
    task = make(name)
    _, _, n_train, n_test = CASES[name]
    train, test = task.examples("train"), task.examples("test")
    assert (len(train), len(test)) == (n_train, n_test)
    for ex in train + test:
        assert ex["id"] and ex["answer"] not in ("", None)
        assert task.prompt(ex) and task.messages(ex)[-1]["role"] == "user"


@pytest.mark.parametrize("name", sorted(CASES))
def test_loads_from_the_fixture_file(name):
    rel, _, n_train, n_test = CASES[name]
    path = os.path.join(FIXTURES, name, rel)
    if name == "gsm8k":  # one file is one split: hold out the test split from it
        task = make(name, source=path, test_split=None, test_size=3)
        assert (len(task.examples("train")), len(task.examples("test"))) == (9, 3)
    else:
        task = make(name, source=path)
        assert (len(task.examples("train")), len(task.examples("test"))) == (n_train, n_test)
        assert task.examples("test") == make(name).examples("test")  # the same rows as the folder form


@pytest.mark.parametrize("name", sorted(CASES))
def test_reference_completions_earn_full_reward(name):
    task = make(name)
    for ex in task.examples("train")[:5] + task.examples("test"):
        target = task.target(ex)
        assert task.correct(ex, target), (name, target)
        assert task.reward(ex, target) == 1.0
        assert task.reward(ex, "I don't know.") == 0.0


@pytest.mark.parametrize("name", sorted(CASES))
def test_splits_are_deterministic_and_disjoint(name):
    a, b = make(name), make(name)
    assert a.examples("train") == b.examples("train") and a.examples("test") == b.examples("test")
    assert not {a.key(ex) for ex in a.examples("train")} & {a.key(ex) for ex in a.examples("test")}
    n = min(3, len(a.examples("train")))
    if n:
        fresh = type(a)(a.cfg)
        assert fresh.sample(step=5, n_prompts=n, seed=1) == a.sample(step=5, n_prompts=n, seed=1)


@pytest.mark.parametrize("name", sorted(CASES))
def test_accepts_dict_and_omegaconf_configs(name):
    from omegaconf import OmegaConf

    task = make(name)
    as_dict = dataclasses.asdict(task.cfg)
    assert type(task)(as_dict).examples("test") == task.examples("test")
    node = OmegaConf.structured(task.cfg)
    assert type(task)(node).examples("test") == task.examples("test")


# ---- data_seed, subsets, holdout ------------------------------------------------------------------------


def test_data_seed_changes_order_and_subsets_but_not_membership_of_published_splits():
    a, b = make("gsm8k"), make("gsm8k", data_seed=99)
    assert a.examples("train") != b.examples("train")  # shuffled differently
    assert sorted(ex["id"] for ex in a.examples("train")) == sorted(ex["id"] for ex in b.examples("train"))


def test_max_train_and_max_test_are_nested_seeded_subsets():
    full = make("countdown_tasks")
    small, smaller = make("countdown_tasks", max_train=10, max_test=4), make("countdown_tasks", max_train=5)
    assert len(small.examples("train")) == 10 and len(small.examples("test")) == 4
    assert smaller.examples("train") == small.examples("train")[:5] == full.examples("train")[:5]
    assert small.examples("test") == full.examples("test")[:4]
    assert make("countdown_tasks", max_train=10, data_seed=5).examples("train") != small.examples("train")


def test_held_out_test_split_does_not_depend_on_train_settings():
    base = make("countdown_tasks")
    for other in (make("countdown_tasks", max_train=3), make("countdown_tasks", shuffle=False)):
        assert {base.key(ex) for ex in other.examples("test")} == {base.key(ex) for ex in base.examples("test")}
    moved = make("countdown_tasks", data_seed=7)
    assert {base.key(ex) for ex in moved.examples("test")} != {base.key(ex) for ex in base.examples("test")}
    assert len(moved.examples("test")) == 8 and len(moved.examples("train")) == 32


def test_shuffle_false_keeps_file_order():
    task = make("gsm8k", shuffle=False, max_train=3)
    assert [ex["id"] for ex in task.examples("train")] == ["train-0", "train-1", "train-2"]


def test_eval_only_sets_have_no_training_split():
    task = make("aime24")
    assert task.examples("train") == []
    with pytest.raises(ValueError, match="no training examples"):
        task.sample(step=0, n_prompts=1, seed=0)


# ---- per-task formats -----------------------------------------------------------------------------------


def test_gsm8k_gold_prompt_and_strict_variant():
    task = make("gsm8k", shuffle=False)
    ex = task.examples("test")[0]
    assert ex["answer"] == "199500"  # "#### 199,500": text after '#### ', commas removed
    assert "<<" not in task.target(ex) and task.target(ex).endswith("The final answer is $\\boxed{199500}$.")
    assert task.prompt(ex) == ex["problem"] + " Let's think step by step and output the final answer within \\boxed{}."
    strict = make("gsm8k", reward="gsm8k_strict", shuffle=False)
    assert strict.prompt(ex).endswith('output the final answer after "####".')
    assert strict.target(ex).endswith("#### 199500") and strict.reward(ex, "so #### 199,500") == 1.0
    assert strict.reward(ex, "\\boxed{199500}") == 0.0


def test_math500_keeps_metadata_and_uses_the_worked_solution_as_target():
    task = make("math500", shuffle=False)
    ex = task.examples("test")[1]
    assert ex["id"] == "test/prealgebra/102.json" and ex["level"] == 1 and ex["subject"] == "Prealgebra"
    assert task.target(ex) == ex["solution"]
    assert task.reward(ex, "Adding, we get $\\boxed{0.75}$.") == 1.0  # math-verify: 3/4 == 0.75
    assert task.reward(ex, "\\boxed{\\frac{4}{3}}") == 0.0


def test_dapo_dedups_and_sends_its_own_prompt():
    task = make("dapo_math")
    examples = task.examples("train") + task.examples("test")
    assert len(examples) == 8  # 24 hub rows, every problem 3 times
    ex = examples[0]
    assert task.messages(ex) == ex["dataset_messages"] and ex["dataset_messages"][0]["content"].startswith(DAPO_PREFIX)
    assert not ex["problem"].startswith("Solve") and ex["problem"].startswith("Let $f(x)")
    assert task.prompt(ex) == ex["dataset_messages"][0]["content"]
    assert task.reward(ex, f"...\nAnswer: {ex['answer']}") == 1.0 and task.reward(ex, f"\\boxed{{{ex['answer']}}}") == 1.0
    boxed = make("dapo_math", reward="math_verify")
    assert boxed.prompt(ex) == fill(BOXED_PROMPT, problem=ex["problem"])


def test_matharena_ids_and_int_answers():
    task = make("aime26", shuffle=False)
    first = task.examples("test")[0]
    assert (first["id"], first["answer"]) == ("1", "55") and task.reward(first, "\\boxed{55}") == 1.0


def test_amc_float_answers_become_integers():
    task = make("amc23", shuffle=False)
    ex = task.examples("test")[0]
    assert ex["answer"] == "156" and task.reward(ex, "\\boxed{156}") == 1.0


def test_olympiadbench_gold_is_its_answer_list_without_math_delimiters():
    assert olympiad_answer(["$\\frac{1}{2}$"]) == "\\frac{1}{2}"
    assert olympiad_answer(["$2$, $3$"]) == olympiad_answer(["$2$", "$3$"]) == "2, 3"
    assert olympiad_answer(["\\$5"]) == "\\$5"  # an escaped dollar is text, not a delimiter
    task = make("olympiadbench", shuffle=False)
    one, half, both, shared = task.examples("test")
    assert (one["answer"], half["answer"], both["answer"]) == ("8", "\\frac{1}{2}", "2, 3")
    assert task.reward(half, "so $x = \\boxed{0.5}$") == 1.0 and task.reward(half, "\\boxed{2}") == 0.0
    # several answers are one set: any order counts, one of them does not
    assert task.reward(both, "\\boxed{3, 2}") == 1.0 and task.reward(both, "\\boxed{2}") == 0.0
    # a problem's shared setting (`context`) comes before its question, in the prompt too
    assert shared["problem"].startswith("Let $a_{k+1}") and shared["problem"].endswith("compute $a_3$.")
    assert task.prompt(shared).startswith(shared["problem"])


def test_minerva_reads_question_and_answer_columns():
    task = make("minerva", shuffle=False)
    sci = task.examples("test")[3]
    assert sci["problem"].startswith("Write $0.00042$") and sci["answer"] == "4.2 \\times 10^{-4}"
    assert task.reward(sci, "\\boxed{0.00042}") == 1.0 and task.reward(sci, "\\boxed{4.2 \\times 10^{-3}}") == 0.0


def test_prompt_template_and_system_prompt_override():
    task = make("aime24", prompt_template="Problem: {problem}\nPut the answer in \\boxed{}.", system_prompt="Be brief.")
    ex = task.examples("test")[0]
    assert task.prompt(ex) == f"Problem: {ex['problem']}\nPut the answer in \\boxed{{}}."
    assert task.messages(ex) == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": task.prompt(ex)}]


def test_countdown_prompt_follows_tinyzero():
    task = make("countdown_tasks", shuffle=False)
    ex = task.examples("train")[0]
    msgs = task.messages(ex)
    assert msgs[0] == {"role": "system", "content": COUNTDOWN_SYSTEM}
    assert msgs[1]["content"].startswith(f"Using the numbers {ex['nums']}, create an equation that equals {ex['target']}.")
    assert "<answer> </answer> tags" in msgs[1]["content"]
    assert task.response_prefix == COUNTDOWN_RESPONSE_PREFIX
    assert task.target(ex).endswith("</answer>") and task.reward(ex, task.target(ex)) == 1.0


def test_countdown_rewards_and_format_weight():
    task = make("countdown_tasks", format_weight=0.1)
    ex = {"nums": [3, 4, 6], "target": 24, "answer": {"target": 24, "nums": [3, 4, 6]}}
    assert task.reward(ex, "<answer>4*6</answer>") == 1.0
    assert task.reward(ex, "<answer>4+6</answer>") == pytest.approx(0.1)
    assert task.reward(ex, "4*6") == 0.0
    assert not task.correct(ex, "<answer>4+6</answer>")
    strict = make("countdown_tasks", reward="countdown_all")
    assert strict.reward(ex, "<answer>4*6</answer>") == 0.0


def test_solver_finds_full_solutions_when_they_exist():
    assert solve((1, 2, 3, 4), 24) is not None
    assert solve((7, 7, 7, 7), 1000) is None
    expr = solve((44, 19, 35), 98)
    assert sorted(int(t) for t in expr.replace("(", " ").replace(")", " ").replace("+", " ").replace("-", " ")
                  .replace("*", " ").replace("/", " ").split()) == [19, 35, 44]


# ---- configuration and source errors --------------------------------------------------------------------


def test_config_errors_say_what_to_set():
    with pytest.raises(ValueError, match="both null"):
        make("math500", train_split=None, test_split=None)
    with pytest.raises(ValueError, match="both 'train'.*test_split=null and test_size=N"):
        make("gsm8k", test_split="train")
    with pytest.raises(ValueError, match="test_size must be > 0"):
        make("countdown_tasks", test_size=0)
    with pytest.raises(ValueError, match="task.reward='exact' is not valid; choose one of: countdown, countdown_all"):
        make("gsm8k", reward="exact")
    with pytest.raises(ValueError, match="no default prompt for reward 'countdown'.*set task.prompt_template"):
        make("gsm8k", reward="countdown")


def test_one_file_for_two_splits_is_an_error_with_the_fix():
    task = make("gsm8k", source=os.path.join(FIXTURES, "gsm8k", "main", "train-00000-of-00001.parquet"))
    with pytest.raises(DataSourceError, match="same file.*task.test_split=null and task.test_size=N"):
        task.examples("train")


def test_schema_mismatch_names_file_and_row(tmp_path):
    shutil.copytree(os.path.join(FIXTURES, "math500"), tmp_path / "m")
    with open(tmp_path / "m" / "test.jsonl", "a") as f:
        f.write('{"problem": "", "solution": "s", "answer": "1", "subject": "x", "level": 1, "unique_id": "u"}\n')
    with pytest.raises(DataSourceError, match=r"test.jsonl \(split 'test'\) row 5: does not fit the math500 schema"):
        make("math500", source=str(tmp_path / "m")).examples("test")
    with pytest.raises(DataSourceError, match="missing column.*needed: question, answer"):
        make("gsm8k", source=os.path.join(FIXTURES, "math500"), test_split=None, test_size=1,
             train_split="test").examples("train")


def test_default_hub_source_offline_says_how_to_point_at_a_local_copy():
    task = Math500Task(Math500Task.config_class())
    assert task.cfg.source == "HuggingFaceH4/MATH-500"
    try:
        task.examples("test")
    except HubUnavailableError as err:
        assert "'HuggingFaceH4/MATH-500'" in str(err) and "task.source=/path/to/copy" in str(err)
    else:
        pytest.skip("MATH-500 is in this machine's datasets cache")


def test_fingerprint_hashes_local_files(tmp_path):
    shutil.copytree(os.path.join(FIXTURES, "aime25"), tmp_path / "a")
    before = make("aime25", source=str(tmp_path / "a")).fingerprint()
    assert before["task"] == "aime25" and before["source_sha256"]["test"]
    with open(tmp_path / "a" / "test.jsonl", "a") as f:
        f.write('{"problem": "New?", "answer": "1", "id": "9"}\n')
    assert make("aime25", source=str(tmp_path / "a")).fingerprint() != before
    assert "source_sha256" not in Aime24Task(Aime24Task.config_class()).fingerprint()  # hub id: no files to hash


def test_task_classes_by_name():
    assert {cls.name for cls in ALL_TASKS.values()} == set(ALL_TASKS)
    assert all(build_task(cls.config_class()).cfg.name == name for name, cls in ALL_TASKS.items())
    assert Gsm8kTask.config_class().config == "main" and DapoMathTask.config_class().reward == "dapo"
    assert Amc23Task.config_class().test_split == "train" and CountdownTasksConfig().test_split is None
