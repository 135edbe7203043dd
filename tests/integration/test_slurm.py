"""Through the real single-node SLURM cluster (scripts/slurm_up.sh): submitit, accounting, our launcher.

These tests skip only outside CI (env CI unset), printing why; in CI a cluster that is down is a failure.
Everything that waits on SLURM has the hang guard (tests/hang.py), so a stuck scheduler fails the test instead of
hanging CI; nothing bounds how long SLURM may take.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest

from bench.run.store import RunDir
from tests.hang import HANG_S, wait_until
from tests.helpers import FAST, REPO, strip_times
from tests.integration.launch_probe import edit_after_submission, make_probe, ran_from_the_snapshot, snapshot_of
from tests.integration.wandb_readback import offline_runs

QUICK = [a for a in FAST if not a.startswith("tracking=")] + ["tracking=offline"]

pytestmark = pytest.mark.slurm


def cluster_problem() -> str | None:
    """Why the cluster cannot take jobs, or None when it can."""
    if shutil.which("sbatch") is None:
        return "sbatch not found (SLURM not installed)"
    try:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=HANG_S)
        if "UP" not in ping.stdout:
            first = (ping.stdout + ping.stderr).strip().splitlines()[:1]
            return f"slurmctld not answering (scontrol ping: {first[0] if first else ping.returncode})"
        nodes = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=HANG_S).stdout.split()
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"SLURM commands failed: {e}"
    if not any(state.rstrip("*") in ("idle", "mix", "alloc") for state in nodes):
        return f"no usable node (states: {nodes})"
    return None


@pytest.fixture(scope="module")
def slurm() -> None:
    problem = cluster_problem()
    if problem is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"SLURM cluster is not usable in CI: {problem}")
    pytest.skip(f"no SLURM cluster ({problem}); bring one up with `bash scripts/slurm_up.sh` "
                "(these tests skip only when CI is unset)")


def cancel_jobs_under(folder: Path, grace: float = 15) -> None:
    """Leave nothing on the cluster: jobs submitted from `folder` (submitit's *_submitted.pkl names start with
    the job id) still queued `grace` seconds after the test are cancelled. The grace lets a job that has
    written its result finish exiting (the launcher returns as soon as the results exist)."""
    ids = sorted({p.name.split("_")[0] for p in folder.rglob("*_submitted.pkl")})
    if not ids:
        return

    def queued() -> str:
        return subprocess.run(["squeue", "-h", "-o", "%i", "-j", ",".join(ids)], capture_output=True, text=True,
                              timeout=HANG_S).stdout.strip()

    deadline = time.monotonic() + grace
    while queued() and time.monotonic() < deadline:
        time.sleep(0.5)
    if queued():
        subprocess.run(["scancel", *ids], capture_output=True, timeout=HANG_S)


@pytest.fixture
def cleanup(tmp_path):
    yield
    cancel_jobs_under(tmp_path)


def job_env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "WANDB_MODE": "offline", "WANDB_SILENT": "true", "HYDRA_FULL_ERROR": "1"}


# ---------------------------------------------------------------- the cluster itself


def test_submitit_roundtrip(slurm, cleanup, tmp_path):
    import submitit

    ex = submitit.AutoExecutor(folder=tmp_path / "%j")
    assert ex.cluster == "slurm"
    ex.update_parameters(timeout_min=2, cpus_per_task=1)
    job = ex.submit(os.getenv, "SLURM_JOB_ID")  # a function: pickled by name, runs in the job
    assert wait_until("the job to finish", job.done, every=0.5)
    assert job.result() == job.job_id  # ran inside SLURM, as that job
    # accounting (slurmdbd) knows the job; sacct lags the end by a second or two
    assert wait_until("sacct to report COMPLETED", lambda: job.state == "COMPLETED", every=0.5)


def test_cancelled_job_is_detected_not_waited_on_forever(slurm, cleanup, tmp_path):
    """Without slurmdbd accounting, submitit waits forever for a job killed before writing its result."""
    import submitit
    from submitit.core.utils import UncompletedJobError

    ex = submitit.AutoExecutor(folder=tmp_path / "%j")
    ex.update_parameters(timeout_min=5, cpus_per_task=1)
    job = ex.submit(time.sleep, 600)
    wait_until("the job to start", lambda: job.state == "RUNNING", every=0.5)
    subprocess.run(["scancel", job.job_id], check=True, timeout=HANG_S)
    assert wait_until("submitit to see the cancellation", job.done, every=0.5)
    with pytest.raises(UncompletedJobError, match="CANCELLED"):
        job.result()


# ---------------------------------------------------------------- code + config snapshot at submission

def test_queued_jobs_keep_the_code_and_config_of_submission(slurm, cleanup, tmp_path):
    """Submit (held in the queue), then edit the code and the config; the jobs must not see the edits.

    Works on a copy of the project (tests/integration/launch_probe.py): the repository is never touched.
    """
    paths = make_probe(tmp_path, "slurm", {"timeout_min": 5, "additional_parameters": {"hold": True}})
    env = job_env() | {"PYTHONPATH": str(paths["code"])}  # the submitting process imports bench from the copy
    proc = subprocess.Popen([sys.executable, str(paths["app"]), "-m", "n=0,1"], cwd=paths["workdir"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        pkls = wait_until("the jobs to be submitted",
                          lambda: sorted(paths["sweep"].glob(".submitit/*/*/*_submitted.pkl")) if proc.poll() is None
                          else pytest.fail(f"launcher exited early:\n{proc.stdout.read()}"))
        edit_after_submission(paths)
        subprocess.run(["scontrol", "release", pkls[0].name.split("_")[0]], check=True, timeout=HANG_S)
        out, _ = proc.communicate(timeout=HANG_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-4000:]

    snapshot = snapshot_of(paths)
    for rec in ran_from_the_snapshot(paths, 2, out):
        assert rec["pythonpath"].split(":")[0] == str(snapshot)                      # subprocesses too
        assert rec["preempt_signal"] == "USR1" and rec["job"]
    assert (snapshot / "conf" / "hydra" / "launcher" / "slurm.yaml").is_file()
    sbatch = next(paths["sweep"].glob(".submitit/*/*/*_submission.sh")).read_text()
    assert "#SBATCH --signal=USR1@120" in sbatch and f"cd {snapshot}" in sbatch


# ---------------------------------------------------------------- a GPU request


def test_gpu_request_reaches_the_sbatch_script(slurm, cleanup, tmp_path):
    """`hydra.launcher.gpus_per_node=1` becomes `#SBATCH --gpus-per-node=1` in the job's script (SLURM then gives
    the job CUDA_VISIBLE_DEVICES, and train.device=auto takes the GPU). This cluster has no GPU, so sbatch refuses
    the job: the test reads the script submitit wrote before calling sbatch, and checks the refusal is about the
    GPU (gres) and nothing else."""
    cmd = [sys.executable, "-m", "bench", "-m", "hydra/launcher=slurm", "method=bf16,tis", *QUICK,
           f"out_root={tmp_path}", "hydra.launcher.gpus_per_node=1", "hydra.launcher.cpus_per_task=4",
           "train.threads=4", "+hydra.launcher.additional_parameters.hold=true"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # the event that ends the wait: sbatch refused the job (the launch exits), or a cluster with GPUs queued it
    # (held: submitit wrote its *_submitted.pkl); then the script is there either way
    wait_until("sbatch to refuse or queue the job", lambda: proc.poll() is not None
               or list(tmp_path.glob("default/.submitit/*/*_submitted.pkl")))
    if proc.poll() is None:
        proc.kill()
    out, _ = proc.communicate()
    scripts = list(tmp_path.glob("default/.submitit/*/.submission_file_*.sh"))
    assert scripts, out[-3000:]
    text = scripts[0].read_text()
    assert "#SBATCH --gpus-per-node=1" in text and "#SBATCH --cpus-per-task=4" in text, text
    assert "#SBATCH --array=0-1" in text  # both runs of the sweep, one GPU each
    assert "#SBATCH --job-name=qrl-default" in text  # the sweep's name, which squeue shows
    if proc.returncode:
        assert proc.returncode == 2 and "Invalid generic resource (gres) specification" in out, out[-3000:]


# ---------------------------------------------------------------- the benchmark itself through SLURM


def test_small_sweep_through_slurm_completes_every_run(slurm, cleanup, tmp_path):
    """2 arms x 1 task x 1 seed, a few steps each, via `qrl-bench -m hydra/launcher=slurm`."""
    cmd = [sys.executable, "-m", "bench", "-m", "hydra/launcher=slurm", "method=bf16,tis", *QUICK,
           f"out_root={tmp_path}", f"hydra.launcher.timeout_min={HANG_S // 60}"]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, env=job_env(), capture_output=True, text=True, timeout=HANG_S)
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[sweep default] 2/2 done · 0 running · 0 failed · 0 skipped · took" in proc.stderr  # the sweep line
    runs = sorted(p.parent for p in tmp_path.glob("default/*/arithmetic/tiny/seed0/run.json"))
    assert [r.parts[-4] for r in runs] == ["bf16@bf16", "tis@fp8_e4m3"], list(tmp_path.rglob("run.json"))
    steps = int(next(a for a in FAST if a.startswith("train.steps=")).split("=")[1])
    job_ids = set()
    for path in runs:
        run = RunDir(path)
        info = run.info()
        assert info["status"] == "completed", info
        assert info["slurm_job_id"], info  # really ran as a SLURM job
        job_ids.add(info["slurm_job_id"])
        assert [r["step"] for r in run.metrics()] == list(range(steps))
        assert run.evals() and (path / "config.yaml").is_file()
        assert info["wandb_id"] and list((path / "wandb").glob(f"offline-run-*-{info['wandb_id']}"))
    assert len(job_ids) == 2
    [snapshot] = list((tmp_path / "default" / ".code").iterdir())
    assert (snapshot / "bench" / "train.py").is_file()
    print(f"sweep of 2 runs through SLURM: {wall:.1f} s")
    # a relaunch submits nothing: both runs completed (each job was queued and allocated only to skip)
    submitted = sorted(tmp_path.rglob("*_submitted.pkl"))
    again = subprocess.run(cmd, cwd=REPO, env=job_env(), capture_output=True, text=True, timeout=HANG_S)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Not submitting 2 of 2 jobs" in again.stdout and "0/2 done · 0 running · 0 failed · 2 skipped" in again.stderr
    # a changed configuration is refused before submission too: exit 2, its reason, nothing queued
    changed = subprocess.run([*cmd, "train.lr=0.001"], cwd=REPO, env=job_env(), capture_output=True, text=True,
                             timeout=HANG_S)
    assert changed.returncode == 2, changed.stderr[-3000:]
    assert "bad_config" in changed.stderr and "holds a run of another configuration (train.lr" in changed.stderr, \
        changed.stderr
    assert sorted(tmp_path.rglob("*_submitted.pkl")) == submitted


def preempted_once(cmd: list[str], running: Callable[[], RunDir | None]) -> tuple[str, int, str]:
    """Launch the sweep `cmd`, send SIGUSR1 to the SLURM job of the run `running()` returns once it is a few steps
    in, and wait for the sweep: (the job id, the sweep's exit code, its output)."""
    proc = subprocess.Popen(cmd, cwd=REPO, env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        job_id = wait_until("a few steps", running, proc).info()["slurm_job_id"]
        subprocess.run(["scancel", "--signal=USR1", job_id], check=True, timeout=HANG_S)
        out, _ = proc.communicate(timeout=HANG_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    return job_id, proc.returncode, out


def test_a_request_sbatch_refuses_is_one_line_exit_2_and_leaves_no_snapshot(slurm, cleanup, tmp_path):
    """A node feature the cluster does not have: sbatch refuses the array; the sweep says so in one line, naming the
    script it refused, exits 2 (bad configuration), and leaves no code snapshot (33 MB) behind (it was a traceback,
    exit 1). A partition it does not have is refused before anything is made, listing the cluster's (sinfo)."""
    cmd = [sys.executable, "-m", "bench", "-m", "hydra/launcher=slurm", "method=bf16", *QUICK, f"out_root={tmp_path}"]
    proc = subprocess.run([*cmd, "hydra.launcher.constraint=nosuchfeature"], cwd=REPO, env=job_env(),
                          capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    [line] = [ln for ln in proc.stderr.splitlines() if ln.startswith("qrl-bench: error:")]
    assert "SLURM refused the sweep's jobs, nothing was submitted" in line and "feature" in line, line
    script = Path(line.split()[-1][:-1]).read_text()
    assert "Traceback" not in proc.stderr and "#SBATCH --constraint=nosuchfeature" in script
    assert not (tmp_path / "default" / ".code").exists()
    proc = subprocess.run([*cmd, "hydra.launcher.partition=nosuch", f"out_root={tmp_path / 'p'}"], cwd=REPO,
                          env=job_env(), capture_output=True, text=True, timeout=HANG_S)
    partitions = subprocess.run(["sinfo", "-h", "-o", "%R"], capture_output=True, text=True, timeout=HANG_S).stdout.split()
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"qrl-bench: error: hydra.launcher.partition=nosuch: this cluster has no partition 'nosuch'; its partitions "
        f"(sinfo): {', '.join(sorted(set(partitions)))}"], proc.stderr
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "kill"])
def test_ctrl_c_of_the_submitter_says_the_jobs_run_on_and_how_to_cancel_them(slurm, cleanup, tmp_path, sig):
    """Ctrl-C (or a kill) while the sweep waits on SLURM: exit 128 + the signal with one line saying the submitted
    jobs keep running and the scancel that ends them (Ctrl-C was a KeyboardInterrupt traceback, a kill said
    nothing); the job is still SLURM's."""
    args = [a for a in QUICK if not a.startswith("train.steps=")]
    cmd = [sys.executable, "-m", "bench", "-m", "hydra/launcher=slurm", "method=bf16", *args, "train.steps=100000",
           f"out_root={tmp_path}", "hydra.launcher.timeout_min=30"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    [submitted] = wait_until("the job submitted", lambda: list(tmp_path.glob("default/.submitit/**/*_submitted.pkl")),
                             proc)
    job_id = submitted.name.split("_")[0]
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 128 + sig, err[-3000:]
    assert "Traceback" not in err and f"keep running on SLURM; `scancel {job_id}` cancels them" in err, err[-3000:]
    queued = subprocess.run(["squeue", "-h", "-o", "%i", "-j", job_id], capture_output=True, text=True,
                            timeout=HANG_S).stdout
    assert job_id in queued  # still SLURM's (the cleanup fixture cancels it)


def test_a_cancelled_job_that_checkpointed_is_summarised_as_preempted(slurm, cleanup, tmp_path):
    """`scancel` of a running job: SLURM's SIGTERM, the run checkpoints (run.json 'preempted'); submitit has no result
    for it (state CANCELLED), and the sweep's summary says 'preempted', with SLURM's state, and exits 143 (it said
    'failed', with only the first line of submitit's error, and exited 1)."""
    args = [a for a in QUICK if not a.startswith(("train.steps=", "train.checkpoint_every="))]
    cmd = [sys.executable, "-m", "bench", "-m", "hydra/launcher=slurm", *args, "train.steps=400",
           "train.checkpoint_every=100", f"out_root={tmp_path}", "hydra.launcher.timeout_min=30"]
    run = RunDir(tmp_path / "default" / "bf16@bf16" / "arithmetic" / "tiny" / "seed0")
    proc = subprocess.Popen(cmd, cwd=REPO, env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        job_id = wait_until("a few steps", lambda: len(run.metrics()) >= 3 and run, proc).info()["slurm_job_id"]
        subprocess.run(["scancel", job_id], check=True, timeout=HANG_S)
        out, _ = proc.communicate(timeout=HANG_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, out[-4000:]
    info = run.info()
    assert info["status"] == "preempted" and 3 <= len(run.metrics()) < 400, info
    line = next(ln for ln in out.splitlines() if "bf16@bf16-arithmetic-tiny-s0:" in ln and "preempted" in ln)
    assert "signal SIGTERM after " in line and " steps" in line and "(state: CANCELLED" in line, line
    assert "0/1 done · 0 running · 0 failed · 1 stopped" in out, out[-3000:]


def test_preempted_slurm_job_is_requeued_and_resumes(slurm, cleanup, tmp_path):
    """SIGUSR1 to a running SLURM job: it checkpoints, submitit requeues it, it resumes and completes with
    the metrics of an uninterrupted run. 40 steps: the signal must land before the last step (with 12 a fast
    machine finished the job first)."""
    steps = 40
    args = [a for a in QUICK if not a.startswith(("train.steps=", "train.checkpoint_every="))]
    args += [f"train.steps={steps}", "train.checkpoint_every=100"]
    ref = subprocess.run([sys.executable, "-m", "bench", *args, f"out_root={tmp_path / 'ref'}"], cwd=REPO,
                         env=job_env(), capture_output=True, text=True, timeout=HANG_S)
    assert ref.returncode == 0, ref.stderr[-3000:]

    # timeout_min=30: submitit calls a signal in the last 20% (or 10 min) of the limit a timeout, not a preemption
    cmd = [sys.executable, "-m", "bench", "-m", "hydra/launcher=slurm", *args, f"out_root={tmp_path / 'slurm'}",
           "hydra.launcher.timeout_min=30"]
    run = RunDir(tmp_path / "slurm" / "default" / "bf16@bf16" / "arithmetic" / "tiny" / "seed0")
    job_id, code, out = preempted_once(cmd, lambda: run if len(run.metrics()) >= 3 else None)
    assert code == 0, out[-4000:]
    info = run.info()
    assert info["status"] == "completed" and info["attempts"] == 2, info
    assert info["slurm_job_id"] == job_id  # the same job, requeued by submitit (not a new submission)
    assert strip_times(run.metrics()) == strip_times(RunDir(next((tmp_path / "ref").rglob("run.json")).parent).metrics())
    logs = "".join(p.read_text() for p in (tmp_path / "slurm" / "default" / ".submitit").rglob("*_log.err"))
    assert "caught SIGUSR1" in logs and "this job is preempted" in logs and "DUE TO JOB REQUEUE" in logs, logs[-3000:]
    attempts = offline_runs(run.path)  # one W&B run id across the requeue
    assert len(attempts) == 2 and all(info["wandb_id"] in a.name for a in attempts)


def test_a_preempted_job_of_spawned_ranks_checkpoints_before_submitit_requeues_it(slurm, cleanup, tmp_path):
    """train.nproc_per_node=2 in one SLURM task (a recipe's ranks on a GPU node): SIGUSR1 reaches the task and the
    two ranks it spawned. submitit's handler in the task requeues at once, and a requeue kills the job: the task must
    let the ranks finish their step and checkpoint first. Proof by result: the requeued attempt resumes from the step
    the signal interrupted, not from step 0 (the preemption's checkpoint is the run's only one)."""
    steps = 30
    args = two_task_args(tmp_path, f"train.steps={steps}", "train.checkpoint_every=1000", "task.n_test=4",
                         "model.warmstart_steps=0", "train.nproc_per_node=2")
    cmd = [sys.executable, "-m", "bench", "-m", "hydra/launcher=slurm", "hydra.launcher.timeout_min=30", *args,
           f"out_root={tmp_path / 'runs'}"]
    def runs() -> list[RunDir]:
        return [RunDir(p.parent) for p in (tmp_path / "runs").rglob("run.json")]

    job_id, code, out = preempted_once(cmd, lambda: next((r for r in runs() if len(r.metrics()) >= 3), None))
    assert code == 0, out[-4000:]
    [run] = runs()
    info = run.info()
    assert info["status"] == "completed" and info["attempts"] == 2 and info["slurm_job_id"] == job_id, info
    assert [r["step"] for r in run.metrics()] == list(range(steps))
    logs = "".join(p.read_text() for p in (tmp_path / "runs" / "default" / ".submitit").rglob("*_log.err"))
    resumed = [int(n) for n in re.findall(r"resuming from step (\d+)", logs)]
    assert resumed and resumed[-1] >= 3, logs[-4000:]
    # the order of the one log the task and its ranks share: submitit's requeue after the ranks' checkpoint (before
    # the fix it came first, and the ranks checkpointed only because a tiny step ends within SLURM's KillWait)
    checkpointed, requeued = logs.find("stopped by SIGUSR1 after"), logs.find("this job is preempted")
    assert 0 <= checkpointed < requeued, logs[-4000:]
    assert "W&B log failed" not in logs, logs[-4000:]  # nothing of the run was killed under it

def two_task_args(tmp_path: Path, *extra: str) -> list[str]:
    """A small tis run of 8 rows in two sampling shards (one per task), its warm start cached under `tmp_path`."""
    return [a for a in QUICK if not a.startswith("train.steps=")] + [
        "method=tis", "train.batch_size=8", "train.group_size=4", "train.sampling_shards=2",
        f"model.cache_dir={tmp_path / 'cache'}", "model.warmstart_target_acc=null", *extra]


def on_two_tasks(args: list[str], timeout_min: int, out_root: Path) -> list[str]:
    """The launch of one run (`args`) as one SLURM job of two tasks, one rank each."""
    return [sys.executable, "-m", "bench", "-m", "hydra/launcher=slurm", "hydra.launcher.tasks_per_node=2",
            f"hydra.launcher.timeout_min={timeout_min}", *args, f"out_root={out_root}"]


def test_one_run_as_two_slurm_tasks_trains_what_one_process_does(slurm, cleanup, tmp_path):
    """`hydra.launcher.tasks_per_node=2`: one run on two SLURM tasks, each one rank (FSDP2 over gloo, the torchrun
    environment exported from SLURM's by submitit). It equals the one-process run with the same sampling shards and
    micro-batches (every metric but time/* to 1e-6 relative); rank 0 alone writes run.json and W&B. The warm start
    is built inside the job, by whichever task takes its lock first (a build on rank 1 used to save no weights:
    transformers writes only on rank 0 of an initialized process group)."""
    args = two_task_args(tmp_path, "train.steps=2", "train.micro_batch_size=4", "train.grad_clip=1e6",
                         "model.warmstart_steps=40")
    cmd = on_two_tasks(args, HANG_S // 60, tmp_path / "two")
    proc = subprocess.run(cmd, cwd=REPO, env=job_env(), capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [info_file] = (tmp_path / "two").rglob("run.json")
    two = RunDir(info_file.parent)
    logs = sorted((tmp_path / "two" / "default" / ".submitit").rglob("*_log.err"))
    assert len(logs) == 2, logs  # two tasks of one job
    assert sum("building the arithmetic warm start" in p.read_text() for p in logs) == 1
    one = subprocess.run([sys.executable, "-m", "bench", *args, f"out_root={tmp_path / 'one'}"], cwd=REPO,
                         env=job_env(), capture_output=True, text=True, timeout=HANG_S)
    assert one.returncode == 0, one.stderr[-3000:]
    ref = RunDir(next((tmp_path / "one").rglob("run.json")).parent)
    assert two.info()["status"] == "completed" and two.info()["slurm_job_id"]
    for kind in ("metrics", "evals"):
        rows_2, rows_1 = strip_times(getattr(two, kind)()), strip_times(getattr(ref, kind)())
        assert [r["step"] for r in rows_2] == [r["step"] for r in rows_1] and rows_1
        for r1, r2 in zip(rows_1, rows_2):
            assert r1.keys() == r2.keys()
            bad = {k: (r1[k], r2[k]) for k in r1 if r2[k] != pytest.approx(r1[k], rel=1e-6, abs=1e-12)}
            assert not bad, (kind, r1["step"], bad)
    [mirror] = offline_runs(two.path)  # one W&B run, rank 0's
    assert two.info()["wandb_id"] in mirror.name


def task_pids(job_id: str) -> dict[int, int]:
    """{SLURM_PROCID: pid} of the job's task processes (submitit's `_submit`), read from /proc."""
    out = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if b"submitit.core._submit" not in (proc / "cmdline").read_bytes():
                continue
            env = dict(i.split("=", 1) for i in (proc / "environ").read_text().split("\0") if "=" in i)
        except OSError:  # gone, or not ours to read
            continue
        if env.get("SLURM_JOB_ID") == job_id and "SLURM_PROCID" in env:
            out[int(env["SLURM_PROCID"])] = int(proc.name)
    return out


def sacct(job_id: str, fields: str) -> str:
    """Accounting's `fields` (comma-separated) of job `job_id`, '|'-separated; '' before it knows the job."""
    return subprocess.run(["sacct", "-n", "-X", "-P", "-o", fields, "-j", job_id], capture_output=True, text=True,
                          timeout=HANG_S).stdout.strip()


def test_a_killed_task_ends_its_two_task_job(slurm, cleanup, tmp_path):
    """Issue 33 N6: kill -9 of one of a run's two SLURM tasks ends the job, reported failed: srun runs with
    --kill-on-bad-exit=1, so SLURM ends the other task instead of leaving it in its next collective until the
    process group's timeout (a dead NCCL peer is not noticed otherwise; gloo over TCP notices at once, so the test
    cannot rely on the survivor failing by itself). Proof by result, not by time: the survivor is stopped
    (SIGSTOP) before its peer is killed, so nothing but SLURM can end it; without the option the job would run
    into its time limit and end TIMEOUT."""
    args = two_task_args(tmp_path, "train.steps=200", "train.checkpoint_every=1000", "task.n_test=4",
                         "model.warmstart_steps=0")
    cmd = on_two_tasks(args, HANG_S // 60 // 2, tmp_path)
    proc = subprocess.Popen(cmd, cwd=REPO, env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        run = wait_until("the run's first step", lambda: next(
            (RunDir(p.parent) for p in tmp_path.rglob("run.json") if RunDir(p.parent).metrics()), None), proc)
        job_id = run.info()["slurm_job_id"]
        tasks = wait_until("both tasks", lambda: (lambda t: t if len(t) == 2 else None)(task_pids(job_id)), proc)
        script = next(tmp_path.glob("default/.submitit/*/*/*_submission.sh")).read_text()
        assert "--kill-on-bad-exit=1" in next(line for line in script.splitlines() if line.startswith("srun ")), script
        os.kill(tasks[0], signal.SIGSTOP)
        killed = time.time()
        os.kill(tasks[1], signal.SIGKILL)
        # the job's end, from accounting (the launcher notices it only at its next poll, up to a minute later)
        state, end = wait_until("the job to end", lambda: (lambda row: row if row[0] not in (
            "", "PENDING", "RUNNING", "COMPLETING", "REQUEUED") else None)(sacct(job_id, "State,End").split("|")),
            every=0.5)
    finally:
        proc.kill()  # the launcher (its job has ended, or the test failed)
        out, _ = proc.communicate()
    assert state == "FAILED", (state, out[-3000:])  # not TIMEOUT: SLURM ended the stopped survivor
    assert not Path(f"/proc/{tasks[0]}").exists()
    assert run.info()["status"] != "completed" and len(run.metrics()) < 200
    took = datetime.fromisoformat(end).timestamp() - killed  # sacct's End: local time, whole seconds
    print(f"kill -9 of task 1 (task 0 stopped) -> the job ended {took:.0f} s later (sacct End), {state}; "
          f"run.json {run.info()['status']!r}")
