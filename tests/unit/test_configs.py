"""Every yaml of every config group composes, validates and builds its object (lightning-hydra-template's
tests/test_configs.py): a broken yaml, a knob its schema lacks or an unknown registry name fails here, fast,
before any training. Every named sweep's first job composes too. The lists come from conf/ itself, so a new
yaml is covered without editing this file.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from importlib.machinery import ModuleSpec
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from bench.launch.cli import CONF_DIR, check_group_overrides  # importing bench.launch.cli registers the schemas
from bench.launch.config import GROUP_REGISTRIES, validate
from bench.launch.dryrun import expand
from bench.algo_config import AlgoConfig
from bench.methods.base import Method, build_method
from bench.registry import METHODS
from bench.models.config import ModelConfig
from bench.rollout import build_engine
from bench.tasks.base import Task, build_task

GROUPS = ("method", "task", "rollout", "model", "tracking")


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def experiments() -> list[str]:
    root = CONF_DIR / "experiment"
    return sorted(str(p.relative_to(root).with_suffix("")) for p in root.rglob("*.yaml"))


def extra_overrides(group: str, option: str, tmp_path: Path) -> list[str]:
    """What an option needs from the user to be complete (documented in its yaml): each data file its schema
    requires (a `*_file` key left MISSING: a task on local files, as tasks/jsonl.py's schema; given a question/answer
    JSONL file, the documented format), and model=hf's path. Read from the composed option, so that a new task on
    local files is covered without editing this test."""
    if (group, option) == ("model", "hf"):
        return [f"model.path={tmp_path}"]
    section = compose_cfg([f"{group}={option}"])[group]
    files = [k for k in section if k.endswith("_file") and OmegaConf.is_missing(section, k)]
    if not files:
        return []
    data = tmp_path / "qa.jsonl"
    data.write_text('{"question": "1+1", "answer": 2}\n{"question": "2+3", "answer": 5}\n')
    return [f"{group}.{k}={data}" for k in files]


def compose_cfg(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=overrides)


@pytest.mark.parametrize("group, option", [(g, o) for g in GROUPS for o in options(g)])
def test_every_yaml_composes_validates_and_builds(group: str, option: str, tmp_path: Path):
    cfg = compose_cfg([f"{group}={option}", *extra_overrides(group, option, tmp_path)])
    if cfg.rollout.engine == "vllm" and importlib.util.find_spec("vllm") is None:
        # an optional engine that is not installed: a configuration error before any work (issue 19 R8)
        with pytest.raises(ValueError, match=r"rollout=vllm needs vLLM, which .* does not have: on a GPU "
                                             r"`pip install -e \.\[vllm\]`"):
            validate(cfg)
        with pytest.raises(ImportError, match=r"qrl-bench\[vllm"):
            build_engine(cfg.rollout, eos_id=1, pad_id=0)
        return
    validate(cfg)
    assert isinstance(build_method(cfg.method, cfg.algo), Method)
    assert isinstance(build_task(cfg.task), Task)
    ModelConfig(**OmegaConf.to_container(cfg.model, resolve=True))
    assert build_engine(cfg.rollout, eos_id=1, pad_id=0).precision == cfg.rollout.precision


@pytest.mark.parametrize("group", [g for g in GROUPS if g in GROUP_REGISTRIES])
def test_registry_backed_groups_have_a_yaml_per_name(group: str):
    """A name in the registry without a yaml could not be selected; a yaml without a name could not build."""
    yamls, names = set(options(group)), set(GROUP_REGISTRIES[group].names())
    assert yamls == names, (f"conf/{group}/<name>.yaml without a registered {group}: {sorted(yamls - names)}; "
                            f"registered without a yaml: {sorted(names - yamls)} (the registry name must be the file "
                            "name)")


@pytest.mark.parametrize("name", experiments())
def test_every_named_sweep_first_job_composes(name: str, monkeypatch):
    jobs = expand([f"+experiment={name}"])
    assert jobs, f"experiment {name} expands to no job"
    cfg = compose_cfg(jobs[0])
    if "vllm" in (cfg.rollout.engine, cfg.eval.engine) and importlib.util.find_spec("vllm") is None:
        # a recipe row on vLLM (the long-response recipes' BF16/FP8 rows) where vLLM is not installed: the one-line
        # refusal, then every other check of the row with the install probe answered (tests/vllm runs it for real)
        with pytest.raises(ValueError, match=r"needs vLLM, which .* does not have"):
            validate(cfg)
        find_spec = importlib.util.find_spec
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda mod, *a: ModuleSpec("vllm", None) if mod == "vllm" else find_spec(mod, *a))
    validate(cfg)
    build_method(cfg.method, cfg.algo)
    build_task(cfg.task)


@pytest.mark.parametrize("name", experiments())
def test_every_job_of_a_named_sweep_has_its_own_run_directory(name: str):
    """Two jobs with one run directory would resume (or skip) each other: e.g. one arm at two rollout
    precisions in a severity ladder without the precision in the run path."""
    from bench.run.store import RunDir

    jobs = expand([f"+experiment={name}"])
    # jobs that differ only in the seed differ in the run path's seed level: compose one seed of each (a compose
    # costs ~0.3-1 s; the separation sweep has 345 jobs) and check that the seed is a level of the path
    by_rest = {tuple(o for o in job if not o.startswith("seed=")): job for job in jobs}
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfgs = [compose("config", overrides=job) for job in by_rest.values()]
    assert all(RunDir.of(c).path.name == f"seed{c.seed}" for c in cfgs)
    paths = [RunDir.of(c).path.parent for c in cfgs]
    clashes = {str(p) for p in paths if paths.count(p) > 1}
    assert not clashes, f"experiment {name}: jobs share run directories {sorted(clashes)[:3]}"


def test_the_default_run_and_the_reference_sweeps_learn_at_their_own_lr():
    """Issue 32 F9: the default run (arithmetic) trains at lr 3e-5, where bf16 learns (README: 36.5 % at step 0 ->
    +2.2 pp at step 100, n = 5); at 1e-4 it unlearned. The committed reference sweeps (the chain task, which learns
    at 1e-4) pin 1e-4 in their yaml, so a change of the default leaves every job of theirs, and their reports, as
    they were run. One job per sweep suffices: the pin is a sweep-level key, and the job-level rows set no lr."""
    default = compose_cfg([])
    assert (default.task.name, default.method.name, default.train.lr) == ("arithmetic", "bf16", 3e-5)
    for sweep in ("smoke_short", "smoke", "severity", "separation_slice", "separation"):
        jobs = expand([f"+experiment={sweep}"])
        assert not [j for j in jobs if any(o.startswith("train.lr=") for o in j)], sweep
        assert compose_cfg(jobs[0]).train.lr == 1e-4, sweep


def test_severity_sweep_is_the_documented_ladder():
    overrides = expand(["+experiment=severity"])
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        jobs = [compose("config", overrides=job) for job in overrides]
    rungs = {(c.method.name, c.rollout.precision, c.rollout.weight_granularity) for c in jobs}
    assert rungs == {("bf16", "bf16", None)} | {
        (method, precision, granularity) for method in ("naive", "tis")
        for precision, granularity in (("fp8_e4m3", None), ("int8", "per_tensor"), ("fp8_e5m2", None), ("int4", None),
                                       ("mxfp4", None))} | {
        (method, "mxfp4", None) for method in ("geo_rs", "seq_is_rs")}  # the sequence-level arms at the harshest rung
    assert len(jobs) == 39 and {c.task.name for c in jobs} == {"chain"} and {c.seed for c in jobs} == {0, 1, 2}


def test_separation_sweep_crosses_lengths_formats_and_every_arm():
    """Issue 24: three chain lengths x two 4-bit formats x the token-, sequence-level and original arms, 5 seeds.

    Every rung lists the same arm rows (checked on the override lists); one rung's seed-0 jobs are composed (a
    compose costs ~1 s of CPU, all 345 would take minutes).
    """
    jobs = expand(["+experiment=separation"])
    assert len(jobs) == 345 and len(expand(["+experiment=separation_slice"])) == 75  # 3 rungs x 5 arms x 5 seeds
    rung_of = lambda job: next(o.split("=", 1)[1] for o in job if o.startswith("sweep="))  # noqa: E731
    arm_part = lambda job: frozenset(o for o in job if o.startswith(("method", "rollout.precision")))  # noqa: E731
    rungs: dict[str, set] = {}
    for job in jobs:
        rungs.setdefault(rung_of(job), set()).add(arm_part(job))
    assert sorted(rungs) == ["separation/len34", "separation/len60", "separation/len90"]
    assert rungs["separation/len34"] == rungs["separation/len60"] == rungs["separation/len90"]
    seed0 = [j for j in jobs if "seed=0" in j and rung_of(j) == "separation/len60"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfgs = [compose("config", overrides=job) for job in seed0]
    arms = set()
    for c in cfgs:
        assert c.train.minibatches >= 4 and c.task.n_test == 1000 and 100 <= c.train.steps <= 150
        assert (c.task.min_steps, c.task.max_steps) == (6, 10)
        arms.add(((c.method.name, c.method.get("is_level", ""), c.method.get("is_mode", "")), c.rollout.precision))
    names = {a[0][0] for a in arms}
    assert {"bf16", "naive", "tis", "acr_uaq", "ess", "ais", "icepop", "geo_rs", "seq_is_rs", "acr"} <= names
    assert (("tis", "sequence", "truncate"), "int4") in arms and (("tis", "token", "mask"), "mxfp4") in arms
    low = {a for a, p in arms if p != "bf16"}  # every corrected arm at both formats, bf16 once
    assert arms == {(a, p) for a in low for p in ("mxfp4", "int4")} | {(("bf16", "", ""), "bf16")}
    assert len(cfgs) == 1 + 2 * len(low) and 5 * 3 * len(cfgs) == len(jobs)


def test_resolved_config_carries_only_its_own_arms_knobs():
    tis, bf16 = compose_cfg(["method=tis"]), compose_cfg(["method=bf16"])
    assert "is_cap_C" in tis.method and "is_cap_C" not in bf16.method
    assert set(bf16.method) == {"name"}  # the rollout precision lives in rollout.* only
    assert set(tis.algo) == {f.name for f in dataclasses.fields(AlgoConfig)}  # shared knobs live in algo


def test_another_arms_knob_is_an_error_naming_the_arm():
    # the arms that have the TIS cap, from the registry (a new arm with it joins the list without an edit here)
    with_cap = ", ".join(e.name for e in METHODS.entries() if "is_cap_C" in {f.name for f in dataclasses.fields(e.schema)})
    assert {"acr", "acr_uaq", "ais", "tis"} <= set(with_cap.split(", "))
    msg = check_group_overrides(["method=bf16", "method.is_cap_C=3"])
    assert msg and "'bf16' has no key 'is_cap_C'" in msg and with_cap in msg
    msg = check_group_overrides(["method=tis", "method.clip_eps_low=0.1"])
    assert msg and "use algo.clip_eps_low=0.1" in msg
    assert check_group_overrides(["method=tis", "method.is_cap_C=3"]) is None
    assert check_group_overrides(["method.is_cap_C=3"]) is not None  # the default arm (bf16) has no cap
    msg = check_group_overrides(["method=bf16,tis", "method.is_cap_C=3"])  # a sweep: every arm must have it
    assert msg and "'bf16'" in msg


def test_help_lists_only_real_choices(capsys: pytest.CaptureFixture[str]):
    from tests.helpers import cli

    out = cli("--help").stdout
    groups = {line.split(":")[0]: line.split(":", 1)[1] for line in out.splitlines() if ": " in line and line[0].isalpha()}
    assert set(options("method")) == {o.strip() for o in groups["method"].split(",")}
    assert "schema" not in out


@pytest.mark.parametrize("overrides, needle", [
    (["algo.clip_eps_low=1.5"], "algo.clip_eps_low=1.5 is out of range; allowed: [0, 1)"),
    (["algo.clip_eps_low=-0.1"], "algo.clip_eps_low=-0.1 is out of range; allowed: [0, 1)"),
    (["method=tis", "method.is_cap_low=3"], "method.is_cap_low=3.0 must be in [0, method.is_cap_C=2.0]"),
    (["method=tis", "method.is_cap_C=0"], "method.is_cap_C=0 is out of range; allowed: (0, inf)"),
    (["method=ais", "method.ais_n_min=1"], "method.ais_n_min=1 is out of range; allowed: [2, inf)"),
    (["method=ais", "method.ais_alpha_max=1.5"], "method.ais_alpha_max=1.5 is out of range; allowed: [0, 1]"),
    (["train.resume_from=first"], "train.resume_from='first' is not valid; choose one of: last, previous"),
])
def test_out_of_range_values_are_refused_naming_the_key(overrides, needle):
    """Issue 13 item 5: a value a type cannot reject (method.clip_eps_low=1.5 was accepted) fails validation."""
    with pytest.raises(ValueError) as err:
        validate(compose_cfg(overrides))
    assert needle in str(err.value)


NAMED_SWEEPS = ("smoke", "smoke_short", "severity", "severity_axes")


@pytest.mark.parametrize("name", NAMED_SWEEPS)
def test_named_sweeps_take_several_optimizer_steps_per_batch(name: str):
    """With one minibatch and one epoch the PPO ratio is 1 at the only update: the clip, ACR's range and P3O's
    trust region never act, and acr trains exactly as tis (issue 21). Every job takes >= 4 steps per batch."""
    overrides = expand([f"+experiment={name}"])
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        jobs = [compose("config", overrides=job) for job in overrides]
    assert jobs and all(c.train.minibatches * c.train.epochs >= 4 for c in jobs)
    assert all((c.train.batch_size // c.train.group_size) % c.train.minibatches == 0 for c in jobs)
