"""The local launcher's worker pool (bench/launch/sweep_pool.py) with real spawned workers: what it does when a worker
is gone before the parent talks to it, and how it announces signals."""

from __future__ import annotations

import io
import signal

from bench.launch.sweep_pool import WorkerPool
from bench.launch.sweep_report import JobView, LiveLine


def _stopped_pool(tmp_path, signals: list[int]) -> tuple[WorkerPool, list[JobView], LiveLine, int | None]:
    """A pool whose only worker died before the sweep's setup reached it (a Ctrl-C or SIGTERM in a sweep's first
    seconds: the worker leaves at the forwarded signal while the parent is still composing configs)."""
    pool = WorkerPool(1)
    worker = pool.workers[0].process
    worker.kill()
    worker.join(timeout=60)
    pool.stopping.extend(signals)
    pool.reached.extend([0] * len(signals))
    jobs = [JobView(0, "job0", tmp_path / "run0", steps=3)]
    line = LiveLine("s", jobs, stream=io.StringIO())
    stopped = pool.run(b"setup", jobs, {0: []}, line, tmp_path)
    return pool, jobs, line, stopped


def test_a_worker_gone_before_the_setup_is_no_traceback_and_its_jobs_are_not_started(tmp_path):
    """It was a BrokenPipeError traceback and exit 1; the sweep stops with its signal and the job is not started."""
    _, jobs, line, stopped = _stopped_pool(tmp_path, [signal.SIGTERM])
    assert stopped == signal.SIGTERM and jobs[0].state == "pending" and jobs[0].outcome is None
    text = line.stream.getvalue()
    assert "caught SIGTERM: passed to 0 running job(s); waiting for their checkpoints (again:" in text, text


def test_two_signals_between_two_looks_are_announced_each_in_order(tmp_path):
    """A double Ctrl-C printed one line, the second signal's, with the first one's words and without the hint."""
    _, _, line, stopped = _stopped_pool(tmp_path, [signal.SIGINT, signal.SIGINT])
    said = [x for x in line.stream.getvalue().splitlines() if "caught SIGINT" in x]
    assert len(said) == 2 and "(again: they stop without waiting" in said[0], said
    assert "they stop without waiting for the current step" in said[1] and "checkpoints" not in said[1]
    assert stopped == signal.SIGINT
