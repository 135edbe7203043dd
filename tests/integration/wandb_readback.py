"""Read an offline W&B run back with wandb's own CLI, to check what the tracker mirrored.

`wandb leet inspect --json RUN_DIR` prints one JSON record per entry of the run's .wandb transaction log: the
only public way to read an offline run in wandb 0.31 (`wandb.Api()` needs the network; infra-notes section 3).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.hang import HANG_S

WANDB_CLI = str(Path(sys.executable).with_name("wandb"))
_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def inspect_records(run_dir: Path) -> list[dict[str, Any]]:
    """All records of one offline run directory (wandb/offline-run-*), via `wandb leet inspect --json`."""
    proc = subprocess.run([WANDB_CLI, "leet", "inspect", "--json", str(run_dir)], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=HANG_S)
    assert proc.returncode == 0, f"wandb leet inspect {run_dir} exited {proc.returncode}: {proc.stderr[-2000:]}"
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def history(run_dir: Path) -> list[dict[str, Any]]:
    """History rows without W&B's own `_` keys; non-finite floats come back as strings and are decoded."""
    rows = []
    for rec in inspect_records(run_dir):
        if rec.get("type") == "history":
            item = rec["history"]["item"]
            rows.append({k: _NONFINITE.get(v, v) if isinstance(v, str) else v
                         for k, v in item.items() if not k.startswith("_")} | {"_step": item["_step"]})
    return rows


def offline_runs(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "wandb").glob("offline-run-*"))
