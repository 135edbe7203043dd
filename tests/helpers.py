"""Shared test helpers: compose a real config from conf/ and run jobs in-process or through the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from bench.launch.cli import CONF_DIR  # noqa: F401  (importing bench.launch.cli registers the schemas)
from tests.hang import HANG_S

# a few-second run: 3 steps of 16 sequences, tiny eval split
FAST = ["train.steps=3", "train.batch_size=16", "train.group_size=4", "train.eval_every=2",
        "train.checkpoint_every=2", "task.n_test=32", "tracking=disabled", "train.threads=1"]
REPO = Path(__file__).resolve().parents[1]


def make_cfg(out_root: Path, *overrides: str, fast: bool = True) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=[*(FAST if fast else []), f"out_root={out_root}", *overrides])


def cli(*args: str, timeout: float = HANG_S, **kw) -> subprocess.CompletedProcess:
    """Run `python -m bench ARGS` in a subprocess with the test environment."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_SILENT": "true"}
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout, **kw)


def strip_times(rows: list[dict]) -> list[dict]:
    """Metrics rows without wall-clock fields (time/*), the only non-deterministic ones."""
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]
