"""A wall-clock limit on one call, so a pathological completion cannot hang reward scoring.

Why not math-verify's own limit: `math_verify.parse(..., parsing_timeout=5)` and `verify(..., timeout_seconds=5)`
wrap each step in `signal.alarm` (math_verify/utils.py). That (1) only works in the main thread (elsewhere
they raise ValueError "signal only works in main thread"), (2) limits each parse/comparison separately, so
one call that tries many candidates can take a multiple of the limit, and (3) `signal.alarm(0)` in their
cleanup cancels any outer timer. So the reward code calls math-verify with its timeouts off and puts one limit
around the whole scoring call here. verl does the same for a different reason
(verl/utils/reward_score/math_verify.py runs math-verify in a spawn process pool so that its alarm works).

Two mechanisms, picked per call by `call_with_time_limit(..., mode="auto")`:

* Main thread (how the trainer scores, bench/sampling.py `score`): a POSIX interval timer (`setitimer`, so the
  limit can be fractional) whose handler raises `ScoreTimeout`. `ScoreTimeout` derives from BaseException,
  like KeyboardInterrupt, so the `except Exception` blocks inside math-verify and sympy do not swallow it;
  and the handler re-arms itself every 50 ms until the call has unwound, so even a bare `except:` that
  swallows one ScoreTimeout gets another. Overhead: two system calls per scored completion.
  Where it does NOT hold: a signal handler only runs between Python bytecodes, so a single long C-level
  operation that holds the GIL (e.g. one giant integer multiplication, or a C regex on a huge string) finishes
  before the limit fires. math-verify/sympy keep huge powers unevaluated (`10^{10^{10}}` is cut at the limit
  like any other slow input, see tests/unit/test_rewards.py), and our own regexes are linear, so this is a
  corner case; use mode="process" where it matters. Memory is not bounded either.
* Any other thread (or mode="process"): the call runs in a helper process (a fresh `python -c` interpreter
  started once and reused; not fork, which is unsafe in a process holding CUDA or threads, and not
  multiprocessing's spawn, which re-imports the caller's __main__). The helper runs the call under the timer
  signal in its own main thread, so ordinary slow inputs come back as a timeout after `seconds`; if the
  helper does not answer within `seconds + KILL_GRACE_S` (stuck in C code), it is killed (SIGKILL) and a new
  one starts on the next call. So this mode also cuts C-level work, within seconds + 1 s. Cost: pickling the
  arguments, about 0.1-1 ms per call; the first call (and the first after a kill) waits for the helper to
  start and import the scorer's module and `setup`, and that wait is NOT counted against the limit. Calls
  from several threads share one helper and take turns (a lock), so process mode scores serially; waiting
  for the lock is not counted either. `fn`, `setup` and the arguments must be picklable (module-level
  functions), and the helper must be able to import them (it gets the caller's sys.path as PYTHONPATH).
"""

from __future__ import annotations

import atexit
import importlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any, Callable, TypeVar

T = TypeVar("T")

MODES = ("auto", "process")
REARM_S = 0.05  # after a timeout, raise again every REARM_S until the limited call has unwound
STARTUP_TIMEOUT_S = 120.0  # helper process start + imports; generous: the machine may be busy
KILL_GRACE_S = 1.0  # process mode: the helper's own timer gets this long past the limit before it is killed


class ScoreTimeout(BaseException):
    """The limited call ran out of time. A BaseException so library `except Exception` blocks let it through."""


class TimeLimitUnavailable(RuntimeError):
    """The helper process for a limit outside the main thread could not be started or died unexpectedly."""


def signal_limit_available() -> bool:
    """True when this thread can use the timer signal: the main thread, on a platform with SIGALRM."""
    return (hasattr(signal, "SIGALRM") and hasattr(signal, "setitimer")
            and threading.current_thread() is threading.main_thread())


def call_with_time_limit(fn: Callable[..., T], *args: Any, seconds: float | None, mode: str = "auto",
                         setup: Callable[[], Any] | None = None) -> T:
    """`fn(*args)`, or raise ScoreTimeout once `seconds` of wall time have passed.

    `seconds` None or <= 0 means no limit. mode "auto": a timer signal in the main thread, a helper process in
    other threads; "process": always the helper process (also bounds C-level work; see the module docstring).
    `setup` (a picklable module-level function, e.g. one that imports sympy) runs once per process where `fn`
    runs, before the first limited call and outside the limit, so one-off import time never counts as a timeout.
    """
    if mode not in MODES:
        raise ValueError(f"unknown time-limit mode {mode!r}; valid: {', '.join(MODES)}")
    if mode == "auto" and (seconds is None or seconds <= 0 or signal_limit_available()):
        if setup is not None and _qualname(setup) not in _SETUPS_DONE:
            setup()
            _SETUPS_DONE.add(_qualname(setup))
        if seconds is None or seconds <= 0:
            return fn(*args)
        return _call_with_timer_signal(fn, args, float(seconds))
    return _HELPER.call(fn, args, None if seconds is None or seconds <= 0 else float(seconds), setup)


_SETUPS_DONE: set[str] = set()  # setups already run in this process


def _qualname(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


# ---- main thread: interval timer + signal ------------------------------------------------------------


class _TimerState:
    active = False  # True only while a limited call runs; a late signal outside it is ignored


def _on_timer(signum: int, frame: Any) -> None:
    if _TimerState.active:
        signal.setitimer(signal.ITIMER_REAL, REARM_S)  # again soon, in case this one is swallowed
        raise ScoreTimeout


def _call_with_timer_signal(fn: Callable[..., T], args: tuple, seconds: float) -> T:
    if _TimerState.active:  # nested limited call: the outer deadline governs
        return fn(*args)
    previous_handler = signal.signal(signal.SIGALRM, _on_timer)
    outer_delay, outer_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    started = time.monotonic()
    try:
        _TimerState.active = True
        try:
            return fn(*args)
        finally:
            _TimerState.active = False  # first: a signal arriving from here on is ignored
    finally:
        _TimerState.active = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_handler)
        if outer_delay > 0:  # someone else's timer was running: give it back, less the time we used
            remaining = max(outer_delay - (time.monotonic() - started), 1e-3)
            signal.setitimer(signal.ITIMER_REAL, remaining, outer_interval)


# ---- other threads: a killable helper process -------------------------------------------------------


def _serve(fd: int) -> None:
    """Helper process main loop over the socket `fd`: ("import", module), ("setup", fn) and
    ("call", fn, args, seconds) requests, answered in turn. Calls run under the timer signal in this
    process's main thread; the parent kills the process only if even that does not answer in time."""
    import socket
    from multiprocessing.connection import Connection

    conn = Connection(socket.socket(fileno=fd).detach())
    conn.send(("ready", None))
    while True:
        try:
            request = conn.recv()
        except EOFError:  # the parent closed its end or exited
            return
        try:
            if request[0] == "import":
                importlib.import_module(request[1])
                conn.send(("ok", None))
            elif request[0] == "setup":
                request[1]()
                conn.send(("ok", None))
            else:
                _, fn, args, seconds = request
                if seconds is None or not signal_limit_available():  # then only the parent's kill bounds it
                    conn.send(("ok", fn(*args)))
                else:
                    conn.send(("ok", _call_with_timer_signal(fn, args, seconds)))
        except ScoreTimeout:
            conn.send(("timeout", None))
        except Exception as exc:  # report, keep serving
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


class _Helper:
    """One lazily started helper process; killed (and restarted on the next call) when it overruns a limit.

    A plain `python -c` subprocess rather than multiprocessing: spawn and forkserver children re-import the
    parent's __main__ module, which would re-run a training script that lacks an `if __name__` guard.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._conn: Any = None
        self._prepared: set[str] = set()
        atexit.register(self._stop)

    def call(self, fn: Callable[..., T], args: tuple, seconds: float | None,
             setup: Callable[[], Any] | None = None) -> T:
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._start()
            module = getattr(fn, "__module__", None)
            if module and module not in self._prepared:  # import outside the limited time
                self._request(("import", module), what=f"importing {module}")
                self._prepared.add(module)
            if setup is not None and _qualname(setup) not in self._prepared:
                self._request(("setup", setup), what=f"running {_qualname(setup)}")
                self._prepared.add(_qualname(setup))
            self._conn.send(("call", fn, args, seconds))
            wait = None if seconds is None else seconds + KILL_GRACE_S
            if not self._conn.poll(wait):  # stuck where the helper's own timer cannot reach: kill it
                self._stop()
                raise ScoreTimeout
            status, value = self._receive(what=f"calling {_qualname(fn)}")
            if status == "timeout":
                raise ScoreTimeout
            return value

    def _start(self) -> None:
        self._stop()
        parent, child = socket.socketpair()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))  # import what we can
        code = "import sys; from bench.run.timelimit import _serve; _serve(int(sys.argv[1]))"
        try:
            self._proc = subprocess.Popen([sys.executable, "-c", code, str(child.fileno())],
                                          pass_fds=(child.fileno(),), env=env, stdin=subprocess.DEVNULL)
        finally:
            child.close()
        self._conn, self._prepared = Connection(parent.detach()), set()
        if not self._conn.poll(STARTUP_TIMEOUT_S):
            self._stop()
            raise TimeLimitUnavailable(f"the scoring helper process did not start within {STARTUP_TIMEOUT_S:.0f} s")
        self._receive(what="starting")

    def _request(self, request: tuple, what: str) -> Any:
        self._conn.send(request)
        if not self._conn.poll(STARTUP_TIMEOUT_S):
            self._stop()
            raise TimeLimitUnavailable(f"the scoring helper process timed out {what}")
        return self._receive(what)

    def _receive(self, what: str) -> tuple[str, Any]:
        try:
            status, value = self._conn.recv()
        except (EOFError, OSError) as exc:
            self._stop()
            raise TimeLimitUnavailable(f"the scoring helper process died while {what}: {exc!r}") from None
        if status == "error":
            raise RuntimeError(f"scoring helper process, while {what}: {value}")
        return status, value

    def _stop(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait(timeout=10)
        if self._conn is not None:
            self._conn.close()
        self._proc, self._conn, self._prepared = None, None, set()


_HELPER = _Helper()
