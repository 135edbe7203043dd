"""A datasets-backed task: question/answer JSONL files with a numeric exact-match reward.

This is how users bring their own data (e.g. a GSM8K export) without network access: the files are read
through `datasets.load_dataset("json", ...)`, the same loader a hub data set would use, so caching and
formats behave as users expect. Answers must be numbers; a GSM8K-style "reasoning #### 42" answer keeps
the part after the last "####". The completion must be just a number (surrounding whitespace allowed)
equal to the answer as an exact rational ("42", "42.0" and "42.00" are all the same number).
The prompt is `task.prompt_template` with the question filled in (default "{question}=", the format of the
synthetic tasks, so a JSONL of "37+5" questions behaves like the arithmetic task).
"""

from __future__ import annotations

import hashlib
import os
import random
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from omegaconf import MISSING

from bench.rewards import gsm8k_gold
from bench.tasks.base import Example, Task, GeneratedTaskConfig, stable_seed
from bench.registry import TASKS

_NUMBER = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")


def parse_number(text: str) -> Fraction | None:
    """The decimal number written in `text` (whitespace around allowed), or None if it is anything else."""
    s = text.strip()
    return Fraction(s) if _NUMBER.fullmatch(s) else None


def _full_path(path: str) -> str:
    return os.path.abspath(os.path.expanduser(str(path)))


def _missing(path: str | None, key: str) -> str | None:
    """Why task.<key> names no JSONL file (None: it does)."""
    if path is None or str(path) in ("", "???"):
        return f"task.{key} is not set: pass a JSONL file, e.g. task.{key}=data/train.jsonl"
    if not os.path.isfile(_full_path(path)):
        return f"task.{key}: JSONL file '{path}' not found (resolved to {_full_path(path)})"
    return None


def check_jsonl(path: str, fields: tuple[str, ...]) -> None:
    """ValueError naming the file (and line) for what the datasets loader reports badly or not at all: an
    empty file, bytes that are not UTF-8, a line that is not a JSON object, a row without a required field."""
    import json

    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    n_rows = 0
    for lineno, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{path} line {lineno}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column {e.start + 1})") from None
        try:
            row = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} line {lineno}: not valid JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path} line {lineno}: expected a JSON object, got {type(row).__name__}")
        missing = [k for k in fields if k not in row]
        if missing:
            raise ValueError(f"{path} line {lineno}: no field {', '.join(map(repr, missing))} (its fields: "
                             f"{', '.join(map(repr, row))}; set task.question_field / task.answer_field)")
        n_rows += 1
    if n_rows == 0:
        raise ValueError(f"{path}: empty JSONL file (no rows)")


def _file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass
class JsonlTaskConfig(GeneratedTaskConfig):
    """A datasets-backed task: question/answer JSONL files, numeric exact-match reward."""

    max_new_tokens: int = 8
    train_file: str = MISSING
    test_file: str = MISSING
    question_field: str = "question"
    answer_field: str = "answer"
    prompt_template: str = "{question}="  # str.format with the question; the completion is the bare number

    def check(self) -> None:
        super().check()
        for key in ("train_file", "test_file"):  # a typo fails at start-up, not at the first evaluation
            if why := _missing(getattr(self, key), key):
                raise ValueError(why)


@TASKS.register("jsonl", schema=JsonlTaskConfig)
class JsonlTask(Task):

    def __init__(self, cfg: Any):
        super().__init__(cfg)
        self.files = {"train": _full_path(cfg.train_file), "test": _full_path(cfg.test_file)}

    def _load(self, split: str) -> list[Example]:
        import datasets

        path = self.files[split]
        qf, af = self.cfg.question_field, self.cfg.answer_field
        check_jsonl(path, (qf, af))  # a clear message before datasets' own errors (StopIteration, KeyError)
        shown = datasets.is_progress_bar_enabled()
        datasets.disable_progress_bars()  # its "Generating split" bars would wrap a one-line error in noise
        try:
            ds = datasets.load_dataset("json", data_files={split: path}, split=split)
        finally:
            if shown:
                datasets.enable_progress_bars()
        rows = []
        for i, row in enumerate(ds):
            answer = gsm8k_gold(row[af])  # the text a correct completion contains: GSM8K's '#### ' suffix, no commas
            value = parse_number(answer)
            if value is None:
                raise ValueError(f"{path} row {i}: answer {row[af]!r} is not a number (the jsonl task is numeric)")
            rows.append({"question": str(row[qf]), "answer": answer, "value": value})
        return rows

    def _build_splits(self) -> dict[str, list[Example]]:
        test = self._load("test")
        test_questions = {ex["question"] for ex in test}
        train = [ex for ex in self._load("train") if ex["question"] not in test_questions]  # keep them disjoint
        rng = random.Random(stable_seed(self.name, self.cfg.data_seed))
        return {"train": _subset(train, self.cfg.n_train, rng), "test": _subset(test, self.cfg.n_test, rng)}

    def fingerprint(self) -> dict[str, Any]:
        fp = super().fingerprint()
        fp["files_sha256"] = {split: _file_sha256(path) for split, path in self.files.items()}
        return fp

    def prompt(self, ex: Example) -> str:
        return self.cfg.prompt_template.format(question=ex["question"])

    def target(self, ex: Example) -> str:
        return ex["answer"]

    def reward(self, ex: Example, completion: str) -> float:
        value = parse_number(completion)
        return float(value is not None and value == ex["value"])


def _subset(rows: list[Example], n: int, rng: random.Random) -> list[Example]:
    """At most n rows, a deterministic subset in file order (n_train/n_test cap large files)."""
    if n >= len(rows):
        return rows
    keep = sorted(rng.sample(range(len(rows)), n))
    return [rows[i] for i in keep]
