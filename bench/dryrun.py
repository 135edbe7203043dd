"""`qrl-bench -m ... --dry-run`: list the jobs a sweep would launch, and which would be skipped as done,
without launching anything (no SLURM submission, no training). Expands the sweep exactly as Hydra's basic
sweeper does: `hydra.sweeper.params` of the composed config plus the command-line overrides.
"""

from __future__ import annotations

import sys

from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser

from bench.config import CONF_DIR, register_configs
from bench.resume import preview
from bench.store import RunDir

register_configs()


def expand(overrides: list[str]) -> list[list[str]]:
    """Every job's override list, in Hydra's order."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        base = [o for o in overrides if "," not in o.split("=", 1)[-1]]
        cfg = compose("config", overrides=base, return_hydra_config=True)
        params = [f"{k}={v}" for k, v in (cfg.hydra.sweeper.params or {}).items()]
        parsed = OverridesParser.create().parse_overrides(params + overrides)
        batches = BasicSweeper.split_arguments(parsed, max_batch_size=None)
    return [job for batch in batches for job in batch]


def dry_run(overrides: list[str]) -> int:
    jobs = expand(overrides)
    counts: dict[str, int] = {}
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for job in jobs:
            cfg = compose("config", overrides=job)
            run = RunDir.of(cfg)
            status = run.status or "new"
            action = preview(run, cfg)  # what the launch will decide under the run's lock (bench/resume.py)
            counts[action] = counts.get(action, 0) + 1
            print(f"{action:7s} {status:10s} {RunDir.name_of(cfg):40s} {run.path}")
    todo = len(jobs) - counts.get("skip", 0) - counts.get("refuse", 0)
    refused = (f", {counts['refuse']} refused (results but no checkpoint; train.overwrite=true restarts them)"
               if counts.get("refuse") else "")
    print(f"{len(jobs)} jobs: {todo} to launch, {counts.get('skip', 0)} already finished{refused}", file=sys.stderr)
    return 0
