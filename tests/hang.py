"""The tests' one hang guard and their one way to wait (issue 32 F8), without the suite's imports (no torch):
the analysis tests use them too.

No test asserts wall-clock time. A timeout (of a subprocess, of a wait, of a whole test through pytest-timeout)
exists only to end a test that hangs, and what a test waits for it waits for by an event (rows written, a file
made, a process gone), polled by `wait_until`.
"""

from __future__ import annotations

import subprocess
import time
from typing import Any, Callable

#: The hang guard, in seconds: at least 10x the slowest guarded wait on an idle 2-core machine (the slowest test
#: takes 77 s idle, docs/tests.md), so that a machine at load 20 never trips it.
HANG_S = 1800


def wait_until(what: str, cond: Callable[[], Any], proc: subprocess.Popen | None = None, every: float = 0.05) -> Any:
    """Wait for an event, not for a time: poll `cond` (rows written, a file made, a process gone) every `every`
    seconds until it returns something truthy, and return that. `proc`, when given, must keep running meanwhile:
    if it ends first, the wait fails with its output. HANG_S is the hang guard."""
    deadline = time.monotonic() + HANG_S
    while True:
        value = cond()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"waiting for {what}: the process ended first (exit {proc.returncode}):\n"
                                 f"{((out or '') + (err or ''))[-4000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"hung: no {what} after {HANG_S} s (the hang guard)")
        time.sleep(every)
