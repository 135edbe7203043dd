"""load: discovery, validation (broken runs are listed, never fatal) and the DataFrames."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from analysis.load import ConfigConflict, discover, load_sweeps, merge

from .synth import BROKEN, METHODS, PRECISION, SEEDS, STEPS, TASKS, write_run


def test_clean_sweep_loads_every_run_with_identity_from_config(clean_sweep: Path):
    sweep = load_sweeps([clean_sweep])
    assert sweep.skipped == []
    assert len(sweep.runs) == len(METHODS) * len(TASKS) * len(SEEDS)
    assert {(r.method, r.precision) for r in sweep.runs} == set(PRECISION.items())
    assert sweep.tasks == TASKS and sweep.models == ["tiny"] and sweep.seeds == SEEDS
    diverged = [r for r in sweep.runs if r.status == "diverged"]
    assert [(r.method, r.task, r.seed) for r in diverged] == [("naive", "arithmetic", 2)]


def test_broken_runs_are_reported_with_their_reason_and_left_out(broken_sweep: Path):
    sweep = load_sweeps([broken_sweep])
    assert len(sweep.runs) == len(METHODS) * len(TASKS) * len(SEEDS)  # none of the seed-3 dirs got in
    assert all(r.seed != 3 for r in sweep.runs)
    reasons = {s.name.split("/", 1)[1]: s.reason for s in sweep.skipped}
    assert set(reasons) == set(BROKEN)
    for rel, fragment in BROKEN.items():
        assert fragment in reasons[rel], (rel, reasons[rel])


def test_truncated_last_line_is_dropped_with_a_warning(clean_sweep: Path):
    sweep = load_sweeps([clean_sweep])
    run = next(r for r in sweep.runs if (r.method, r.task, r.seed) == ("bf16", "arithmetic", 2))
    assert list(run.metrics["step"]) == list(range(STEPS))
    assert any("dropped unreadable last line" in w for w in run.warnings)


def test_long_metrics_table_holds_the_logged_values(clean_sweep: Path):
    sweep = load_sweeps([clean_sweep])
    path = clean_sweep / "tis" / "countdown" / "tiny" / "seed1" / "metrics.jsonl"
    logged = [json.loads(line) for line in path.read_text().splitlines()]
    long = sweep.metrics
    assert list(long.columns) == ["run_id", "method", "precision", "task", "model", "seed", "step", "metric", "value"]
    sel = long[(long.method == "tis") & (long.task == "countdown") & (long.seed == 1) & (long.metric == "mismatch/kl_k3")]
    assert sel.sort_values("step")["value"].tolist() == [rec["mismatch/kl_k3"] for rec in logged]
    assert set(sel["precision"]) == {"fp8_e4m3"}
    ev = sweep.evals
    assert {"eval/accuracy", "step", "method", "seed"} <= set(ev.columns)


def test_repeated_steps_keep_the_last_record(clean_sweep: Path):
    path = clean_sweep / "ess" / "countdown" / "tiny" / "seed0" / "metrics.jsonl"
    lines = path.read_text().splitlines()
    resumed = json.loads(lines[5])
    resumed["reward/mean"] = 123.0
    path.write_text("\n".join(lines[:6] + [json.dumps(resumed)] + lines[6:]) + "\n")
    run = next(r for r in load_sweeps([clean_sweep]).runs if (r.method, r.task, r.seed) == ("ess", "countdown", 0))
    assert run.metrics.loc[run.metrics.step == 5, "reward/mean"].item() == 123.0
    assert len(run.metrics) == STEPS
    assert any("repeated step" in w for w in run.warnings)


def test_identity_falls_back_to_the_path(clean_sweep: Path):
    # the run directory as the trainer lays it out: <method>@<precision>/<task>/<model>/seed<k>
    (clean_sweep / "ais@fp8_e4m3" / "countdown" / "tiny").mkdir(parents=True)
    (clean_sweep / "ais" / "countdown" / "tiny" / "seed1").rename(clean_sweep / "ais@fp8_e4m3" / "countdown" / "tiny" / "seed1")
    cfg_path = clean_sweep / "ais@fp8_e4m3" / "countdown" / "tiny" / "seed1" / "config.yaml"
    cfg = yaml.safe_load(cfg_path.read_text())
    del cfg["method"]["name"]
    del cfg["rollout"]["precision"]
    del cfg["seed"]
    cfg_path.write_text(yaml.safe_dump(cfg))
    run = next(r for r in load_sweeps([clean_sweep]).runs if r.path.parent.parent.parent.name == "ais@fp8_e4m3"
               and r.path.name == "seed1" and r.task == "countdown")
    assert (run.method, run.precision, run.seed) == ("ais", "fp8_e4m3", 1)


def test_discovery_skips_hidden_checkpoint_and_output_dirs(clean_sweep: Path):
    run_dir = clean_sweep / "tis" / "arithmetic" / "tiny" / "seed0"
    (clean_sweep / ".hydra").mkdir()
    (clean_sweep / ".hydra" / "metrics.jsonl").write_text("{}\n")
    (run_dir / "ckpt").mkdir()
    (run_dir / "ckpt" / "metrics.jsonl").write_text("{}\n")
    report = clean_sweep / "report" / "x"
    report.mkdir(parents=True)
    (report / "run.json").write_text("{}")
    found = discover(clean_sweep, exclude=[clean_sweep / "report"])
    assert len(found) == len(METHODS) * len(TASKS) * len(SEEDS)
    assert run_dir in found


def test_same_run_in_two_sweep_dirs_is_a_listed_duplicate(clean_sweep: Path, tmp_path: Path):
    other = tmp_path / "other"
    shutil.copytree(clean_sweep / "tis" / "arithmetic" / "tiny" / "seed0", other / "tis" / "arithmetic" / "tiny" / "seed0")
    sweep = load_sweeps([clean_sweep, other])
    assert len(sweep.runs) == len(METHODS) * len(TASKS) * len(SEEDS)
    assert [s.reason.startswith("duplicate of sweep/tis/arithmetic/tiny/seed0") for s in sweep.skipped] == [True]


def test_the_same_run_with_another_configuration_is_refused_not_a_duplicate(tmp_path: Path):
    """train.steps=12 in one sweep directory and 8 in the other, same method/task/model/seed: the loader used to
    drop one as a "duplicate" and pool the other's seeds with the first; now it refuses, naming the key."""
    for name, steps in (("long", 12), ("short", 8)):
        for seed in (0, 1):
            write_run(tmp_path / name, "tis", "arithmetic", seed, steps_planned=steps)
    with pytest.raises(ConfigConflict, match=r"long/tis/arithmetic/tiny/seed0 vs short/tis/arithmetic/tiny/seed0: "
                                             r"train\.steps: 12 -> 8") as e:
        load_sweeps([tmp_path / "long", tmp_path / "short"])
    assert "2 run(s)" in str(e.value)  # seed 1 as well
    with pytest.raises(ConfigConflict, match="train.steps: 12 -> 8"):  # merged from sources loaded apart
        merge([load_sweeps([tmp_path / "long"]), load_sweeps([tmp_path / "short"])])
    # another seed with another configuration is refused too: it would be pooled as a seed of the first
    write_run(tmp_path / "third", "tis", "arithmetic", 2, steps_planned=8)
    with pytest.raises(ConfigConflict, match="long/tis/arithmetic/tiny/seed0 vs third/tis/arithmetic/tiny/seed2"):
        load_sweeps([tmp_path / "long", tmp_path / "third"])
    # only what changes the numbers counts: the sweep's name and the W&B settings are not the configuration
    shutil.copytree(tmp_path / "long", tmp_path / "again")
    for cfg_path in (tmp_path / "again").rglob("config.yaml"):
        cfg = yaml.safe_load(cfg_path.read_text())
        cfg["sweep"], cfg["tracking"]["mode"] = "renamed", "disabled"
        cfg_path.write_text(yaml.safe_dump(cfg))
    again = load_sweeps([tmp_path / "long", tmp_path / "again"])
    assert len(again.runs) == 2 and [s.reason.split(" of ")[0] for s in again.skipped] == ["duplicate"] * 2


def test_cli_refuses_two_configurations_in_one_cell_with_exit_2(tmp_path: Path):
    import io
    from contextlib import redirect_stderr

    from analysis.cli import main

    write_run(tmp_path / "a", "bf16", "arithmetic", 0, steps_planned=12)
    write_run(tmp_path / "b", "bf16", "arithmetic", 0, steps_planned=8)
    err = io.StringIO()
    with redirect_stderr(err):
        assert main([str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "rep")]) == 2
    assert "train.steps: 12 -> 8" in err.getvalue() and not (tmp_path / "rep").exists()


def _copy_with_task(src: Path, dst: Path, **task) -> None:
    shutil.copytree(src, dst)
    config = yaml.safe_load((dst / "config.yaml").read_text())
    config["task"].update(task)
    (dst / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


def test_one_task_name_with_two_problem_sets_is_two_tasks_not_a_duplicate(clean_sweep: Path, tmp_path: Path):
    """Chains of 6-10 and of 8-16 steps are both `task=chain` on one model (the separation sweep's rungs in two
    sweep directories): the runs are two cells, labelled by the task keys that differ, never one dropped as a
    duplicate of the other or pooled with it as seeds."""
    src = clean_sweep / "tis" / "arithmetic" / "tiny"
    for rung, (lo, hi) in {"len60": (6, 10), "len90": (8, 16)}.items():
        for seed in (0, 1):
            _copy_with_task(src / f"seed{seed}", tmp_path / rung / "tis" / "arithmetic" / "tiny" / f"seed{seed}",
                            min_steps=lo, max_steps=hi)
    sweep = load_sweeps([tmp_path / "len60", tmp_path / "len90"])
    assert not sweep.skipped and len(sweep.runs) == 4
    assert sweep.tasks == ["arithmetic (min_steps=6, max_steps=10)", "arithmetic (min_steps=8, max_steps=16)"]
    # loaded apart (each alone has one problem set: plain name) and merged: labelled together, still not duplicates
    merged = merge([load_sweeps([tmp_path / "len60"]), load_sweeps([tmp_path / "len90"])])
    assert not merged.skipped and merged.tasks == sweep.tasks
    # the very same run twice is still a listed duplicate
    shutil.copytree(tmp_path / "len60", tmp_path / "again")
    again = load_sweeps([tmp_path / "len60", tmp_path / "again"])
    assert len(again.runs) == 2 and len(again.skipped) == 2 and again.tasks == ["arithmetic"]


def test_missing_sweep_dir_is_an_error(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_sweeps([tmp_path / "nope"])


def test_missing_steps_anywhere_are_detected_and_listed(clean_sweep: Path):
    """Issue 13 item 2: a run whose rows lack a middle step (a lost line) is listed, not used; so is a run
    the trainer itself marked `incomplete`, and a diverged run with a hole before its last step."""
    gap = clean_sweep / "tis" / "arithmetic" / "tiny" / "seed0" / "metrics.jsonl"
    lines = gap.read_text().splitlines()
    gap.write_text("\n".join(lines[:4] + lines[5:]) + "\n")  # step 4 is gone; the last step is still there
    marked = clean_sweep / "ais" / "countdown" / "tiny" / "seed1" / "run.json"
    info = json.loads(marked.read_text())
    info.update(status="incomplete", reason="metrics.jsonl lacks step 3 (lost lines)")
    marked.write_text(json.dumps(info))
    div = clean_sweep / "naive" / "arithmetic" / "tiny" / "seed2" / "metrics.jsonl"  # the diverged run
    lines = div.read_text().splitlines()
    div.write_text("\n".join(lines[:1] + lines[2:]) + "\n")
    sweep = load_sweeps([clean_sweep])
    reasons = {s.name.split("/", 1)[1]: s.reason for s in sweep.skipped}
    assert reasons == {
        "tis/arithmetic/tiny/seed0": "incomplete: metrics.jsonl lacks 1 step(s): 4",
        "ais/countdown/tiny/seed1": "status=incomplete (metrics.jsonl lacks step 3 (lost lines)) at step 11",
        "naive/arithmetic/tiny/seed2": "incomplete: metrics.jsonl lacks 1 step(s): 1",
    }, reasons
    assert len(sweep.runs) == len(METHODS) * len(TASKS) * len(SEEDS) - 3


def test_an_unfinished_runs_reason_says_how_far_it_got_never_none(tmp_path: Path):
    """Issue 32 F6: the trainer's run.json records no step, and the reason read "status=failed (OSError: test) at
    step None"; it now counts the logged rows (W&B's summary, which has a step, still gives it)."""
    for seed, (status, reason, rows) in enumerate([("failed", "OSError: test", 3), ("running", None, 0)]):
        run = write_run(tmp_path / "s", "tis", "arithmetic", seed=seed)
        info = json.loads((run / "run.json").read_text())
        info.update(status=status, reason=reason)
        del info["step"]
        (run / "run.json").write_text(json.dumps(info))
        (run / "metrics.jsonl").write_text("".join(json.dumps({"step": k}) + "\n" for k in range(rows)))
    reasons = sorted(s.reason for s in load_sweeps([tmp_path / "s"]).skipped)
    assert reasons == ["status=failed (OSError: test) after 3 logged step(s)",
                       "status=running before its first logged step"], reasons


def test_an_evaluation_without_an_accuracy_is_named_in_the_warnings(clean_sweep: Path):
    """A null accuracy at an intermediate step is left out of the AUC; it was dropped without a word."""
    path = clean_sweep / "tis" / "countdown" / "tiny" / "seed1" / "eval.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    lines[1]["eval/accuracy"] = None
    path.write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    run = next(r for r in load_sweeps([clean_sweep]).runs if (r.method, r.task, r.seed) == ("tis", "countdown", 1))
    step = lines[1]["step"]
    assert any(w.startswith(f"eval.jsonl: 1 evaluation(s) without a finite eval/accuracy (step {step})") for w in run.warnings)
