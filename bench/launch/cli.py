"""The run and the sweep behind `qrl-bench` (bench/launch/entry.py parses the command line and answers --help
and config errors before this module's imports: torch, transformers).

`execute` runs one job to an outcome (a key of EXIT, each with a one-line cause; the codes are listed by
`qrl-bench --exit-codes`, bench/launch/entry.py); `hydra_main` is the Hydra task of a run or of each sweep job.
"""

from __future__ import annotations

import dataclasses
import errno
import math
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from bench.launch import sweep_report
from bench.launch.sweep_report import SIGNAL_OUTCOMES
from bench.launch.config import CONF_DIR, GROUP_REGISTRIES, NAME_KEYS, RENAMED_METHODS, register_configs, validate
from bench.models.config import USER_NAMED_MODELS
from bench.algo_config import AlgoConfig
from bench.launch.overrides import SWEEP_OVERWRITE, check_overrides
from bench.rollout import close_engines
from bench.run.preempt import PreemptionGuard, Stopped, stop_on_signals, submitit_preempt_signal
from bench.run.resume import Plan
from bench.run.store import RunDir, RunLocked, root_os_error, unwritable

if TYPE_CHECKING:
    from bench.train import Parts

EXIT = {"completed": 0, "skipped": 0, "failed": 1, "bad_config": 2, "diverged": 3, "locked": 4, "refused": 5,
        "incomplete": 6, "preempted": 128 + signal.SIGTERM, "interrupted": 128 + signal.SIGTERM}
#: SIGNAL_OUTCOMES (bench/launch/sweep_report.py), outcomes ended by a signal: their exit code is 128 + that signal
#: outcomes every rank of a multi-process run reaches on one shared decision (bench.distributed.group.leave)
TOGETHER = ("completed", "skipped", "diverged", "preempted", "incomplete", "refused", "locked")
#: errno values that name an environment problem in one line (no traceback)
ENVIRONMENT_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO)

register_configs()


class Outcome(str):
    """A job's outcome (a key of EXIT), with what a sweep's summary shows: the reason and the run directory."""

    def __new__(cls, name: str, reason: str | None = None, run_dir: Path | None = None,
                signum: int | None = None) -> "Outcome":
        obj = super().__new__(cls, name)
        obj.reason, obj.run_dir, obj.signum = reason, run_dir, signum
        return obj

    def __reduce__(self) -> tuple:
        return (Outcome, (str(self), self.reason, self.run_dir, self.signum))

    @property
    def together(self) -> bool:
        """Whether every rank of a multi-process run reaches this outcome on one shared decision (TOGETHER), so that
        they may leave the process group through a barrier (bench.distributed.group.leave)."""
        return str(self) in TOGETHER

    @property
    def code(self) -> int:
        if str(self) in SIGNAL_OUTCOMES and self.signum:
            return 128 + self.signum
        return EXIT[str(self)]

    def as_dict(self, name: str) -> dict[str, Any]:
        return {"name": name, "outcome": str(self), "code": self.code, "reason": self.reason,
                "run_dir": None if self.run_dir is None else str(self.run_dir), "signal": self.signum}


def say(name: str, message: str) -> None:
    print(f"qrl-bench: {name}: {message}", file=sys.stderr, flush=True)


def execute(cfg: DictConfig, overrides: list[str] | None = None) -> Outcome:
    """Run one job to an outcome in EXIT; never raises for bad input, divergence, a busy or finished run
    directory, a signal or an error during the run (it reports each in one line)."""
    name = RunDir.name_of(cfg)
    from bench.distributed.group import export_slurm_tasks

    export_slurm_tasks()  # SLURM tasks of one run (hydra.launcher.tasks_per_node / nodes): torchrun's env
    with stop_on_signals():
        try:
            return _execute(cfg, name, overrides)
        except Stopped as e:  # before the run directory was taken: nothing was written
            sig = signal.Signals(e.signum).name
            _remove_run_dir(cfg)  # Hydra made it (hydra.run.dir) before the job started
            say(name, f"stopped by {sig} before training started; nothing was written")
            return Outcome("interrupted", f"stopped by {sig} before training started", signum=e.signum)


def _launch_ranks(cfg: DictConfig, overrides: list[str] | None) -> Outcome:
    """The run's `train.nproc_per_node` processes, started here; returns rank 0's outcome.

    In a submitit job (SLURM) this process holds submitit's handler of the preemption signal, which requeues the job
    at once, and a requeue kills the job's processes: the ranks, which had the signal too (SLURM signals every process
    of the job step), would die mid-step without their checkpoint. So the signal is only recorded here while the ranks
    finish their step and checkpoint, and submitit's requeue runs after they returned 'preempted'."""
    from bench.distributed.group import launch_local

    if submitit_preempt_signal() is None:  # a signal to this process is passed on to the ranks
        return launch_local(cfg.train.nproc_per_node, execute, cfg, overrides, pass_signals=True)
    with PreemptionGuard() as guard:
        outcome = launch_local(cfg.train.nproc_per_node, execute, cfg, overrides)
        if guard.requested and outcome == "preempted":
            guard.exit_after_checkpoint()  # submitit's requeue (it exits); else the signal's exit code
    return outcome


def _build(cfg: DictConfig, name: str) -> Parts | Outcome:
    """The run's parts (bench.train.build), then the vLLM preflight where it applies; bad input is an Outcome, and a
    signal during either closes the engines already built (here, not in vLLM's atexit)."""
    from bench.launch.vllm_preflight import applies, preflight
    from bench.train import build

    parts = None
    try:
        parts = build(cfg)  # before touching the run dir: bad input leaves nothing behind (bench.train.check_startup)
        if applies(cfg):  # before any evaluation or training: a vLLM that cannot serve the run fails in seconds
            preflight(parts, say=lambda line: say(name, line))
    except (ValueError, OSError, ImportError) as e:  # ImportError: an optional engine's package is missing
        return _bad_input(cfg, name, e)
    except Stopped:
        if parts is not None:
            close_engines(parts.eval_engine, parts.engine)
        raise
    return parts


def _execute(cfg: DictConfig, name: str, overrides: list[str] | None) -> Outcome:
    try:
        validate(cfg)
    except ValueError as e:
        return _bad_input(cfg, name, e)
    run = RunDir.of(cfg)
    early = _before_any_work(cfg, run, name)
    if early is not None:
        return early
    if cfg.train.nproc_per_node > 1 and distributed_env_size() == 1:  # launch the run's processes here
        return _launch_ranks(cfg, overrides)
    if cfg.train.threads > 0:
        import torch
        torch.set_num_threads(cfg.train.threads)
    from bench.run.resume import decide
    from bench.train import train

    parts = _build(cfg, name)
    if isinstance(parts, Outcome):
        return parts
    from bench.distributed.group import broadcast_object, is_follower, world_size

    try:
        if is_follower():  # ranks > 0 of a multi-process run: rank 0 owns the run directory
            return _follow(parts, run, name, overrides)
        try:
            with run.lock():
                plan = decide(run, cfg)
                if world_size() > 1:
                    broadcast_object(plan)
                ended = _announce(plan, run, name)
                if ended is not None:
                    return ended
                try:
                    status = train(parts, run, OmegaConf.to_yaml(cfg, resolve=True), name, plan, overrides)
                except Stopped as e:
                    return _stopped(run, name, e)
                except Exception as e:  # noqa: BLE001 -- reported in one line, recorded in run.json
                    return _failed(run, name, e)
        except RunLocked as e:
            if world_size() > 1:
                broadcast_object(Plan("skip", str(e), outcome="locked"))
            print(f"qrl-bench: error: {e}; not starting a second writer", file=sys.stderr)
            return Outcome("locked", str(e), run.path)
        except OSError as e:  # taking the lock or preparing the directory (decide); errors of training are handled above
            message = f"run directory {run.path} cannot be written: {describe_error(e)}"
            print(f"qrl-bench: error: {message}", file=sys.stderr, flush=True)
            return Outcome("bad_config", message, run.path)
        reason = run.info().get("reason")
        say(name, result_line(run, status) + (f" ({reason})" if reason else ""))
        return Outcome(status, reason, run.path)
    finally:
        if world_size() > 1:  # while the process group lives: vLLM's engines shut theirs down
            close_engines(parts.eval_engine, parts.engine)


def _before_any_work(cfg: DictConfig, run: RunDir, name: str) -> Outcome | None:
    """The refusals and the cheap skip a run gets before it builds anything (each decided again under the lock);
    None when the run goes on."""
    from bench.run.resume import settled

    found = settled(run, cfg)  # before any work; decided again under the lock
    if found is not None:
        outcome, reason = found
        if outcome == "skipped":
            say(name, f"already completed in {run.path}, skipping")
        else:
            print(f"qrl-bench: error: {name}: {reason}", file=sys.stderr, flush=True)
        return Outcome(outcome, reason, run.path)
    why = unwritable(run.path)
    if why:  # before the warm start and the lock (RunDir.lock would fail in a traceback)
        return _bad_input(cfg, name, ValueError(f"run directory {run.path} is not writable ({why}); "
                                                "make it writable, or choose another out_root=DIR"))
    return None


def _announce(plan: Plan, run: RunDir, name: str) -> Outcome | None:
    """Say what the resume decision is; the outcome where it ends the run here (skip, refuse), else None."""
    for note in plan.notes:
        say(name, f"note: {note}")
    if plan.action == "skip":
        say(name, plan.message)
        return Outcome(plan.outcome or "skipped", plan.message, run.path)
    if plan.action == "refuse":
        print(f"qrl-bench: error: {name}: {plan.message}", file=sys.stderr, flush=True)
        return Outcome(plan.outcome or "refused", plan.message, run.path)
    if plan.action == "resume":
        say(name, f"{plan.message} in {run.path}")
    return None


def result_line(run: RunDir, status: str) -> str:
    """The run's result in one line, whether or not W&B is on: 'completed · eval accuracy 41.5 % (step 20) ·
    KL(mu||pi_old) 2.1e-04 · 20 steps · 1m32s -> DIR'. KL is the mean over the run's steps of mismatch/kl_k3,
    as the analysis's severity axis reads it (analysis/severity.py); the time is this attempt's training time."""
    info, rows, evals = run.info(), run.metrics(), [e for e in run.evals() if "eval/accuracy" in e]
    parts = [status]
    if evals:
        parts.append(f"eval accuracy {100 * evals[-1]['eval/accuracy']:.1f} % (step {evals[-1].get('step')})")
    kl = [r["mismatch/kl_k3"] for r in rows if isinstance(r.get("mismatch/kl_k3"), (int, float))]
    kl = [k for k in kl if math.isfinite(k)]
    if kl:
        parts.append(f"KL(mu||pi_old) {sum(kl) / len(kl):.2e}")
    parts.append(f"{len(rows)} steps")
    wall = info.get("final/wall_s") or info.get("wall_s")
    if isinstance(wall, (int, float)):
        parts.append(sweep_report.fmt_duration(wall))
    return " · ".join(parts) + f" -> {run.path}"


def distributed_env_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def _follow(parts: Parts, run: RunDir, name: str, overrides: list[str] | None) -> Outcome:
    """A rank > 0: train along with rank 0 on its plan, writing nothing (rank 0 reports the outcome)."""
    from bench.distributed.follower import FollowerRun
    from bench.distributed.group import broadcast_object
    from bench.train import train

    plan = broadcast_object(None)
    if plan.action not in ("start", "resume"):
        return Outcome(plan.outcome or "skipped", plan.message, run.path)
    try:
        status = train(parts, FollowerRun(run.path), OmegaConf.to_yaml(parts.cfg, resolve=True), name,
                       plan, overrides)
    except Stopped as e:  # preempted along with rank 0, which reports it
        return Outcome("preempted", None, run.path, signum=e.signum)
    return Outcome(status, None, run.path)


def _bad_input(cfg: DictConfig, name: str, err: BaseException) -> Outcome:
    """Bad configuration or input: one line, and no (empty) run directory left behind."""
    print(f"qrl-bench: error: {err}", file=sys.stderr, flush=True)
    _remove_run_dir(cfg)
    return Outcome("bad_config", str(err))


def _remove_run_dir(cfg: DictConfig) -> None:
    """The run's directory and its parents, while empty (Hydra makes hydra.run.dir before the job starts)."""
    try:
        from hydra.utils import to_absolute_path

        remove_empty_dirs(RunDir.of(cfg).path, Path(to_absolute_path(cfg.out_root)))
    except Exception:  # noqa: BLE001 -- the config may be too broken to name its directory
        pass


def remove_empty_dirs(path: Path, stop: Path) -> None:
    """rmdir `path` and its parents while they are empty, up to (not including) `stop`."""
    path, stop = Path(path).absolute(), Path(stop).absolute()
    while path != stop and stop in path.parents:
        try:
            path.rmdir()
        except OSError:
            return
        path = path.parent


def describe_error(err: BaseException) -> str:
    """One line naming the cause: the OS error with its file when there is one, else type and message."""
    os_err = root_os_error(err)
    if os_err is not None and os_err.errno in ENVIRONMENT_ERRNOS:
        where = f" writing {os_err.filename}" if os_err.filename else ""
        return f"{os_err.strerror or os.strerror(os_err.errno)}{where}"
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"


def _failed(run: RunDir, name: str, err: Exception) -> Outcome:
    cause = describe_error(err)
    os_err = root_os_error(err)
    if os_err is None or os_err.errno not in ENVIRONMENT_ERRNOS:
        traceback.print_exc()  # an unexpected error: the traceback is for the bug report
    run.clean_temporaries()  # a partial checkpoint of a full disk must not stay
    try:
        run.finish("failed", reason=cause)
    except OSError:
        pass
    from bench.run.resume import relaunch_effect

    full = os_err is not None and os_err.errno in (errno.ENOSPC, errno.EDQUOT)
    then = "free some space, then relaunch" if full else "relaunch"
    print(f"qrl-bench: error: {name} failed: {cause} (run directory {run.path}; run.json 'failed'; "
          f"{then} the same command to {relaunch_effect(run)})", file=sys.stderr, flush=True)
    return Outcome("failed", cause, run.path)


def _stopped(run: RunDir, name: str, err: Stopped) -> Outcome:
    """A signal ended the job inside the lock: report the run the way a preemption does."""
    sig = signal.Signals(err.signum).name
    if run.status == "running":  # stopped before the loop could checkpoint (a second Ctrl-C, setup)
        run.clean_temporaries()
        run.finish("preempted", reason=f"stopped by {sig} before a checkpoint of the current step")
    info = run.info()
    status = info.get("status")
    if status is None:  # before the run started (deciding, starting W&B): nothing of it was written
        say(name, f"stopped by {sig} before training started -> {run.path}")
        return Outcome("interrupted", f"stopped by {sig} before training started", run.path, signum=err.signum)
    if status != "preempted":  # the signal came after the run ended (final evaluation)
        say(name, f"{status} -> {run.path}")
        return Outcome(status, info.get("reason"), run.path, signum=err.signum)
    from bench.run.resume import relaunch_effect

    steps = len(run.metrics())
    how = "checkpointed" if err.checkpointed else "not checkpointed"
    say(name, f"stopped by {sig} after {steps} step(s), {how}; run.json 'preempted'; "
              f"relaunch the same command to {relaunch_effect(run)} -> {run.path}")
    return Outcome("preempted", info.get("reason"), run.path, signum=err.signum)


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def hydra_main(cfg: DictConfig) -> Any:
    hc = HydraConfig.get()
    if hc.mode == RunMode.MULTIRUN and cfg.train.overwrite:  # set by an experiment yaml (the CLI checks argv)
        print(f"qrl-bench: error: {SWEEP_OVERWRITE}", file=sys.stderr, flush=True)
        outcome = Outcome("bad_config", SWEEP_OVERWRITE)
    else:
        outcome = execute(cfg, overrides=list(hc.overrides.task))
    from bench.distributed.group import leave

    leave(outcome.together)  # a rank of SLURM tasks or torchrun (its one job): leave the process group
    if hc.mode == RunMode.RUN:
        if outcome.code:
            sys.exit(outcome.code)
        return 0
    return outcome.as_dict(RunDir.name_of(cfg))  # to the sweep launcher's summary (bench/launch/sweep_report.py)


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


def check_names(args: list[str]) -> str | None:
    """The error for a renamed arm (`method=fp8`: naming the new name) or for an override of a name key
    (`method.name=tis`: a registered name is its config file's name and nothing else, bench/launch/config.py)."""
    for arg in args:
        key, eq, value = arg.lstrip("+~").partition("=")
        if not eq:
            continue
        if key == "method":
            for choice in value.split(","):
                if choice.strip() in RENAMED_METHODS:
                    return f"method={choice.strip()} was renamed: {RENAMED_METHODS[choice.strip()]}"
        group, _, knob = key.partition(".")
        if group in NAME_KEYS and knob == NAME_KEYS[group]:
            if group == "model" and any(a.lstrip("+").startswith(f"model={m}") for a in args for m in USER_NAMED_MODELS):
                continue
            return (f"{arg}: {key} is the {group}'s config file name and cannot be overridden; choose the "
                    f"{group} with {group}=<name>" + (" (model=hf takes model.name=...)" if group == "model" else ""))
    return None


def _default_choices() -> dict[str, str]:
    defaults = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "config.yaml").defaults, resolve=False)
    out = {}
    for d in defaults:
        if isinstance(d, dict):
            for k, v in d.items():
                if not str(k).startswith("_schema"):
                    out[str(k)] = str(v)
    return out


def out_root_of(args: list[str]) -> Path | None:
    """The results directory the command line names (out_root=..., default from conf/config.yaml), absolute;
    None where it is an interpolation (Hydra resolves it)."""
    values = [a.split("=", 1)[1] for a in args if a.lstrip("+").startswith("out_root=")]
    out_root = values[-1] if values else str(OmegaConf.load(CONF_DIR / "config.yaml").out_root)
    return None if "${" in out_root else Path(out_root).expanduser().absolute()


def first_missing(path: Path | None) -> Path | None:
    """The outermost folder of `path` that does not exist yet (the first one a mkdir -p would make), or None."""
    if path is None or path.exists():
        return None
    while not path.parent.exists():
        path = path.parent
    return path


def unwritable_out_root(args: list[str]) -> str | None:
    """The error when the results directory (out_root=..., default from conf/config.yaml) cannot be written:
    Hydra would otherwise fail creating its output directory with a long logging traceback."""
    out_root = out_root_of(args)
    if out_root is None:
        return None
    why = unwritable(out_root)
    if why:
        return f"results directory {out_root} is not writable ({why}); choose another with out_root=DIR"
    return None


def run(args: list[str], checked: bool = False) -> None:
    """The command line after bench.launch.entry: its checks (unless the entry point's quick check `checked` them
    already), then the dry run, the run or the sweep; exits with the code of EXIT."""
    if not checked:
        plain = [a for a in args if not a.startswith("-")]
        error = config_error(args, plain) or check_overrides(args)
        if error:
            print(f"qrl-bench: error: {error}", file=sys.stderr)
            sys.exit(EXIT["bad_config"])
    if "--dry-run" in args:
        from bench.launch.dryrun import dry_run

        try:
            sys.exit(dry_run([a for a in args if a not in ("--dry-run", "-m", "--multirun")]))
        except ValueError as e:  # a setting only the dry run reads (a QRL_SLURM_* variable for its SLURM advice)
            print(f"qrl-bench: error: {e}", file=sys.stderr)
            sys.exit(EXIT["bad_config"])
    if "--preflight" in args:  # the vLLM preflight of every engine setup of the sweep, here, before queueing it
        from bench.launch.vllm_preflight import preflight_sweep

        sys.exit(preflight_sweep([a for a in args if a not in ("--preflight", "-m", "--multirun")]))
    out_root = out_root_of(args)
    made = first_missing(out_root)  # a launch refused at build time leaves no empty results folder it made
    try:
        hydra_main()
    finally:
        if made is not None:
            remove_empty_dirs(out_root, made.parent)
    code = sweep_report.exit_code()  # a sweep: its launcher recorded the jobs' outcomes (None for one run)
    if code:
        sys.exit(code)


def config_error(args: list[str], plain: list[str]) -> str | None:
    """The checks of the command line that come before composing it (bench.launch.overrides composes it)."""
    return check_names(plain) or check_group_overrides(plain) or unwritable_out_root(args)
