"""The root of the Hydra config tree (conf/), its registration, and the value checks run before any work.

Each component's schema lives beside it (lingua's `OptimArgs` beside `optim.py`): `MethodConfig` and every
arm's schema in bench/methods/, `AlgoConfig` in bench/grpo.py, task schemas in bench/tasks/, engine schemas in
bench/rollout/, `ModelConfig` in bench/models/load.py, `TrainConfig` in bench/train.py, `EvalConfig` in
bench/evaluation.py, `TrackingConfig` in bench/tracking.py. This module composes them into `Config` and hands
them to Hydra's ConfigStore, so that a misspelt key or a value of the wrong type fails at start-up naming it;
`validate` runs every schema's `check()` (ranges and choices a type cannot express) before any work starts.

The schemas are stored under top-level names (`schema_method_tis`, ...) that the group yamls extend
(`defaults: [/schema_method_tis@_here_]`), not as members of the groups, so that `--help` lists only real
choices.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from bench.budget import BudgetConfig
from bench.evaluation import EvalConfig
from bench.grpo import AlgoConfig
from bench.identity import run_path
from bench.methods.base import METHODS
from bench.models.load import ModelConfig
from bench.rollout.base import ENGINES
from bench.tasks.base import TASKS
from bench.tracking import TrackingConfig, tracking_mode
from bench.train import TrainConfig

#: conf/: the config tree (groups method/ model/ task/ rollout/ tracking/ experiment/, hydra/launcher/)
CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
#: group name -> the registry whose names are its choices (the other groups are plain data: model/, tracking/)
GROUP_REGISTRIES = {"method": METHODS, "task": TASKS, "rollout": ENGINES}


@dataclass
class Config:
    method: Any = MISSING  # the arm's schema (bench/methods/<arm>.py)
    model: ModelConfig = MISSING
    task: Any = MISSING  # the task's schema (bench/tasks/<task>.py)
    rollout: Any = MISSING  # the engine's schema (bench/rollout/<engine>.py)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)  # the dry run's GPU-hours estimate (bench/budget.py)
    eval: EvalConfig = field(default_factory=EvalConfig)
    tracking: TrackingConfig = MISSING
    seed: int = 0
    sweep: str = "default"
    out_root: str = "results"


def schema_name(group: str, name: str | None = None) -> str:
    """The ConfigStore name a group yaml extends: schema_<group>[_<name>]."""
    return f"schema_{group}" if name is None else f"schema_{group}_{name}"


def register_configs() -> None:
    """Every schema into Hydra's ConfigStore, and the `qrl_run_dir` resolver of conf/config.yaml."""
    cs = ConfigStore.instance()
    cs.store(name=schema_name("config"), node=Config)
    cs.store(name=schema_name("model"), node=ModelConfig)
    cs.store(name=schema_name("tracking"), node=TrackingConfig)
    for group, registry in GROUP_REGISTRIES.items():
        for entry in registry.entries():
            cs.store(name=schema_name(group, entry.name), node=entry.schema)
    if not OmegaConf.has_resolver("qrl_run_dir"):
        OmegaConf.register_new_resolver("qrl_run_dir", lambda *a: str(run_path(*a)))


def group_schema(group: str, name: str) -> type:
    return GROUP_REGISTRIES[group].schema(name)


def _as_object(node: DictConfig, schema: type, where: str) -> Any:
    """The node as its schema's dataclass instance (interpolations resolved); a `???` names its key."""
    try:
        values = OmegaConf.to_container(node, resolve=True, throw_on_missing=True)
    except MissingMandatoryValue as e:
        raise ValueError(f"{where}.{e.full_key.split('.')[-1]} is not set (it is required)") from None
    names = {f.name for f in dataclasses.fields(schema)}
    return schema(**{k: v for k, v in values.items() if k in names})


def validate(cfg: DictConfig) -> None:
    """Every schema's `check()`, then the checks across sections: raises ValueError naming the bad value."""
    parts = [("method", group_schema("method", cfg.method.name)), ("task", group_schema("task", cfg.task.name)),
             ("rollout", group_schema("rollout", cfg.rollout.engine)), ("algo", AlgoConfig), ("train", TrainConfig),
             ("tracking", TrackingConfig), ("model", ModelConfig), ("eval", EvalConfig), ("budget", BudgetConfig)]
    for key, schema in parts:
        obj = _as_object(cfg[key], schema, key)
        check = getattr(obj, "check", None)
        if check is not None:
            check()
    tracking_mode(cfg)  # WANDB_MODE overrides tracking.mode: a bad one must fail here, not inside the run
    check_across(cfg)


def check_across(cfg: DictConfig) -> None:
    """Checks that need two sections: the advantage estimator and DAPO's knobs against train.* and task.*."""
    algo, train = cfg.algo, cfg.train
    if algo.advantage == "grpo" and train.group_size < 2:
        raise ValueError(f"train.group_size={train.group_size} is too small for algo.advantage=grpo: group-normalized "
                         "advantages need at least 2 responses per prompt (algo.advantage=gae works with 1)")
    if algo.dynamic_sampling and train.group_size < 2:
        raise ValueError(f"algo.dynamic_sampling drops groups of equal rewards: train.group_size={train.group_size} "
                         "must be at least 2")
    if algo.overlong_penalty and algo.overlong_buffer_len > cfg.task.max_new_tokens:
        raise ValueError(f"algo.overlong_buffer_len={algo.overlong_buffer_len} must be <= task.max_new_tokens="
                         f"{cfg.task.max_new_tokens} (the penalty ramps over the last buffer_len tokens of the limit)")
