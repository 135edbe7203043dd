"""Run identity, defined once for the runner (bench) and the analysis (analysis/), which imports it without torch.

A run is identified by (sweep, method, task, model, seed); everything else follows from that here:

    run path   <out_root>/<sweep>/<method>/<task>/<model>/seed<k>/      (a pure function of the identity, so
                                                                         a relaunched sweep finds its runs)
    run name   <method>-<task>-<model>-s<seed>                          (W&B name, progress bars, logs)
    files      config.yaml run.json metrics.jsonl eval.jsonl ckpt/last.pt
    statuses   running completed failed diverged preempted incomplete
    metrics    <namespace>/<name>, one vocabulary for metrics.jsonl, W&B, plots and tables

Hydra's own run directory (conf/config.yaml) is computed by `run_path` through the `qrl_run_dir` resolver.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# ------------------------------------------------------------------------------------------------ layout
CONFIG_FILE = "config.yaml"
INFO_FILE = "run.json"
METRICS_FILE = "metrics.jsonl"
EVAL_FILE = "eval.jsonl"
CKPT_DIR = "ckpt"
SEED_DIR = re.compile(r"seed(\d+)")


def run_path(out_root: str | Path, sweep: str, method: str, task: str, model: str, seed: int) -> Path:
    """The run directory: a pure function of the sweep axes, so a relaunch finds its earlier runs."""
    return Path(out_root) / str(sweep) / str(method) / str(task) / str(model) / f"seed{int(seed)}"


def parse_run_path(path: Path) -> dict[str, Any]:
    """{method, task, model, seed} from a run directory's last four parts, or {} if it is not one."""
    parts = Path(path).parts
    m = SEED_DIR.fullmatch(parts[-1]) if parts else None
    if len(parts) < 4 or m is None:
        return {}
    return {"method": parts[-4], "task": parts[-3], "model": parts[-2], "seed": int(m.group(1))}


def run_name(method: str, task: str, model: str, seed: int) -> str:
    return f"{method}-{task}-{model}-s{seed}"


# ---------------------------------------------------------------------------------------------- statuses
#: Every state a run.json can hold. A diverged run is a result (an arm that collapses is a finding), so
#: analysis keeps it; running / failed / preempted runs have no final result. `incomplete`: trained to the
#: end, but steps are missing from metrics.jsonl that no checkpoint could recompute (unreadable lines, set
#: aside in metrics.jsonl.bad-<time>); analysis leaves it out, `train.overwrite=true` reruns it.
STATUSES = ("running", "completed", "failed", "diverged", "preempted", "incomplete")
FINISHED_STATUSES = ("completed", "diverged")

# ----------------------------------------------------------------------------------------------- metrics
#: The metric namespaces of a metrics.jsonl / eval.jsonl row (besides "step"):
#:   reward/*   the rollout batch's rewards          train/*     loss, grad norm, entropy, clipfrac, lr
#:   mismatch/* pi_old vs mu (bench/mismatch.py)     method/<arm>/*  each arm's own diagnostics
#:   quant/*    QuRL weight-update / quant error     time/*      wall-clock seconds and throughput
#:   eval/*     greedy test evaluation (eval/accuracy); eval sets: eval/<set>/<metric> (pass@k, avg@k, ...)
#:   final/*    run.json summary of a completed run
#:   critic/*   PPO's value model (algo.advantage=gae)  sampling/*  DAPO dynamic sampling / overlong counts
NAMESPACES = ("reward", "train", "mismatch", "method", "quant", "time", "eval", "final", "critic", "sampling")
#: Wall-clock keys: the only metrics that differ between two runs of the same config.
TIME_KEYS = ("time/rollout_s", "time/sync_s", "time/recompute_s", "time/train_s", "time/step_s",
             "time/rollout_tokens_per_s")


def method_metric(method: str, key: str) -> str:
    """The namespace of an arm's own diagnostic: `method/<arm>/<key>`."""
    return f"method/{method}/{key}"


def is_time_metric(key: str) -> bool:
    return key.startswith("time/")


# ----------------------------------------------------------------------------------------------- reading
@dataclass
class JsonlRead:
    """The readable rows of a JSONL file, and the lines that were not (line number, text)."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    bad: list[tuple[int, str]] = field(default_factory=list)
    n_lines: int = 0
    linenos: list[int] = field(default_factory=list)  # the line number of each row

    @property
    def torn_tail_only(self) -> bool:
        """True when the only unreadable line is the last one: what a writer killed mid-line leaves."""
        return len(self.bad) == 1 and self.bad[0][0] == self.n_lines


def read_jsonl(path: Path) -> JsonlRead:
    """Every line of `path` that is a JSON object, in order; the others are reported, never silently lost.

    A missing file reads as empty. Bytes that are not UTF-8 make that line unreadable, not the file.
    """
    out = JsonlRead()
    path = Path(path)
    if not path.exists():
        return out
    lines = [ln for ln in path.read_bytes().split(b"\n")]
    if lines and lines[-1] == b"":
        lines.pop()
    out.n_lines = len(lines)
    for lineno, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw.decode("utf-8"))
            if not isinstance(obj, dict):
                raise ValueError("not a JSON object")
        except (ValueError, UnicodeDecodeError):
            out.bad.append((lineno, raw.decode("utf-8", errors="replace")[:200]))
            continue
        out.rows.append(obj)
        out.linenos.append(lineno)
    return out
