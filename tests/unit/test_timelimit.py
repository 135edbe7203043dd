"""The per-call time limit: main-thread timer signal, helper process elsewhere, and where each one holds."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from bench.run.timelimit import ScoreTimeout, call_with_time_limit, signal_limit_available

# No test here bounds a cut call's wall time from above (issue 32 F8: a loaded machine stretches any such bound).
# That the limit acted is a result only a cut call gives: ScoreTimeout from work that would otherwise return a value
# after 5-30 s (minutes for stuck_in_c). A lower bound (the call was not cut before its limit) holds on any machine;
# a limit that never acts trips the hang guard (tests/hang.py).

# Module-level functions: process mode pickles them by reference and the helper imports this module.


def python_loop(seconds: float) -> str:
    """Slow pure-Python work: interruptible between bytecodes."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return "done"


def swallow_once(seconds: float) -> str:
    """Slow work behind a bare except (as careless library code has), then more slow work."""
    try:
        python_loop(seconds)
    except:  # noqa: E722 - the point of the test
        pass
    return python_loop(seconds)


def nested_limits(inner_seconds: float) -> str:
    """10 s of work under an inner limit: with an inner limit longer than that, only the outer one can cut it."""
    return call_with_time_limit(python_loop, 10.0, seconds=inner_seconds)


def sort_in_c(data: list[int]) -> str:
    """One long C call holding the GIL: list.sort of ints compares in C, with no bytecode boundary inside."""
    data.sort()
    return "sorted"


def stuck_in_c(n: int) -> int:
    """One long C call holding the GIL (no bytecode boundary for a signal handler to run at)."""
    return sum(range(n))


def add(a: int, b: int) -> int:
    return a + b


def in_thread(fn, *args, **kwargs):
    box: dict = {}

    def run():
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - hand any outcome back to the test
            box["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return box


def timed(fn, *args, **kwargs):
    t0 = time.monotonic()
    try:
        return fn(*args, **kwargs), time.monotonic() - t0
    except ScoreTimeout:
        return ScoreTimeout, time.monotonic() - t0


# ---- main thread: timer signal -------------------------------------------------------------------------


def test_fast_calls_return_their_value():
    assert call_with_time_limit(add, 2, 3, seconds=1.0) == 5
    assert call_with_time_limit(add, 2, 3, seconds=None) == 5  # no limit
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)  # nothing left armed


def test_main_thread_limit_cuts_python_work():
    assert signal_limit_available()
    value, wall = timed(call_with_time_limit, python_loop, 10.0, seconds=0.3)
    assert value is ScoreTimeout and wall >= 0.3  # uncut, the loop returns "done" after 10 s


def test_a_swallowed_timeout_is_raised_again():
    # Without re-arming, the second 5 s loop would run to the end after the first timeout was swallowed.
    assert timed(call_with_time_limit, swallow_once, 5.0, seconds=0.3)[0] is ScoreTimeout  # not "done"


def test_timeout_is_not_an_exception_subclass():
    """Library code catching Exception must not swallow it (math-verify and sympy do catch Exception)."""
    assert not issubclass(ScoreTimeout, Exception) and issubclass(ScoreTimeout, BaseException)


def test_previous_handler_and_outer_timer_are_restored():
    fired = []
    previous = signal.signal(signal.SIGALRM, lambda *_: fired.append(1))
    try:
        signal.setitimer(signal.ITIMER_REAL, 5.0)
        assert call_with_time_limit(add, 1, 1, seconds=0.5) == 2
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 4.0 < remaining <= 5.0  # the outer timer is back, less the time used
        signal.setitimer(signal.ITIMER_REAL, 0)
        assert signal.getsignal(signal.SIGALRM) is not None and not fired
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_no_stray_signal_after_a_timeout():
    assert timed(call_with_time_limit, python_loop, 5.0, seconds=0.1)[0] is ScoreTimeout
    assert python_loop(0.3) == "done"  # a re-armed timer firing now would raise here
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_nested_limits_keep_the_outer_deadline():
    # the inner 60 s limit does not extend the outer 0.3 s: if it did, the 10 s loop would return "done"
    assert timed(call_with_time_limit, nested_limits, 60.0, seconds=0.3)[0] is ScoreTimeout


def test_signal_mode_does_not_hold_inside_one_long_c_call():
    """Documented limitation: the handler runs only after the C call returns. Process mode covers this.

    The evidence is an event, not a time: the limit fired (ScoreTimeout) and yet the list is sorted, so the C sort
    ran to its end past the limit. A sort of 10**6 ints takes 0.1-1 s on any CPU, far past the 0.01 s limit; the
    rare attempt where the timer fires before the sort even starts (a loaded machine) is tried again."""
    import random

    for _ in range(5):
        data = random.Random(0).sample(range(10**6), 10**6)
        value = timed(call_with_time_limit, sort_in_c, data, seconds=0.01)[0]
        if data[:3] == [0, 1, 2]:  # the sort ran, to its end (a cut mid-sort would leave it unsorted)
            break
    assert value is ScoreTimeout and data == sorted(data)  # the limit fired, after the C call completed


def test_unknown_mode_lists_valid_ones():
    with pytest.raises(ValueError, match="auto, process"):
        call_with_time_limit(add, 1, 2, seconds=1.0, mode="thread")


# ---- other threads and process mode: helper process ----------------------------------------------------


def test_worker_thread_calls_use_the_helper_process():
    box = in_thread(call_with_time_limit, add, 20, 22, seconds=5.0)
    assert box == {"value": 42}
    box = in_thread(timed, call_with_time_limit, python_loop, 30.0, seconds=0.5)
    value, wall = box["value"]
    assert value is ScoreTimeout and wall >= 0.5  # uncut, the loop returns "done" after 30 s


def test_process_mode_kills_a_call_stuck_in_c_code():
    # sum(range(10**10)) holds the GIL for minutes; the helper is killed at limit + KILL_GRACE_S (1 s).
    assert timed(call_with_time_limit, stuck_in_c, 10**10, seconds=0.3, mode="process")[0] is ScoreTimeout
    assert call_with_time_limit(add, 1, 2, seconds=5.0, mode="process") == 3  # a fresh helper serves on


def test_process_mode_reports_errors_of_the_call():
    with pytest.raises(RuntimeError, match="TypeError"):
        call_with_time_limit(add, 1, "x", seconds=5.0, mode="process")
