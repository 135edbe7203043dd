"""Launchers that freeze code and config at submission: hydra/launcher=local (the default) and =slurm.

Why: a sweep can sit in a queue for hours. With the stock Hydra launchers a queued job imports `bench`
from the working tree *when it starts* and re-composes its config from conf/ *when it starts*, so an edit
made after submitting silently changes jobs submitted before it. Here, at submission (`launch`):

1. code: the project files (bench/, hydra_plugins/, conf/ (with conf/experiment/), pyproject.toml; git-tracked plus
   untracked-not-ignored, as on disk) are copied to <sweep_dir>/.code/<timestamp>/ and jobs import from it.
   - SLURM: each job starts in that directory. `python -m submitit.core._submit` puts its working directory
     first on sys.path, ahead of the checkout and of an editable install, so `bench` and this launcher
     (both unpickled by reference) come from the copy; PYTHONPATH points there too, for subprocesses.
     The job then chdirs back to the submission directory, so relative paths (out_root) keep their meaning.
   - local: the snapshot goes first on sys.path while the worker processes are spawned (multiprocessing's
     `spawn` hands the parent's sys.path to its children), so the workers import `bench` from it
     (bench/launch/sweep_pool.py: the worker pool, signals passed on, one log per run).
2. config: every job's config is composed in the submitting process and shipped with the job; the job's
   Hydra ConfigLoader is wrapped so that its `load_sweep_config` returns that frozen config instead of
   re-reading conf/ (both stock launchers call it inside the job).
3. SLURM preemption: submitit's signal is set to `preempt_signal` (USR1) both in `#SBATCH --signal` and in
   the job (SUBMITIT_PREEMPT_SIGNAL): SIGUSR1 -> bench.run.preempt checkpoints -> submitit requeues the job.
4. While the sweep runs, both launchers show one live line (runs done / running / failed / skipped, ETA;
   for SLURM also the array's queue state) and at the end list the jobs that did not complete, with reason
   and log, and set the sweep's exit code (bench/launch/sweep_report.py).

Hydra only instantiates launchers from the `hydra_plugins` namespace: the classes that conf/hydra/launcher/
*.yaml name are thin subclasses in hydra_plugins/qrl_bench/launchers.py.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, NoReturn, Sequence

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher
from omegaconf import DictConfig, OmegaConf

from bench.launch import sweep_report
from bench.run.identity import STATUSES, RunId
from bench.run.store import CODE_PATHS, GIT_DIRTY, is_dirty
from bench.launch.requests import (check_gpu_blocks, check_gpu_request, check_launcher_values, check_signal_delay,
                                   gpu_blocks, request_warnings, visible_gpus)
from bench.launch.sweep_report import JobView, LiveLine

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT_PATHS = CODE_PATHS


def _git(root: Path, *args: str) -> str | None:
    """stdout of a git command in `root`, or None when git fails or `root` is not the top of a checkout
    (a copy of the project lying inside some other repository must not report that repository's state)."""
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=root, capture_output=True, text=True,
                             timeout=60)
        if top.returncode or Path(top.stdout.strip()).resolve() != root.resolve():
            return None
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def _project_files(root: Path, paths: Sequence[str]) -> list[Path]:
    """Files to snapshot, relative to root: what git would see (tracked + untracked-not-ignored), as on disk.

    Outside a git checkout (an unpacked release, a copy), every file under `paths` except bytecode.
    """
    listed = _git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *paths)
    if listed is not None:
        return sorted({Path(p) for p in listed.split("\0") if p and (root / p).is_file()})
    files = []
    for name in paths:
        top = root / name
        candidates = [top] if top.is_file() else sorted(top.rglob("*")) if top.is_dir() else []
        files += [p.relative_to(root) for p in candidates
                  if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"]
    return files


def code_digest(root: Path, files: Sequence[Path]) -> str:
    """sha256 over the files' paths and bytes: two snapshots with one digest hold the same code."""
    h = hashlib.sha256()
    for rel in files:
        h.update(str(rel).encode() + b"\0" + (root / rel).read_bytes() + b"\0")
    return h.hexdigest()


def snapshot_code(dest: Path, root: Path = REPO_ROOT, paths: Sequence[str] = SNAPSHOT_PATHS) -> Path:
    """Copy the project's code and configs to `dest` (which must not exist yet); returns `dest`, or an earlier
    snapshot beside it (in dest's folder) of the very same files, so that relaunching a sweep with unchanged code
    does not copy it again (~33 MB a call, warm starts included).

    The copy is not a git checkout, so SNAPSHOT.json records where it came from (source path, git sha,
    dirty flag, time, the files' digest) for the run's provenance (run.json git_sha).
    """
    files = _project_files(root, paths)
    if not any(f.parts[0] == "bench" for f in files):
        raise RuntimeError(f"no bench/ package found under {root} to snapshot")
    digest = code_digest(root, files)
    for earlier in sorted(dest.parent.glob("*/SNAPSHOT.json"), reverse=True) if dest.parent.is_dir() else []:
        try:
            if json.loads(earlier.read_text()).get("digest") == digest:
                return earlier.parent
        except (OSError, ValueError):
            continue
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    for rel in files:
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, tmp / rel)
    sha = _git(root, "rev-parse", "HEAD")
    sha = sha.strip() if sha else None
    dirty = _git(root, *GIT_DIRTY)
    (tmp / "SNAPSHOT.json").write_text(json.dumps({
        "source": str(root), "git_sha": sha, "git_dirty": None if dirty is None else is_dirty(dirty),
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "files": len(files), "digest": digest}, indent=2) + "\n")
    tmp.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(dest)  # a half-copied snapshot never looks complete
    return dest


class FrozenConfigLoader:
    """Hydra's ConfigLoader, except that `load_sweep_config` returns the configs composed at submission.

    Both stock launchers call `hydra_context.config_loader.load_sweep_config(master, overrides)` inside the
    job; with this wrapper in the (pickled) HydraContext that call no longer reads conf/.
    """

    def __init__(self, loader: Any, master: DictConfig, job_overrides: Sequence[Sequence[str]]) -> None:
        self._loader = loader
        self._configs = {tuple(ov): loader.load_sweep_config(master, list(ov)) for ov in job_overrides}

    def load_sweep_config(self, master_config: DictConfig, sweep_overrides: List[str]) -> DictConfig:
        return copy.deepcopy(self._configs[tuple(sweep_overrides)])

    def __getattr__(self, name: str) -> Any:  # everything else: the real loader
        if name.startswith("__") or name in ("_loader", "_configs"):
            raise AttributeError(name)
        return getattr(self._loader, name)


class _Snapshotting:
    """What both launchers add to their stock parent: the code snapshot and the frozen configs."""

    config: DictConfig | None
    hydra_context: HydraContext | None

    def _init_snapshotting(self, code_dir: str | None) -> None:
        self.code_dir = code_dir  # None: <sweep_dir>/.code/<timestamp>
        self.code: Path | None = None  # made at the first launch of this process
        self.code_is_new = False  # made by this process (not an earlier snapshot of the same files)

    def _unsettled(self, jobs: list[JobView], overrides: dict[int, list[str]],
                   not_done: str = "Not starting") -> list[JobView]:
        """The jobs that have work; the rest (completed, or refused before any work: a changed configuration) are
        recorded as the job itself would report them (`_settled`) and never handed out: on SLURM each costs a queue
        wait and an allocation, locally a worker's start and a job header in a finished run's run.log."""
        assert self.hydra_context is not None
        configs = self.hydra_context.config_loader._configs
        todo = [j for j in jobs if not _settled(j, configs[tuple(overrides[j.idx])])]
        if len(todo) < len(jobs):
            log.info(f"{not_done} {len(jobs) - len(todo)} of {len(jobs)} jobs: already completed, or refused "
                     "before any work (the summary says which)")
        return todo

    def _snapshot(self) -> Path:
        if self.code is None:
            assert self.config is not None
            sweep_dir = Path(str(self.config.hydra.sweep.dir)).absolute()
            code = Path(self.code_dir or sweep_dir / ".code" / time.strftime("%Y%m%d-%H%M%S")).absolute()
            if code.exists():  # two submissions within one second: keep both
                code = code.with_name(f"{code.name}-{os.getpid()}")
            self.code = snapshot_code(code)
            self.code_is_new = self.code == code
            reused = "" if self.code_is_new else " (unchanged code: an earlier snapshot)"
            log.info(f"Code snapshot for these jobs: {self.code}{reused}")
        return self.code

    def _freeze_configs(self, job_overrides: Sequence[Sequence[str]]) -> None:
        assert self.config is not None and self.hydra_context is not None
        loader = self.hydra_context.config_loader
        loader = getattr(loader, "_loader", loader)  # a second batch: wrap the real loader again
        self.hydra_context = HydraContext(config_loader=FrozenConfigLoader(loader, self.config, job_overrides),
                                          callbacks=self.hydra_context.callbacks)


def job_views(loader: FrozenConfigLoader, master: DictConfig, job_overrides: Sequence[Sequence[str]],
              initial_job_idx: int) -> tuple[list[JobView], dict[int, list[str]]]:
    """The sweep's jobs as the live line sees them (name, run directory, steps, warm-start key), from the
    configs composed at submission; and each job's overrides by index."""
    views, overrides = [], {}
    for i, ov in enumerate(job_overrides):
        idx = initial_job_idx + i
        cfg = loader.load_sweep_config(master, list(ov))
        try:  # the run's own directory (bench/run/identity.py), not Hydra's sweep dir/subdir: a job may set `sweep`
            rid = RunId.of(cfg)
            run_dir, name = rid.path(cfg.out_root), rid.name
            key = (str(cfg.task.name), OmegaConf.to_yaml(cfg.task), OmegaConf.to_yaml(cfg.model))
            steps, arm = int(cfg.train.steps), str(rid.arm)
        except Exception:  # noqa: BLE001 -- another Hydra app (the launcher tests' probe)
            run_dir = Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)
            name, key, steps, arm = " ".join(filter_overrides(ov)) or f"job{idx}", (), 1, ""
        views.append(JobView(idx, name, run_dir.absolute(), steps, key, own_dir=bool(key), arm=arm))
        overrides[idx] = list(ov)
    return views, overrides


def _job_returns(jobs: list[JobView], overrides: dict[int, list[str]], config: DictConfig) -> list[JobReturn]:
    """Hydra's JobReturn per job, each holding its outcome dict (a job never started: 'not started')."""
    out = []
    for j in jobs:
        value = j.outcome or {"name": j.name, "outcome": "not started", "code": 1,
                              "reason": "the sweep stopped before it started"}
        out.append(JobReturn(overrides=overrides[j.idx], cfg=None, hydra_cfg=config, working_dir=str(j.run_dir),
                             task_name=j.name, status=JobStatus.COMPLETED, _return_value=value))
    return out


class SnapshotLocalLauncher(_Snapshotting, Launcher):
    """Parallel local worker processes (bench/launch/sweep_pool.py) + code/config snapshot + the sweep's live line."""

    def __init__(self, n_jobs: int = -1, code_dir: str | None = None) -> None:
        self.n_jobs = int(n_jobs)
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None
        self._init_snapshotting(code_dir)
        self._stopped_by: int | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        import cloudpickle

        from bench.launch.sweep_pool import WorkerPool

        assert self.config is not None and self.hydra_context is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir)).absolute()
        sweep_dir.mkdir(parents=True, exist_ok=True)
        code = str(self._snapshot())
        n_workers = self.n_jobs if self.n_jobs > 0 else max(1, (os.cpu_count() or 1) + 1 + self.n_jobs)
        n_workers = min(n_workers, len(job_overrides))
        nproc = int(OmegaConf.select(self.config, "train.nproc_per_node", default=1) or 1)
        on_gpu = OmegaConf.select(self.config, "train.device", default="auto") != "cpu"
        gpus = gpu_blocks(visible_gpus(), nproc, n_workers) if on_gpu else None
        if gpus is not None:
            log.info(f"{len(gpus)} local worker(s), each on its own GPUs: {'; '.join(gpus)}")
        if self._stopped_by is not None:  # an earlier batch of this sweep was stopped: start nothing more
            self._freeze_configs(job_overrides)
            jobs, overrides = job_views(self.hydra_context.config_loader, self.config, job_overrides, initial_job_idx)
            sweep_report.finish(LiveLine(sweep_dir.name, jobs), self._stopped_by)
            return _job_returns(jobs, overrides, self.config)
        sys.path.insert(0, code)  # spawned workers get this sys.path: they import `bench` from the snapshot
        try:
            pool = WorkerPool(n_workers, gpus)  # started now: their imports overlap the config composition below
            try:
                self._freeze_configs(job_overrides)
                if gpus is not None:
                    check_gpu_blocks(self.hydra_context.config_loader._configs.values(), nproc)
                jobs, overrides = job_views(self.hydra_context.config_loader, self.config, job_overrides,
                                            initial_job_idx)
                line = LiveLine(sweep_dir.name, jobs)
                todo = self._unsettled(jobs, overrides)
                log.info(f"Launching {len(todo)} jobs on {n_workers} local worker processes; sweep output dir: "
                         f"{sweep_dir}; each run's output goes to <run dir>/run.log")
                payload = cloudpickle.dumps((self.hydra_context, self.config, self.task_function, Singleton.get_state()))
                if todo:
                    self._stopped_by = pool.run(payload, todo, overrides, line, sweep_dir)
            finally:
                pool.close()
        finally:
            sys.path.remove(code)
        sweep_report.finish(line, self._stopped_by)
        return _job_returns(jobs, overrides, self.config)


#: srun options of every job: a task that dies (kill -9, out of memory, a segfault) ends the job's other tasks at
#: once, instead of leaving them waiting in their next collective until the process group's timeout (NCCL)
SRUN_ARGS = ("--kill-on-bad-exit=1",)


class SnapshotSlurmLauncher(_Snapshotting, SlurmLauncher):
    """hydra-submitit-launcher's SlurmLauncher + code/config snapshot + our preemption signal."""

    def __init__(self, preempt_signal: str = "USR1", code_dir: str | None = None, **params: Any) -> None:
        check_launcher_values(params)
        check_signal_delay(params)
        for warning in check_gpu_request(params):
            log.warning(warning)
        super().__init__(**params)
        self._init_snapshotting(code_dir)
        self.preempt_signal = preempt_signal.upper().removeprefix("SIG")
        self.submit_cwd: str | None = None
        self._user_setup = list(self.params.get("setup") or [])
        self._user_sbatch = dict(self.params.get("additional_parameters") or {})
        self._user_srun = [a for a in self.params.get("srun_args") or [] if a not in SRUN_ARGS]

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        code = shlex.quote(str(self._snapshot()))
        self._freeze_configs(job_overrides)
        configs = list(self.hydra_context.config_loader._configs.values())
        for warning in request_warnings(self.params, configs):
            log.warning(warning)
        self.submit_cwd = os.getcwd()
        self.params["srun_args"] = [*SRUN_ARGS, *self._user_srun]
        sig = self.preempt_signal
        self.params["setup"] = [
            f"cd {code}",
            f'export PYTHONPATH={code}"${{PYTHONPATH:+:$PYTHONPATH}}"',
            f"export SUBMITIT_PREEMPT_SIGNAL={sig}",
            *self._user_setup,
        ]
        self.params["additional_parameters"] = {
            "signal": f"{sig}@{self.params.get('signal_delay_s', 120)}",
            **self._user_sbatch,
        }
        assert self.config is not None and self.hydra_context is not None
        jobs, overrides = job_views(self.hydra_context.config_loader, self.config, job_overrides, initial_job_idx)
        line = LiveLine(Path(str(self.config.hydra.sweep.dir)).name, jobs)
        todo = self._unsettled(jobs, overrides, "Not submitting")  # (no allocation is spent on them)
        if not todo:
            sweep_report.finish(line)
            return _job_returns(jobs, overrides, self.config)
        monitor = SlurmMonitor(todo, line)
        with _submitted_jobs(monitor.submitted), _terminate_as_interrupt() as stopped_by:
            monitor.start()
            try:
                results = super().launch([overrides[j.idx] for j in todo], initial_job_idx)
            except Exception as e:  # noqa: BLE001 -- one kind is ours to report (`_refused_submission`)
                if monitor.submitted or type(e).__name__ != "FailedJobError":
                    raise
                self._refused_submission(e)
            except KeyboardInterrupt:  # Ctrl-C (or a kill) while waiting: the jobs are SLURM's now; say so, and how
                print(f"\nqrl-bench: {_left_running(monitor.submitted)}", file=sys.stderr)  # to end them
                sys.exit(128 + (stopped_by[0] or signal.SIGINT))
            finally:
                monitor.stop()
        for job, ret, sub in zip(todo, results, monitor.submitted):
            job.state = "done"
            job.outcome = _as_recorded(sweep_report.outcome_of(ret._return_value, job.name), job, monitor.started)
            job.log = _submitit_log(sub)
        sweep_report.finish(line)
        return _job_returns(jobs, overrides, self.config)

    def _refused_submission(self, err: BaseException) -> NoReturn:
        """sbatch refused the array (a partition, account, QoS, constraint or GPU request the cluster does not have):
        nothing was submitted, so the code snapshot made for it goes (33 MB; the script sbatch refused stays, in the
        submitit folder, to read what was asked), and the cause is one line, exit 2, as for any request found bad
        before any work."""
        if self.code is not None and self.code_is_new:
            shutil.rmtree(self.code, ignore_errors=True)
            try:
                self.code.parent.rmdir()  # .code/, when no earlier snapshot is there
            except OSError:
                pass
            self.code, self.code_is_new = None, False
        said = [line.strip() for line in str(err).splitlines() if "error" in line.lower()] or [str(err).strip()]
        scripts = sorted(Path(str(self.params.get("submitit_folder", ""))).parent.glob(".submission_file_*.sh"))
        where = f"; the script it refused: {scripts[-1]}" if scripts else ""
        print(f"qrl-bench: error: SLURM refused the sweep's jobs, nothing was submitted: {said[-1]} (check the "
              f"hydra.launcher request against the cluster: sinfo, sacctmgr show assoc{where})", file=sys.stderr)
        sys.exit(2)

    def __call__(self, sweep_overrides: List[str], job_dir_key: str, job_num: int, job_id: str,
                 singleton_state: Dict[type, Singleton]) -> JobReturn:
        """Runs inside the SLURM job (started in the snapshot): back to the submission directory, then the stock
        job. Its output stays in submitit's log files (<sweep>/.submitit/<time>/<job id>_log.{out,err}), where
        SLURM users look; the sweep's summary names them."""
        if self.submit_cwd is not None:
            os.chdir(self.submit_cwd)
        return super().__call__(sweep_overrides, job_dir_key, job_num, job_id, singleton_state)


def _settled(job: JobView, cfg: DictConfig) -> bool:
    """Whether the job's outcome is known before it runs (bench.run.resume.settled: completed, or refused before
    any work); then it is recorded as the job itself would report it and not submitted: on SLURM each job costs
    a queue wait and an allocation (8 GPUs for some recipes) only to say so."""
    from bench.launch.cli import Outcome
    from bench.run.resume import settled
    from bench.run.store import RunDir

    if not job.own_dir:
        return False
    try:
        found = settled(RunDir.of(cfg), cfg)
    except Exception:  # noqa: BLE001 -- undecided here: the job decides, as it always does
        return False
    if found is None:
        return False
    job.state, job.outcome = "done", Outcome(found[0], found[1], job.run_dir).as_dict(job.name)
    return True


def _as_recorded(outcome: dict[str, Any], job: JobView, since: float) -> dict[str, Any]:
    """A job submitit reports lost (its result missing: `scancel`, a node lost) whose run says, in a run.json
    written by this launch, that it was preempted (it caught SLURM's SIGTERM and checkpointed) is 'preempted' with
    the run's reason beside SLURM's; one cancelled before its run wrote anything says so in words (it showed
    submitit's UncompletedJobError and result file); any other outcome is as submitit reported it."""
    info_file = job.run_dir / "run.json"
    fresh = info_file.exists() and info_file.stat().st_mtime >= since
    if outcome["outcome"] == "failed" and "(state: CANCELLED" in str(outcome.get("reason")) and not fresh:
        state = str(outcome["reason"]).split("(state: ", 1)[1].split(")", 1)[0]
        return {**outcome, "reason": f"cancelled on SLURM before the run started ({state}); relaunching the same "
                                     "command runs it"}
    if outcome["outcome"] != "failed" or not fresh:
        return outcome
    info = json.loads(info_file.read_text())
    if info.get("status") != "preempted":
        return outcome
    return {**outcome, "outcome": "preempted", "code": 128 + int(signal.SIGTERM),
            "reason": f"{info.get('reason')} (SLURM: {outcome['reason']})"}


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[list[int]]:
    """While the launcher waits on SLURM, SIGTERM (a `kill`, a closed session's hang-up) interrupts the wait as
    Ctrl-C does, so that it too says the submitted jobs run on and how to cancel them (it ended silently). Yields
    [the signal's number], 0 until one came."""
    came = [0]

    def interrupt(signum: int, frame: Any) -> None:
        came[0] = signum
        raise KeyboardInterrupt

    old = {s: signal.signal(s, interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield came
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def _left_running(submitted: list[Any]) -> str:
    """What a Ctrl-C of the submitting process leaves: the submitted jobs run on, and how to cancel them."""
    if not submitted:
        return "interrupted before any job was submitted"
    ids = " ".join(sorted({str(j.job_id).split("_")[0] for j in submitted}))
    return (f"interrupted: the sweep's {len(submitted)} submitted job(s) keep running on SLURM; `scancel {ids}` cancels "
            "them (each checkpoints first), and relaunching the same command later skips or resumes them")


def _submitit_log(job: Any) -> Path | None:
    """The stderr file of a submitted job (where its traceback and progress are)."""
    try:
        return Path(job.paths.stderr)
    except Exception:  # noqa: BLE001
        return None


class _SafeJob:
    """A submitit job whose `results()` returns a failed JobReturn instead of raising (a job that SLURM
    killed, or one whose requeues ran out), so that one lost job does not hide the results of the others."""

    def __init__(self, job: Any) -> None:
        self._job = job

    def __getattr__(self, name: str) -> Any:
        return getattr(self._job, name)

    def results(self) -> list[JobReturn]:
        try:
            return self._job.results()
        except Exception as e:  # noqa: BLE001 -- reported in the sweep's summary
            return [JobReturn(status=JobStatus.FAILED, _return_value=e)]


class _submitted_jobs:
    """While active, submitit's executors hand their submitted jobs (wrapped in _SafeJob) to `sink` too."""

    def __init__(self, sink: list) -> None:
        self.sink = sink

    def __enter__(self) -> None:
        import submitit

        self._original = original = submitit.AutoExecutor.map_array
        sink = self.sink

        def map_array(executor: Any, fn: Any, *iterables: Any) -> list:
            jobs = [_SafeJob(j) for j in original(executor, fn, *iterables)]
            sink.extend(jobs)
            return jobs

        submitit.AutoExecutor.map_array = map_array

    def __exit__(self, *exc: object) -> None:
        import submitit

        submitit.AutoExecutor.map_array = self._original


#: a run's statuses once its process has ended (run.json)
ENDED = tuple(s for s in STATUSES if s != "running")


class SlurmMonitor:
    """A thread that redraws the sweep's line while the submitit launcher waits: the array's queue state
    (`squeue`) and each run's own state (its run.json, rows of metrics.jsonl)."""

    def __init__(self, jobs: list[JobView], line: LiveLine, every: float = 5.0) -> None:
        self.jobs, self.line, self.every = jobs, line, every
        self.submitted: list[Any] = []
        self.seen: set[int] = set()  # the jobs (JobView.idx) seen in the queue
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="qrl-slurm-monitor", daemon=True)
        self.started = time.time()  # a run.json written since is this launch's

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            try:
                queue = self._queue_states()
                for view, sub in zip(self.jobs, self.submitted):
                    self._update(view, queue.get(str(sub.job_id)))
                pend = sum(1 for s in queue.values() if s == "PENDING")
                self.line.refresh(extra=f"queue: {pend} waiting, {len(queue) - pend} active" if queue else "")
            except Exception:  # noqa: BLE001 -- the monitor is a view; the launcher's wait decides
                pass

    def _queue_states(self) -> dict[str, str]:
        ids = sorted({str(j.job_id).split("_")[0] for j in self.submitted})
        if not ids:
            return {}
        out = subprocess.run(["squeue", "-h", "-r", "-o", "%i %T", "-j", ",".join(ids)], capture_output=True,
                             text=True, timeout=30)
        if out.returncode != 0 and "Invalid job id" not in out.stderr:  # (every job gone from slurmctld: empty)
            raise RuntimeError(f"squeue: {out.stderr.strip()}")  # not an empty queue: this round shows nothing
        return dict(line.split(None, 1) for line in out.stdout.splitlines() if " " in line)

    def _update(self, view: JobView, queue_state: str | None) -> None:
        info_file = view.run_dir / "run.json"
        fresh = info_file.exists() and info_file.stat().st_mtime >= self.started
        status = json.loads(info_file.read_text()).get("status") if fresh else None
        if queue_state is not None:  # back in the queue (a requeue) undoes an end seen before
            view.state, view.outcome = ("pending" if queue_state == "PENDING" else "running"), None
            self.seen.add(view.idx)
        elif status in ENDED:  # out of the queue: ended
            view.state = "done"  # (a preempted job SLURM requeues is back in the queue; one `scancel`led is not)
            view.outcome = {"outcome": status, "reason": None}
        elif view.idx in self.seen and view.state != "done":  # left the queue without ending its run
            view.state = "done"
            view.outcome = {"outcome": "failed", "reason": "left the SLURM queue without ending its run (scancel, "
                                                            "or the job died before its run could record it)"}

