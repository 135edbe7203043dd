"""Launchers that freeze code and config at submission: hydra/launcher=local (the default) and =slurm.

Why: a sweep can sit in a queue for hours. With the stock Hydra launchers a queued job imports `bench`
from the working tree *when it starts* and re-composes its config from conf/ *when it starts*, so an edit
made after submitting silently changes jobs submitted before it. Here, at submission (`launch`):

1. code: the project files (bench/, hydra_plugins/, conf/ (with conf/experiment/), pyproject.toml; git-tracked plus
   untracked-not-ignored, as on disk) are copied to <sweep_dir>/.code/<timestamp>/ and jobs import from it.
   - SLURM: each job starts in that directory. `python -m submitit.core._submit` puts its working directory
     first on sys.path, ahead of the checkout and of an editable install, so `bench` and this launcher
     (both unpickled by reference) come from the copy; PYTHONPATH points there too, for subprocesses.
     The job then chdirs back to the submission directory, so relative paths (out_root) keep their meaning.
   - local: the snapshot goes first on sys.path while the worker processes are spawned (loky hands the
     parent's sys.path to its workers), so the workers import `bench` from it. (With n_jobs=1 joblib runs
     the jobs in the launching process, which imported `bench` from the checkout: only the config is frozen.)
2. config: every job's config is composed in the submitting process and shipped with the job; the job's
   Hydra ConfigLoader is wrapped so that its `load_sweep_config` returns that frozen config instead of
   re-reading conf/ (both stock launchers call it inside the job).
3. SLURM preemption: submitit's signal is set to `preempt_signal` (USR1) both in `#SBATCH --signal` and in
   the job (SUBMITIT_PREEMPT_SIGNAL): SIGUSR1 -> bench.preempt checkpoints -> submitit requeues the job.

Hydra only instantiates launchers from the `hydra_plugins` namespace: the classes that conf/hydra/launcher/
*.yaml name are thin subclasses in hydra_plugins/qrl_bench/launchers.py.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Sequence

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn
from hydra.types import HydraContext
from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher
from omegaconf import DictConfig

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]
SNAPSHOT_PATHS = ("bench", "hydra_plugins", "conf", "pyproject.toml")


def _git(root: Path, *args: str) -> str | None:
    """stdout of a git command in `root`, or None when git fails or `root` is not the top of a checkout
    (a copy of the project lying inside some other repository must not report that repository's state)."""
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=root, capture_output=True, text=True,
                             timeout=60)
        if top.returncode or Path(top.stdout.strip()).resolve() != root.resolve():
            return None
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def _project_files(root: Path, paths: Sequence[str]) -> list[Path]:
    """Files to snapshot, relative to root: what git would see (tracked + untracked-not-ignored), as on disk.

    Outside a git checkout (an unpacked release, a copy), every file under `paths` except bytecode.
    """
    listed = _git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *paths)
    if listed is not None:
        return sorted({Path(p) for p in listed.split("\0") if p and (root / p).is_file()})
    files = []
    for name in paths:
        top = root / name
        candidates = [top] if top.is_file() else sorted(top.rglob("*")) if top.is_dir() else []
        files += [p.relative_to(root) for p in candidates
                  if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"]
    return files


def snapshot_code(dest: Path, root: Path = REPO_ROOT, paths: Sequence[str] = SNAPSHOT_PATHS) -> Path:
    """Copy the project's code and configs to `dest` (which must not exist yet); returns `dest`.

    The copy is not a git checkout, so SNAPSHOT.json records where it came from (source path, git sha,
    dirty flag, time) for the run's provenance (run.json git_sha).
    """
    files = _project_files(root, paths)
    if not any(f.parts[0] == "bench" for f in files):
        raise RuntimeError(f"no bench/ package found under {root} to snapshot")
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    for rel in files:
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, tmp / rel)
    sha = _git(root, "rev-parse", "HEAD")
    sha = sha.strip() if sha else None
    dirty = _git(root, "status", "--porcelain", "--untracked-files=no")
    (tmp / "SNAPSHOT.json").write_text(json.dumps({
        "source": str(root), "git_sha": sha, "git_dirty": None if dirty is None else bool(dirty),
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "files": len(files)}, indent=2) + "\n")
    tmp.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(dest)  # a half-copied snapshot never looks complete
    return dest


class FrozenConfigLoader:
    """Hydra's ConfigLoader, except that `load_sweep_config` returns the configs composed at submission.

    Both stock launchers call `hydra_context.config_loader.load_sweep_config(master, overrides)` inside the
    job; with this wrapper in the (pickled) HydraContext that call no longer reads conf/.
    """

    def __init__(self, loader: Any, master: DictConfig, job_overrides: Sequence[Sequence[str]]) -> None:
        self._loader = loader
        self._configs = {tuple(ov): loader.load_sweep_config(master, list(ov)) for ov in job_overrides}

    def load_sweep_config(self, master_config: DictConfig, sweep_overrides: List[str]) -> DictConfig:
        return copy.deepcopy(self._configs[tuple(sweep_overrides)])

    def __getattr__(self, name: str) -> Any:  # everything else: the real loader
        if name.startswith("__") or name in ("_loader", "_configs"):
            raise AttributeError(name)
        return getattr(self._loader, name)


class _Snapshotting:
    """What both launchers add to their stock parent: the code snapshot and the frozen configs."""

    config: DictConfig | None
    hydra_context: HydraContext | None

    def _init_snapshotting(self, code_dir: str | None) -> None:
        self.code_dir = code_dir  # None: <sweep_dir>/.code/<timestamp>
        self.code: Path | None = None  # made at the first launch of this process

    def _snapshot(self) -> Path:
        if self.code is None:
            assert self.config is not None
            sweep_dir = Path(str(self.config.hydra.sweep.dir)).absolute()
            code = Path(self.code_dir or sweep_dir / ".code" / time.strftime("%Y%m%d-%H%M%S")).absolute()
            if code.exists():  # two submissions within one second: keep both
                code = code.with_name(f"{code.name}-{os.getpid()}")
            self.code = snapshot_code(code)
            log.info(f"Code snapshot for these jobs: {code}")
        return self.code

    def _freeze_configs(self, job_overrides: Sequence[Sequence[str]]) -> None:
        assert self.config is not None and self.hydra_context is not None
        loader = self.hydra_context.config_loader
        loader = getattr(loader, "_loader", loader)  # a second batch: wrap the real loader again
        self.hydra_context = HydraContext(config_loader=FrozenConfigLoader(loader, self.config, job_overrides),
                                          callbacks=self.hydra_context.callbacks)


class SnapshotJoblibLauncher(_Snapshotting, JoblibLauncher):
    """hydra-joblib-launcher (parallel local worker processes) + code/config snapshot."""

    def __init__(self, code_dir: str | None = None, **joblib: Any) -> None:
        super().__init__(**joblib)
        self._init_snapshotting(code_dir)

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        code = str(self._snapshot())
        self._freeze_configs(job_overrides)
        sys.path.insert(0, code)  # workers spawned now get this sys.path
        try:
            return super().launch(job_overrides, initial_job_idx)
        finally:
            sys.path.remove(code)


def check_gpu_request(params: Dict[str, Any]) -> list[str]:
    """Coherence of a job's GPU/CPU request (hydra.launcher.*); raises ValueError for a contradiction and
    returns warnings for a request that runs but wastes what it asked for.

    submitit writes `gpus_per_node` as `#SBATCH --gpus-per-node=N`; SLURM then exports CUDA_VISIBLE_DEVICES to
    the job, where `train.device=auto` finds the GPU. Asking twice (a gpu `gres` as well) double-books or gets
    the job rejected; `cpus_per_gpu` is ignored by SLURM without `gpus_per_task` (submitit only warns); a run
    trains on one device, so a second GPU per job idles (run more jobs instead: one per GPU).
    """
    per_node, per_task = params.get("gpus_per_node"), params.get("gpus_per_task")
    gres = str(params.get("gres") or "")
    if (per_node or per_task) and "gpu" in gres:
        raise ValueError(f"hydra.launcher: GPUs requested twice (gpus_per_node={per_node}, gpus_per_task={per_task}, "
                         f"gres={gres!r}); use gpus_per_node=1 alone")
    if params.get("cpus_per_gpu") and not per_task:
        raise ValueError(f"hydra.launcher.cpus_per_gpu={params['cpus_per_gpu']} needs gpus_per_task (SLURM ignores it "
                         "with gpus_per_node); set cpus_per_task instead")
    n_gpus = max(int(per_node or 0), int(per_task or 0))
    return [f"hydra.launcher asks for {n_gpus} GPUs per job, but a run trains on one (train.device=cuda uses the "
            "first visible GPU): the others idle; submit one job per GPU instead"] if n_gpus > 1 else []


class SnapshotSlurmLauncher(_Snapshotting, SlurmLauncher):
    """hydra-submitit-launcher's SlurmLauncher + code/config snapshot + our preemption signal."""

    def __init__(self, preempt_signal: str = "USR1", code_dir: str | None = None, **params: Any) -> None:
        for warning in check_gpu_request(params):
            log.warning(warning)
        super().__init__(**params)
        self._init_snapshotting(code_dir)
        self.preempt_signal = preempt_signal.upper().removeprefix("SIG")
        self.submit_cwd: str | None = None
        self._user_setup = list(self.params.get("setup") or [])
        self._user_sbatch = dict(self.params.get("additional_parameters") or {})

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        code = shlex.quote(str(self._snapshot()))
        self._freeze_configs(job_overrides)
        self.submit_cwd = os.getcwd()
        sig = self.preempt_signal
        self.params["setup"] = [
            f"cd {code}",
            f'export PYTHONPATH={code}"${{PYTHONPATH:+:$PYTHONPATH}}"',
            f"export SUBMITIT_PREEMPT_SIGNAL={sig}",
            *self._user_setup,
        ]
        self.params["additional_parameters"] = {
            "signal": f"{sig}@{self.params.get('signal_delay_s', 120)}",
            **self._user_sbatch,
        }
        return super().launch(job_overrides, initial_job_idx)

    def __call__(self, sweep_overrides: List[str], job_dir_key: str, job_num: int, job_id: str,
                 singleton_state: Dict[type, Singleton]) -> JobReturn:
        """Runs inside the SLURM job (started in the snapshot): back to the submission directory, then the stock job."""
        if self.submit_cwd is not None:
            os.chdir(self.submit_cwd)
        return super().__call__(sweep_overrides, job_dir_key, job_num, job_id, singleton_state)
