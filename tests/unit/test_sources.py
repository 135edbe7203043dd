"""Loading splits from local copies in the hub layouts, the offline error, bad files, deterministic splits."""

from __future__ import annotations

import json
import os
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bench.tasks import sources
from bench.tasks.sources import (
    DataSourceError,
    HubUnavailableError,
    holdout,
    is_local,
    iter_rows,
    load_split,
    resolve_split,
    subsample,
)

FIXTURES = os.path.join(os.path.dirname(__file__), os.pardir, "fixtures", "data")


def fixture(*parts: str) -> str:
    return os.path.normpath(os.path.join(FIXTURES, *parts))


# ---- every fixture, folder and file form -----------------------------------------------------------------

LAYOUTS = [  # (folder, config, split, the file it resolves to, rows, a column)
    ("gsm8k", "main", "train", "main/train-00000-of-00001.parquet", 12, "question"),
    ("gsm8k", "main", "test", "main/test-00000-of-00001.parquet", 4, "question"),
    ("math500", None, "test", "test.jsonl", 5, "unique_id"),
    ("dapo_math", None, "train", "data/dapo-math-17k.parquet", 24, "reward_model"),
    ("deepscaler", None, "train", "deepscaler.json", 12, "solution"),
    ("aime24", None, "train", "data/train-00000-of-00001.parquet", 4, "year"),
    ("aime25", None, "test", "test.jsonl", 4, "id"),
    ("aime26", None, "train", "data/train-00000-of-00001.parquet", 4, "problem_idx"),
    ("amc23", None, "train", "data/train-00000-of-00001.parquet", 4, "url"),
    ("minerva", None, "test", "test.jsonl", 4, "question"),
    ("olympiadbench", None, "test", "test.jsonl", 4, "final_answer"),
    ("countdown_tasks", None, "train", "data/train-00000-of-00001.parquet", 40, "nums"),
]


@pytest.mark.parametrize("folder, config, split, rel, n, column", LAYOUTS)
def test_fixture_folders_resolve_like_hub_snapshots(folder, config, split, rel, n, column):
    resolved = resolve_split(fixture(folder), split, config=config)
    assert resolved.kind == "files" and resolved.paths == (fixture(folder, rel),)
    rows = load_split(fixture(folder), split, config=config, required=[column])
    assert len(rows) == n and all(column in r for r in rows)
    assert load_split(fixture(folder, rel), split, required=[column]) == rows  # the file itself: same rows


@pytest.mark.parametrize("folder, config, split, rel, n, column", LAYOUTS)
def test_rows_equal_what_the_datasets_library_reads(folder, config, split, rel, n, column, tmp_path):
    import datasets

    path = fixture(folder, rel)
    builder = "parquet" if path.endswith(".parquet") else "json"
    ds = datasets.load_dataset(builder, data_files={split: path}, split=split, cache_dir=str(tmp_path))
    assert load_split(path, split) == ds.to_list()


def test_nested_columns_come_back_as_dicts_and_lists():
    row = load_split(fixture("dapo_math"), "train")[0]
    assert row["prompt"][0]["role"] == "user" and row["prompt"][0]["content"].startswith("Solve the following")
    assert set(row["reward_model"]) == {"ground_truth", "style"} and isinstance(row["extra_info"]["index"], str)
    cd = load_split(fixture("countdown_tasks"), "train")[0]
    assert isinstance(cd["nums"], list) and all(isinstance(x, int) for x in cd["nums"]) and isinstance(cd["target"], int)
    assert isinstance(load_split(fixture("amc23"), "train")[0]["answer"], float)


# ---- other local layouts -------------------------------------------------------------------------------


def write_jsonl(path, rows) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return str(path)


ROWS = [{"problem": f"p{i}", "answer": str(i)} for i in range(6)]


@pytest.mark.parametrize(
    "files, split, expected",
    [
        (["train.jsonl", "test.jsonl"], "test", ["test.jsonl"]),
        (["train.parquet", "train.jsonl"], "train", ["train.parquet"]),  # one format per split, parquet first
        (["data/test.jsonl"], "test", ["data/test.jsonl"]),
        (["test/part-0.jsonl", "test/part-1.jsonl"], "test", ["test/part-0.jsonl", "test/part-1.jsonl"]),
        (["train-00000-of-00002.parquet", "train-00001-of-00002.parquet", "test-00000-of-00001.parquet"], "train",
         ["train-00000-of-00002.parquet", "train-00001-of-00002.parquet"]),
        (["train_part.jsonl"], "train", ["train_part.jsonl"]),
        (["data/everything.parquet"], "train", ["data/everything.parquet"]),  # no split name: the train split
        (["README.md", "notes.txt", "all.jsonl"], "train", ["all.jsonl"]),
    ],
)
def test_folder_layouts(tmp_path, files, split, expected):
    for rel in files:
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if rel.endswith(".parquet"):
            pq.write_table(pa.Table.from_pylist(ROWS), path)
        elif rel.endswith(".jsonl"):
            write_jsonl(path, ROWS)
        else:
            path.write_text("not data")
    resolved = resolve_split(str(tmp_path), split)
    assert [os.path.relpath(p, tmp_path) for p in resolved.paths] == expected
    assert load_split(str(tmp_path), split) == ROWS * len(expected)


def test_split_less_files_are_train_only(tmp_path):
    write_jsonl(tmp_path / "data" / "all.jsonl", ROWS)
    with pytest.raises(DataSourceError, match="no 'test' split.*all.jsonl.*'train' split"):
        resolve_split(str(tmp_path), "test")


def test_config_subfolders(tmp_path):
    for config in ("main", "socratic"):
        write_jsonl(tmp_path / config / "test.jsonl", [{"problem": config, "answer": "1"}])
    assert load_split(str(tmp_path), "test", config="socratic") == [{"problem": "socratic", "answer": "1"}]
    with pytest.raises(DataSourceError, match="set task.config to one of its subfolders: main, socratic"):
        resolve_split(str(tmp_path), "test")
    assert load_split(str(tmp_path / "main"), "test", config="main")[0]["problem"] == "main"  # pointed inside


def test_missing_split_lists_what_is_there(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", ROWS)
    with pytest.raises(DataSourceError) as err:
        resolve_split(str(tmp_path), "test")
    msg = str(err.value)
    assert str(tmp_path) in msg and "'test'" in msg and "found: train.jsonl" in msg and "save_to_disk" in msg
    assert "\n" not in msg


def test_save_to_disk_folders(tmp_path):
    import datasets

    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS[:4]),
                               "test": datasets.Dataset.from_list(ROWS[4:])})
    dd.save_to_disk(str(tmp_path / "dict"))
    assert load_split(str(tmp_path / "dict"), "test") == ROWS[4:]
    assert resolve_split(str(tmp_path / "dict"), "train").kind == "saved"
    with pytest.raises(DataSourceError, match="no split 'validation'; splits: train, test"):
        load_split(str(tmp_path / "dict"), "validation")
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "single"))
    assert load_split(str(tmp_path / "single"), "train") == ROWS
    # the .arrow file inside is a data file on its own too (datasets' IPC stream format)
    arrow = [f for f in os.listdir(tmp_path / "single") if f.endswith(".arrow")][0]
    assert load_split(str(tmp_path / "single" / arrow), "train") == ROWS


def test_arrow_ipc_file_format(tmp_path):
    path = tmp_path / "test.arrow"
    table = pa.Table.from_pylist(ROWS)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    assert load_split(str(tmp_path), "test") == ROWS


def test_json_array_and_bom(tmp_path):
    path = tmp_path / "train.json"
    path.write_text("\ufeff" + json.dumps(ROWS), encoding="utf-8")
    assert load_split(str(path), "train") == ROWS


# ---- hub ids and the offline error ---------------------------------------------------------------------


@pytest.mark.parametrize("source, local", [
    ("openai/gsm8k", False), ("gsm8k", False), ("HuggingFaceH4/MATH-500", False), ("a.b-c/d_e.f", False),
    ("/abs/path", True), ("./rel", True), ("~/x", True), ("data/train.parquet", True), ("a/b/c", True),
    ("x.jsonl", True),
])
def test_is_local(source, local):
    assert is_local(source) is local


def test_existing_relative_folder_is_local_even_if_it_looks_like_a_hub_id(tmp_path, monkeypatch):
    (tmp_path / "openai" / "gsm8k").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert is_local("openai/gsm8k")


def test_offline_hub_dataset_error_says_how_to_use_a_local_copy(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubUnavailableError) as err:
        load_split("qrl-bench-tests/not-cached-anywhere", "train", config="main")
    msg = str(err.value)
    assert "'qrl-bench-tests/not-cached-anywhere'" in msg and "split 'train'" in msg and "config 'main'" in msg
    assert "offline mode is on (HF_HUB_OFFLINE=1)" in msg
    assert "task.source=/path/to/copy" in msg and "main/train-00000-of-00001.parquet" in msg
    assert "save_to_disk" in msg and "hf download qrl-bench-tests/not-cached-anywhere --repo-type dataset" in msg
    assert "\n" not in msg
    assert isinstance(err.value, ConnectionError)


def test_unreachable_message_without_offline_mode_names_the_network_error(monkeypatch):
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    resolved = resolve_split("openai/gsm8k", "test", config="main")
    msg = sources.hub_unavailable_message(resolved, ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub"))
    assert "the Hugging Face Hub is unreachable (Couldn't reach 'openai/gsm8k' on the Hub)" in msg
    assert "task.source=/path/to/copy" in msg


def test_missing_local_path_is_a_file_not_found_naming_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file or folder.*nope.jsonl"):
        load_split(str(tmp_path / "nope.jsonl"), "train")
    with pytest.raises(ValueError, match="task.source is not set"):
        load_split("", "train")


# ---- bad files: one line naming the file ----------------------------------------------------------------


def one_line_error(path: str, split: str = "train", **kw) -> str:
    with pytest.raises(DataSourceError) as err:
        load_split(path, split, **kw)
    msg = str(err.value)
    assert "\n" not in msg and path in msg, msg
    return msg


def test_non_utf8_jsonl(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_bytes(b'{"problem": "caf\xe9", "answer": "1"}\n')
    assert "not UTF-8 text (byte 0xe9 at offset 16)" in one_line_error(str(path))


def test_corrupt_and_truncated_parquet(tmp_path):
    bad = tmp_path / "train.parquet"
    bad.write_bytes(os.urandom(2048))
    assert "not a readable parquet file" in one_line_error(str(bad))
    good = fixture("countdown_tasks", "data", "train-00000-of-00001.parquet")
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(open(good, "rb").read()[:-200])
    assert "parquet" in one_line_error(str(cut))


def test_empty_files(tmp_path):
    for name in ("train.jsonl", "train.parquet", "train.json", "train.arrow"):
        (tmp_path / name).write_bytes(b"")
        assert "the file is empty" in one_line_error(str(tmp_path / name))
    (tmp_path / "blank.jsonl").write_text("\n  \n")
    assert "only whitespace" in one_line_error(str(tmp_path / "blank.jsonl"))
    (tmp_path / "none.json").write_text("[]")
    assert "no rows" in one_line_error(str(tmp_path / "none.json"))
    pq.write_table(pa.table({"problem": pa.array([], pa.string())}), tmp_path / "zero.parquet")
    assert "has no rows" in one_line_error(str(tmp_path / "zero.parquet"))


def test_invalid_json_names_the_line(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"problem": "a", "answer": "1"}\n{"problem": "b", "answer": \n')
    assert "line 2: invalid JSON" in one_line_error(str(path))
    arr = tmp_path / "arr.json"
    arr.write_text('[1, 2]')
    assert "element 1: expected a JSON object" in one_line_error(str(arr))


def test_missing_columns_list_found_and_needed(tmp_path):
    msg = one_line_error(fixture("gsm8k", "main", "test-00000-of-00001.parquet"), required=["problem", "answer"])
    assert "missing column(s) problem; columns found: question, answer; needed: problem, answer" in msg
    path = write_jsonl(str(tmp_path / "train.jsonl"), [{"problem": "a", "answer": "1"}, {"problem": "b"}])
    assert "line 2: missing column(s) answer; columns found: problem" in one_line_error(path, required=["problem", "answer"])


def test_unsupported_extension(tmp_path):
    path = tmp_path / "train.csv"
    path.write_text("problem,answer\na,1\n")
    assert "not a data file" in one_line_error(str(path))


def test_a_copied_fixture_folder_with_a_broken_shard_names_the_shard(tmp_path):
    shutil.copytree(fixture("gsm8k"), tmp_path / "gsm8k")
    shard = tmp_path / "gsm8k" / "main" / "test-00000-of-00001.parquet"
    shard.write_bytes(b"PAR1garbage")
    assert str(shard) in one_line_error(str(tmp_path / "gsm8k"), "test", config="main")


def test_iter_rows_is_lazy_for_large_files():
    resolved = resolve_split(fixture("countdown_tasks"), "train")
    it = iter_rows(resolved)
    assert next(it)["target"] > 0  # rows stream in batches; nothing forces the whole file into a list


# ---- deterministic splits and subsets --------------------------------------------------------------------


def test_holdout_is_a_function_of_the_seed():
    rows = list(range(100))
    train, test = holdout(rows, 10, seed=7)
    assert len(test) == 10 and len(train) == 90 and sorted(train + test) == rows
    assert holdout(rows, 10, seed=7) == (train, test)
    assert holdout(rows, 10, seed=8)[1] != test
    assert test == sorted(test) and train == sorted(train)  # file order kept inside each part


def test_holdout_rejects_impossible_sizes():
    with pytest.raises(ValueError, match="cannot hold out 5 test rows from 5"):
        holdout([1, 2, 3, 4, 5], 5, seed=0)
    with pytest.raises(ValueError, match=">= 0"):
        holdout([1, 2], -1, seed=0)


def test_subsample_is_seeded_nested_and_optional():
    rows = list(range(50))
    a = subsample(rows, 20, seed=3)
    assert a == subsample(rows, 20, seed=3) and a != subsample(rows, 20, seed=4)
    assert subsample(rows, 10, seed=3) == a[:10]  # smaller limits are prefixes: nested subsets
    assert sorted(subsample(rows, None, seed=3)) == rows and subsample(rows, None, seed=3) != rows  # shuffled
    assert subsample(rows, 5, seed=3, shuffle=False) == [0, 1, 2, 3, 4]
    assert subsample(rows, 0, seed=3, shuffle=False) == rows


# ---- the hub path, through datasets.load_dataset (a local repository folder stands in for the hub) --------


@pytest.fixture
def private_datasets_cache(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.mark.parametrize("folder, config, split", [("aime24", None, "train"), ("gsm8k", "main", "test"),
                                                   ("dapo_math", None, "train"), ("math500", None, "test")])
def test_hub_loading_path_reads_the_same_rows(private_datasets_cache, folder, config, split):
    """datasets.load_dataset accepts a repository folder, so the hub code path runs here without a network."""
    as_hub = sources.ResolvedSplit(fixture(folder), split, None, "hub")
    expected = load_split(fixture(folder), split, config=config)
    if config:  # load_dataset on a whole repo folder would mix configs; point it at the config's files
        as_hub = sources.ResolvedSplit(fixture(folder, config), split, None, "hub")
    assert list(iter_rows(as_hub)) == expected
    assert os.listdir(private_datasets_cache)  # it went through datasets' own cache


def test_hub_loading_path_errors_name_the_dataset(private_datasets_cache):
    as_hub = sources.ResolvedSplit(fixture("aime24"), "validation", None, "hub")
    with pytest.raises(DataSourceError, match=r"hub dataset '.*aime24', split 'validation': .*"):
        list(iter_rows(as_hub))
    with pytest.raises(DataSourceError, match="missing column.*needed: question"):
        list(iter_rows(sources.ResolvedSplit(fixture("aime24"), "train", None, "hub"), required=["question"]))
