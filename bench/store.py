"""The run directory: the source of truth of a run (W&B only mirrors it).

    <out_root>/<sweep>/<method>/<task>/<model>/seed<k>/
        config.yaml    resolved config            run.json     status, reason, versions, host, git sha, wandb id
        metrics.jsonl  one line per training step eval.jsonl   one line per evaluation
        ckpt/last.pt   model + optimizer + RNG + step (for resume)
        .lock          held while a process owns the run (two processes never write one run dir)

Every write is append-only or atomic (write to a temp file, then rename), so a crash never loses metrics
already written and never leaves a half-written checkpoint.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
from contextlib import contextmanager
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

import torch
from filelock import FileLock, Timeout

from bench.identity import (
    CKPT_DIR,
    CONFIG_FILE,
    EVAL_FILE,
    INFO_FILE,
    METRICS_FILE,
    STATUSES,
    read_jsonl,
    run_name,
    run_path,
)

TRACKED_PACKAGES = ("torch", "transformers", "datasets", "hydra-core", "omegaconf", "submitit", "wandb", "qrl-bench")


class RunLocked(RuntimeError):
    """Another process owns this run directory."""


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def git_info(cwd: Path | None = None) -> tuple[str | None, bool | None]:
    """(sha, dirty) of the code checkout, or (None, None) outside git.

    A code snapshot made at sweep submission (bench/launchers.py) is no git checkout; it carries the sha
    and dirty flag of the checkout it was copied from in SNAPSHOT.json.
    """
    snap = Path(__file__).resolve().parents[1] / "SNAPSHOT.json"
    if cwd is None and snap.exists():
        d = json.loads(snap.read_text())
        return d.get("git_sha"), d.get("git_dirty")
    cwd = cwd or Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
        if sha.returncode:
            return None, None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=10)
        return sha.stdout.strip(), bool(dirty.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        return None, None


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in TRACKED_PACKAGES:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class RunDir:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.metrics_file = self.path / METRICS_FILE
        self.eval_file = self.path / EVAL_FILE
        self.info_file = self.path / INFO_FILE
        self.ckpt_file = self.path / CKPT_DIR / "last.pt"

    @classmethod
    def of(cls, cfg: Any) -> "RunDir":
        """The run directory of a composed config (out_root relative to the launch directory)."""
        from hydra.utils import to_absolute_path

        return cls(run_path(to_absolute_path(cfg.out_root), cfg.sweep, cfg.method.name, cfg.task.name,
                            cfg.model.name, cfg.seed))

    @staticmethod
    def name_of(cfg: Any) -> str:
        return run_name(cfg.method.name, cfg.task.name, cfg.model.name, cfg.seed)

    # ---------------------------------------------------------------- ownership
    @contextmanager
    def lock(self) -> Iterator["RunDir"]:
        """Exclusive ownership for the lifetime of a process's work on this run (OS lock: freed on crash)."""
        self.path.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(self.path / ".lock"))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            raise RunLocked(f"run directory {self.path} is in use by another process") from None
        try:
            yield self
        finally:
            lock.release()

    # ---------------------------------------------------------------- run.json
    def info(self) -> dict[str, Any]:
        if not self.info_file.exists():
            return {}
        try:
            return json.loads(self.info_file.read_text())
        except json.JSONDecodeError:
            return {}

    @property
    def status(self) -> str | None:
        return self.info().get("status")

    def update_info(self, **fields: Any) -> dict[str, Any]:
        info = self.info()
        info.update(fields, updated_at=now())
        _atomic_write(self.info_file, (json.dumps(info, indent=2, default=str) + "\n").encode())
        return info

    def start(self, config_yaml: str, run_name: str, overrides: list[str] | None = None) -> dict[str, Any]:
        """Record config and provenance; keeps fields of an earlier attempt (wandb id, start time)."""
        self.path.mkdir(parents=True, exist_ok=True)
        _atomic_write(self.path / CONFIG_FILE, config_yaml.encode())
        sha, dirty = git_info()
        prev = self.info()
        attempts = int(prev.get("attempts", 0)) + 1
        return self.update_info(
            status="running", reason=None, run_name=run_name, git_sha=sha, git_dirty=dirty,
            versions=versions(), host=socket.gethostname(), argv=sys.argv, overrides=overrides or [],
            slurm_job_id=os.environ.get("SLURM_JOB_ID"), attempts=attempts,
            code_dir=str(Path(__file__).resolve().parents[1]),
            started_at=prev.get("started_at", now()), finished_at=None,
        )

    def finish(self, status: str, reason: str | None = None, **fields: Any) -> None:
        if status not in STATUSES:
            raise ValueError(f"unknown run status {status!r}; valid: {', '.join(STATUSES)}")
        self.update_info(status=status, reason=reason, finished_at=now(), **fields)

    # ---------------------------------------------------------------- metrics
    def append(self, file: Path, row: dict[str, Any]) -> None:
        with open(file, "a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def append_metrics(self, row: dict[str, Any]) -> None:
        self.append(self.metrics_file, row)

    def append_eval(self, row: dict[str, Any]) -> None:
        self.append(self.eval_file, row)

    def metrics(self) -> list[dict[str, Any]]:
        return read_jsonl(self.metrics_file).rows

    def evals(self) -> list[dict[str, Any]]:
        return read_jsonl(self.eval_file).rows

    def truncate_to(self, step: int) -> None:
        """Drop rows at or after `step` (written after the checkpoint we resume from; they are redone)."""
        for file in (self.metrics_file, self.eval_file):
            rows = [r for r in read_jsonl(file).rows if r["step"] < step]
            _atomic_write(file, "".join(json.dumps(r) + "\n" for r in rows).encode())

    # ---------------------------------------------------------------- checkpoints
    def save_checkpoint(self, state: dict[str, Any]) -> None:
        self.ckpt_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.ckpt_file.with_name(f"last.pt.tmp{os.getpid()}")
        torch.save(state, tmp)
        os.replace(tmp, self.ckpt_file)

    def load_checkpoint(self) -> dict[str, Any] | None:
        if not self.ckpt_file.exists():
            return None
        # onto the CPU: a checkpoint written on a GPU must load anywhere; restore() moves tensors to the run's device
        return torch.load(self.ckpt_file, map_location="cpu", weights_only=False)

    def drop_checkpoint(self) -> None:
        self.ckpt_file.unlink(missing_ok=True)
