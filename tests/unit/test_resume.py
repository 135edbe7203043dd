"""bench/run/resume.py `decide` and the RunDir operations it relies on, on hand-made run directories.

Each case is one of issue 13's faults: what the relaunch must do with the directory it has just locked.
The end-to-end versions (real trainer, real processes) are in tests/integration/test_faults.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from bench.run.resume import decide, final_status, preview
from bench.run.identity import ADDED_KEYS, CONFIG_FILE, config_hash
from bench.run.runlog import RunLog
from bench.run.store import RunDir


def cfg(**train):
    return OmegaConf.create({"train": {"overwrite": False, "resume_from": "last", "eval_every": 2, **train}})


def write_rows(run: RunDir, steps, evals=(), bad: dict[int, str] | None = None) -> None:
    """metrics rows for `steps` (a line of text replaces the row at the steps in `bad`), eval rows for `evals`."""
    run.path.mkdir(parents=True, exist_ok=True)
    bad = bad or {}
    run.metrics_file.write_text("".join((bad[s] if s in bad else json.dumps({"step": s, "x": s})) + "\n" for s in steps))
    run.eval_file.write_text("".join(json.dumps({"step": s, "eval/accuracy": 0.5}) + "\n" for s in evals))


def save(run: RunDir, step: int) -> None:
    run.save_checkpoint({"step": step, "weights": torch.arange(3.0) + step})


@pytest.fixture
def run(tmp_path: Path) -> RunDir:
    """A run directory as `RunDir.start` leaves it before its first row: config.yaml records the configuration
    (run.json, with its config_hash, is left out: the tests below write the run.json each case needs)."""
    run = RunDir(tmp_path / "sweep" / "bf16" / "arithmetic" / "tiny" / "seed0")
    run.path.mkdir(parents=True)
    (run.path / CONFIG_FILE).write_text(OmegaConf.to_yaml(cfg()))
    return run


def test_completed_and_other_finished_runs_are_skipped_untouched(run):
    for status, outcome in [("completed", "skipped"), ("diverged", "diverged"), ("incomplete", "incomplete")]:
        write_rows(run, range(4), [0, 2, 4])
        run.update_info(status=status, reason="why")
        before = run.metrics_file.read_bytes(), run.eval_file.read_bytes(), run.info_file.read_bytes()
        plan = decide(run, cfg())
        assert (plan.action, plan.outcome) == ("skip", outcome)
        assert "train.overwrite=true" in plan.message
        assert (run.metrics_file.read_bytes(), run.eval_file.read_bytes(), run.info_file.read_bytes()) == before


def test_rows_without_a_checkpoint_are_refused_not_truncated(run):
    # a completed run whose run.json was deleted (its checkpoint is dropped at completion)
    write_rows(run, range(10), [0, 2, 4, 6, 8, 10])
    before = run.metrics_file.read_bytes()
    plan = decide(run, cfg())
    assert (plan.action, plan.outcome) == ("refuse", "refused")
    assert str(run.path) in plan.message and "train.overwrite=true" in plan.message
    assert "10 metrics rows" in plan.message and "no run.json" in plan.message
    assert run.metrics_file.read_bytes() == before


@pytest.mark.parametrize("status", ["running", "preempted", "failed"])
def test_an_unfinished_run_without_a_checkpoint_restarts_from_step_0(run, status):
    # killed (running), stopped (preempted) or failed (a full disk) before its first checkpoint: issue 19 R1
    write_rows(run, range(3), [0, 2])
    run.update_info(status=status, wandb_id="abc", attempts=1)
    plan = decide(run, cfg())
    assert (plan.action, plan.start, plan.checkpoint) == ("start", 0, None)
    assert any("restarting from step 0; its 3 metrics and 2 eval rows are recomputed identically" in n
               for n in plan.notes), plan.notes
    assert run.metrics() == [] and run.evals() == []
    info = run.info()
    assert info["wandb_id"] is None and info["attempts"] == 1  # a new W&B run; the attempt count is kept
    assert preview(RunDir(run.path), cfg()) == "run"  # nothing left to restart


def test_overwrite_is_the_explicit_way_to_restart(run):
    write_rows(run, range(10), [0, 2])
    run.update_info(status="completed", wandb_id="abc")
    save(run, 8)
    plan = decide(run, cfg(overwrite=True))
    assert plan.action == "start" and plan.checkpoint is None
    assert not run.metrics_file.exists() and not run.info_file.exists() and not run.ckpt_file.exists()
    assert any("deleted" in n for n in plan.notes)


def test_empty_directory_starts(run):
    run.path.mkdir(parents=True, exist_ok=True)
    plan = decide(run, cfg())
    assert plan.action == "start" and plan.start == 0 and plan.notes == []


def test_resume_keeps_every_readable_row_and_drops_those_after_the_checkpoint(run):
    write_rows(run, range(8), [0, 2, 4, 6])
    run.update_info(status="preempted")
    save(run, 6)
    plan = decide(run, cfg())
    assert (plan.action, plan.start, plan.checkpoint["step"]) == ("resume", 6, 6)
    assert plan.message == "resuming from step 6 (ckpt/last.pt)"
    assert [r["step"] for r in run.metrics()] == [0, 1, 2, 3, 4, 5]
    assert [r["step"] for r in run.evals()] == [0, 2, 4]


def test_unreadable_line_is_set_aside_and_recomputed_from_the_previous_checkpoint(run):
    # torn line at step 5, checkpoints at 4 (prev) and 7 (last): resume from 4 recomputes 5 (and 6)
    write_rows(run, range(9), [0, 2, 4, 6], bad={5: '{"step": 5, "x'})
    run.update_info(status="preempted")
    save(run, 4)
    save(run, 7)
    assert torch.load(run.prev_ckpt_file)["step"] == 4  # the last two are kept
    plan = decide(run, cfg())
    assert (plan.action, plan.start) == ("resume", 4)
    assert plan.message == "resuming from step 4 (ckpt/prev.pt)"
    [aside] = run.path.glob("metrics.jsonl.bad-*")
    assert aside.read_text() == '{"step": 5, "x\n'
    assert any("metrics.jsonl: unreadable line 6 moved to metrics.jsonl.bad-" in n for n in plan.notes), plan.notes
    assert any("lacks step 5" in n and "ckpt/prev.pt (step 4)" in n for n in plan.notes), plan.notes
    assert [r["step"] for r in run.metrics()] == [0, 1, 2, 3]


def test_unrecoverable_missing_step_goes_on_and_ends_incomplete(run):
    torn = '{"step": 1, "x": "' + "y" * 5000  # a long torn line is set aside whole, not abridged
    write_rows(run, range(9), [0, 2, 4, 6], bad={1: torn})
    run.update_info(status="preempted")
    save(run, 4)
    save(run, 7)
    plan = decide(run, cfg())
    assert (plan.action, plan.start) == ("resume", 7)
    assert [r["step"] for r in run.metrics()] == [0, 2, 3, 4, 5, 6]  # every readable row is kept
    [aside] = run.path.glob("metrics.jsonl.bad-*")
    assert aside.read_text() == torn + "\n"
    assert any("lacks step 1" in n and "end 'incomplete'" in n for n in plan.notes), plan.notes
    status, reason = final_status(run, steps=7, eval_every=2)
    assert status == "incomplete" and "metrics.jsonl lacks step 1" in reason and "eval.jsonl lacks step 7" in reason


def test_unreadable_checkpoint_is_named_with_both_ways_on(run):
    write_rows(run, range(9), [0, 2, 4, 6])
    run.update_info(status="preempted")
    save(run, 4)
    save(run, 7)
    run.ckpt_file.write_bytes(b"")  # empty: torch.load raises EOFError / RuntimeError
    plan = decide(run, cfg())
    assert (plan.action, plan.outcome) == ("refuse", "refused")
    assert str(run.ckpt_file) in plan.message and "unreadable" in plan.message
    assert "train.resume_from=previous resumes from ckpt/prev.pt (step 4)" in plan.message
    assert "train.overwrite=true restarts the run from step 0" in plan.message
    assert len(run.metrics()) == 9  # refused: nothing touched
    plan = decide(run, cfg(resume_from="previous"))
    assert (plan.action, plan.start) == ("resume", 4) and plan.message == "resuming from step 4 (ckpt/prev.pt)"


def test_missing_last_checkpoint_falls_back_to_the_previous(run):
    # a crash between the two renames of save_checkpoint: last.pt moved to prev.pt, the new one not in place
    write_rows(run, range(6), [0, 2, 4])
    run.update_info(status="running")
    save(run, 2)
    save(run, 4)
    run.ckpt_file.unlink()
    plan = decide(run, cfg())
    assert (plan.action, plan.start) == ("resume", 2)
    assert any("ckpt/last.pt is missing" in n for n in plan.notes)


def test_stale_temporaries_are_removed(run):
    write_rows(run, range(3), [0, 2])
    save(run, 2)
    (run.path / "ckpt" / "last.pt.tmp12345").write_bytes(b"partial")
    (run.path / "run.json.tmp999").write_text("{")
    (run.path / "keep.tmp").write_text("not ours")
    plan = decide(run, cfg())
    assert sorted(plan.notes)[:2] == ["removed stale temporary ckpt/last.pt.tmp12345",
                                      "removed stale temporary run.json.tmp999"]
    assert not (run.path / "ckpt" / "last.pt.tmp12345").exists() and (run.path / "keep.tmp").exists()


def test_append_after_a_torn_line_keeps_the_new_row_whole(run):
    run.path.mkdir(parents=True, exist_ok=True)
    run.metrics_file.write_text('{"step": 0}\n{"step": 1, "x')  # a writer killed mid-line
    RunLog(run).log({"step": 1, "x": 2})  # no mirror
    read = [json.loads(line) for line in run.metrics_file.read_text().splitlines() if line.endswith("}")]
    assert read == [{"step": 0}, {"step": 1, "x": 2}]


def test_failed_atomic_write_leaves_no_temporary(run, monkeypatch):
    run.path.mkdir(parents=True, exist_ok=True)

    def boom(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("bench.run.store.os.replace", boom)
    with pytest.raises(OSError):
        run.save_checkpoint({"step": 1})
    monkeypatch.undo()
    assert list(run.path.rglob("*.tmp*")) == []


def test_preview_says_what_decide_will_do_without_touching_anything(run):
    from bench.run.resume import preview

    run.path.mkdir(parents=True, exist_ok=True)
    assert preview(run, cfg()) == "run"
    write_rows(run, range(3), [0, 2])
    (run.path / "ckpt").mkdir()
    (run.path / "ckpt" / "last.pt.tmp1").write_bytes(b"x")
    before = sorted(p.name for p in run.path.rglob("*"))
    assert preview(run, cfg()) == "refuse" and decide(run, cfg()).action == "refuse"
    run.update_info(status="preempted")  # stopped before its first checkpoint
    assert preview(run, cfg()) == "restart" and run.metrics() != []
    save(run, 2)
    assert preview(run, cfg()) == "resume"
    run.update_info(status="diverged")
    assert preview(run, cfg()) == "skip" and preview(run, cfg(overwrite=True)) == "restart"
    assert "last.pt.tmp1" in before  # preview removed nothing (decide did, above)


# ---- issue 32 F2: two witnesses of the configuration, config.yaml and run.json's config_hash -------------------


def recorded(run: RunDir, **train) -> bytes:
    """A completed run of cfg(**train) with both records, as `RunDir.start` and `finish` leave them; returns the
    bytes of config.yaml."""
    write_rows(run, range(4), [0, 2, 4])
    text = OmegaConf.to_yaml(cfg(**train))
    (run.path / CONFIG_FILE).write_text(text)
    run.update_info(status="completed", config_hash=config_hash(OmegaConf.to_container(cfg(**train))),
                    overrides=[f"train.{k}={v}" for k, v in train.items()])
    return text.encode()


def damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "delete":
        path.unlink()
    elif how == "tear":  # garbage after half the file: YAML and JSON that no longer parse
        path.write_bytes(data[: len(data) // 2] + b"\x00{[")
    else:  # "truncate": cut at a line in the middle, as a writer killed half way leaves it (YAML that still parses)
        path.write_bytes(b"".join(data.splitlines(keepends=True)[:2]))


def files(run: RunDir) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in run.path.iterdir() if p.is_file()}


@pytest.mark.parametrize("how", ["delete", "tear", "truncate"])
def test_a_lost_config_yaml_still_refuses_a_changed_config_by_run_jsons_hash(run, how):
    """F2: config.yaml deleted or torn, a relaunch with another lr resumed and rewrote both records to it."""
    recorded(run, lr=1e-4)
    damage(run.path / CONFIG_FILE, how)
    before = files(run)
    plan = decide(run, cfg(lr=5e-4))
    assert (plan.action, plan.outcome) == ("refuse", "bad_config")
    assert "another configuration" in plan.message and "config_hash" in plan.message
    assert "train.lr=0.0001" in plan.message  # run.json's record of the earlier launch's overrides
    assert {"delete": "is missing", "tear": "is unreadable", "truncate": "does not hash to it"}[how] in plan.message
    assert preview(run, cfg(lr=5e-4)) == "refuse"
    assert files(run) == before  # neither record rewritten
    assert decide(run, cfg(lr=1e-4)).action == "skip"  # the same configuration: the hash agrees


@pytest.mark.parametrize("how", ["delete", "tear"])
def test_a_lost_run_json_still_refuses_a_changed_config_naming_the_keys(run, how):
    recorded(run, lr=1e-4)
    damage(run.info_file, how)
    before = files(run)
    plan = decide(run, cfg(lr=5e-4))
    assert (plan.action, plan.outcome) == ("refuse", "bad_config")
    assert "train.lr: 0.0001 -> 0.0005" in plan.message
    assert files(run) == before


def test_a_config_yaml_that_disagrees_with_run_jsons_hash_is_no_witness(run):
    """An edited config.yaml (says lr 5e-4; run.json's hash says 1e-4): the launch that matches the edit is refused,
    the one that matches the hash is not."""
    recorded(run, lr=1e-4)
    (run.path / CONFIG_FILE).write_text(OmegaConf.to_yaml(cfg(lr=5e-4)))
    plan = decide(run, cfg(lr=5e-4))
    assert plan.outcome == "bad_config" and "does not hash to it" in plan.message
    assert decide(run, cfg(lr=1e-4)).action == "skip"


@pytest.mark.parametrize("how", ["delete", "tear"])
def test_results_with_neither_record_are_refused_with_both_ways_on(run, how):
    recorded(run, lr=1e-4)
    damage(run.path / CONFIG_FILE, how)
    damage(run.info_file, how)
    before = files(run)
    for launch in (cfg(lr=1e-4), cfg(lr=5e-4)):  # no launch can be shown to be that run
        plan = decide(run, launch)
        assert (plan.action, plan.outcome) == ("refuse", "refused")
        assert "neither a readable config.yaml nor run.json's config_hash" in plan.message
        assert "move the directory" in plan.message and "train.overwrite=true" in plan.message
        assert "\n" not in plan.message and preview(run, launch) == "refuse"
    assert files(run) == before
    assert decide(run, cfg(lr=5e-4, overwrite=True)).action == "start"  # the way to discard them


def test_a_directory_without_records_or_results_starts(run):
    (run.path / CONFIG_FILE).unlink()
    assert decide(run, cfg(lr=5e-4)).action == "start"


# ---- keys added after a run was recorded (bench.run.identity.ADDED_KEYS) ------------------------------------------
def with_keys(base, keys: dict):
    """`base` with dotted `keys` set (a launch whose code has keys the recorded run's code lacked)."""
    launch = base.copy()
    for key, value in keys.items():
        OmegaConf.update(launch, key, value, force_add=True)
    return launch


NEUTRAL = {key: added.neutral for key, added in ADDED_KEYS.items()}


def test_a_key_added_since_at_its_neutral_value_is_no_change(run):
    """A run recorded before the keys of ADDED_KEYS existed is skipped by a launch that sets them all to their
    neutral values; its records are untouched (and run.json's hash still vouches for config.yaml)."""
    recorded(run, lr=1e-4)
    before = files(run)
    launch = with_keys(cfg(lr=1e-4), NEUTRAL)
    assert decide(run, launch).action == "skip" and preview(run, launch) == "skip"
    assert files(run) == before
    assert decide(run, with_keys(cfg(lr=5e-4), NEUTRAL)).outcome == "bad_config"  # a recorded key still counts


@pytest.mark.parametrize("key, value, named", [
    ("rollout.compact", True, "rollout.compact: '<unset>' -> True (added in 4a105a2; only rollout.compact=false"),
    ("algo.baseline", "kept", "algo.baseline: '<unset>' -> 'kept' (added in dd028ce; only algo.baseline=\"all\""),
    ("train.new_knob", 1, "train.new_knob: '<unset>' -> 1 (a key one record lacks and bench.run.identity.ADDED_KEYS "
                          "does not declare)"),
])
def test_an_added_key_off_its_neutral_value_or_an_undeclared_one_is_refused_naming_it(run, key, value, named):
    recorded(run, lr=1e-4)
    before = files(run)
    plan = decide(run, with_keys(cfg(lr=1e-4), {**NEUTRAL, key: value}))
    assert (plan.action, plan.outcome) == ("refuse", "bad_config")  # the CLI's exit 2
    assert named in plan.message, plan.message
    assert files(run) == before


def test_a_declared_key_recorded_with_another_value_is_a_change(run):
    """The rule covers a key the record lacks: recorded with a value, the key is compared as any other."""
    recorded(run, lr=1e-4)
    base = with_keys(cfg(lr=1e-4), {"algo.baseline": "kept"})
    (run.path / CONFIG_FILE).write_text(OmegaConf.to_yaml(base))
    run.update_info(config_hash=config_hash(OmegaConf.to_container(base)))
    plan = decide(run, with_keys(cfg(lr=1e-4), NEUTRAL))
    assert plan.outcome == "bad_config" and "algo.baseline: 'kept' -> 'all'" in plan.message


def test_an_edited_record_that_drops_a_key_is_still_caught_by_the_hash(run):
    """Deleting a key from config.yaml (to pass it off as an older run) breaks its hash: the record is no witness,
    and run.json's hash, which the launch's neutral keys do not match, refuses."""
    base = with_keys(cfg(lr=1e-4), {"rollout.compact": True})
    write_rows(run, range(4), [0, 2, 4])
    run.update_info(status="completed", config_hash=config_hash(OmegaConf.to_container(base)))
    (run.path / CONFIG_FILE).write_text(OmegaConf.to_yaml(cfg(lr=1e-4)))  # rollout.compact deleted
    plan = decide(run, with_keys(cfg(lr=1e-4), NEUTRAL))
    assert plan.outcome == "bad_config" and "does not hash to it" in plan.message


def test_a_changed_engine_is_named_first_and_its_keys_are_said_to_be_the_other_engines():
    """A run made with rollout=vllm relaunched without it: the refusal listed incidental keys first, with the
    added-key advice (`rollout.compact=false` would not make the runs the same), and hid `rollout.engine` in
    "and 8 more"."""
    from bench.run.identity import UNSET, describe_diff

    diff = [(f"rollout.k{i}", UNSET, i) for i in range(8)] + [("rollout.compact", UNSET, True),
                                                              ("rollout.engine", "vllm", "embedded")]
    text = describe_diff(diff)
    assert text.startswith("rollout.engine: 'vllm' -> 'embedded'; "), text
    assert "rollout.compact: '<unset>' -> True (only one of the two rollout.engine values has this key)" in text
    assert "only rollout.compact=false" not in text and text.endswith("; and 4 more")
