"""What a launch does with the run directory it has just locked: skip it, refuse it, start it or resume it.

`decide(run, cfg)` runs under the run directory's lock (bench.launch.cli.execute), so the status it reads is final: a
second launch that waited while the first finished sees `completed` and skips, instead of starting over.
The rules, in order (issue 13):

0. The directory's records of its configuration must describe the same run (`config_mismatch`): config.yaml and
   run.json's `config_hash` are two witnesses, and a launch whose semantic config differs from either
   (bench/run/identity.py NON_SEMANTIC_KEYS are left out) is refused before any work (exit 2), naming the keys
   and both values when config.yaml can say them, unless `train.overwrite=true`. A directory with results but
   neither record readable is refused too (`unrecorded`, exit 5), saying how to keep or discard them. A
   directory is never silently satisfied by, or resumed into, the results of another configuration, and its
   records are never rewritten to a configuration its rows were not trained with.
1. Temporaries a killed or failed writer left (`ckpt/last.pt.tmp<pid>`, `run.json.tmp<pid>`) are removed.
2. `train.overwrite=true`: the run is reset (metrics, evals, checkpoints, run.json) and starts at step 0.
   It is the only way rows are ever deleted without a checkpoint to recompute them from.
3. A finished run (completed, diverged, incomplete) is skipped: its outcome is reported, nothing is written.
4. The checkpoint: ckpt/last.pt, or ckpt/prev.pt when last.pt is missing (a crash between the two renames
   of `save_checkpoint`) or when asked for (`train.resume_from=previous`). An unreadable checkpoint is
   refused, naming the file and both ways on (resume from the previous one, or restart).
5. No checkpoint but rows in metrics.jsonl / eval.jsonl:
   - run.json says the run started and never finished (`running`, `preempted`, `failed`: killed, stopped or
     failed before its first checkpoint, e.g. a full disk at that checkpoint): it restarts from step 0 by
     itself. Its rows are deleted and recomputed identically (a run is a deterministic function of its config
     and seed); a note says so in the job's output (run.log in a sweep). The earlier attempt's W&B run is
     left as it is and a new one starts, since W&B cannot log a step twice into one run.
   - no readable run.json (a completed run whose run.json was deleted): refused, naming the directory and
     `train.overwrite=true`. Nothing says these rows are an unfinished run's; only the user may decide to
     recompute them.
6. Resume: unreadable lines are set aside (`metrics.jsonl.bad-<time>`, with a warning naming file and
   lines) and every readable row is kept; rows at or after the checkpoint's step are dropped (they are
   recomputed identically). A step missing before it is recomputed when ckpt/prev.pt precedes it; otherwise
   the run goes on and ends `incomplete` (listed, not used, by qrl-analyze).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import OmegaConf

from bench.run.identity import CONFIG_FILE, config_diff, config_hash, describe_diff
from bench.run.store import CheckpointError, RunDir

#: statuses a relaunch does not touch (train.overwrite=true reruns them)
FINAL_STATUSES = ("completed", "diverged", "incomplete")
#: statuses of a run that started and did not finish: without a checkpoint, a relaunch restarts it from step 0
UNFINISHED_STATUSES = ("running", "preempted", "failed")
RESUME_FROM = ("last", "previous")
OVERWRITE_HINT = "train.overwrite=true"


@dataclass
class Plan:
    """The decision for one launch. `action`: start | resume | skip | refuse."""

    action: str
    message: str = ""
    outcome: str | None = None  # for skip / refuse: the outcome bench.launch.cli reports
    checkpoint: dict[str, Any] | None = None
    start: int = 0
    notes: list[str] = field(default_factory=list)  # warnings to print (set-aside lines, cleaned files)


def expected_steps(start: int, eval_every: int) -> tuple[set[int], set[int]]:
    """The metrics and eval steps a run that reached `start` must have written before it."""
    return set(range(start)), {s for s in range(start) if s % eval_every == 0}


def missing_steps(run: RunDir, start: int, eval_every: int) -> dict[str, list[int]]:
    """{file name: steps below `start` without a row} for metrics.jsonl and eval.jsonl (empty when complete)."""
    want_m, want_e = expected_steps(start, eval_every)
    have_m = {r.get("step") for r in run.metrics()}
    have_e = {r.get("step") for r in run.evals()}
    out = {run.metrics_file.name: sorted(want_m - have_m), run.eval_file.name: sorted(want_e - have_e)}
    return {k: v for k, v in out.items() if v}


def describe_missing(missing: dict[str, list[int]]) -> str:
    parts = []
    for name, steps in missing.items():
        shown = ", ".join(map(str, steps[:8])) + (", ..." if len(steps) > 8 else "")
        parts.append(f"{name} lacks step{'s' if len(steps) > 1 else ''} {shown}")
    return "; ".join(parts)


def final_status(run: RunDir, steps: int, eval_every: int) -> tuple[str, str | None]:
    """("completed", None), or ("incomplete", why) when rows are missing that nobody can recompute now."""
    missing = missing_steps(run, steps, eval_every)
    if not any(r.get("step") == steps for r in run.evals()):
        missing.setdefault(run.eval_file.name, []).append(steps)
    if not missing:
        return "completed", None
    return "incomplete", (f"{describe_missing(missing)} (lost lines; no checkpoint could recompute them; "
                          f"{OVERWRITE_HINT} reruns the run)")


def config_change(run: RunDir, cfg: Any) -> str | None:
    """How `cfg` differs from the configuration that made `run`'s directory, or None when it does not (or nothing
    records one: `unrecorded` decides that case).

    Two records witness that configuration: config.yaml (every key: the difference is named, `train.lr: 0.0001 ->
    0.0002`) and run.json's `config_hash`. config.yaml counts when run.json has no hash or when it hashes to it;
    one that does not (torn, edited) is no witness, and the hash alone decides: it cannot name the keys, so the
    message gives run.json's record of the earlier launch's overrides instead. Nothing here writes."""
    new = OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else dict(cfg)
    new.pop("hydra", None)
    old, info = run.config(), run.info()
    stored = info.get("config_hash")
    if old is not None and (stored is None or config_hash(old) == stored):
        diff = config_diff(old, new)
        return describe_diff(diff) if diff else None
    if stored is None or stored == config_hash(new):
        return None
    where = run.path / CONFIG_FILE
    state = ("is missing" if not where.exists() else "is unreadable" if old is None
             else "does not hash to it (torn or edited)")
    overrides = info.get("overrides")
    earlier = f"; the earlier launch's overrides: {' '.join(map(str, overrides))}" if overrides else ""
    return (f"run.json's config_hash {stored} is not this launch's {config_hash(new)}; its {CONFIG_FILE} {state}, "
            f"so the keys cannot be named{earlier}")


def config_mismatch(run: RunDir, cfg: Any) -> str | None:
    """Why `cfg` may not use `run`'s directory: config.yaml or run.json's config_hash says a run of another
    configuration made it (`config_change`), or None. Ignores train.overwrite (the caller decides)."""
    change = config_change(run, cfg)
    if change is None:
        return None
    return (f"{run.path} holds a run of another configuration ({change}); refusing to reuse or mix "
            f"its results. Use another sweep=NAME, or launch this run alone with {OVERWRITE_HINT} to delete them "
            f"and start it")


def unrecorded(run: RunDir) -> str | None:
    """Why no launch may use `run`'s results: it holds rows or a checkpoint, but neither a readable config.yaml nor
    run.json's config_hash says which configuration made them, so no launch can be shown to be that run (it
    would be resumed, skipped or restarted on a guess). None when something records it, or there is nothing to
    lose. Ignores train.overwrite (the caller decides)."""
    if run.config() is not None or run.info().get("config_hash") or not (run.has_rows() or has_checkpoint(run)):
        return None
    return (f"{run.path} holds the results of an earlier run ({len(run.metrics())} metrics rows) but neither a "
            f"readable {CONFIG_FILE} nor run.json's config_hash says which configuration made them; refusing to "
            f"resume, skip or restart it on a guess. To keep them, move the directory out of the results (or "
            f"restore its {CONFIG_FILE}) and relaunch; to discard them, relaunch with {OVERWRITE_HINT}")


# 68 lines: the module docstring's decision list, case by case in its order, so each case reads beside its rule
def decide(run: RunDir, cfg: Any) -> Plan:
    """Decide what this launch does with `run` (see the module docstring). Call it holding the run's lock."""
    notes = [f"removed stale temporary {p.relative_to(run.path)}" for p in run.clean_temporaries()]
    overwrite = bool(cfg.train.get("overwrite", False))
    found = settled(run, cfg)
    if found is not None and found[0] != "skipped":  # a completed run's skip is decided below, with its reason
        return Plan("refuse", found[1], outcome=found[0], notes=notes)
    resume_from = str(cfg.train.get("resume_from", "last"))
    if overwrite:
        had = run.has_rows() or run.info_file.exists()
        run.reset()
        return Plan("start", notes=notes + ([f"{OVERWRITE_HINT}: the earlier results were deleted"] if had else []))

    info = run.info()
    status = info.get("status")
    if status in FINAL_STATUSES:
        what = {"completed": "already completed", "diverged": f"already diverged ({info.get('reason')})",
                "incomplete": f"already ended incomplete ({info.get('reason')})"}[status]
        return Plan("skip", f"{what} in {run.path}, skipping ({OVERWRITE_HINT} reruns it)",
                    outcome="skipped" if status == "completed" else status, notes=notes)

    ckpt_path = run.prev_ckpt_file if resume_from == "previous" else run.ckpt_file
    if resume_from == "last" and not run.ckpt_file.exists() and run.prev_ckpt_file.exists():
        ckpt_path = run.prev_ckpt_file
        notes.append("ckpt/last.pt is missing (interrupted while being replaced): resuming from ckpt/prev.pt")
    try:
        ckpt = run.load_checkpoint(ckpt_path)
    except CheckpointError as e:
        return Plan("refuse", _unreadable(run, e, resume_from), outcome="refused", notes=notes)
    if ckpt is None and resume_from == "previous":
        return Plan("refuse", f"train.resume_from=previous: there is no {ckpt_path} to resume from "
                              f"({OVERWRITE_HINT} restarts the run from step 0)", outcome="refused", notes=notes)

    if ckpt is None:
        if run.has_rows() and status in UNFINISHED_STATUSES:
            return Plan("start", notes=notes + [restart_from_zero(run, status)])
        if run.has_rows():
            n = len(run.metrics())
            return Plan("refuse", (
                f"{run.path} holds the results of an earlier run ({n} metrics rows) but no run.json saying "
                f"what they are (a completed run whose run.json was lost?) and no checkpoint to resume them "
                f"from; refusing to overwrite them. Rerun with {OVERWRITE_HINT} to start it again from step 0"),
                outcome="refused", notes=notes)
        return Plan("start", notes=notes)

    eval_every = int(cfg.train.eval_every)
    for file, aside, lines in run.set_aside_bad_lines():
        notes.append(f"{file}: unreadable line{'s' if len(lines) > 1 else ''} "
                     f"{', '.join(map(str, lines))} moved to {aside.name}")
    start = int(ckpt["step"])
    run.truncate_to(start)
    missing = missing_steps(run, start, eval_every)
    if missing and run.prev_ckpt_file.exists() and ckpt_path != run.prev_ckpt_file:
        earliest = min(s for steps in missing.values() for s in steps)
        try:
            prev = run.load_checkpoint(run.prev_ckpt_file)
        except CheckpointError:
            prev = None
        if prev is not None and int(prev["step"]) <= earliest:
            ckpt, start, ckpt_path = prev, int(prev["step"]), run.prev_ckpt_file
            run.truncate_to(start)
            notes.append(f"{describe_missing(missing)}: resuming from ckpt/prev.pt (step {start}) to recompute them")
            missing = {}
    if missing:
        notes.append(f"{describe_missing(missing)} and no checkpoint precedes them: the run continues and "
                     f"will end 'incomplete' ({OVERWRITE_HINT} restarts it from step 0)")
    source = ckpt_path.relative_to(run.path)
    return Plan("resume", f"resuming from step {start} ({source})", checkpoint=ckpt, start=start, notes=notes)


def restart_from_zero(run: RunDir, status: str) -> str:
    """Delete the rows of a run that never checkpointed and forget its W&B run; returns the note to print."""
    n_metrics, n_evals = len(run.metrics()), len(run.evals())
    run.truncate_to(0)
    if run.info().get("wandb_id"):
        run.update_info(wandb_id=None)
    return (f"run.json says '{status}' and there is no checkpoint (stopped before its first one): restarting "
            f"from step 0; its {n_metrics} metrics and {n_evals} eval rows are recomputed identically")


def has_checkpoint(run: RunDir) -> bool:
    """True when a relaunch has a checkpoint file to resume from (ckpt/last.pt or ckpt/prev.pt)."""
    return run.ckpt_file.exists() or run.prev_ckpt_file.exists()


def relaunch_effect(run: RunDir) -> str:
    """What relaunching the same command does to this unfinished run, for the messages printed when it stops."""
    if has_checkpoint(run):
        return "resume from its last checkpoint"
    return "restart it from step 0 (no checkpoint was written yet; its rows are recomputed identically)"


def settled(run: RunDir, cfg: Any) -> tuple[str, str] | None:
    """(outcome, reason) that a launch of `cfg` reaches before any work, read without the run's lock: a changed
    configuration (bad_config), results nothing records (refused), a completed run (skipped); None when the run
    goes on. The job says it before building anything (bench.launch.cli) and decides again under the lock
    (`decide`); the SLURM launcher says it before submitting, so that no allocation is spent on a job that would
    only say it (bench/launch/launchers.py)."""
    overwrite = bool(cfg.train.get("overwrite", False))
    mismatch = None if overwrite else config_mismatch(run, cfg)
    if mismatch:
        return "bad_config", mismatch
    unknown = None if overwrite else unrecorded(run)
    if unknown:
        return "refused", unknown
    if run.status == "completed" and not overwrite:
        return "skipped", "already completed"
    return None


def preview(run: RunDir, cfg: Any) -> str:
    """What `decide` would do, without touching anything (for --dry-run): run | resume | skip | refuse | restart.

    It does not open checkpoints: an unreadable one shows as `resume` here and is refused at launch.
    """
    if bool(cfg.train.get("overwrite", False)):
        return "restart" if run.has_rows() or run.info_file.exists() else "run"
    found = settled(run, cfg)
    if found is not None and found[0] != "skipped":
        return "refuse"
    if run.status in FINAL_STATUSES:
        return "skip"
    if has_checkpoint(run):
        return "resume"
    if run.has_rows():
        return "restart" if run.status in UNFINISHED_STATUSES else "refuse"
    return "run"


def refusal_reason(run: RunDir, cfg: Any) -> str:
    """Why `preview` says refuse, with the way on, without the run's path (the dry run counts the jobs per reason):
    its refusals are a changed configuration, results whose configuration nothing records, and rows without
    run.json nor checkpoint (`decide` says each). The way on is a run launched alone: a sweep refuses
    train.overwrite (SWEEP_OVERWRITE in bench/launch/overrides.py)."""
    change = config_change(run, cfg)
    if change is not None:
        return (f"the run directory holds a run of another configuration ({change}); use another sweep=NAME, or "
                f"launch this run alone with {OVERWRITE_HINT} to delete its results")
    if unrecorded(run):
        return (f"results but neither {CONFIG_FILE} nor run.json's config_hash records their configuration; move "
                f"the directory away to keep them, or launch this run alone with {OVERWRITE_HINT} to delete them")
    return f"rows but no run.json nor checkpoint; launch this run alone with {OVERWRITE_HINT} to restart it"


def _unreadable(run: RunDir, err: CheckpointError, resume_from: str) -> str:
    """The refusal for an unreadable checkpoint: the file, the cause, and the two ways on."""
    ways = [f"{OVERWRITE_HINT} restarts the run from step 0"]
    if resume_from == "last" and run.prev_ckpt_file.exists():
        try:
            prev = run.load_checkpoint(run.prev_ckpt_file)
            ways.insert(0, f"train.resume_from=previous resumes from ckpt/prev.pt (step {int(prev['step'])})")
        except CheckpointError:
            ways.append("ckpt/prev.pt is unreadable too")
    return f"{err}; " + "; ".join(ways)


__all__ = ["FINAL_STATUSES", "RESUME_FROM", "UNFINISHED_STATUSES", "Plan", "config_change", "config_mismatch", "decide",
           "final_status", "missing_steps", "preview", "refusal_reason", "relaunch_effect", "unrecorded"]
