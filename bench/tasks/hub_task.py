"""The shared machinery of the datasets-backed benchmark tasks (math sets, Countdown-Tasks).

A `HubTask` reads rows from `task.source` (a hub id or a local copy, bench/tasks/sources.py), maps each row of
the hub schema to a common example dict with an adapter (`adapt`), and builds a deterministic train/test split:

* both `train_split` and `test_split` set: the two published splits (GSM8K train/test);
* `test_split` null: `test_size` rows of the train split held out by seed (sets published with one split,
  e.g. Countdown-Tasks-3to4, DAPO-Math-17k, DeepScaleR);
* `train_split` null: an evaluation-only set (MATH-500, AIME, AMC); the train split is empty.

Rows repeated within a split are kept once (DAPO-Math-17k stores each of its ~17k problems many times over:
1.79M rows), train drops any problem that is also in test, and then `max_train` / `max_test` keep a subset
chosen by `data_seed` (shuffled by it unless `shuffle` is false). All of it depends on `data_seed` only, so
every RL seed trains and evaluates on the same problems.

Prompts: `messages(ex)` is the chat form ([system,] user), `prompt(ex)` the user text alone. The text is the
task's default for its reward (the formats the papers use) unless `prompt_template` overrides it; templates
use named placeholders ({problem} for math; {nums} and {target} for Countdown) and every other brace is
literal, so "\\boxed{}" needs no escaping. Running them through a tokenizer's chat template is the caller's job
(bench/models/tokenizer.py `encode_prompts`); `task.chat_template` overrides the model's choice for this task.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import Any, Optional

from bench.domains import num
from bench.rewards import Reward
from bench.registry import SCORERS, TASKS
from bench.tasks import sources
from bench.tasks.base import Example, Task, TaskConfig, stable_seed


@dataclass
class HubTaskConfig(TaskConfig):
    """Schema shared by the datasets-backed tasks; each task's subclass sets its defaults."""

    source: str = ""  # hub id ("openai/gsm8k") or a local file / folder (see bench/tasks/sources.py)
    config: Optional[str] = None  # hub config name ("main" for gsm8k); also a subfolder of a local copy
    train_split: Optional[str] = "train"  # null: evaluation-only set
    test_split: Optional[str] = "test"  # null: hold out `test_size` rows of the train split
    test_size: int = num(0, "[0, inf)")  # rows held out of the train split when test_split is null
    max_train: Optional[int] = num(None, "[1, inf)", {None: "all"})  # keep at most this many train problems
    max_test: Optional[int] = num(None, "[1, inf)", {None: "all"})
    shuffle: bool = True  # order (and subsets) by data_seed; false: file order, first rows
    prompt_template: Optional[str] = None  # null: the task's default for its reward
    system_prompt: Optional[str] = None
    chat_template: Optional[bool] = None  # null: the model's setting (model.chat_template); false: plain text
    reward: str = "math_verify"  # a SCORERS name (bench/registry.py, scorers in bench/rewards.py)
    format_weight: float = num(0.0, "[0, 1]")  # reward of a wrong but well-formatted answer (bench/rewards.py)
    reward_time_limit_s: float = num(5.0, "(0, 3600]")  # per completion; bench/run/timelimit.py
    max_new_tokens: int = 1024

    def check(self) -> None:
        super().check()
        if not self.source:
            raise ValueError(f"task.source is empty: give a hub id or a local file/folder (task={self.name})")
        if missing := sources.missing_local_source(self.source):  # a hub id is checked where it is read
            raise ValueError(missing)
        if self.reward not in SCORERS:
            raise ValueError(f"task.reward={self.reward!r} is not valid; choose one of: {', '.join(SCORERS.names())}")
        if self.train_split is None and self.test_split is None:
            raise ValueError(f"task.train_split=null: train_split and test_split are both null; set at least one "
                             f"(task={self.name})")
        if self.train_split is not None and self.train_split == self.test_split:
            raise ValueError(f"task.test_split={self.test_split}: train_split and test_split are both "
                             f"{self.train_split!r}; to hold out a test split from it set test_split=null and "
                             f"test_size=N (task={self.name})")
        if self.test_split is None and self.test_size <= 0:
            raise ValueError(f"task.test_size={self.test_size}: test_split is null, so test_size must be > 0 rows to "
                             f"hold out (task={self.name})")
        templates = TASKS.get(self.name).default_templates
        if self.prompt_template is None and self.reward not in templates:
            raise ValueError(f"task {self.name!r} has no default prompt for reward {self.reward!r} (defaults for: "
                             f"{', '.join(sorted(templates))}); set task.prompt_template")


def fill(template: str, **values: Any) -> str:
    """`template` with each {name} placeholder replaced; other braces (\\boxed{}) are left as they are."""
    out = template
    for key, value in values.items():
        out = out.replace("{" + key + "}", str(value))
    return out


class HubTask(Task):
    """A Task over a hub dataset. Subclasses set the class attributes and implement `adapt` and `final_line`."""

    name = ""
    config_class: type[HubTaskConfig] = HubTaskConfig
    required_columns: tuple[str, ...] = ()
    default_templates: dict[str, str] = {}  # reward name -> user-message template
    placeholders: tuple[str, ...] = ("problem",)

    def __init__(self, cfg: Any):
        if isinstance(cfg, dict):
            cfg = self.config_class(**cfg)
        super().__init__(cfg)
        self.rewarder = Reward(cfg.reward, format_weight=cfg.format_weight, time_limit_s=cfg.reward_time_limit_s)

    # ---- data -------------------------------------------------------------------------------------

    @abstractmethod
    def adapt(self, row: dict[str, Any], index: int, split: str) -> Example:
        """One hub-schema row as an example dict with at least "id", "problem" and "answer" (the gold)."""

    def key(self, ex: Example) -> Any:
        """What makes two examples the same problem (dedup, train/test disjointness)."""
        return ex["problem"]

    def _resolve(self, split: str) -> sources.ResolvedSplit:
        return sources.resolve_split(self.cfg.source, split, config=self.cfg.config)

    def _load(self, split: str) -> list[Example]:
        """Adapted, de-duplicated examples of one published split, in file order."""
        resolved = self._resolve(split)
        out, seen = [], set()
        for i, row in enumerate(sources.iter_rows(resolved, required=self.required_columns)):
            try:
                ex = self.adapt(row, i, split)
            except (KeyError, TypeError, ValueError, IndexError) as exc:
                raise sources.DataSourceError(f"{resolved.describe()} row {i}: does not fit the {self.name} schema "
                                              f"({type(exc).__name__}: {exc})") from None
            k = self.key(ex)
            if k not in seen:
                seen.add(k)
                out.append(ex)
        if not out:
            raise sources.DataSourceError(f"{resolved.describe()}: no rows")
        return out

    def _build_splits(self) -> dict[str, list[Example]]:
        cfg = self.cfg
        train_split, test_split = cfg.train_split, cfg.test_split
        if train_split and test_split and sources.is_local(cfg.source):
            a, b = self._resolve(train_split), self._resolve(test_split)
            same = a.kind == b.kind == "files" and a.paths == b.paths
        else:
            same = False
        if same:
            raise sources.DataSourceError(
                f"task {self.name!r}: task.source {cfg.source!r} gives the same file(s) for splits {train_split!r} and "
                f"{test_split!r}; pass a folder with one file per split, or set task.test_split=null and "
                f"task.test_size=N to hold out N rows as the test split")
        train = self._load(train_split) if train_split else []
        if test_split:
            test = self._load(test_split)
        else:
            train, test = sources.holdout(train, int(cfg.test_size), stable_seed(self.name, "holdout", cfg.data_seed))
        test_keys = {self.key(ex) for ex in test}
        train = [ex for ex in train if self.key(ex) not in test_keys]
        train_seed, test_seed = (stable_seed(self.name, part, cfg.data_seed) for part in ("train", "test"))
        return {"train": sources.subsample(train, cfg.max_train, train_seed, shuffle=cfg.shuffle),
                "test": sources.subsample(test, cfg.max_test, test_seed, shuffle=cfg.shuffle)}

    def fingerprint(self) -> dict[str, Any]:
        fp = super().fingerprint()
        if sources.is_local(self.cfg.source):
            splits = [s for s in (self.cfg.train_split, self.cfg.test_split) if s]
            fp["source_sha256"] = {s: sources.files_sha256(self._resolve(s)) for s in splits}
        return fp

    # ---- format and reward ------------------------------------------------------------------------

    def template(self) -> str:
        if self.cfg.prompt_template is not None:
            return self.cfg.prompt_template
        return self.default_templates[self.cfg.reward]

    def placeholder_values(self, ex: Example) -> dict[str, Any]:
        return {name: ex[name] for name in self.placeholders}

    def prompt(self, ex: Example) -> str:
        """The user message text (no chat template applied)."""
        return fill(self.template(), **self.placeholder_values(ex))

    def messages(self, ex: Example) -> list[dict[str, str]]:
        """The chat form of the prompt: an optional system message, then the user message."""
        system = [{"role": "system", "content": self.cfg.system_prompt}] if self.cfg.system_prompt else []
        return system + [{"role": "user", "content": self.prompt(ex)}]

    @abstractmethod
    def final_line(self, ex: Example) -> str:
        """The closing answer of a reference completion, in the format the configured reward reads."""

    def target(self, ex: Example) -> str:
        """A reference completion: the worked solution when the set has one, then the final answer line."""
        reasoning = (ex.get("reasoning") or "").strip()
        line = self.final_line(ex)
        return f"{reasoning}\n{line}" if reasoning else line

    def correct(self, ex: Example, completion: str) -> bool:
        """The verdict without format shaping (for accuracy and pass@k)."""
        return self.rewarder.correct(completion, ex["answer"])

    def reward(self, ex: Example, completion: str) -> float:
        return self.rewarder(completion, ex["answer"])

