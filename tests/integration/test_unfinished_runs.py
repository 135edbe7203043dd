"""Issue 19 R1: a run stopped before its first checkpoint is never stranded, and a sweep never deletes a completed run.

A run that stopped (kill -9, a dead sweep worker, a full disk at its first checkpoint) leaves rows, run.json
`running`/`failed`/`preempted` and no ckpt/. The relaunch of the same command restarts it from step 0, says so,
and ends with the rows of an uninterrupted run; the message printed when it failed says what the relaunch does.
`train.overwrite=true` on a sweep is refused before anything runs, leaving completed runs untouched.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bench.run.store import RunDir
from bench.methods import arm_precision
from tests.hang import HANG_S, wait_until
from tests.helpers import FAST, REPO, strip_times
from tests.integration.signals import alive, descendants
from tests.integration.test_faults import env, interrupt, one_line_error, qrl_bench

pytestmark = pytest.mark.slow

STEPS = 6
# no checkpoint before the end: every interruption below comes before the first one
ARGS = [a for a in FAST if not a.startswith(("train.steps=", "train.checkpoint_every="))] + [
    f"train.steps={STEPS}", "train.checkpoint_every=100"]
RESTART_NOTE = "restarting from step 0"


def run_of(out: Path, method: str = "bf16") -> RunDir:
    return RunDir(out / "default" / f"{method}@{arm_precision(method)}" / "arithmetic" / "tiny" / "seed0")


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, RunDir]:
    """Uninterrupted runs of the two arms used below."""
    out = tmp_path_factory.mktemp("reference")
    proc = qrl_bench("-m", *ARGS, "method=bf16,tis", f"out_root={out}", env=env(QRL_LOCAL_JOBS="2"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = {m: run_of(out, m) for m in ("bf16", "tis")}
    assert all(r.status == "completed" and len(r.metrics()) == STEPS for r in runs.values())
    return runs


def assert_equal_to(run: RunDir, ref: RunDir) -> None:
    assert run.status == "completed", run.info()
    assert strip_times(run.metrics()) == strip_times(ref.metrics())
    assert run.evals() == ref.evals()


def test_kill_9_before_the_first_checkpoint_restarts_from_step_0(tmp_path, reference):
    run = run_of(tmp_path)
    first = interrupt([*ARGS, f"out_root={tmp_path}"], run, signal.SIGKILL, after_rows=2)
    assert first.returncode == -signal.SIGKILL
    assert run.status == "running" and len(run.metrics()) >= 2 and not (run.path / "ckpt").exists()

    again = qrl_bench(*ARGS, f"out_root={tmp_path}")
    assert again.returncode == 0, again.stderr[-3000:]  # was: exit 5, "no checkpoint to resume them from"
    assert f"note: run.json says 'running' and there is no checkpoint (stopped before its first one): " \
           f"{RESTART_NOTE}" in again.stderr
    assert_equal_to(run, reference["bf16"])
    assert run.info()["attempts"] == 2


# The checkpoint write fails as on a full disk: torch.save into ckpt/last.pt.tmp<pid> raises ENOSPC after
# writing part of the file (the way a real full disk ends it); every other write goes through.
FULL_DISK = """
import errno, sys, torch
real = torch.save
def save(obj, f, *a, **k):
    if "last.pt.tmp" in str(getattr(f, "name", f)):
        f.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")
    return real(obj, f, *a, **k)
torch.save = save  # bench/run/store.py imports torch where it writes, so it finds this one
from bench.launch.entry import main
sys.argv = ["qrl-bench", *sys.argv[1:]]
main()
"""


def test_a_full_disk_at_the_first_checkpoint_says_restart_and_the_relaunch_completes(tmp_path, reference):
    run = run_of(tmp_path)
    args = [a for a in ARGS if not a.startswith("train.checkpoint_every=")] + ["train.checkpoint_every=2"]
    full = subprocess.run([sys.executable, "-c", FULL_DISK, *args, f"out_root={tmp_path}"], cwd=REPO, env=env(),
                          capture_output=True, text=True, timeout=HANG_S)
    assert full.returncode == 1, full.stderr[-3000:]
    line = one_line_error(full.stderr)
    assert f"No space left on device writing {run.ckpt_file}" in line
    # the message is true: no checkpoint exists, so the relaunch restarts (it used to promise a resume)
    assert "free some space, then relaunch the same command to restart it from step 0" in line
    assert "resume from its last checkpoint" not in line
    assert run.status == "failed" and len(run.metrics()) == 2 and list(run.path.rglob("*.tmp*")) == []
    assert not run.ckpt_file.exists()

    again = qrl_bench(*args, f"out_root={tmp_path}")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "run.json says 'failed'" in again.stderr and RESTART_NOTE in again.stderr
    assert_equal_to(run, reference["bf16"])


def _worker_of(proc: subprocess.Popen, run: RunDir) -> int:
    """The pid of the sweep worker process whose job writes `run` (its run.log's header names it)."""
    def worker() -> int | None:
        log = run.path / "run.log"
        if log.exists() and "(worker pid " in log.read_text():
            pid = int(log.read_text().rsplit("(worker pid ", 1)[1].split(")", 1)[0])
            return pid if pid in descendants(proc.pid) else None
        return None

    return wait_until(f"the worker of {run.path.name}", worker, proc, every=0.1)


def test_a_sweep_relaunch_restarts_a_job_whose_worker_died_and_never_touches_completed_runs(tmp_path, reference):
    bf16, tis = run_of(tmp_path, "bf16"), run_of(tmp_path, "tis")
    done = qrl_bench(*ARGS, "method=bf16", f"out_root={tmp_path}")
    assert done.returncode == 0, done.stderr[-3000:]
    completed = bf16.metrics_file.read_bytes(), bf16.eval_file.read_bytes(), bf16.info()["attempts"]

    # the sweep: bf16 is skipped; tis's worker is killed (kill -9) after 2 rows, before any checkpoint
    cmd = [sys.executable, "-m", "bench", "-m", *ARGS, "method=bf16,tis", f"out_root={tmp_path}"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env(QRL_LOCAL_JOBS="1"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        worker = _worker_of(proc, tis)
        wait_until("2 rows of tis", lambda: len(tis.metrics()) >= 2, proc)
        os.kill(worker, signal.SIGKILL)
        _, err = proc.communicate(timeout=HANG_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not alive(worker)
    assert proc.returncode == 1, err[-3000:]
    assert "died (killed by SIGKILL) during the job; relaunch the sweep to resume it" in err
    # the sweep saw its worker die: the run says so (it said 'running', as a live one does, to a report or a dry run)
    assert tis.status == "failed" and "killed by SIGKILL" in tis.info()["reason"] and not (tis.path / "ckpt").exists()

    # the advice of the old refusal, train.overwrite=true on the sweep: refused before any job, nothing touched
    over = qrl_bench("-m", *ARGS, "method=bf16,tis", f"out_root={tmp_path}", "train.overwrite=true")
    assert over.returncode == 2, over.stderr[-3000:]
    assert "train.overwrite=true is refused on a sweep (-m)" in one_line_error(over.stderr)
    assert (bf16.metrics_file.read_bytes(), bf16.eval_file.read_bytes(), bf16.info()["attempts"]) == completed

    # the relaunch of the same sweep (what a SLURM requeue does): tis restarts from step 0, bf16 is skipped
    again = qrl_bench("-m", *ARGS, "method=bf16,tis", f"out_root={tmp_path}", env=env(QRL_LOCAL_JOBS="1"))
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    assert RESTART_NOTE in (tis.path / "run.log").read_text()  # said in the job's own log
    assert (bf16.metrics_file.read_bytes(), bf16.eval_file.read_bytes(), bf16.info()["attempts"]) == completed
    assert_equal_to(tis, reference["tis"])
