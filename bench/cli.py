"""`qrl-bench` (= `python -m bench`): Hydra entry point for one run or a multirun sweep.

    qrl-bench                                  the embedded default: tiny model, CPU, W&B offline
    qrl-bench method=tis task=countdown        one run of another arm / task
    qrl-bench -m +experiment=smoke                  a named sweep (sweeps/), local launcher in parallel
    qrl-bench -m +experiment=smoke hydra/launcher=slurm     the same sweep on SLURM (submitit)
    qrl-bench -m +experiment=smoke --dry-run        list the jobs (and which would be skipped as done)

Exit codes of a single run: 0 completed, 2 bad configuration, 3 diverged, 1 failed (traceback printed).
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from bench.config import register_configs, validate
from bench.store import RunDir, RunLocked, run_path

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
EXIT = {"completed": 0, "skipped": 0, "failed": 1, "bad_config": 2, "diverged": 3, "locked": 4}

register_configs()


def run_name(cfg: DictConfig) -> str:
    return f"{cfg.method.name}-{cfg.task.name}-{cfg.model.name}-s{cfg.seed}"


def run_dir_of(cfg: DictConfig) -> RunDir:
    return RunDir(run_path(hydra.utils.to_absolute_path(cfg.out_root), cfg.sweep, cfg.method.name,
                          cfg.task.name, cfg.model.name, cfg.seed))


def execute(cfg: DictConfig) -> str:
    """Run one job to an outcome in EXIT; never raises for bad config, divergence or a busy run dir."""
    try:
        validate(cfg)
    except ValueError as e:
        print(f"qrl-bench: error: {e}", file=sys.stderr)
        return "bad_config"
    run = run_dir_of(cfg)
    name = run_name(cfg)
    if run.status == "completed":
        print(f"qrl-bench: {name}: already completed in {run.path}, skipping", file=sys.stderr)
        return "skipped"
    if cfg.train.threads > 0:
        import torch

        torch.set_num_threads(cfg.train.threads)
    from bench.train import build, train  # heavy imports (torch, transformers) only for real work

    try:
        parts = build(cfg)  # before touching the run dir: bad input leaves nothing behind
    except (ValueError, OSError) as e:
        print(f"qrl-bench: error: {e}", file=sys.stderr)
        return "bad_config"
    try:
        with run.lock():
            try:
                status = train(parts, run, OmegaConf.to_yaml(cfg, resolve=True), name)
            except Exception as e:
                run.finish("failed", reason=f"{type(e).__name__}: {e}")
                raise
    except RunLocked as e:
        print(f"qrl-bench: {e}; not starting a second writer", file=sys.stderr)
        return "locked"
    print(f"qrl-bench: {name}: {status} -> {run.path}", file=sys.stderr)
    return status


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def hydra_main(cfg: DictConfig) -> int:
    code = EXIT[execute(cfg)]
    if HydraConfig.get().mode == RunMode.RUN and code:
        sys.exit(code)
    return code


def main() -> None:
    if "--dry-run" in sys.argv[1:]:
        from bench.dryrun import dry_run

        sys.exit(dry_run([a for a in sys.argv[1:] if a not in ("--dry-run", "-m", "--multirun")]))
    hydra_main()


if __name__ == "__main__":
    main()
