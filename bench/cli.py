"""`qrl-bench` (= `python -m bench`): Hydra entry point for one run or a multirun sweep.

    qrl-bench                                  the embedded default: tiny model, CPU, W&B offline
    qrl-bench method=tis task=countdown        one run of another arm / task
    qrl-bench -m +experiment=smoke             a named sweep (conf/experiment/), local launcher in parallel
    qrl-bench -m +experiment=smoke hydra/launcher=slurm     the same sweep on SLURM (submitit)
    qrl-bench -m +experiment=smoke --dry-run   list the jobs (and which would be skipped as done)

Exit codes of a single run: 0 completed (or already completed), 1 failed (traceback printed), 2 bad
configuration, 3 diverged, 4 the run directory is in use by another process.
"""

from __future__ import annotations

import dataclasses
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from bench.config import CONF_DIR, GROUP_REGISTRIES, register_configs, validate
from bench.grpo import AlgoConfig
from bench.store import RunDir, RunLocked

EXIT = {"completed": 0, "skipped": 0, "failed": 1, "bad_config": 2, "diverged": 3, "locked": 4}

register_configs()


def execute(cfg: DictConfig) -> str:
    """Run one job to an outcome in EXIT; never raises for bad config, divergence or a busy run dir."""
    try:
        validate(cfg)
    except ValueError as e:
        print(f"qrl-bench: error: {e}", file=sys.stderr)
        return "bad_config"
    run = RunDir.of(cfg)
    name = RunDir.name_of(cfg)
    if run.status == "completed":
        print(f"qrl-bench: {name}: already completed in {run.path}, skipping", file=sys.stderr)
        return "skipped"
    if cfg.train.threads > 0:
        import torch

        torch.set_num_threads(cfg.train.threads)
    from bench.train import build, train

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


def check_group_overrides(args: list[str]) -> str | None:
    """The error for an override of a key that the selected component does not have, naming the component.

    Hydra would reject `method=bf16 method.is_cap_C=3` too, but only as "key not in struct"; here the message
    names the arm, the arms that do have the knob, and `algo.<key>` for a shared GRPO knob. Covers the
    registry-backed groups (method, task, rollout); defaults come from conf/config.yaml.
    """
    defaults = _default_choices()
    chosen = {g: [c for a in args if a.startswith(f"{g}=") for c in a.split("=", 1)[1].split(",")] or [defaults[g]]
              for g in GROUP_REGISTRIES}
    algo_keys = {f.name for f in dataclasses.fields(AlgoConfig)}
    for arg in args:
        key = arg.lstrip("+~").split("=", 1)[0]
        group, _, knob = key.partition(".")
        if group not in GROUP_REGISTRIES or not knob or "." in knob or "=" not in arg:
            continue
        registry = GROUP_REGISTRIES[group]
        for choice in chosen[group]:
            if choice not in registry:
                continue  # Hydra names the unknown choice itself
            fields = {f.name for f in dataclasses.fields(registry.schema(choice))}
            if knob in fields:
                continue
            owners = [n for n in registry.names() if knob in {f.name for f in dataclasses.fields(registry.schema(n))}]
            hint = f" (it belongs to {group}={', '.join(owners)})" if owners else ""
            if group == "method" and knob in algo_keys:
                hint = f" (a GRPO knob shared by every arm: use algo.{knob}={arg.split('=', 1)[1]})"
            return (f"{arg}: {group} {choice!r} has no key {knob!r}{hint}; "
                    f"its keys: {', '.join(sorted(fields))}")
    return None


def _default_choices() -> dict[str, str]:
    defaults = OmegaConf.load(CONF_DIR / "config.yaml").defaults
    out = {}
    for d in defaults:
        if isinstance(d, (dict, DictConfig)):
            for k, v in d.items():
                out[str(k)] = str(v)
    return out


def main() -> None:
    args = sys.argv[1:]
    error = check_group_overrides([a for a in args if not a.startswith("-")])
    if error:
        print(f"qrl-bench: error: {error}", file=sys.stderr)
        sys.exit(EXIT["bad_config"])
    if "--dry-run" in args:
        from bench.dryrun import dry_run

        sys.exit(dry_run([a for a in args if a not in ("--dry-run", "-m", "--multirun")]))
    hydra_main()


if __name__ == "__main__":
    main()
