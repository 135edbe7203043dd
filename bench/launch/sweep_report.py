"""What a sweep shows while it runs and when it ends, for both launchers (bench/launch/launchers.py).

While it runs: one live line on stderr (a terminal gets it redrawn in place every second; a log file gets a
line when a job starts or ends, and at most every 30 s otherwise):

    [sweep smoke_short] 10/24 done · 2 running · 1 failed · 3 skipped · 8 pending · ETA 3m10s

(the ETA: measured lead-in, per-step and tail times scheduled on the workers, bench/launch/eta.py)

Each run's own output (progress bar, warnings) goes to its run directory's run.log, not here. When it ends:
the counts, then every job that did not complete with its outcome, reason and log, and the sweep's exit
code (`exit_code`, read by bench.launch.cli.main):

    0 every job completed or was skipped as completed; 128+N the sweep was stopped by signal N;
    otherwise the exit code its unfinished jobs share (bench/launch/cli.py), or 1 when they differ.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from bench.launch.eta import Eta, completed_before
from bench.timing import fmt_duration  # noqa: F401  (re-exported: the sweep line and its tests use it)

_EXIT_CODE: int | None = None
OK_OUTCOMES = ("completed", "skipped")


def exit_code() -> int | None:
    """The exit code of the last sweep launched in this process (None: no sweep was launched)."""
    return _EXIT_CODE


def set_exit_code(code: int | None) -> None:
    global _EXIT_CODE
    _EXIT_CODE = code


@dataclass
class JobView:
    """One job as the sweep line sees it."""

    idx: int
    name: str
    run_dir: Path
    steps: int
    key: tuple = ()  # what its warm start depends on (task, model): see bench/sweep_pool.order_jobs
    state: str = "pending"  # pending | running | done
    outcome: dict[str, Any] | None = None
    started: float | None = None
    log: Path | None = None  # the job's own output; default <run dir>/run.log (local launcher)
    own_dir: bool = False  # run_dir is the qrl-bench run directory (hydra.run.dir); else Hydra's sweep subdir
    arm: str = ""  # <method>@<precision>: with `key`, what its seconds per step depend on (bench/launch/eta.py)
    _completed: bool | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.log = self.log or self.run_dir / "run.log"

    def rows(self) -> int:
        """Rows of its metrics.jsonl (steps trained, by this and earlier attempts)."""
        try:
            return (self.run_dir / "metrics.jsonl").read_bytes().count(b"\n")
        except OSError:
            return 0

    def will_skip(self) -> bool:
        """Whether its run was completed before the sweep started (the launch skips it); read once."""
        if self._completed is None:
            self._completed = completed_before(self.run_dir)
        return self._completed

    def progress(self) -> float:
        """Fraction of its steps done: 1 when done, rows of metrics.jsonl / steps while running."""
        if self.state == "done":
            return 1.0
        if self.state != "running":
            return 0.0
        return min(1.0, self.rows() / max(1, self.steps))


#: the outcomes of a job a signal ended (bench/launch/cli.py's Outcome): stopped, to be resumed, not failed
SIGNAL_OUTCOMES = ("preempted", "interrupted")
#: outcomes a relaunch of the same command meets again (a changed configuration, a run directory it will not touch)
REFUSALS = ("bad_config", "refused")


def counts(jobs: list[JobView]) -> dict[str, int]:
    """Jobs by what the line says of them; a refused one (a changed configuration: it did no work, and a relaunch
    meets it again) is not counted as failed."""
    out = {"done": 0, "running": 0, "failed": 0, "stopped": 0, "refused": 0, "skipped": 0, "pending": 0}
    for j in jobs:
        if j.state == "done":
            kind = (j.outcome or {}).get("outcome")
            out["done" if kind == "completed" else "skipped" if kind == "skipped"
                else "stopped" if kind in SIGNAL_OUTCOMES else "refused" if kind in REFUSALS else "failed"] += 1
        else:
            out[j.state] += 1
    return out


def status_line(sweep: str, jobs: list[JobView], elapsed: float, extra: str = "", eta_text: str = "?",
                stopping: bool = False) -> str:
    """The sweep's line; `stopping` (a signal came): the pending jobs will not start, so there is no ETA."""
    c = counts(jobs)
    parts = [f"{c['done']}/{len(jobs)} done", f"{c['running']} running", f"{c['failed']} failed",
             f"{c['skipped']} skipped"]
    if c["stopped"]:
        parts.insert(3, f"{c['stopped']} stopped")
    if c["refused"]:
        parts.insert(3, f"{c['refused']} refused")
    if c["pending"]:
        parts.append(f"{c['pending']} {'not started' if stopping else 'pending'}")
    if extra:
        parts.append(extra)
    remaining = c["running"] + (0 if stopping else c["pending"])
    if stopping and remaining:
        parts.append("stopping: waiting for the running jobs")
    else:
        parts.append(f"ETA {eta_text}" if remaining else f"took {fmt_duration(elapsed)}")
    return f"[sweep {sweep}] " + " · ".join(parts)


@dataclass
class LiveLine:
    """The sweep's one status line on `stream` (redrawn in place on a terminal)."""

    sweep: str
    jobs: list[JobView]
    stream: TextIO = field(default_factory=lambda: sys.stderr)
    t0: float = field(default_factory=time.monotonic)
    _last: str = ""
    _last_t: float = 0.0
    _width: int = 0
    eta: Eta = field(default_factory=Eta)  # its `slots`: the local pool's workers (None: SLURM, as seen running)
    stopping: bool = False  # a signal came: no further job starts (sweep_pool.WorkerPool sets it)

    @property
    def tty(self) -> bool:
        return bool(getattr(self.stream, "isatty", lambda: False)())

    def refresh(self, extra: str = "", force: bool = False) -> None:
        now = time.monotonic()
        left = self.eta.update(now, self.jobs)
        line = status_line(self.sweep, self.jobs, now - self.t0, extra, "?" if left is None else fmt_duration(left),
                           self.stopping)
        changed = _without_eta(line) != _without_eta(self._last)
        if self.tty:
            if force or changed or now - self._last_t >= 1.0:
                pad = max(0, self._width - len(line))
                self.stream.write("\r" + line + " " * pad)
                self.stream.flush()
                self._width, self._last, self._last_t = len(line), line, now
        elif force or changed or now - self._last_t >= 30.0:
            self.stream.write(line + "\n")
            self.stream.flush()
            self._last, self._last_t = line, now

    def message(self, text: str) -> None:
        """A line of its own (above the live line on a terminal)."""
        if self.tty and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self._width = 0
        self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        self.refresh(force=self.tty)
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def _without_eta(line: str) -> str:
    return line.rsplit(" · ", 1)[0]


def finish(line: LiveLine, stopped_by: int | None = None) -> int:
    """Print the end of the sweep (counts, then each job that did not complete) and record the exit code."""
    line.close()
    bad = [j for j in line.jobs if (j.outcome or {}).get("outcome") not in OK_OUTCOMES]
    for j in bad:
        o = j.outcome or {"outcome": "not started", "reason": "the sweep stopped before it started"}
        reason = o.get("reason") or ""
        log = f"; log: {j.log}" if j.log is not None and j.log.exists() else ""
        line.message(f"  {o['outcome']:<12s} {j.name}: {reason}{log}")
    if stopped_by:
        code = 128 + stopped_by
    elif not bad:
        code = 0
    else:
        codes = {int((j.outcome or {}).get("code") or 1) for j in bad}
        codes.discard(0)
        code = codes.pop() if len(codes) == 1 else 1
    if bad or stopped_by:
        line.message(f"[sweep {line.sweep}] {len(bad)} of {len(line.jobs)} job(s) did not complete "
                     f"(exit code {code}); {_way_on(bad, stopped_by)}")
    set_exit_code(code)
    return code


def _way_on(bad: list[Any], stopped_by: int | None) -> str:
    """What relaunching does: it resumes or retries the failed and stopped jobs, and refuses the refused ones again."""
    refused = sum(1 for j in bad if (j.outcome or {}).get("outcome") in REFUSALS)
    if refused and refused == len(bad) and not stopped_by:
        return "relaunching the same command would refuse them again: each line above says what to change"
    if refused:
        return (f"relaunch the same command to resume or retry the others; the {refused} refused need the change "
                "their line names")
    return "relaunch the same command to resume or retry them"


def outcome_of(value: Any, name: str) -> dict[str, Any]:
    """A job's return value (bench.launch.cli.hydra_main's dict) or the exception it raised, as an outcome dict."""
    if isinstance(value, dict) and "outcome" in value:
        return value
    if isinstance(value, BaseException):  # its first line, and the line with SLURM's state if there is one
        text = [line.strip() for line in str(value).strip().splitlines()]
        shown = [line for i, line in enumerate(text) if i == 0 or "(state:" in line][:2]
        return {"name": name, "outcome": "failed", "code": 1, "reason": f"{type(value).__name__}: {' '.join(shown)}"}
    return {"name": name, "outcome": "failed", "code": 1, "reason": f"unexpected job result {value!r}"}


__all__ = ["JobView", "LiveLine", "exit_code", "finish", "outcome_of", "status_line"]
