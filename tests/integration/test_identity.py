"""A run is what its configuration says (issue 18): the precision is part of the run's identity, a changed
configuration is never satisfied by (or mixed into) another configuration's results, a sweep over a setting
outside the identity gets one directory per value, and every group option's name is its file name."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir

from bench.launch.cli import EXIT, check_names, execute
from bench.launch.config import CONF_DIR, NAME_KEYS, USER_NAMED_MODELS
from bench.launch.dryrun import expand
from bench.launch.sweeper import as_hydra_renders
from bench.run.identity import RunId, config_hash, parse_run_path
from bench.run.store import RunDir
from tests.hang import HANG_S
from tests.helpers import cli, make_cfg

GROUPS = ("method", "task", "rollout", "model")


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


@pytest.mark.parametrize("group", GROUPS)
def test_every_option_composes_to_its_file_name(group):
    """The composed name (method.name, task.name, rollout.engine, model.name) is the yaml's file name, for every
    yaml of every group: the registry key is the only place a name is written."""
    extra = {"model": ["model.path=/nonexistent"]}  # hf has a required path
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for option in options(group):
            cfg = compose("config", overrides=[f"{group}={option}", *(extra.get(group, []) if option == "hf" else [])])
            assert cfg[group][NAME_KEYS[group]] == option
            text = (CONF_DIR / group / f"{option}.yaml").read_text()
            assert not any(line.startswith(("name:", "engine:", "precision:")) for line in text.splitlines()), option


def test_a_stale_name_in_a_yaml_cannot_compose(tmp_path):
    """`name: tis` left in icepop.yaml used to train TIS into tis/...: now the yaml fails to compose."""
    conf = tmp_path / "conf"
    import shutil

    shutil.copytree(CONF_DIR, conf)
    (conf / "method" / "icepop.yaml").write_text((conf / "method" / "icepop.yaml").read_text() + "name: tis\n")
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        with pytest.raises(Exception, match="read-only"):
            compose("config", overrides=["method=icepop"])


def test_a_name_key_cannot_be_overridden():
    assert "cannot be overridden" in check_names(["method=bf16", "method.name=tis"])
    assert "cannot be overridden" in check_names(["task.name=gsm8k"])
    assert check_names(["model=hf", "model.path=/m", "model.name=mine"]) is None and "hf" in USER_NAMED_MODELS
    r = cli("method=bf16", "method.name=tis", "--dry-run")
    assert r.returncode == EXIT["bad_config"] and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("old, new", [("fp8", "method=naive"), ("fp8_ppo_is", "method=naive_ppo_is"),
                                      ("seq_mis", "method=geo_rs")])
def test_old_method_names_name_the_new_one(old, new):
    msg = check_names([f"method=bf16,{old}"])
    assert msg and new in msg
    if old == "seq_mis":
        assert "seq_is_rs" in msg  # verl's Seq-MIS has its own name


def test_run_id_path_name_and_tags_round_trip(tmp_path):
    rid = RunId("s", "tis", "int8", "gsm8k", "qwen3-8b", 2, variant="train.lr=3e-4")
    path = rid.path(tmp_path)
    assert path == tmp_path / "s" / "tis@int8" / "gsm8k" / "qwen3-8b" / "train.lr=3e-4" / "seed2"
    assert parse_run_path(path) == {"method": "tis", "precision": "int8", "task": "gsm8k", "model": "qwen3-8b",
                                    "variant": "train.lr=3e-4", "seed": 2}
    assert rid.name == "tis@int8-gsm8k-qwen3-8b-train.lr=3e-4-s2"
    assert rid.tags == ["method:tis", "precision:int8", "task:gsm8k", "model:qwen3-8b", "variant:train.lr=3e-4",
                        "seed:2"]
    assert RunId("s", "tis", "int8", "gsm8k", "m", 0).path(tmp_path).parent.name == "m"  # no variant, no level


def test_config_hash_leaves_out_only_the_non_semantic_keys(tmp_path):
    a = make_cfg(tmp_path, "method=tis")
    from omegaconf import OmegaConf

    base = OmegaConf.to_container(a, resolve=True)
    for key in ("train.threads=2", "tracking=offline", "train.checkpoint_every=7", "sweep=other"):
        assert config_hash(OmegaConf.to_container(make_cfg(tmp_path, "method=tis", key), resolve=True)) == config_hash(base), key
    for key in ("train.lr=5e-4", "train.steps=4", "task.n_test=50", "rollout.precision=int8", "algo.clip_eps_high=0.28"):
        assert config_hash(OmegaConf.to_container(make_cfg(tmp_path, "method=tis", key), resolve=True)) != config_hash(base), key


def test_a_sweep_over_arms_and_precisions_gives_every_job_its_own_directory(tmp_path):
    """Repro 1: `-m method=fp8,tis rollout.precision=int8,fp8_e4m3` put both precisions in one directory."""
    jobs = expand(["method=naive,tis", "rollout.precision=int8,fp8_e4m3", f"out_root={tmp_path}", "sweep=x"])
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        paths = {RunDir.of(compose("config", overrides=j)).path for j in jobs}
    assert {p.relative_to(tmp_path / "x").parts[0] for p in paths} == {
        "naive@int8", "naive@fp8_e4m3", "tis@int8", "tis@fp8_e4m3"}


def test_a_sweep_over_another_setting_gets_a_variant_level(tmp_path):
    """R4: `-m train.lr=1e-4,3e-4` collapsed onto one directory; now each value is a level of the run path."""
    jobs = expand(["method=tis", "train.lr=1e-4,3e-4", "seed=0,1", f"out_root={tmp_path}"])
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        paths = [RunDir.of(compose("config", overrides=j)).path for j in jobs]
    assert len(set(paths)) == 4
    assert {p.parent.name for p in paths} == {"train.lr=0.0001", "train.lr=0.0003"}
    out = cli("-m", "method=tis", "train.lr=1e-4,3e-4", f"out_root={tmp_path}", "--dry-run").stdout
    assert "train.lr=0.0001/seed0" in out and "train.lr=0.0003/seed0" in out
    # QuRL Table 4: rows that differ in the learning rate or the UAQ scale of one arm at one precision
    jobs = expand(["+experiment=paper/qurl_table4", f"out_root={tmp_path}"])
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        paths = [RunDir.of(compose("config", overrides=j)).path for j in jobs]
    assert len(set(paths)) == len(paths) == 5
    # each folder names the value its row means, spelt as a command line's would be (the rows say 1e-6 and 1.5e-6)
    assert sorted(p.parent.name for p in paths) == ["method.uaq_scale=1.5", "method.uaq_scale=2.0", "train.lr=1.5e-06",
                                                     "train.lr=1e-06", "train.lr=2e-06"]
    swept = expand(["method=tis", "train.lr=1.5e-6,3e-4", f"out_root={tmp_path}"])[0]
    assert "variant='train.lr=1.5e-06'" in swept  # Hydra's spelling of a command line's value, which rows now share
    assert [as_hydra_renders(o) for o in ("train.lr=1.5e-6", "+a.b=2e-6", "~a", "eval.sets=[aime24,amc23]", "x=1,2")] == [
        "train.lr=1.5e-06", "+a.b=2e-06", "~a", "eval.sets=[aime24,amc23]", "x=1,2"]


@pytest.mark.slow
def test_a_changed_config_is_refused_before_any_work_naming_the_keys(tmp_path):
    """Repro 2 and R2: a relaunch into a directory of another configuration is exit 2, nothing written, and
    train.overwrite=true is the way on; the same config with other non-semantic keys is skipped as done."""
    first = make_cfg(tmp_path, "method=ais", "rollout.precision=int8", "sweep=y")
    assert execute(first) == "completed"
    run = RunDir.of(first)
    assert run.path.relative_to(tmp_path).parts[:2] == ("y", "ais@int8")
    # the other precision is another run, in its own directory
    assert RunDir.of(make_cfg(tmp_path, "method=ais", "sweep=y")).path.parent.parent.parent.name == "ais@fp8_e4m3"
    before = {p: p.read_bytes() for p in run.path.iterdir() if p.is_file()}
    for change, key in (("train.lr=5e-4", "train.lr"), ("train.steps=4", "train.steps"), ("task.n_test=50", "task.n_test")):
        r = cli("method=ais", "rollout.precision=int8", "sweep=y", f"out_root={tmp_path}", *_fast(), change)
        assert r.returncode == EXIT["bad_config"], r.stderr
        line = r.stderr.strip().splitlines()[-1]
        assert key in line and "train.overwrite=true" in line and "another configuration" in line
        assert {p: p.read_bytes() for p in run.path.iterdir() if p.is_file()} == before  # nothing written
    # non-semantic keys: the completed run is found and skipped
    r = cli("method=ais", "rollout.precision=int8", "sweep=y", f"out_root={tmp_path}", *_fast(), "train.threads=2",
            timeout=HANG_S)
    assert r.returncode == 0 and "already completed" in r.stderr
    info = run.info()
    assert info["config_hash"] == config_hash(yaml.safe_load((run.path / "config.yaml").read_text()))
    # overwrite: the user's explicit way on
    assert execute(make_cfg(tmp_path, "method=ais", "rollout.precision=int8", "sweep=y", "train.steps=4",
                            "train.overwrite=true")) == "completed"
    assert len(run.metrics()) == 4


def _fast() -> list[str]:
    from tests.helpers import FAST

    return list(FAST)


@pytest.mark.slow
def test_a_lost_or_torn_record_never_lets_a_changed_config_through(tmp_path):
    """Issue 32 F2, end to end: config.yaml deleted or torn, a relaunch with another train.lr resumed and rewrote
    config.yaml and run.json's config_hash to it. Either record alone refuses (exit 2); both lost refuse (exit 5)
    with the ways on; no record is rewritten."""
    first = make_cfg(tmp_path, "train.steps=2")
    assert execute(first) == "completed"
    run = RunDir.of(first)
    config, info = run.path / "config.yaml", run.info_file
    good = {p: p.read_bytes() for p in (config, info)}

    def relaunch(*extra: str):
        before = {p.name: p.read_bytes() for p in run.path.iterdir() if p.is_file()}
        outcome = execute(make_cfg(tmp_path, "train.steps=2", *extra))
        assert {p.name: p.read_bytes() for p in run.path.iterdir() if p.is_file()} == before  # nothing rewritten
        return outcome

    for damaged in (config, info):
        for how in ("delete", "tear"):
            if how == "delete":
                damaged.unlink()
            else:
                damaged.write_bytes(b"{[" + good[damaged][: len(good[damaged]) // 2])  # parses as neither
            outcome = relaunch("train.lr=5e-4")
            assert (outcome, outcome.code) == ("bad_config", 2), outcome.reason
            assert "another configuration" in outcome.reason
            assert ("train.lr: 3e-05 -> 0.0005" if damaged is info else "config_hash") in outcome.reason
            damaged.write_bytes(good[damaged])
    assert relaunch() == "skipped"  # both records back: the same configuration is the completed run
    for how in ("delete", "tear"):
        for damaged in (config, info):
            damaged.unlink() if how == "delete" else damaged.write_bytes(b"{[" + good[damaged][:40])
        for extra in ((), ("train.lr=5e-4",)):
            outcome = relaunch(*extra)
            assert (outcome, outcome.code) == ("refused", 5), outcome.reason
            assert "move the directory" in outcome.reason and "train.overwrite=true" in outcome.reason
        for damaged in (config, info):
            damaged.write_bytes(good[damaged])
