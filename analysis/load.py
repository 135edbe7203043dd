"""Run discovery, validation and the DataFrames every other module reads.

The run directory is the source of truth: `<sweep>/<method>@<precision>/<task>/<model>[/<variant>]/seed<k>/` with
`config.yaml`, `run.json`, `metrics.jsonl`, `eval.jsonl`. A sweep on disk is always partly broken: jobs
still running, jobs that failed, a metrics file cut mid-line by preemption, a config written by an older
trainer. Analysis must never die on one bad directory, and must never silently mix a half-finished run
into a mean. So every directory becomes either a `Run` (used) or a `Skipped` (listed in the report with
its reason), and soft problems that do not invalidate a run become `Run.warnings`.

Identity comes from the resolved config (method.name, rollout.precision, task.name, model.name, variant, seed),
with the path as a fallback, so the method is named exactly as the run named itself everywhere downstream. A run
of a sweep variant (bench/launch/sweeper.py: jobs that differ in a setting outside the identity) is its own arm, named
`<method>[<variant>]`, so two settings are never pooled as seeds of one arm. Runs loaded from several sources that
share an identity are duplicates only when their whole configuration is equal; otherwise loading is refused, naming
the keys that differ (`unique_runs`).
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd
import yaml

from bench.run import identity
from bench.run.identity import FINISHED_STATUSES, SEED_DIR, STATUSES

from . import arms

ID_COLUMNS = ["run_id", "method", "precision", "task", "model", "seed"]
KNOWN_STATUSES = STATUSES
RUN_FILES = (identity.INFO_FILE, identity.METRICS_FILE)
#: The number every accuracy table, figure and the report's verdict read as a run's result (`Run.final_accuracy`).
RESULT_KEY = "eval/accuracy"
# Sub-directories of a sweep that never hold runs; pruned so discovery does not walk checkpoints.
PRUNED_DIRS = {"ckpt", "wandb", "__pycache__"}


class RunError(Exception):
    """A problem that makes a run directory unusable; its message is the reason shown in the report."""


@dataclass
class Run:
    """One usable run: identity, provenance, and its per-step and per-eval tables."""

    run_id: str
    path: Path
    method: str
    precision: str
    task: str
    model: str
    seed: int
    status: str
    reason: str | None
    config: dict[str, Any]
    info: dict[str, Any]
    metrics: pd.DataFrame  # one row per step: "step" + numeric metric columns
    evals: pd.DataFrame  # one row per evaluation: "step" + "eval/..." columns
    warnings: list[str] = field(default_factory=list)
    severity: str = ""  # the precision plus the rollout options that change its numerics (`severity_key`)
    task_key: str = ""  # the task's whole configuration (`task_key`): one task name can hold several problem sets
    final: dict[str, float] = field(default_factory=dict)  # the final evaluation's finite eval/* values (`final_eval`)
    final_step: int | None = None  # the step of that evaluation; None: the run has no evaluation

    @property
    def final_accuracy(self) -> float | None:
        """The run's result: RESULT_KEY of its final evaluation (a finite number by `final_eval`), or None."""
        return self.final.get(RESULT_KEY)

    @property
    def method_name(self) -> str:
        """The arm's method as configured; `method` carries the sweep variant's label besides it (`<method>[<variant>]`)."""
        return str(get(self.config, "method.name", self.method))

    @property
    def task_name(self) -> str:
        """The task's name as configured; `task` may carry a variant label besides it (`label_tasks`)."""
        return str(get(self.config, "task.name", self.task))

    @property
    def identity(self) -> tuple[str, str, str, str, int, str, str]:
        return (self.method, self.precision, self.task_name, self.model, self.seed, self.severity, self.task_key)

    @property
    def cell_key(self) -> tuple[str, str, str, str, str, str]:
        """Every identity axis but the seed: the runs that share it are the seeds of one cell."""
        return (self.method, self.precision, self.task_name, self.model, self.severity, self.task_key)

    @property
    def arm(self) -> identity.Arm:
        """The run's arm: its method at its rollout precision."""
        return identity.Arm(self.method, self.precision)

    @property
    def engine(self) -> str:
        """The rollout engine (embedded | vllm | ...): run.json `runtime`, else the config's rollout.engine."""
        declared = self.info.get("runtime")
        if isinstance(declared, dict) and isinstance(declared.get("engine"), str):
            return declared["engine"]
        engine = get(self.config, "rollout.engine")
        return engine if isinstance(engine, str) and "${" not in engine else "embedded"

    @property
    def device(self) -> str:
        """Where the run computed (cpu | cuda), from run.json `runtime`. A run without it was written by a
        trainer older than `train.device`, which had no GPU code path: it ran on the CPU."""
        declared = self.info.get("runtime")
        if isinstance(declared, dict) and isinstance(declared.get("device"), str):
            return declared["device"]
        return "cpu"


@dataclass
class Skipped:
    """A directory that was found but left out, with the reason a reader needs to fix or ignore it."""

    path: Path
    reason: str
    status: str | None = None
    name: str = ""  # <sweep>/<method>/<task>/<model>/seed<k>: readable, and free of machine-local prefixes

    def __post_init__(self) -> None:
        self.name = self.name or str(self.path)


@dataclass
class Sweep:
    """Everything loaded from one or more sweep directories (and/or a W&B cache)."""

    runs: list[Run]
    skipped: list[Skipped]
    sources: list[str] = field(default_factory=list)

    @cached_property
    def metrics(self) -> pd.DataFrame:
        """Long format: run_id, method, precision, task, model, seed, step, metric, value (finite values only)."""
        frames = []
        for r in self.runs:
            if r.metrics.empty:
                continue
            long = r.metrics.melt(id_vars="step", var_name="metric", value_name="value")
            long = long[pd.notna(long["value"])].assign(**_identity_columns(r))
            frames.append(long)
        cols = ID_COLUMNS + ["step", "metric", "value"]
        if not frames:
            return pd.DataFrame(columns=cols)
        return pd.concat(frames, ignore_index=True)[cols]

    @cached_property
    def evals(self) -> pd.DataFrame:
        """One row per (run, eval step): identity columns, step, and the eval/* metrics."""
        frames = []
        for r in self.runs:
            if r.evals.empty:
                continue
            frames.append(r.evals.assign(**_identity_columns(r)))
        if not frames:
            return pd.DataFrame(columns=ID_COLUMNS + ["step"])
        out = pd.concat(frames, ignore_index=True)
        rest = [c for c in out.columns if c not in ID_COLUMNS]
        return out[ID_COLUMNS + rest]

    @cached_property
    def index(self) -> pd.DataFrame:
        """One row per used run: identity, status, length and provenance (the runs.csv of the report)."""
        rows = []
        for r in self.runs:
            rows.append(
                {
                    "run_id": r.run_id,
                    "method": r.method,
                    "precision": r.precision,
                    "task": r.task,
                    "model": r.model,
                    "seed": r.seed,
                    "status": r.status,
                    "reason": r.reason,
                    "steps": int(r.metrics["step"].max()) + 1 if not r.metrics.empty else 0,
                    "final_eval_step": r.final_step,
                    "final_eval_accuracy": r.final_accuracy,
                    "git_sha": r.info.get("git_sha"),
                    "git_dirty": r.info.get("git_dirty"),
                    "host": r.info.get("host"),
                    "started_at": r.info.get("started_at"),
                    "finished_at": r.info.get("finished_at"),
                    "wandb_id": r.info.get("wandb_id"),
                    "path": str(r.path),
                }
            )
        return pd.DataFrame(rows)

    # Sorted axes of the sweep, used by plots, tables and the report alike so their orders agree.
    @property
    def tasks(self) -> list[str]:
        return sorted({r.task for r in self.runs})

    @property
    def models(self) -> list[str]:
        return sorted({r.model for r in self.runs})

    @property
    def seeds(self) -> list[int]:
        return sorted({r.seed for r in self.runs})


def _identity_columns(run: Run) -> dict[str, Any]:
    return {c: getattr(run, c) for c in ID_COLUMNS}


def get(config: dict[str, Any], dotted: str, default: Any = None) -> Any:
    """config["a"]["b"] for "a.b", or `default` when any level is missing."""
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists stay values (they are settings, not sub-trees)."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def discover(root: Path, exclude: Iterable[Path] = ()) -> list[Path]:
    """Every run directory under `root` (root itself may be one).

    A run directory holds run.json or metrics.jsonl, or is named seed<k> (a job that has not written
    anything yet is still a run of the sweep, and is listed as not started rather than forgotten). The walk
    does not descend into a run directory, hidden directories (.hydra, .submitit), checkpoints or `exclude`
    (the report's own output directory).
    """
    excluded = {p.resolve() for p in exclude}
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if any(f in filenames for f in RUN_FILES) or SEED_DIR.fullmatch(here.name):
            found.append(here)
            dirnames[:] = []
            continue
        dirnames[:] = sorted(
            d
            for d in dirnames
            if not d.startswith(".") and d not in PRUNED_DIRS and (here / d).resolve() not in excluded
        )
    return sorted(found)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        obj = json.loads(path.read_text())
    except FileNotFoundError:
        raise RunError(f"missing {path.name}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RunError(f"{path.name}: invalid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise RunError(f"{path.name}: expected a JSON object, got {type(obj).__name__}")
    return obj


def _read_config(run_dir: Path) -> dict[str, Any]:
    """config.yaml (the trainer's resolved Hydra config) or config.json (the W&B cache writes that)."""
    for name, parse in (("config.yaml", yaml.safe_load), ("config.json", json.loads)):
        path = run_dir / name
        if path.exists():
            try:
                cfg = parse(path.read_text())
            except (yaml.YAMLError, json.JSONDecodeError, UnicodeDecodeError) as e:
                raise RunError(f"{name}: cannot parse ({str(e).splitlines()[0]})") from None
            if not isinstance(cfg, dict):
                raise RunError(f"{name}: expected a mapping")
            return cfg
    raise RunError("missing config.yaml")


def read_jsonl(path: Path, required: bool = True) -> tuple[list[dict[str, Any]], list[str]]:
    """Records of a JSONL file (bench.run.identity.read_jsonl) and warnings.

    A bad *last* line is what a killed writer leaves behind (preemption mid-write): it is dropped with a
    warning. A bad line anywhere else means the file is corrupt, and the run is rejected, because silently
    dropping steps in the middle would shift every curve.
    """
    if not path.exists():
        if required:
            raise RunError(f"missing {path.name}")
        return [], []
    read = identity.read_jsonl(path)
    if read.bad and not read.torn_tail_only:
        lineno, text = read.bad[0]
        raise RunError(f"{path.name}: invalid JSON on line {lineno} ({text[:60]!r})")
    warnings = [f"{path.name}: dropped unreadable last line {read.bad[0][0]} (truncated write?)"] if read.bad else []
    return read.rows, warnings


def _frame(records: list[dict[str, Any]], name: str, warnings: list[str]) -> pd.DataFrame:
    """Records -> one row per step with numeric columns only.

    Repeated steps (a resumed run re-logs the steps after its last checkpoint) keep the last record,
    which is the one the resumed run continued from.
    """
    if not records:
        return pd.DataFrame(columns=["step"])
    df = pd.DataFrame.from_records(records)
    if "step" not in df:
        warnings.append(f"{name}: no 'step' key; using line order as step")
        df["step"] = range(len(df))
    df["step"] = pd.to_numeric(df["step"], errors="coerce")
    if df["step"].isna().any():
        warnings.append(f"{name}: {int(df['step'].isna().sum())} record(s) without a numeric step dropped")
        df = df[df["step"].notna()]
    df["step"] = df["step"].astype(int)
    n_dup = int(df["step"].duplicated(keep="last").sum())
    if n_dup:
        warnings.append(f"{name}: {n_dup} repeated step(s) (resume?); kept the last record of each")
        df = df.drop_duplicates("step", keep="last")
    numeric = {"step": df["step"]}
    for col in df.columns:
        if col == "step":
            continue
        values = pd.to_numeric(df[col], errors="coerce")
        if values.notna().any():
            numeric[col] = values.astype(float)
    return pd.DataFrame(numeric).sort_values("step").reset_index(drop=True)


def finite_number(value: Any) -> bool:
    """A JSON number that is finite: not null, not a string, not a boolean, not NaN or ±inf."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _step(record: dict[str, Any]) -> int | None:
    step = record.get("step")
    return int(step) if finite_number(step) and float(step).is_integer() else None


def final_eval(records: list[dict[str, Any]], final_step: int | None, warnings: list[str]) -> tuple[int | None, dict[str, float]]:
    """The run's final evaluation, (step, its finite eval/* values), as read from eval.jsonl's own records.

    Every table and the report's summary read a run's result from here, and only from here: the eval row at
    `final_step` (train.steps for a completed run), or the last eval row a diverged run wrote (`final_step`
    None). Its RESULT_KEY must be a finite number (where the run records it at all: rows of eval sets alone, as a
    W&B export may hold, have none). A missing row, a torn last line, or a row whose accuracy is null, a string,
    NaN or inf leaves the run out (RunError): reading the last earlier row instead would report an earlier step's
    accuracy as final (issue 19: a torn line flipped the sign of a gap; issue 32: a null final accuracy was
    reported as the step-15 one). Another eval/* key that is not a finite number in that row is dropped with a
    warning, so no table reads it from an earlier row either. A run without any evaluation gives (None, {})."""
    by_step = {s: r for r in records if (s := _step(r)) is not None}  # a repeated step keeps its last record
    if final_step is None and not by_step:
        return None, {}
    step = max(by_step) if final_step is None else final_step
    row = by_step.get(step)
    if row is None:
        torn = any(w.startswith("eval.jsonl: dropped unreadable last line") for w in warnings)
        why = "its last line is unreadable (a torn write)" if torn else "there is no row for that step"
        raise RunError(f"incomplete: eval.jsonl lacks the final evaluation (step {step}): {why}; "
                       "an earlier step's accuracy is not reported as final")
    value = row.get(RESULT_KEY)
    recorded = any(RESULT_KEY in r for r in by_step.values())  # a run of eval sets alone records no accuracy
    if recorded and not finite_number(value):
        raise RunError(f"incomplete: eval.jsonl's final evaluation (step {step}) has {RESULT_KEY}="
                       f"{json.dumps(value)}, not a finite number; an earlier step's accuracy is not reported as final")
    bad = sorted(k for k, v in row.items() if k.startswith("eval/") and not finite_number(v))
    if bad:
        warnings.append(f"eval.jsonl: the final evaluation (step {step}) has no finite value for {', '.join(bad)}; "
                        "the tables leave them out for this run")
    return step, {k: float(v) for k, v in row.items() if k.startswith("eval/") and finite_number(v)}


def nan_settings(config: dict[str, Any]) -> list[str]:
    """The settings of a config that are NaN (`key=nan`): no setting's value, so a run configured with one is a
    configuration error, whatever it then recorded (algo.adv_eps=nan trains on NaN advantages and "diverges")."""
    return [f"{k}=nan" for k, v in flatten(config).items() if isinstance(v, float) and math.isnan(v)]


#: the step a divergence names in its reason (bench/compute.py Diverged: "step 12: non-finite loss (nan)")
_DIVERGED_AT = re.compile(r"^step (\d+):")


def diverged_step(info: dict[str, Any], logged_steps: int | None = None) -> int | None:
    """The training step at which a diverged run stopped: run.json `diverged_step` (bench/train.py), else the step
    its reason names, else the number of steps it logged (the diverged step writes no row); None when unknown."""
    step = info.get("diverged_step")
    if finite_number(step):
        return int(step)
    match = _DIVERGED_AT.match(str(info.get("reason") or ""))
    return int(match[1]) if match else logged_steps


def check_divergence(step: int | None) -> None:
    """A diverged run is a result of training only when training had run: a divergence in step 0, the first rollout
    batch of the untrained policy, comes from the setup (a setting, the data, the model), and its last evaluation is
    the starting accuracy, no outcome of any training. Such a run is left out (RunError), saying so."""
    if step is not None and step < 1:
        raise RunError("diverged at step 0, on the untrained policy's first batch: the non-finite value comes from "
                       "the setup (a setting, the data or the model), not from training; not a result")


def _identity_from_path(run_dir: Path) -> dict[str, Any]:
    """<method>@<precision>/<task>/<model>[/<variant>]/seed<k> from the path, the fallback when the config lacks a key."""
    return identity.parse_run_path(run_dir)


def _precision(config: dict[str, Any]) -> str:
    """The rollout precision; an unresolved interpolation (an older trainer) falls back to the method's."""
    for key in ("rollout.precision",):
        value = get(config, key)
        if isinstance(value, str) and value and "${" not in value:
            return value
    return "unknown"


#: rollout options that change the rollout's numerics besides its precision: (config key, run.json precision key)
SEVERITY_OPTIONS = {
    "w": ("rollout.weight_granularity", "weight_granularity"),
    "a": ("rollout.act_granularity", "act_granularity"),
    "act": ("rollout.act_dtype", None),
    "kv": ("rollout.kv_cache_dtype", None),
    "lm_head": ("rollout.quantize_lm_head", None),
    "embed": ("rollout.quantize_embeddings", None),
    # another engine at the same precision is another rollout policy (vLLM: a bf16 engine with FP8 matrix
    # multiplies); the embedded engine is left out of the key, so that runs before the option keep theirs
    "engine": ("rollout.engine", None),
}
#: option values a severity key leaves out (a run that does not name them: the default engine)
IMPLICIT_OPTIONS = {"engine": (None, "embedded")}


def severity_key(config: dict[str, Any], info: dict[str, Any], precision: str) -> str:
    """How severe a run's rollout is, as data: `precision;w=..;a=..;act=..;kv=..;lm_head=..;embed=..[;engine=..]`.

    Granularities are read as the run resolved them (run.json `precision`, written by the trainer), so a
    default left implicit and the same default written out are one severity; the rest come from the config
    (absent = the engine's default). Two runs of an arm that differ only here are different runs, not duplicates.
    """
    declared = info.get("precision") if isinstance(info.get("precision"), dict) else {}
    parts = [precision]
    for short, (key, info_key) in SEVERITY_OPTIONS.items():
        value = declared.get(info_key) if info_key and info_key in declared else get(config, key)
        if isinstance(value, str) and "${" in value:
            value = None
        if value not in IMPLICIT_OPTIONS.get(short, ()):
            parts.append(f"{short}={value}")
    return ";".join(parts)


def task_key(config: dict[str, Any]) -> str:
    """The task's configuration as one string (every `task.*` key but its name): runs of one task name whose
    problems differ (chains of 3-6 steps vs 8-16; 200 vs 1,000 test problems) are different runs, never seeds of
    one cell or duplicates of each other."""
    task = get(config, "task", {})
    if not isinstance(task, dict):
        return ""
    return json.dumps({k: v for k, v in task.items() if k != "name"}, sort_keys=True, default=str)


def label_tasks(runs: list[Run]) -> None:
    """Name each task variant where runs of one task name differ in its configuration: the name plus the keys that
    vary, `chain (min_steps=6, max_steps=10)`, in place. Idempotent: labels are rebuilt from each run's config,
    so sources loaded apart and merged are labelled together."""
    by_name: dict[str, list[Run]] = {}
    for r in runs:
        by_name.setdefault(r.task_name, []).append(r)
    for name, group in by_name.items():
        options = [json.loads(r.task_key) if r.task_key else {} for r in group]
        order = [k for r in group for k in (get(r.config, "task", {}) or {})]  # the config's order, not sorted
        keys = [k for k in dict.fromkeys(order) if len({repr(o.get(k)) for o in options}) > 1]
        for r, o in zip(group, options):
            r.task = name + (f" ({', '.join(f'{k}={o.get(k)}' for k in keys)})" if keys else "")


def _where(info: dict[str, Any], run_dir: Path) -> str:
    """How far an unfinished run got, for its left-out reason: run.json's step (W&B's summary has one), else the
    metrics rows it logged (the trainer's run.json records none: "at step None" said nothing)."""
    if isinstance(info.get("step"), int):
        return f" at step {info['step']}"
    logged = len(identity.read_jsonl(run_dir / "metrics.jsonl").rows)
    return f" after {logged} logged step(s)" if logged else " before its first logged step"


def load_run(run_dir: Path, root: Path | None = None, run_id: str | None = None) -> Run:
    """Read and validate one run directory; raises RunError with the reason it cannot be used."""
    run_dir = Path(run_dir)
    info = _finished_info(run_dir)
    status = info["status"]
    config = _read_config(run_dir)
    if nans := nan_settings(config):
        raise RunError(f"configuration error: {', '.join(nans)} (NaN is no setting's value); not a result")
    if status == "diverged":
        check_divergence(diverged_step(info))
    fallback = _identity_from_path(run_dir)
    ident, seed = _identity(config, fallback)

    warnings: list[str] = []
    metrics, evals, eval_records = _read_rows(run_dir, warnings)
    planned = get(config, "train.steps")
    logged = _check_complete(metrics, status, info, planned)
    final_step, final = final_eval(eval_records, (planned if isinstance(planned, int) else logged)
                                   if status == "completed" else None, warnings)

    variant = get(config, "variant", fallback.get("variant")) or ""
    method = str(ident["method"]) + (f"[{variant}]" if variant else "")
    arms.learn(method, info)
    precision = _precision(config)
    if precision == "unknown" and fallback.get("precision"):
        precision = str(fallback["precision"])
    return Run(
        run_id=run_id or _default_run_id(run_dir, root),
        path=run_dir,
        method=method,
        precision=precision,
        task=str(ident["task"]),
        model=str(ident["model"]),
        seed=seed,
        status=status,
        reason=info.get("reason"),
        config=config,
        info=info,
        metrics=metrics,
        evals=evals,
        warnings=warnings,
        severity=severity_key(config, info, precision),
        task_key=task_key(config),
        final=final,
        final_step=final_step,
    )


def _finished_info(run_dir: Path) -> dict[str, Any]:
    """run.json of a run that finished (completed or diverged); RunError for an empty or unfinished one."""
    present = {p.name for p in run_dir.iterdir()} if run_dir.is_dir() else set()
    if not present & {"run.json", "metrics.jsonl", "config.yaml", "config.json"}:
        raise RunError("empty run directory (job not started?)")
    info = _read_json(run_dir / "run.json")
    status = info.get("status")
    if status not in KNOWN_STATUSES:
        raise RunError(f"run.json: unknown status {status!r}")
    if status not in FINISHED_STATUSES:
        reason = info.get("reason")
        raise RunError(f"status={status}" + (f" ({reason})" if reason else "") + _where(info, run_dir))
    return info


def _identity(config: dict[str, Any], fallback: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """The run's method, task, model and seed from its config, else from its path; and its integer seed."""
    ident = {
        "method": get(config, "method.name", fallback.get("method")),
        "task": get(config, "task.name", fallback.get("task")),
        "model": get(config, "model.name", fallback.get("model")),
        "seed": get(config, "seed", fallback.get("seed")),
    }
    missing = [k for k, v in ident.items() if v is None]
    if missing:
        raise RunError(f"config lacks {', '.join(missing)} and the path does not encode them")
    try:
        return ident, int(ident["seed"])
    except (TypeError, ValueError):
        raise RunError(f"config: seed={ident['seed']!r} is not an integer") from None


def _read_rows(run_dir: Path, warnings: list[str]) -> tuple[pd.DataFrame, pd.DataFrame, list[dict[str, Any]]]:
    """metrics.jsonl and eval.jsonl as frames, and eval.jsonl's records; what was dropped goes to `warnings`."""
    records, w = read_jsonl(run_dir / "metrics.jsonl")
    warnings += w
    if not records:
        raise RunError("metrics.jsonl is empty")
    metrics = _frame(records, "metrics.jsonl", warnings)
    if metrics.empty:
        raise RunError("metrics.jsonl has no usable step")
    eval_records, w = read_jsonl(run_dir / "eval.jsonl", required=False)
    warnings += w
    evals = _frame(eval_records, "eval.jsonl", warnings)
    if evals.empty:
        warnings.append("no eval.jsonl records: left out of the accuracy tables")
    elif "eval/accuracy" in evals:
        bad = evals.loc[~np.isfinite(pd.to_numeric(evals["eval/accuracy"], errors="coerce")), "step"].astype(int).tolist()
        if bad:  # the AUC and the curves skip them: say so, as for every other row dropped
            warnings.append(f"eval.jsonl: {len(bad)} evaluation(s) without a finite eval/accuracy (step "
                            f"{', '.join(map(str, bad[:10]))}{', ...' if len(bad) > 10 else ''}): left out of the "
                            "AUC and the curves")
    return metrics, evals, eval_records


def _check_complete(metrics: pd.DataFrame, status: str, info: dict[str, Any], planned: Any) -> int:
    """The steps logged (the last step + 1); RunError when a completed or diverged run lacks a step it must have."""
    logged = int(metrics["step"].max()) + 1
    if status == "completed" and isinstance(planned, int) and logged < planned:
        raise RunError(f"incomplete: status=completed but only {logged} of {planned} steps in metrics.jsonl")
    missing_steps = sorted(set(range(logged)) - set(metrics["step"].tolist()))
    if missing_steps:  # a completed or diverged run must have every step up to its last one
        shown = ", ".join(map(str, missing_steps[:10])) + (", ..." if len(missing_steps) > 10 else "")
        raise RunError(f"incomplete: metrics.jsonl lacks {len(missing_steps)} step(s): {shown}")
    if status == "completed" and isinstance(info.get("step"), int) and info["step"] + 1 > logged:
        raise RunError(f"incomplete: run.json says step {info['step']} but metrics.jsonl ends at step {logged - 1}")
    if status == "diverged":
        check_divergence(diverged_step(info, logged))
    return logged


def _default_run_id(run_dir: Path, root: Path | None) -> str:
    """The path relative to its sweep directory, prefixed with the sweep's name: unique and readable."""
    if root is not None:
        try:
            rel = run_dir.resolve().relative_to(root.resolve())
            return str(Path(root.resolve().name) / rel) if str(rel) != "." else root.resolve().name
        except ValueError:
            pass
    return str(run_dir)


def log(msg: str) -> None:
    """Progress goes to stderr; stdout carries only the report path (so scripts can capture it)."""
    print(f"[qrl-analyze] {msg}", file=sys.stderr)


class ConfigConflict(ValueError):
    """Runs that agree on every identity axis but the seed and differ in their configuration (`unique_runs`)."""


def unique_runs(runs: Iterable[Run], skipped: list[Skipped]) -> list[Run]:
    """The runs without duplicates (each appended to `skipped`, naming the run it duplicates).

    A duplicate is the very same configuration loaded twice: the same identity and the same whole configuration
    (bench.run.identity.config_diff: every setting that changes the run's numbers, the seed aside). Runs that agree
    on every identity axis but the seed (method, precision, task, model, severity, task settings) and differ in any
    other setting (train.steps=80 in one sweep directory, 30 in another) would be pooled as seeds of one cell, or
    one dropped as a "duplicate" of the other: both are refused, raising ConfigConflict naming the runs and the
    keys. They are not labelled apart as task variants are (`label_tasks`): a task variant holds for every arm of
    the task, so each arm's runs of it line up with a baseline; a setting that differs for one arm's runs only
    would split that arm off its cell, and where such a setting belongs (the arm, the task) only the person who
    launched the runs knows. The sweeper names such runs at launch (`variant`, bench/launch/sweeper.py)."""
    first: dict[tuple, Run] = {}  # cell_key -> the first run found there
    seen: dict[tuple, str] = {}
    kept: list[Run] = []
    conflicts: list[str] = []
    for r in runs:
        ref = first.setdefault(r.cell_key, r)
        # the identity's own keys are compared as resolved (cell_key: a config may lack them, the path has them)
        diff = [d for d in identity.config_diff(ref.config, r.config) if d[0] not in identity.AXIS_KEYS.values()]
        if diff:
            conflicts.append(f"{ref.run_id} vs {r.run_id}: {identity.describe_diff(diff)}")
        elif r.identity in seen:
            skipped.append(Skipped(r.path, f"duplicate of {seen[r.identity]}", r.status, r.run_id))
        else:
            seen[r.identity] = r.run_id
            kept.append(r)
    if conflicts:
        shown = "; ".join(conflicts[:3]) + (f"; and {len(conflicts) - 3} more" if len(conflicts) > 3 else "")
        raise ConfigConflict(
            f"{len(conflicts)} run(s) share a method, precision, task and model with another run but not its "
            f"configuration, so they are neither seeds of one cell nor duplicates: {shown}. Analyse each "
            "configuration on its own, or launch them as variants of one sweep (bench/launch/sweeper.py)")
    return kept


#: settings an arm sets for itself (its method, its rollout, and the trainer precision fp16 and matched choose)
ARM_SETTINGS = ("method.", "rollout.", "train.dtype")


def compared_apart(sweep: Sweep) -> list[str]:
    """The settings, besides an arm's own (`ARM_SETTINGS`) and the seed, on which runs compared with each other (one
    task and model) differ: 'train.steps: 20 (bf16@bf16 ×3), 10 (naive@mxfp4 ×1)'. Their gaps include those
    differences (a run of 10 steps against one of 20, another learning rate). A sweep variant's own keys
    (`variant=<key>=<value>`, bench/launch/sweeper.py) are intended differences and not listed."""
    axes = set(identity.AXIS_KEYS.values())
    groups: dict[tuple, list] = {}
    for r in sweep.runs:
        groups.setdefault((r.model, r.task_name, r.task_key), []).append(r)
    out = []
    for (model, task, _), runs in groups.items():
        named = {part.split("=", 1)[0] for r in runs for part in str(get(r.config, "variant") or "").split(",")}
        flat = {r.run_id: {k: v for k, v in identity.semantic_config(r.config).items()
                           if not k.startswith(ARM_SETTINGS) and k not in axes and k not in named}
                for r in runs}
        for key in sorted({k for f in flat.values() for k in f}):
            values: dict[str, Counter] = {}
            for r in runs:
                values.setdefault(json.dumps(flat[r.run_id].get(key), default=str)[:60], Counter())[r.arm] += 1
            if len(values) > 1:
                where = f" on {task} / {model}" if len(groups) > 1 else ""
                out.append(f"{key}{where}: " + ", ".join(
                    f"{v} ({', '.join(f'{arm} ×{n}' for arm, n in sorted(arms.items()))})"
                    for v, arms in sorted(values.items())))
    return out


def load_dirs(run_dirs: Iterable[tuple[Path, Path | None]], sources: list[str] | None = None) -> Sweep:
    """Load (run_dir, sweep_root) pairs into a Sweep; a duplicate keeps the first found (`unique_runs`)."""
    runs: list[Run] = []
    skipped: list[Skipped] = []
    for run_dir, root in run_dirs:
        name = _default_run_id(run_dir, root)
        try:
            run = load_run(run_dir, root, run_id=name)
        except RunError as e:
            status = None
            try:
                status = json.loads((run_dir / "run.json").read_text()).get("status")
            except Exception:  # noqa: BLE001 - the status is decoration on an already-rejected run
                pass
            skipped.append(Skipped(run_dir, str(e), status if isinstance(status, str) else None, name))
            continue
        except Exception as e:  # noqa: BLE001 - one odd directory must not stop the analysis of the rest
            skipped.append(Skipped(run_dir, f"unexpected error: {type(e).__name__}: {e}", None, name))
            continue
        runs.append(run)
    runs = unique_runs(runs, skipped)
    label_tasks(runs)
    return Sweep(runs=runs, skipped=skipped, sources=list(sources or []))


def load_sweeps(roots: Iterable[Path], exclude: Iterable[Path] = ()) -> Sweep:
    """Discover and load every run under each sweep directory.

    A directory with no run directory under it is an error, not an empty sweep: `qrl-analyze results/<sweep>` in a
    fresh clone finds only the committed report there, and an empty "report" written over it would destroy it."""
    pairs: list[tuple[Path, Path | None]] = []
    sources = []
    for root in roots:
        root = Path(root)
        if not root.is_dir():
            raise FileNotFoundError(f"sweep directory {root} does not exist{_nearby(root)}")
        sources.append(str(root))
        found = discover(root, exclude)
        if not found:
            raise FileNotFoundError(
                f"no run directory under {root} (a run directory holds run.json or metrics.jsonl, or is named "
                f"seed<N>): run the sweep first (qrl-bench -m ...), or name the directory its runs are in")
        pairs += [(d, root) for d in found]
    return load_dirs(pairs, sources)


def _nearby(root: Path) -> str:
    """'; did you mean results/smoke_short? (sweeps there: ...)' for a sweep directory that does not exist."""
    import difflib

    parent = root.parent if str(root.parent) else Path(".")
    names = sorted(p.name for p in parent.iterdir() if p.is_dir()) if parent.is_dir() else []
    if not names:
        return ""
    close = difflib.get_close_matches(root.name, names, n=1, cutoff=0.6)
    shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
    return (f"; did you mean {parent / close[0]}?" if close else "") + f" (directories in {parent}: {shown})"


def merge(sweeps: Iterable[Sweep]) -> Sweep:
    """Several sources into one Sweep; a run found twice keeps its first occurrence (`unique_runs`)."""
    runs: list[Run] = []
    skipped: list[Skipped] = []
    sources: list[str] = []
    for s in sweeps:
        sources += s.sources
        skipped += s.skipped
        runs += s.runs
    runs = unique_runs(runs, skipped)
    label_tasks(runs)
    return Sweep(runs=runs, skipped=skipped, sources=sources)
