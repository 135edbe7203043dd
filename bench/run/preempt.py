"""Preemption: turn SIGUSR1 / SIGTERM / SIGINT into "finish this step, checkpoint, exit so the job is requeued".

A signal can arrive in the middle of an optimizer step; checkpointing from inside the handler would save
a half-updated model. So the handler only records the request, and the training loop polls
`guard.requested` at a step boundary, writes its checkpoint, marks the run "preempted" and calls
`guard.exit_after_checkpoint()`.

Who requeues the job:
- under submitit (SLURM), submitit installed its own handler for its preemption signal (SUBMITIT_PREEMPT_SIGNAL,
  USR1 for our SLURM launcher): it calls `scontrol requeue` on the job and exits. We chain to that handler
  once our checkpoint is safe, so the requeued job resumes from it.
- for SIGTERM submitit only logs ("bypass"): SLURM itself requeues a job it preempts (PreemptMode=REQUEUE)
  and a `scancel` must not be undone, so we just exit.
- outside submitit, bench.launch.cli installs `stop_on_signals` around the whole job: its handler raises `Stopped`,
  so the previous handler we chain to turns into a clean unwind to bench.launch.cli, which reports the run and exits
  with 128 + signal number (the shell's convention for "killed by that signal"); relaunching resumes. The
  same `Stopped` ends a job stopped outside the training loop (during the warm start, the final eval), and
  tells a sweep worker (bench/launch/sweep_pool.py) to exit after its job.
- Ctrl-C (SIGINT) is a preemption too; a second Ctrl-C stops at once (`Stopped`, without a new checkpoint:
  the run resumes from its last one).
- a process that starts others (a sweep's workers, a run's ranks) puts each in a process group of its own and passes
  every signal it gets on to them, once (`passing_signals_to`): a terminal's Ctrl-C or a `kill` of the launcher then
  reaches each of them exactly once, and they ask the kernel for a signal when it dies (`die_with_parent`).

    with PreemptionGuard() as guard:
        for step in ...:
            train_step(...)
            if guard.requested:
                save_checkpoint(...); mark_preempted(...)
                guard.exit_after_checkpoint()
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from contextlib import contextmanager
from types import FrameType
from typing import Any, Callable, Iterable, Iterator, NoReturn, Union

Handler = Union[Callable[[int, Union[FrameType, None]], Any], int, None]

DEFAULT_SIGNALS = (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)


class Stopped(BaseException):
    """A stop signal that unwinds the job (a BaseException, like KeyboardInterrupt: `except Exception` in the
    training code must not swallow it). `checkpointed`: the training loop wrote its checkpoint first."""

    def __init__(self, signum: int, checkpointed: bool = False) -> None:
        self.signum = int(signum)
        self.checkpointed = checkpointed
        super().__init__(f"stopped by {signal.Signals(signum).name}")


def _raise_stopped(signum: int, frame: FrameType | None) -> None:
    raise Stopped(signum)


@contextmanager
def stop_on_signals(signals: tuple[int, ...] = DEFAULT_SIGNALS) -> Iterator[None]:
    """While active, each of `signals` that still has its default disposition raises `Stopped`.

    Signals someone already handles (submitit's requeue handler in a SLURM job) are left alone. Main thread
    only (elsewhere it installs nothing).
    """
    installed: dict[int, Handler] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in signals:
            current = signal.getsignal(sig)
            if current in (signal.SIG_DFL, signal.default_int_handler, None):
                installed[sig] = signal.signal(sig, _raise_stopped)
    try:
        yield
    finally:
        for sig, handler in installed.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


PR_SET_PDEATHSIG = 1


def die_with_parent(signum: int = signal.SIGTERM) -> None:
    """Ask Linux for `signum` when the parent process dies, even by kill -9 (no-op elsewhere)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
    except (OSError, AttributeError):
        pass


@contextmanager
def passing_signals_to(pids: Callable[[], Iterable[int]], signals: tuple[int, ...] = DEFAULT_SIGNALS
                       ) -> Iterator[None]:
    """While active, each of `signals` this process gets is passed on to the processes `pids()` names, once, and
    does nothing else here: they decide (their PreemptionGuard: checkpoint after the step; a second SIGINT: stop at
    once). Main thread only (elsewhere it installs nothing)."""

    def pass_on(signum: int, frame: FrameType | None) -> None:
        for pid in pids():
            try:
                os.kill(pid, signum)
            except ProcessLookupError:  # ended meanwhile
                pass

    previous: dict[int, Handler] = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, pass_on) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def submitit_preempt_signal() -> signal.Signals | None:
    """The signal submitit uses for preemption/timeout in this process, or None outside a submitit job.

    Mirrors submitit's JobEnvironment._usr_sig (env SUBMITIT_PREEMPT_SIGNAL, default USR2) without importing
    submitit or relying on its private API.
    """
    if not os.environ.get("SUBMITIT_EXECUTOR"):
        return None
    sig = getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"), None)
    return signal.Signals(sig) if sig is not None else None


class PreemptionGuard:
    """Records SIGUSR1/SIGTERM (and submitit's preemption signal) while active; see the module docstring.

    A context manager: entering installs the handlers (remembering the previous ones, e.g. submitit's),
    leaving restores them. Only usable from the main thread (a Python rule for signal handlers); elsewhere
    it installs nothing and `requested` stays False.
    """

    def __init__(self, signals: tuple[int, ...] = DEFAULT_SIGNALS) -> None:
        extra = submitit_preempt_signal()
        sigs = [signal.Signals(s) for s in signals]
        if extra is not None and extra not in sigs:
            sigs.append(extra)
        self.signals: tuple[signal.Signals, ...] = tuple(sigs)
        self.requested = False
        self.signal_name: str | None = None
        self._signum: int | None = None
        self._previous: dict[signal.Signals, Handler] = {}

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.requested and signum == signal.SIGINT == self._signum:
            raise Stopped(signum)  # a second Ctrl-C: stop now, the last checkpoint is the resume point
        # keep the first signal: it decides who requeues (a later SIGTERM must not hide submitit's USR1)
        if not self.requested:
            self.requested = True
            self._signum = signum
            self.signal_name = signal.Signals(signum).name
            print(f"qrl-bench: caught {self.signal_name}: checkpointing after the current step, then exiting",
                  file=sys.stderr, flush=True)

    def __enter__(self) -> "PreemptionGuard":
        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        self._restore()

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()

    def exit_after_checkpoint(self) -> NoReturn:
        """Call once the checkpoint is written: hand over to the previous handler (submitit's requeue), else exit.

        submitit's requeue handler ends in sys.exit(-1) after `scontrol requeue` (or raises its
        UncompletedJobError when it refuses to requeue, which submitit reports as the job's result);
        either way it propagates from here. bench.launch.cli's handler (`stop_on_signals`) raises `Stopped`,
        marked as checkpointed. Handlers that return (submitit's SIGTERM "bypass") fall through to our own exit.
        """
        signum = self._signum if self._signum is not None else signal.SIGTERM
        previous = self._previous.get(signal.Signals(signum))
        self._restore()
        if callable(previous):
            try:
                previous(signum, None)
            except Stopped as e:
                e.checkpointed = True
                raise
        sys.stdout.flush()
        sys.stderr.flush()
        if submitit_preempt_signal() is not None and int(os.environ.get("RANK", "0")) > 0:
            # another rank of a SLURM job of several tasks: rank 0 requeues the job (submitit's handler returns on
            # the other ranks). Exiting non-zero here made srun (--kill-on-bad-exit) kill rank 0 while it was still
            # closing the run and requeueing: the job would end without its requeue.
            sys.exit(0)
        sys.exit(128 + signum)
