"""Signalling a real trainer process at a chosen step, the way SLURM and a user's Ctrl-C do.

The point of the signal is a step count (`after_rows` rows in metrics.jsonl). Polling the file races the trainer:
on a fast machine it finishes another step or two between the poll and the signal. So the process (with its
children, for a tree) is frozen with SIGSTOP the moment the rows are there, signalled while frozen, and thawed:
the signal then lands at most one step later than the rows observed, on any machine.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from bench.run.store import RunDir
from tests.hang import HANG_S, wait_until
from tests.helpers import REPO


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (children, their children, ...), from /proc."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _send(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def signal_frozen(root: int, targets: list[int], sig: int) -> None:
    """Freeze `root` and every process below it, send `sig` to `targets`, thaw: no process moves on between the
    moment the caller saw what it waited for and the signal."""
    frozen = [root, *descendants(root)]
    _send(frozen, signal.SIGSTOP)
    _send(targets, sig)
    _send(frozen, signal.SIGCONT)


def interrupt(cmd: list[str], run: RunDir, sig: int, after_rows: int, env: dict[str, str], tree: bool = False,
              ) -> subprocess.CompletedProcess:
    """Start `cmd`, and once metrics.jsonl has `after_rows` rows send `sig` (to the whole process tree with
    `tree`, as SLURM signals every process of a job) while the process is frozen; wait for it to exit."""
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(f"{after_rows} rows before the signal", lambda: len(run.metrics()) >= after_rows, proc, every=0.01)
        signal_frozen(proc.pid, [proc.pid, *(descendants(proc.pid) if tree else [])], sig)
        out, err = proc.communicate(timeout=HANG_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
