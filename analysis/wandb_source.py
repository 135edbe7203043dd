"""W&B as an optional second source of runs, cached on disk for offline re-use.

The run directories are the source of truth; W&B is a mirror, useful when the runs were produced on
machines whose disks the analyst cannot see. Following openrlbenchmark, each W&B run is pulled once with
its *full* history (`scan_history`, not the sampled `history`, which returns ~500 random points so curves
would change between invocations) and cached. Unlike openrlbenchmark, the cache is written in the run
directory format itself (`config.json`, `run.json`, `metrics.jsonl`, `eval.jsonl`), so exactly one loader
(`load.py`) validates and reads both sources, and a cached group can be analysed with no network at all.

Cache layout: `<cache>/<entity>/<project>/<group>/<run_id>/`, plus `fetch.json` per group (what was
fetched, when, from where). Runs whose cached copy is final (completed/diverged/failed) and whose W&B
state has not changed are not downloaded again.

`wandb` is imported lazily: the rest of the package, and every test, works without network or W&B login.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from bench.run.identity import STATUSES

from .load import Sweep, load_sweeps

# W&B run.state -> run.json status. "crashed" is W&B's word for a process that died without finishing.
STATE_TO_STATUS = {
    "finished": "completed",
    "running": "running",
    "pending": "running",
    "crashed": "failed",
    "failed": "failed",
    "killed": "failed",
    "preempting": "preempted",
    "preempted": "preempted",
}
FINAL_STATUSES = ("completed", "diverged", "failed")
KNOWN_STATUSES = STATUSES


class WandbUnavailable(RuntimeError):
    """The W&B API cannot be used and there is no cache to fall back on; the message says what to do."""


def default_cache() -> Path:
    """Next to the model cache the trainer uses (QRL_BENCH_CACHE), so one variable moves both."""
    root = os.environ.get("QRL_BENCH_CACHE", "~/.cache/qrl-bench")
    return Path(root).expanduser() / "wandb"


def group_dir(cache: Path, entity_project: str, group: str | None) -> Path:
    entity, project = _split_path(entity_project)
    return Path(cache) / entity / project / (group or "_all")


def _split_path(entity_project: str) -> tuple[str, str]:
    parts = entity_project.strip("/").split("/")
    if len(parts) != 2 or not all(parts):
        raise ValueError(f"--wandb {entity_project!r}: expected ENTITY/PROJECT")
    return parts[0], parts[1]


def unflatten(config: dict[str, Any]) -> dict[str, Any]:
    """{"method.name": "tis"} -> {"method": {"name": "tis"}}, for trackers that log a flattened config;
    nested dicts pass through. W&B's own bookkeeping keys (leading underscore) are dropped."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if key.startswith("_"):
            continue
        if isinstance(value, dict) and set(value) == {"value"}:  # the raw API form {"key": {"value": v}}
            value = value["value"]
        node = out
        parts = key.replace("/", ".").split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                break
        else:
            node[parts[-1]] = unflatten(value) if isinstance(value, dict) else value
    return out


def split_history(rows: Iterable[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """W&B history rows -> (metrics.jsonl records, eval.jsonl records).

    W&B keeps one stream per run: a row may hold training metrics, eval/* metrics, or both (when both were
    logged at the same step). The step is the logged "step" key when present, else W&B's `_step`.
    Non-scalar values (histograms, tables) and W&B's own `_*` keys are dropped.
    """
    metrics: list[dict[str, Any]] = []
    evals: list[dict[str, Any]] = []
    for row in rows:
        step = row.get("step", row.get("_step"))
        if step is None:
            continue
        train: dict[str, Any] = {}
        ev: dict[str, Any] = {}
        for k, v in row.items():
            if k.startswith("_") or k == "step" or v is None or isinstance(v, (dict, list, str)):
                continue
            (ev if k.startswith("eval/") else train)[k] = v
        if train:
            metrics.append({"step": int(step), **train})
        if ev:
            evals.append({"step": int(step), **ev})
    return metrics, evals


def _status(run: Any) -> tuple[str, str | None]:
    """The run's own status if the tracker mirrored it into the summary (it knows 'diverged'), else the
    W&B state mapped onto run.json statuses."""
    summary = dict(getattr(run, "summary", {}) or {})
    own = summary.get("run/status", summary.get("status"))
    reason = summary.get("run/reason", summary.get("reason"))
    if own in KNOWN_STATUSES:
        return own, reason
    return STATE_TO_STATUS.get(getattr(run, "state", None), "failed"), reason


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=1, default=str))


def _write_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r, default=str) + "\n")


def cache_run(run: Any, dest: Path) -> None:
    """Write one W&B run into `dest` in the run directory format, atomically (temp dir + rename), so an
    interrupted fetch never leaves a half-written run that would look complete."""
    metrics, evals = split_history(run.scan_history(page_size=1000))
    status, reason = _status(run)
    try:
        meta = dict(run.metadata or {})
    except Exception:  # noqa: BLE001 - metadata is optional provenance, fetched separately by the API
        meta = {}
    config = unflatten(dict(run.config))
    declared = config.pop("run_info", None) or {}  # method, precision and runtime declarations (bench.train)
    info = {
        **{k: v for k, v in declared.items() if k in ("method", "arm", "precision", "runtime")},  # "arm": runs before 2026-11-28
        "status": status,
        "reason": reason,
        "diverged_step": dict(getattr(run, "summary", {}) or {}).get("run/diverged_step"),
        "step": max((m["step"] for m in metrics), default=-1),
        "run_name": run.name,
        "git_sha": (meta.get("git") or {}).get("commit"),
        "git_dirty": None,
        "versions": {"python": meta.get("python")} if meta.get("python") else {},
        "host": meta.get("host"),
        "started_at": str(getattr(run, "created_at", "") or "") or None,
        "finished_at": None,
        "wandb_id": run.id,
        "source": "wandb",
        "wandb_path": "/".join(run.path) if isinstance(getattr(run, "path", None), (list, tuple)) else None,
        "wandb_state": getattr(run, "state", None),
    }
    tmp = dest.parent / f".{dest.name}.tmp-{os.getpid()}"  # hidden: never discovered as a run
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    _write_json(tmp / "config.json", config)
    _write_json(tmp / "run.json", info)
    _write_jsonl(tmp / "metrics.jsonl", metrics)
    _write_jsonl(tmp / "eval.jsonl", evals)
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)


def _is_fresh(dest: Path, run: Any) -> bool:
    """A cached run is reused when it is final and W&B has not changed its state since it was cached."""
    try:
        info = json.loads((dest / "run.json").read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return info.get("status") in FINAL_STATUSES and info.get("wandb_state") == getattr(run, "state", None)


def fetch(entity_project: str, group: str | None, cache: Path, log: Callable[[str], None] = lambda _: None) -> Path:
    """Refresh the cache of a W&B project/group from the API; returns the group's cache directory.

    Raises WandbUnavailable (with the underlying error) when wandb is missing or the API cannot be used.
    """
    dest_root = group_dir(cache, entity_project, group)
    try:
        import wandb  # lazy: heavy, and only this path needs it
    except ImportError as e:
        raise WandbUnavailable(f"the wandb package is not installed ({e})") from e
    try:
        api = wandb.Api(timeout=30)
        runs = list(api.runs(entity_project, filters={"group": group} if group else {}))
    except Exception as e:  # noqa: BLE001 - network, auth, unknown project: all mean "no API"
        raise WandbUnavailable(f"cannot query the W&B API for {entity_project} ({type(e).__name__}: {e})") from e
    dest_root.mkdir(parents=True, exist_ok=True)
    fetched, reused = 0, 0
    for run in runs:
        dest = dest_root / run.id
        if _is_fresh(dest, run):
            reused += 1
            continue
        log(f"wandb: fetching {entity_project}/{run.id} ({run.name})")
        cache_run(run, dest)
        fetched += 1
    _write_json(
        dest_root / "fetch.json",
        {"entity_project": entity_project, "group": group, "fetched_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
         "runs": sorted(r.id for r in runs)},
    )
    log(f"wandb: {fetched} run(s) fetched, {reused} reused from cache {dest_root}")
    return dest_root


def load_wandb(
    entity_project: str,
    group: str | None,
    cache: Path,
    offline: bool = False,
    log: Callable[[str], None] = lambda _: None,
) -> Sweep:
    """Runs of a W&B project/group, read through the local cache.

    Online: refresh the cache, then read it. If the API is unreachable and a cache exists, say so and use
    the cache (a stale table is better than none, and the report states the source). `offline=True` never
    touches the network. Without a cache, raise WandbUnavailable telling the user how to get one.
    """
    _split_path(entity_project)  # validate before anything else
    where = group_dir(cache, entity_project, group)
    if not offline:
        try:
            fetch(entity_project, group, cache, log)
        except WandbUnavailable as e:
            if not where.is_dir():
                raise WandbUnavailable(
                    f"{e}; and there is no cache at {where}. Run qrl-analyze once with network access and W&B "
                    "credentials (same --cache), or analyse the run directories instead."
                ) from e
            log(f"wandb: {e}; using the cached copy at {where}")
    elif not where.is_dir():
        raise WandbUnavailable(
            f"--offline: no cache for {entity_project} group {group!r} at {where}. Run once without --offline "
            "(with network access) to fill it, or point --cache at a copied cache directory."
        )
    sweep = load_sweeps([where])
    sweep.sources = [f"wandb:{entity_project}" + (f" group={group}" if group else "") + f" (cache {where})"]
    return sweep
