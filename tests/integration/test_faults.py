"""Issue 13's fault probe, each fault a test: real trainer processes, real files, real signals.

A completed run is never destroyed (a second launch, a deleted run.json); a damaged line never costs the rows
after it; a broken checkpoint, a full disk, a read-only results directory and bad inputs each end in one line
naming the cause with a documented exit code; Ctrl-C and a SIGTERM during the final evaluation end cleanly;
stale temporaries are removed; the W&B history read back after any interruption equals metrics.jsonl.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from bench.run.store import RunDir
from tests.hang import HANG_S
from tests.helpers import FAST, REPO, make_cfg, strip_times
from tests.integration import signals
from tests.integration.wandb_readback import history, offline_runs

pytestmark = pytest.mark.slow

STEPS = 10
ARGS = [a for a in FAST if not a.startswith(("train.steps=", "train.checkpoint_every="))] + [f"train.steps={STEPS}"]
EVERY3 = [*ARGS, "train.checkpoint_every=3"]  # checkpoints at steps 3, 6, 9: ckpt/prev.pt exists after step 6


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "WANDB_MODE": "disabled", "WANDB_SILENT": "true", **extra}


def qrl_bench(*args: str, timeout: float = HANG_S, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=REPO, env=kw.pop("env", env()),
                          capture_output=True, text=True, timeout=timeout, **kw)


def run_of(out: Path, model: str = "tiny") -> RunDir:
    return RunDir(out / "default" / "bf16@bf16" / "arithmetic" / model / "seed0")


def interrupt(args: list[str], run: RunDir, sig: int, after_rows: int, tree: bool = False,
              **kw) -> subprocess.CompletedProcess:
    """`qrl-bench ARGS`, signalled at `after_rows` rows (see tests/integration/signals.py)."""
    return signals.interrupt([sys.executable, "-m", "bench", *args], run, sig, after_rows,
                             env=kw.pop("env", env()), tree=tree)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> RunDir:
    """An uninterrupted run: what every resumed run below must end equal to."""
    out = tmp_path_factory.mktemp("reference")
    proc = qrl_bench(*ARGS, f"out_root={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = run_of(out)
    assert run.status == "completed" and len(run.metrics()) == STEPS
    return run


@pytest.fixture(scope="module")
def preempted(tmp_path_factory) -> RunDir:
    """A run preempted (SIGUSR1) after its checkpoint at step 6 and before the end: ckpt/last.pt is the
    preemption's (step 7 or 8; 9 on a machine fast enough to finish a step between the poll and the freeze),
    ckpt/prev.pt the periodic one at step 6. Tests work on copies of it."""
    out = tmp_path_factory.mktemp("preempted")
    run = run_of(out)
    first = interrupt([*EVERY3, f"out_root={out}"], run, signal.SIGUSR1, after_rows=7)
    assert first.returncode == 128 + signal.SIGUSR1, first.stderr[-3000:]
    assert run.status == "preempted" and run.load_checkpoint(run.prev_ckpt_file)["step"] == 6
    assert run.load_checkpoint()["step"] == len(run.metrics()) in (7, 8, 9)
    return run


def copy_run(src: RunDir, out: Path) -> RunDir:
    dst = run_of(out)
    shutil.copytree(src.path, dst.path)
    return dst


def one_line_error(stderr: str) -> str:
    """The `qrl-bench: error:` line; there must be exactly one and no traceback."""
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = [ln for ln in stderr.splitlines() if ln.startswith("qrl-bench: error:")]
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


# ------------------------------------------------------------------------------- 1. a completed run survives
def test_a_launch_that_waited_while_the_run_completed_skips_it(tmp_path, monkeypatch):
    """Launch B (this process) reads `running`-or-nothing, and while it builds, launch A (a real second
    process) runs the same job to completion; B then takes the lock and must skip, not start over at step 0."""
    import bench.train
    from bench.launch.cli import execute

    cfg = make_cfg(tmp_path, *ARGS, fast=False)
    run = RunDir.of(cfg)
    real_build = bench.train.build

    def build_while_the_other_launch_finishes(c):
        parts = real_build(c)
        a = qrl_bench(*ARGS, f"out_root={tmp_path}")
        assert a.returncode == 0 and run.status == "completed", a.stderr[-3000:]
        return parts

    monkeypatch.setattr(bench.train, "build", build_while_the_other_launch_finishes)
    assert run.status is None  # B's early check sees no run
    a_rows = None

    def snapshot():
        return run.metrics_file.read_bytes(), run.eval_file.read_bytes(), run.info()["attempts"]

    outcome = execute(cfg)
    assert outcome == "skipped" and "already completed" in outcome.reason, outcome.reason
    a_rows = snapshot()
    assert a_rows[2] == 1 and len(run.metrics()) == STEPS and run.status == "completed"
    monkeypatch.setattr(bench.train, "build", real_build)
    # and a third launch through the CLI changes nothing either
    third = qrl_bench(*ARGS, f"out_root={tmp_path}")
    assert third.returncode == 0 and "already completed" in third.stderr
    assert snapshot() == a_rows


def test_completed_run_without_run_json_is_refused_until_overwrite(tmp_path, reference):
    run = copy_run(reference, tmp_path)
    run.info_file.unlink()
    rows = run.metrics_file.read_bytes()
    refused = qrl_bench(*ARGS, f"out_root={tmp_path}")
    assert refused.returncode == 5, refused.stderr[-3000:]
    line = one_line_error(refused.stderr)
    assert str(run.path) in line and "train.overwrite=true" in line and f"{STEPS} metrics rows" in line
    assert run.metrics_file.read_bytes() == rows and not run.info_file.exists()

    again = qrl_bench(*ARGS, f"out_root={tmp_path}", "train.overwrite=true")
    assert again.returncode == 0, again.stderr[-3000:]
    assert run.info()["attempts"] == 1 and strip_times(run.metrics()) == strip_times(reference.metrics())


# ------------------------------------------------------------------------- 2. a damaged line costs nothing else
def test_torn_line_is_set_aside_and_its_step_recomputed_from_the_previous_checkpoint(tmp_path, preempted, reference):
    run = copy_run(preempted, tmp_path)
    lines = run.metrics_file.read_text().splitlines()
    lines[6] = lines[6][:40]  # step 6: a torn line in the middle, the rows after it intact
    run.metrics_file.write_text("\n".join(lines) + "\n")
    (run.path / "ckpt" / "last.pt.tmp4242").write_bytes(b"a partial checkpoint of a killed writer")
    (run.path / "run.json.tmp77").write_text("{")

    second = qrl_bench(*EVERY3, f"out_root={tmp_path}")
    assert second.returncode == 0, second.stderr[-3000:]
    err = second.stderr
    assert "metrics.jsonl: unreadable line 7 moved to metrics.jsonl.bad-" in err, err[-3000:]
    assert "resuming from step 6 (ckpt/prev.pt)" in err  # the relaunch says where it resumes
    assert "removed stale temporary ckpt/last.pt.tmp4242" in err and "removed stale temporary run.json.tmp77" in err
    assert list(run.path.rglob("*.tmp*")) == []
    [aside] = run.path.glob("metrics.jsonl.bad-*")
    assert aside.read_text() == lines[6] + "\n"
    assert run.status == "completed" and run.info()["attempts"] == 2
    assert strip_times(run.metrics()) == strip_times(reference.metrics())
    assert run.evals() == reference.evals()
    assert run.info()["overrides"] == [*EVERY3, f"out_root={tmp_path}"]  # Hydra's task overrides, recorded


def test_unrecoverable_missing_step_ends_incomplete_and_analysis_lists_it(tmp_path, preempted):
    run = copy_run(preempted, tmp_path)
    lines = run.metrics_file.read_text().splitlines()
    lines[2] = "\x00" * 10  # step 2: before ckpt/prev.pt (step 6), so no checkpoint can recompute it
    run.metrics_file.write_text("\n".join(lines) + "\n")
    second = qrl_bench(*EVERY3, f"out_root={tmp_path}")
    assert second.returncode == 6, second.stderr[-3000:]
    assert "metrics.jsonl lacks step 2 and no checkpoint precedes them" in second.stderr
    info = run.info()
    assert info["status"] == "incomplete" and "metrics.jsonl lacks step 2" in info["reason"]
    assert [r["step"] for r in run.metrics()] == [s for s in range(STEPS) if s != 2]  # every other row kept
    # a relaunch changes nothing and says why; qrl-analyze lists the run with its reason, never uses it
    third = qrl_bench(*EVERY3, f"out_root={tmp_path}")
    assert third.returncode == 6 and "already ended incomplete" in third.stderr
    report = subprocess.run([sys.executable, "-m", "analysis", str(tmp_path / "default"), "--formats", "png"],
                            cwd=REPO, capture_output=True, text=True, timeout=HANG_S)
    assert report.returncode == 1, report.stderr[-3000:]  # no usable run
    assert "status=incomplete (metrics.jsonl lacks step 2" in report.stderr


# ------------------------------------------------------------------------------ 5. one line per failure
def test_unreadable_checkpoint_is_named_and_the_previous_one_offered(tmp_path, preempted, reference):
    run = copy_run(preempted, tmp_path)
    run.ckpt_file.write_bytes(b"")
    refused = qrl_bench(*EVERY3, f"out_root={tmp_path}")
    assert refused.returncode == 5, refused.stderr[-3000:]
    line = one_line_error(refused.stderr)
    assert f"checkpoint {run.ckpt_file} is unreadable" in line
    assert "train.resume_from=previous resumes from ckpt/prev.pt (step 6)" in line and "train.overwrite=true" in line
    resumed = qrl_bench(*EVERY3, f"out_root={tmp_path}", "train.resume_from=previous")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from step 6 (ckpt/prev.pt)" in resumed.stderr
    assert strip_times(run.metrics()) == strip_times(reference.metrics())


@pytest.fixture
def small_fs(tmp_path):
    """A 3 MiB tmpfs: room for the rows, not for the ~4 MB checkpoint (root only)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root): the full-disk case is not exercised")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_full_disk_fails_in_one_line_marks_failed_and_leaves_no_temporary(small_fs):
    proc = qrl_bench(*ARGS, f"out_root={small_fs}")
    assert proc.returncode == 1, proc.stderr[-3000:]
    run = run_of(small_fs)
    line = one_line_error(proc.stderr)
    assert f"No space left on device writing {run.ckpt_file}" in line and "free some space" in line
    info = run.info()
    assert info["status"] == "failed" and info["reason"].startswith("No space left on device")
    assert list(run.path.rglob("*.tmp*")) == []


@contextmanager
def read_only(folder: Path) -> Iterator[bool]:
    """`folder` (made here) read-only while the block runs: a read-only tmpfs mounted on it (root; yields True), or
    else a directory without write permission (yields False)."""
    folder.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(folder)],
                             capture_output=True).returncode == 0
    if not mounted:
        folder.chmod(0o555)  # not root: a directory without write permission
    try:
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(folder)], capture_output=True)
        folder.chmod(0o755)


def test_read_only_results_directory_is_one_line(tmp_path):
    ro = tmp_path / "ro"
    with read_only(ro) as mounted:
        proc = qrl_bench(*ARGS, f"out_root={ro / 'results'}")
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = one_line_error(proc.stderr)
    assert f"results directory {ro / 'results'} is not writable" in line
    assert ("read-only file system" in line) == mounted


@pytest.mark.parametrize("sweep", [False, True], ids=["run", "sweep"])
def test_a_new_run_in_a_read_only_sweep_directory_is_one_line(tmp_path, sweep):
    """Issue 32 F6: out_root writable, its sweep directory read-only: Hydra made the run directory (and a sweep's
    multirun.yaml) before any check and failed in a 30-line traceback; now one line, exit 2, before any work."""
    ro = tmp_path / "results" / "default"
    with read_only(ro):
        proc = qrl_bench(*(["-m", "seed=0,1"] if sweep else []), *ARGS, f"out_root={tmp_path / 'results'}")
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = one_line_error(proc.stderr)
    assert f"{'sweep' if sweep else 'run'} directory " in line and "cannot be written" in line and "out_root=" in line
    assert "Traceback" not in proc.stderr and list(ro.iterdir()) == []


@pytest.fixture(scope="module")
def warm_model() -> str:
    """The built-in model's cached warm start: an ordinary HF model directory (model=hf model.path=...)."""
    from bench.warmstart import warm_start_dir
    from bench.tasks.base import build_task

    cfg = make_cfg(Path("/nonexistent"))
    return str(warm_start_dir(cfg.model, build_task(cfg.task)))


def _jsonl(path: Path, content: bytes) -> str:
    path.write_bytes(content)
    return str(path)


@pytest.mark.parametrize("case", ["empty_jsonl", "no_answer_column", "not_utf8", "empty_model_dir", "prompt_too_long",
                                  "response_fills_the_context"])
def test_bad_input_is_exit_2_naming_the_culprit_before_step_0(tmp_path, warm_model, case):
    good = _jsonl(tmp_path / "good.jsonl", b'{"question": "1+1", "answer": "2"}\n{"question": "2+3", "answer": "5"}\n')
    empty = _jsonl(tmp_path / "empty.jsonl", b"")
    no_answer = _jsonl(tmp_path / "q.jsonl", b'{"question": "1+1"}\n')
    latin1 = _jsonl(tmp_path / "latin1.jsonl", '{"question": "café", "answer": "1"}\n'.encode("latin-1"))
    jsonl = ["model=hf", f"model.path={warm_model}", "task=jsonl", f"task.train_file={good}"]
    args, needle = {
        "empty_jsonl": ([*jsonl, f"task.test_file={empty}"], f"{empty}: empty JSONL file (no rows)"),
        "no_answer_column": ([*jsonl, f"task.test_file={no_answer}"], f"{no_answer} line 1: no field 'answer'"),
        "not_utf8": ([*jsonl, f"task.test_file={latin1}"], f"{latin1} line 1: not UTF-8 text (byte 0xe9"),
        "empty_model_dir": (["model=hf", f"model.path={tmp_path / 'model'}"], f"model directory {tmp_path / 'model'} is empty"),
        "prompt_too_long": (["model=hf", f"model.path={warm_model}", "task.max_new_tokens=125"],
                            "prompts do not fit the model's context of 128 tokens with task.max_new_tokens=125"),
        # it said "(... at most -72 fit)"
        "response_fills_the_context": (["model=hf", f"model.path={warm_model}", "task.max_new_tokens=200"],
                                       "task.max_new_tokens=200 leaves no room for a prompt in the model's context of "
                                       "128 tokens"),
    }[case]
    (tmp_path / "model").mkdir()
    out = tmp_path / "results"
    proc = qrl_bench(*ARGS, *args, f"out_root={out}")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert needle in one_line_error(proc.stderr)
    assert not out.exists() or not any(p.is_file() for p in out.rglob("*")), list(out.rglob("*"))  # nothing left


def test_ctrl_c_on_a_single_run_is_a_clean_preemption(tmp_path):
    run = run_of(tmp_path)
    first = interrupt([*ARGS, f"out_root={tmp_path}"], run, signal.SIGINT, after_rows=3)
    assert first.returncode == 130, first.stderr[-3000:]
    assert "KeyboardInterrupt" not in first.stderr and "Traceback" not in first.stderr
    assert "stopped by SIGINT after" in first.stderr and "checkpointed" in first.stderr
    info = run.info()
    assert info["status"] == "preempted" and "SIGINT" in info["reason"]
    assert run.load_checkpoint()["step"] == len(run.metrics())


def test_sigterm_during_the_final_evaluation_ends_the_run_cleanly(tmp_path, warm_model):
    # a long final eval (4000 test prompts) and no eval in between: the signal lands while it runs
    args = [*ARGS, "model=hf", f"model.path={warm_model}", "train.steps=2", "train.eval_every=100",
            "task.n_test=4000", f"out_root={tmp_path}"]
    run = run_of(tmp_path, "hf")
    proc = interrupt(args, run, signal.SIGTERM, after_rows=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "SIGTERM arrived during the final evaluation; the run is completed" in proc.stderr
    info = run.info()
    assert info["status"] == "completed" and [e["step"] for e in run.evals()] == [0, 2]


# --------------------------------------------------------------------------- 7. W&B history survives resumes
@pytest.mark.parametrize("how", ["TERM", "USR1", "KILL"])
def test_wandb_history_after_an_interrupted_run_equals_metrics_jsonl(tmp_path, reference, how):
    """TERM and USR1 go to the trainer and its W&B service process too (as SLURM signals every process of
    the job: the service dies with its unflushed rows); kill -9 hits the trainer alone (the offline file
    loses its last unflushed block). After the relaunch, the W&B history equals the run directory's rows."""
    args = [*[a for a in EVERY3 if not a.startswith("tracking=")], "tracking=offline", f"out_root={tmp_path}"]
    run = run_of(tmp_path)
    sig = getattr(signal, f"SIG{how}")
    first = interrupt(args, run, sig, after_rows=5, tree=how != "KILL", env=env(WANDB_MODE="offline"))
    assert first.returncode in (128 + sig, -sig), first.stderr[-3000:]
    second = qrl_bench(*args, env=env(WANDB_MODE="offline"))
    assert second.returncode == 0, second.stderr[-3000:]
    assert strip_times(run.metrics()) == strip_times(reference.metrics())
    wandb_id = run.info()["wandb_id"]
    attempts = offline_runs(run.path)
    assert len(attempts) == 2 and all(wandb_id in a.name for a in attempts)
    logged = {h["_step"]: h for h in history(attempts[-1])}  # the resumed attempt alone holds everything
    expected: dict[int, dict] = {}
    for row in [*run.evals(), *run.metrics()]:
        expected.setdefault(row["step"], {}).update(row)
    assert sorted(logged) == sorted(expected)
    for step, row in expected.items():
        assert {k: logged[step][k] for k in row} == row, step
