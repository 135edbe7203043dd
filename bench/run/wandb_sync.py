"""`qrl-bench sync SWEEP_DIR...`: upload a sweep's offline W&B mirrors, each run under the name, group and tags it
recorded.

Compute nodes often have no internet, so runs mirror themselves offline (tracking=offline, the default): each
attempt of a run writes `<run_dir>/wandb/offline-run-<time>-<id>/run-<id>.wandb` (bench/run/tracking.py), and a
resumed run keeps its W&B id, so its attempts are pieces of one W&B run. This command finds every run directory
under the given sweep directories (the folders with a run.json), collects their offline attempts in time order and
hands them to `wandb sync` in one call: W&B uploads the pieces of one run in order of start time, and each run
under the project, entity, name, group (the sweep), job type (the arm) and tags (`method:tis`, `seed:0`, ...)
recorded in its file; nothing here renames or retags anything. `wandb sync` skips attempts already uploaded, so
running the command again uploads only what is new.

    qrl-bench sync results/smoke_short             upload (from a machine that reaches the W&B server)
    qrl-bench sync results/smoke_short --dry-run   list the runs and attempts and print the command; upload nothing

Before uploading it checks that the W&B server (`WANDB_BASE_URL`, or W&B's default) answers, so a node without
internet gets one line instead of `wandb sync` retrying for minutes; missing credentials are W&B's own one-line
error ("No API key configured. Use `wandb login` to log in.").
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from bench.run.identity import INFO_FILE

#: the folder W&B writes a run's files to, inside the run directory (bench/run/tracking.py: dir=<run_dir>)
WANDB_DIR = "wandb"
#: folders under a sweep that hold no runs: the code snapshots (.code/), submitit's logs (.submitit/), checkpoints
SKIPPED_DIRS = {"ckpt", WANDB_DIR, "__pycache__"}
#: paths per `wandb sync` call: a sweep of thousands of attempts stays far below the OS's argument-length limit
CHUNK = 200
#: seconds to wait for the W&B server to accept a connection before saying it is unreachable
CONNECT_TIMEOUT_S = 10.0
USAGE = "qrl-bench sync SWEEP_DIR [SWEEP_DIR ...] [--dry-run]"


@dataclass
class RunMirror:
    """One run directory and its offline W&B attempts, oldest first."""

    path: Path
    name: str  # the W&B run name it recorded (run.json run_name)
    wandb_id: str | None
    attempts: list[Path] = field(default_factory=list)


def run_dirs(root: Path) -> list[Path]:
    """Every run directory (a folder holding run.json) under `root`, in path order; hidden folders (.code, .submitit),
    checkpoints and W&B folders are not entered."""
    found = []
    for here, dirs, files in os.walk(root):
        if INFO_FILE in files:
            found.append(Path(here))
            dirs[:] = []
            continue
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIPPED_DIRS)
    return sorted(found)


def offline_attempts(run_dir: Path) -> list[Path]:
    """The run's offline W&B attempts (`wandb/offline-run-<YYYYMMDD_HHMMSS>-<id>` holding a .wandb file), oldest
    first: their names start with the time they began."""
    return sorted(d for d in (run_dir / WANDB_DIR).glob("offline-run-*") if d.is_dir() and any(d.glob("*.wandb")))


def find(roots: list[Path]) -> list[RunMirror]:
    """Every run under the sweep directories, with its offline attempts (none: W&B was disabled or online)."""
    runs = []
    for root in roots:
        for d in run_dirs(root):
            try:
                info = json.loads((d / INFO_FILE).read_text())
            except (OSError, ValueError):
                info = {}
            info = info if isinstance(info, dict) else {}
            runs.append(RunMirror(d, str(info.get("run_name") or d.name), info.get("wandb_id"), offline_attempts(d)))
    return runs


def commands(runs: list[RunMirror]) -> list[list[str]]:
    """The `wandb sync` calls that upload every attempt: no --project/--entity/--id/--job-type/--replace-tags, so
    each run keeps what it recorded. Attempts of one run stay in one call (W&B orders them by start time)."""
    calls: list[list[str]] = [[]]
    for run in runs:
        if calls[-1] and len(calls[-1]) + len(run.attempts) > CHUNK:
            calls.append([])
        calls[-1] += [str(a) for a in run.attempts]
    return [[sys.executable, "-m", "wandb", "sync", *paths] for paths in calls if paths]


def server_problem(base_url: str, timeout: float = CONNECT_TIMEOUT_S) -> str | None:
    """Why the W&B server at `base_url` cannot be reached (no DNS, no route, refused, timed out), or None."""
    url = urlsplit(base_url)
    host, port = url.hostname, url.port or (443 if url.scheme == "https" else 80)
    if not host:
        return f"WANDB_BASE_URL={base_url!r} names no host"
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as e:
        return f"{host}:{port}: {e.strerror or type(e).__name__}"
    return None


def base_url() -> str:
    """The W&B server `wandb sync` will use: WANDB_BASE_URL, else the host `wandb login --host` saved, else W&B's
    default."""
    import wandb

    settings = wandb.Settings()
    settings.update_from_system_settings()
    settings.update_from_env_vars(dict(os.environ))
    return str(settings.base_url)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="qrl-bench sync", usage=USAGE, description=__doc__.split("\n\n")[0])
    parser.error = lambda message: parser.exit(2, f"qrl-bench sync: error: {message} (usage: {USAGE})\n")  # one line
    parser.add_argument("sweeps", nargs="+", type=Path, metavar="SWEEP_DIR")
    parser.add_argument("--dry-run", action="store_true", help="list the runs and the wandb sync command; upload nothing")
    args = parser.parse_args(argv)
    for root in args.sweeps:
        if not root.is_dir():
            print(f"qrl-bench sync: {root} is not a directory; give a sweep directory such as results/<sweep>",
                  file=sys.stderr)
            return 2
    runs = find(args.sweeps)
    mirrored = [r for r in runs if r.attempts]
    where = ", ".join(map(str, args.sweeps))
    if not mirrored:
        why = "no run directory (run.json)" if not runs else (
            f"{len(runs)} run(s), none with an offline W&B mirror (tracking=disabled or online, or WANDB_MODE=disabled: "
            "scripts/quickstart.sh sets it unless WANDB_MODE=offline is given)")
        print(f"qrl-bench sync: nothing to upload under {where}: {why}", file=sys.stderr)
        return 2
    for r in mirrored:
        print(f"{r.name}  id {r.wandb_id}  {len(r.attempts)} offline attempt(s)  {r.path}")
    calls = commands(mirrored)
    n = sum(len(r.attempts) for r in mirrored)
    print(f"{len(mirrored)} run(s), {n} offline attempt(s) under {where}"
          + (f"; {len(runs) - len(mirrored)} run(s) without an offline mirror" if len(runs) > len(mirrored) else ""))
    if args.dry_run:
        for call in calls:
            print(" ".join(call))
        return 0
    url = base_url()
    if problem := server_problem(url):
        print(f"qrl-bench sync: cannot reach the W&B server {url} ({problem}); run this command where it is "
              "reachable (a login node), after `wandb login`", file=sys.stderr)
        return 1
    for call in calls:
        rc = subprocess.run(call, stdin=subprocess.DEVNULL).returncode
        if rc:
            print(f"qrl-bench sync: wandb sync exited {rc}; the runs after it were not uploaded", file=sys.stderr)
            return rc
    return 0


__all__ = ["RunMirror", "commands", "find", "main", "offline_attempts", "run_dirs", "server_problem"]
