"""The Task contract and the base task schema (the registry, TASKS, is in bench/registry.py).

A task owns its data (a deterministic train/test split), the text format of prompts and answers, and a
verifiable reward. It knows nothing about models or tokenizers: the trainer turns `prompt(ex)` into token
ids and hands the decoded completion back to `reward(ex, completion)`.

Determinism is the point of most of this file: the split depends only on `cfg.data_seed` (so every RL seed
trains and evaluates on the same problems), and `sample(step, n, seed)` is a pure function of its arguments
(so a run resumed at step k sees exactly the prompts the interrupted run would have seen).
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable

from omegaconf import MISSING, OmegaConf

from bench.domains import check_schema, num
from bench.registry import TASKS

SPLITS = ("train", "test")
Example = dict[str, Any]


@dataclass
class TaskConfig:
    """`task.*` keys every task has; each task's schema (beside it, bench/tasks/<task>.py) adds its own."""

    name: str = MISSING
    max_new_tokens: int = num(16, "[1, inf)")  # response tokens at most (a schema may change the default only)
    data_seed: int = num(1234, "[0, inf)")  # fixed across RL seeds: every seed sees the same train/test split

    def check(self) -> None:
        """Value checks a domain cannot express (bench/domains.py holds the ranges)."""


@dataclass
class GeneratedTaskConfig(TaskConfig):
    """Tasks that make (or cap) their own problem set: how many train and test problems."""

    n_train: int = num(5000, "[1, inf)")
    n_test: int = num(200, "[1, inf)")




def config_to_dict(cfg: Any) -> dict[str, Any]:
    """A plain dict of a config given as a dataclass, an OmegaConf node or a dict (tasks accept all three)."""
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return dataclasses.asdict(cfg)
    if isinstance(cfg, dict):
        return dict(cfg)
    from omegaconf import OmegaConf  # only needed for Hydra configs

    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def stable_seed(*parts: Any) -> int:
    """A 64-bit seed from any printable parts, identical across processes (unlike `hash()`)."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little")


def unique_examples(
    make: Callable[[random.Random], Example],
    key: Callable[[Example], Any],
    n: int,
    rng: random.Random,
    exclude: set | None = None,
    patience: int = 2000,
) -> list[Example]:
    """Draw up to `n` examples from `make(rng)` whose `key` is new (and not in `exclude`).

    Stops early after `patience` consecutive duplicates: small problem spaces (e.g. 3-number countdown)
    hold fewer distinct problems than a large n_train asks for, and then the split is simply smaller.
    `exclude` is updated in place, so drawing the test split first and then the train split with the same
    set makes them disjoint by construction.
    """
    seen = exclude if exclude is not None else set()
    out: list[Example] = []
    misses = 0
    while len(out) < n and misses < patience:
        ex = make(rng)
        k = key(ex)
        if k in seen:
            misses += 1
            continue
        seen.add(k)
        out.append(ex)
        misses = 0
    return out


class Task(ABC):
    """A task with a verifiable reward. Subclasses implement `_build_splits`, `prompt`, `target`, `reward`."""

    name: str = ""  # the registry key, set by @TASKS.register

    def __init__(self, cfg: Any):
        if _unnamed(cfg):  # a config built in code: its name is the task's
            if OmegaConf.is_config(cfg):
                cfg.name = self.name
            else:
                cfg = dataclasses.replace(cfg, name=self.name)
        check_schema(schema_object(cfg, TASKS.schema(self.name)), "task")  # as the launch's check, for a task built in code
        self.cfg = cfg
        self._splits: dict[str, list[Example]] | None = None

    @property
    def max_new_tokens(self) -> int:
        """Generation budget; the task knows how long its answers can be."""
        return int(self.cfg.max_new_tokens)

    # ---- data -------------------------------------------------------------------------------------
    @abstractmethod
    def _build_splits(self) -> dict[str, list[Example]]:
        """{"train": [...], "test": [...]}, disjoint, a deterministic function of the config."""

    def examples(self, split: str) -> list[Example]:
        """The examples of `split` ("train" or "test"); built once, then cached on the task."""
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
        if self._splits is None:
            self._splits = self._build_splits()
        return self._splits[split]

    def sample(self, step: int, n_prompts: int, seed: int) -> list[Example]:
        """Training prompts for RL step `step`: a pure function of (seed, step), so resume is exact.

        Distinct examples within a step when the train split is large enough, with replacement otherwise.
        """
        train = self.examples("train")
        if not train:
            raise ValueError(f"task {self.name!r} has no training examples")
        rng = random.Random(stable_seed("sample", seed, step))
        if n_prompts <= len(train):
            return rng.sample(train, n_prompts)
        return rng.choices(train, k=n_prompts)

    def fingerprint(self) -> dict[str, Any]:
        """Everything that determines this task's data and format; keys the warm-start cache.

        Tasks reading files override it to add the file contents' hash.
        """
        return {"task": self.name, "cfg": config_to_dict(self.cfg)}

    # ---- format and reward ------------------------------------------------------------------------
    @abstractmethod
    def prompt(self, ex: Example) -> str:
        """The prompt text (without BOS: the tokenizer helper adds it)."""

    def messages(self, ex: Example) -> list[dict[str, str]]:
        """The prompt as chat messages, for models whose prompts go through a chat template (one user turn)."""
        return [{"role": "user", "content": self.prompt(ex)}]

    @property
    def response_prefix(self) -> str:
        """Text every response starts with, placed after the prompt (after the chat template's generation prompt)."""
        return ""

    @abstractmethod
    def target(self, ex: Example) -> str:
        """A reference completion in the exact answer format (without EOS); used for the SFT warm start."""

    @abstractmethod
    def reward(self, ex: Example, completion: str) -> float:
        """1.0 if `completion` is a correct answer, 0.0 if it is wrong or malformed. Never raises."""



class GeneratedTask(Task):
    """A synthetic task (arithmetic, chain, countdown): the splits are drawn from `_make(rng)`, the test split
    first (so it stays the same when n_train changes) and then the train split, disjoint by prompt, from one
    stream seeded by (task name, task.data_seed). A subclass writes `_make`, `prompt`, `target` and `reward`."""

    @abstractmethod
    def _make(self, rng: random.Random) -> Example:
        """One random problem."""

    def _build_splits(self) -> dict[str, list[Example]]:
        rng = random.Random(stable_seed(self.name, self.cfg.data_seed))
        seen: set = set()
        test = unique_examples(self._make, self.prompt, self.cfg.n_test, rng, seen)  # test first: stable under n_train
        train = unique_examples(self._make, self.prompt, self.cfg.n_train, rng, seen)
        return {"train": train, "test": test}


def schema_object(cfg: Any, schema: type) -> Any:
    """`cfg` (a schema instance, an OmegaConf node or a dict) as an instance of `schema`, for its checks."""
    if isinstance(cfg, schema):
        return cfg
    values = config_to_dict(cfg)
    names = {f.name for f in dataclasses.fields(schema)}
    return schema(**{k: v for k, v in values.items() if k in names})


def build_task(task_cfg: Any) -> Task:
    """The Task named by `task_cfg.name` (a schema instance built in code: the task registered with that schema).
    Unknown names fail listing the valid ones."""
    if _unnamed(task_cfg):
        schema = OmegaConf.get_type(task_cfg) if OmegaConf.is_config(task_cfg) else type(task_cfg)
        return TASKS.get(TASKS.name_of_schema(schema))(task_cfg)
    return TASKS.get(task_cfg.name)(task_cfg)


def _unnamed(cfg: Any) -> bool:
    """True for a task config built in code from its schema (its `name` is still MISSING)."""
    if OmegaConf.is_config(cfg):
        return OmegaConf.is_missing(cfg, "name")
    return dataclasses.is_dataclass(cfg) and getattr(cfg, "name", None) in (MISSING, None, "")
