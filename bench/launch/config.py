"""The root of the Hydra config tree (conf/), its registration, and the value checks run before any work.

Each component's schema lives beside it (lingua's `OptimArgs` beside `optim.py`): `MethodConfig` and every
arm's schema in bench/methods/, task schemas in bench/tasks/, engine schemas in bench/rollout/. The sections every
run has are torch-free modules of their own, so that importing this module imports no torch (the registries import
their components, and torch with them, only when a name is first looked up): `AlgoConfig` in bench/algo_config.py,
`TrainConfig` in bench/train_config.py, `ModelConfig` in bench/models/config.py, `EvalConfig` in
bench/eval_config.py, `TrackingConfig` in bench/run/tracking.py. This module composes them into `Config` and hands
them to Hydra's ConfigStore, so that a misspelt key or a value of the wrong type fails at start-up naming it;
`validate` runs every schema's `check()` (ranges and choices a type cannot express) before any work starts.

A registered name is stated once: the registry key (`@METHODS.register("tis")`), which is also the yaml's file
name (conf/method/tis.yaml). conf/config.yaml puts `_schema/<group>@<group>: ${<group>}` before each group, so the
chosen option is merged into its schema, stored here under the option's name with the name field (`name`, for
rollout `engine`) already set and read-only: a yaml or an override that states another name fails to compose.
Model presets are plain data (conf/model/<preset>.yaml): their schema is ModelConfig with `name` set to the file
name the same way; only `model=hf` takes its name from `model.name=...`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from bench import CONF_DIR, CONFIG_GROUPS  # defined where `qrl-bench --help` reads them without this module's imports
from bench.algo_config import AlgoConfig
from bench.domains import check_schema, domains, num, numeric_kind
from bench.eval_config import EvalConfig
from bench.launch.budget import BudgetConfig
from bench.launch.power import PowerConfig
from bench.methods import arm_precision
from bench.models.config import USER_NAMED_MODELS, ModelConfig
from bench.registry import ENGINES, ESTIMATORS, METHODS, TASKS
from bench.run.identity import check_path_parts, run_path, run_subdir
from bench.run.tracking import TrackingConfig, tracking_mode
from bench.train_config import TrainConfig

#: group name -> the registry whose names are its choices (the other groups are plain data: model/, tracking/)
GROUP_REGISTRIES = {"method": METHODS, "task": TASKS, "rollout": ENGINES}
#: the key of each group's node that holds the option's name
NAME_KEYS = {"method": "name", "task": "name", "rollout": "engine", "model": "name"}
#: arms renamed since an earlier release: old name -> the message that names the new one
RENAMED_METHODS = {
    "fp8": "the uncorrected arm is 'naive' at every precision: method=naive (rollout.precision=fp8_e4m3 by default)",
    "fp8_ppo_is": "the uncorrected PPO-IS arm is 'naive_ppo_is': method=naive_ppo_is",
    "seq_mis": "geometric-mean sequence rejection (verl Geo-RS) is method=geo_rs; verl's Seq-MIS "
               "(product ratio, preset decoupled_seq_is_rs) is method=seq_is_rs",
}


@dataclass
class Config:
    method: Any = MISSING  # the arm's schema (bench/methods/<arm>.py)
    model: ModelConfig = MISSING
    task: Any = MISSING  # the task's schema (bench/tasks/<task>.py)
    rollout: Any = MISSING  # the engine's schema (bench/rollout/<engine>.py)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)  # the dry run's GPU-hours estimate (bench/launch/budget.py)
    power: PowerConfig = field(default_factory=PowerConfig)  # the dry run's seed count (bench/launch/power.py)
    eval: EvalConfig = field(default_factory=EvalConfig)
    tracking: TrackingConfig = MISSING
    seed: int = num(0, "[0, inf)")  # names the run (seed<N>, -s<N>) and seeds its generators
    convention: str = "ours"  # whose defaults the arm's knobs take: conf/convention/, docs/arms.md §8
    sweep: str = "default"
    variant: str = ""  # set by the sweeper when jobs would share a run directory (bench/run/identity.py)
    out_root: str = "results"


def schema_name(group: str, name: str | None = None) -> str:
    """The ConfigStore name a group yaml extends: schema_<group>[_<name>]."""
    return f"schema_{group}" if name is None else f"schema_{group}_{name}"


def register_configs() -> None:
    """Every schema into Hydra's ConfigStore, and the `qrl_run_dir` resolver of conf/config.yaml."""
    cs = ConfigStore.instance()
    cs.store(name=schema_name("config"), node=Config)
    cs.store(name=schema_name("tracking"), node=TrackingConfig)
    for group, registry in GROUP_REGISTRIES.items():
        for entry in registry.entries():
            cs.store(group=f"_schema/{group}", name=entry.name, node=named_schema(entry.schema, NAME_KEYS[group], entry.name))
    for preset in sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml")):
        cs.store(group="_schema/model", name=preset,
                 node=named_schema(ModelConfig, "name", preset, readonly=preset not in USER_NAMED_MODELS))
    resolvers = {"qrl_run_dir": lambda *a: str(run_path(*a)), "qrl_run_subdir": run_subdir,
                 "qrl_default_precision": default_precision}
    for name, fn in resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)


def named_schema(schema: type, key: str, name: str, readonly: bool = True) -> DictConfig:
    """`schema` as a config node whose `key` holds `name`, read-only: the one place an option's name is set."""
    node = OmegaConf.structured(schema)
    node[key] = name
    if readonly:
        node._get_node(key)._set_flag("readonly", True)
    return node


def default_precision(method: str) -> str:
    """`rollout.precision` when the command line does not set it: the arm's declared precision (bf16, fp16), or
    DEFAULT_LOW_PRECISION for the arms that treat a low-precision rollout (bench/methods/__init__.py)."""
    return arm_precision(str(method))


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
    for check in checks(cfg):
        check()


def checks(cfg: DictConfig) -> list[Callable[[], Any]]:
    """The checks `validate` runs, in order, each on its own: bench.launch.entry runs them before torch is
    imported and leaves the ones that need torch (is CUDA usable?) to the run."""
    parts = [("method", group_schema("method", cfg.method.name)), ("task", group_schema("task", cfg.task.name)),
             ("rollout", group_schema("rollout", cfg.rollout.engine)), ("algo", AlgoConfig), ("train", TrainConfig),
             ("tracking", TrackingConfig), ("model", ModelConfig), ("eval", EvalConfig), ("budget", BudgetConfig),
             ("power", PowerConfig)]
    out: list[Callable[[], Any]] = [lambda: check_known_keys(cfg, dict(parts)), lambda: check_root_domains(cfg),
                                    lambda: check_path_parts(cfg)]
    out += [lambda key=key, schema=schema: _check_part(cfg, key, schema) for key, schema in parts]
    # WANDB_MODE overrides tracking.mode: a bad one must fail here, not inside the run
    return out + [lambda: tracking_mode(cfg), lambda: check_across(cfg)]




def check_known_keys(cfg: DictConfig, sections: dict[str, type]) -> None:
    """Refuse a key that no schema has: `+experimnt=smoke_short` or `+train.foo=1` compose (a `+` may add any key),
    but nothing reads them, so the run would train the default job or ignore the value while recording it in its
    identity. Checks the root and the top level of each section (free-form dict fields below are their own)."""
    import difflib

    def refuse(key: str, section: str | None, valid: list[str]) -> None:
        name = key.rpartition(".")[2]
        groups = CONFIG_GROUPS if section is None else ()  # at the root a misspelt group is the likelier mistake
        close = difflib.get_close_matches(name, [*valid, *groups], n=1, cutoff=0.6)
        hint = (f" (did you mean the config group: +{close[0]}=...?)" if close and close[0] in groups
                else f" (did you mean {close[0]!r}?)" if close else "")
        listing = f"; config groups (group=option): {', '.join(groups)}" if groups else ""
        raise ValueError(f"+{key}: {section or 'the config'} has no key {name!r}{hint}; nothing would read it, so it "
                         f"is refused. Valid keys: {', '.join(k for k in valid if k not in groups)}{listing}")

    root = sorted(f.name for f in dataclasses.fields(Config))
    for key in cfg.keys():
        if key != "hydra" and key not in root:
            refuse(str(key), None, root)
    for section, schema in sections.items():
        names = sorted(f.name for f in dataclasses.fields(schema))
        for key in cfg[section].keys():
            if key not in names:
                refuse(f"{section}.{key}", section, names)


def domain_table() -> str:
    """The Markdown table of every numeric key's allowed values (docs/configuration.md holds it verbatim; a test
    compares the two, so the page cannot go stale): key, the options that have it, type, allowed values."""
    rows: dict[tuple[str, str, Any], list[str]] = {}
    sections = [(group, e.name, e.schema) for group, registry in GROUP_REGISTRIES.items() for e in registry.entries()]
    sections += [(s, "", schema) for s, schema in (("train", TrainConfig), ("algo", AlgoConfig), ("eval", EvalConfig),
                                                   ("model", ModelConfig), ("budget", BudgetConfig),
                                                   ("power", PowerConfig))]
    for section, option, schema in [("", "", Config), *sections]:
        for key, dom in domains(schema).items():
            kind = numeric_kind(schema, key).__name__
            rows.setdefault((f"{section}.{key}".lstrip("."), kind, dom), []).append(option)
    lines = ["| key | where | type | allowed |", "|---|---|---|---|"]
    for (key, kind, dom), options in rows.items():
        where = ", ".join(o for o in options if o) if any(options) else "all"
        every = next(r for g, r in GROUP_REGISTRIES.items() if key.startswith(f"{g}.")).names() if any(options) else []
        if every and sorted(options) == every:
            where = "all"
        allowed = dom.describe().replace("|", "\\|")
        lines.append(f"| `{key}` | {where} | {kind} | {allowed} |")
    return "\n".join(lines)


#: the page that holds `domain_table` between its markers
DOMAINS_PAGE = CONF_DIR.parent / "docs" / "configuration.md"
DOMAINS_BEGIN, DOMAINS_END = "<!-- domains:begin", "<!-- domains:end -->"


def write_domain_table(page: Path = DOMAINS_PAGE) -> bool:
    """Rewrite the table between the page's markers with `domain_table()` (after a knob is added, removed or its
    range changed: `python -m bench.launch.config`); True when the page changed."""
    text = page.read_text()
    head, rest = text.split(DOMAINS_BEGIN, 1)
    marker, _, rest = rest.partition("-->")
    _, tail = rest.split(DOMAINS_END, 1)
    new = f"{head}{DOMAINS_BEGIN}{marker}-->\n{domain_table()}\n{DOMAINS_END}{tail}"
    if new == text:
        return False
    page.write_text(new)
    return True


def check_root_domains(cfg: DictConfig) -> None:
    """The root's own numeric keys (seed) against their declared domains."""
    for name, dom in domains(Config).items():
        if not dom.admits(cfg[name]):
            raise ValueError(f"{name}={cfg[name]} is out of range; allowed: {dom.describe(numeric_kind(Config, name) is int)}")


def _check_part(cfg: DictConfig, key: str, schema: type) -> None:
    """The section's declared numeric domains (bench/domains.py), then its schema's own `check()`."""
    check_schema(_as_object(cfg[key], schema, key), key)


#: the framework whose defaults the arm takes when convention= is not given (conf/convention/)
OUR_CONVENTION = "ours"


def arm_conventions(method: str) -> list[str]:
    """The conventions `method` can take: ours, and each framework with a preset conf/convention_preset/<arm>_<fw>.yaml."""
    known = sorted(p.stem for p in (CONF_DIR / "convention").glob("*.yaml"))
    return [OUR_CONVENTION] + [c for c in known if c != OUR_CONVENTION
                               and (CONF_DIR / "convention_preset" / f"{method}_{c}.yaml").exists()]


def check_convention(cfg: DictConfig) -> None:
    """convention=<framework> must have a preset for the arm: a framework without a counterpart would otherwise run
    our conventions under its name (the preset group is optional in conf/config.yaml)."""
    convention, method = str(cfg.get("convention", OUR_CONVENTION)), str(cfg.method.name)
    valid = arm_conventions(method)
    if convention not in valid:
        raise ValueError(f"convention={convention}: {convention} has no counterpart of method={method} (no "
                         f"conf/convention_preset/{method}_{convention}.yaml); conventions for {method}: "
                         f"{', '.join(valid)} (docs/arms.md §8)")


def check_across(cfg: DictConfig) -> None:
    """Checks that need two sections (the advantage estimator and DAPO's knobs against train.* and task.*) or
    none (the root's seed)."""
    algo, train = cfg.algo, cfg.train
    if algo.advantage not in ESTIMATORS:
        raise ValueError(f"algo.advantage={algo.advantage!r} is not valid; "
                         f"choose one of: {', '.join(ESTIMATORS.names())}")
    check_convention(cfg)
    fixed = METHODS.entry(cfg.method.name).meta.get("precision")
    if fixed is not None and cfg.rollout.precision != fixed:
        raise ValueError(f"method={cfg.method.name} is the {fixed} baseline and rolls out in {fixed}, not "
                         f"rollout.precision={cfg.rollout.precision}; an uncorrected {cfg.rollout.precision} rollout "
                         f"is method=naive rollout.precision={cfg.rollout.precision}")
    METHODS.get(cfg.method.name).check_run(cfg)  # what an arm needs of the other sections
    if algo.advantage == "grpo" and train.group_size < 2:
        raise ValueError(f"train.group_size={train.group_size} is too small for algo.advantage=grpo: group-normalized "
                         "advantages need at least 2 responses per prompt (algo.advantage=gae works with 1)")
    if algo.dynamic_sampling and train.group_size < 2:
        raise ValueError(f"algo.dynamic_sampling drops groups of equal rewards: train.group_size={train.group_size} "
                         "must be at least 2")
    if algo.overlong_penalty and algo.overlong_buffer_len > cfg.task.max_new_tokens:
        raise ValueError(f"algo.overlong_buffer_len={algo.overlong_buffer_len} must be <= task.max_new_tokens="
                         f"{cfg.task.max_new_tokens} (the penalty ramps over the last buffer_len tokens of the limit)")
    check_engines_across_ranks(cfg)


def check_engines_across_ranks(cfg: DictConfig) -> None:
    """The engines a run of train.nproc_per_node ranks can use (bench/distributed/engines.py `check_engine`), before
    the job is queued: on SLURM the run would refuse them only after its GPUs were allocated."""
    world = int(cfg.train.get("nproc_per_node") or 1)
    if world == 1:
        return
    from bench.distributed.engines import check_engine
    from bench.eval_config import VLLM_EVAL_PRECISION, eval_engine_kind

    shared = None  # the evaluation is not vLLM's
    if eval_engine_kind(cfg.eval.engine, cfg.rollout.engine) == "vllm":  # its precision: the device's (auto: either)
        device = {"cuda": "gpu", "cpu": "cpu"}.get(str(cfg.train.get("device", "auto")))
        precisions = [VLLM_EVAL_PRECISION[device]] if device else list(VLLM_EVAL_PRECISION.values())
        shared = cfg.rollout.engine == "vllm" and cfg.rollout.precision in precisions
    check_engine(cfg.rollout.engine, world, int(cfg.train.get("sampling_shards") or world), shared, str(cfg.eval.engine))


if __name__ == "__main__":  # python -m bench.launch.config: the configuration page's table of allowed values
    print(f"{DOMAINS_PAGE}: {'rewritten' if write_domain_table() else 'already up to date'}")
