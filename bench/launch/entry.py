"""`qrl-bench` (= `python -m bench`): the command line's front door. It answers `--help`, `--exit-codes` and every
config error before torch and transformers are imported (~10 s of CPU), then hands over to bench.launch.cli.

    qrl-bench                                  the embedded default: tiny model, CPU, W&B offline
    qrl-bench method=tis task=countdown        one run of another arm / task
    qrl-bench -m +experiment=smoke             a named sweep (conf/experiment/), local launcher in parallel
    qrl-bench -m +experiment=smoke hydra/launcher=slurm     the same sweep on SLURM (submitit)
    qrl-bench -m +experiment=smoke --dry-run   list the jobs (and which would be skipped as done)
    qrl-bench sync results/smoke               upload the sweep's offline W&B runs (bench/run/wandb_sync.py)

The config check (`quick_check`) runs in a forked child that imports the suite with stand-ins for torch and
transformers (bench.launch.stubs): it composes the command line the way Hydra will (bench.launch.overrides) and
runs `bench.launch.config.validate`'s checks on it, except those that need torch itself (is CUDA usable?), which the
run makes again. An error is one line naming the value, its valid choices and a close match, and exit code 2.
The child's imports never reach this process; a child that cannot decide (a module whose import-time code a
stand-in does not survive) hands the checks back to the run, in this process, as before.
"""

from __future__ import annotations

import os
import sys


EXIT_CODES = """\
Exit codes of a single run (every non-zero one comes with a one-line cause on stderr):
    0    completed, or already completed (skipped)
    1    failed: an error during the run (run.json `failed` with the cause; a traceback for unexpected errors)
    2    bad configuration or input, found before any work (nothing written): an unknown choice or key, a value
         out of range, unreadable or too long data, a missing optional engine, a bad WANDB_MODE, a run
         directory that cannot be written
    3    diverged: a non-finite loss or gradient (run.json `diverged`; metrics kept); also a relaunch of one
    4    the run directory is in use by another process (its lock is held)
    5    refused: the run directory holds rows but neither run.json nor a checkpoint (a completed run that
         lost its run.json), or results but neither config.yaml nor run.json's config_hash to say what made
         them, or an unreadable checkpoint; the message names the way on (train.overwrite=true,
         train.resume_from=previous, moving the directory away to keep it). A run stopped before its first checkpoint is not
         refused: it restarts from step 0 (bench/run/resume.py)
    6    incomplete: trained to the end, but steps are missing from metrics.jsonl that no checkpoint could
         recompute (their lines were unreadable); also a relaunch of such a run
    128+N  stopped by signal N (SIGINT 130, SIGUSR1 138, SIGTERM 143) after checkpointing: run.json
         `preempted`; the same command resumes it
A sweep (-m) exits 0 when every job completed or was skipped as completed; otherwise with the code its unfinished
jobs share, 1 when they differ, 128+N when the sweep itself was stopped by signal N; it lists every job that
did not complete, with its reason and log.
"""

HELP = """usage: qrl-bench [-m] [--dry-run | --preflight] [key=value ...]     (python -m bench)
       qrl-bench sync SWEEP_DIR [...] [--dry-run]

One GRPO run, or with -m a sweep, of an arm (a method at a rollout precision) on a task and a model.

examples:
  qrl-bench                                          one run: bf16 arm, arithmetic, tiny model, CPU (100 steps, ~4 min)
  qrl-bench method=tis rollout.precision=int8 seed=1  one arm at another precision -> results/default/tis@int8/...
  qrl-bench -m method=bf16,naive,tis seed=0,1,2      a sweep: every combination, local workers in parallel
  qrl-bench -m method=bf16,naive,tis rollout.precision=int8,mxfp4   arms x precisions: 5 jobs (bf16 runs once,
                                                     at bf16, its fixed precision; docs/sweeps.md)
  qrl-bench -m +experiment=smoke_short --dry-run     list a named sweep's jobs and what each launch would do
  qrl-bench -m +experiment=smoke_short               run a named sweep (conf/experiment/)
  qrl-bench -m +experiment=smoke_short hydra/launcher=slurm   the same sweep on SLURM (submitit)
  qrl-bench -m +experiment=paper/qurl_table1 --dry-run     a paper recipe: its rows, GPU-hours
  qrl-bench -m +experiment=paper/qurl_table2 --preflight   its vLLM engines checked here (a GPU node) before queueing
  qrl-analyze results/smoke_short                    figures, tables and report.md of a sweep
  qrl-bench sync results/smoke_short [--dry-run]     upload a sweep's offline W&B runs (names, groups, tags kept)

config groups (choose with group=option):
{groups}
Every key of the resolved config can be set as key=value (e.g. train.steps=20 algo.clip_eps_high=0.28);
`qrl-bench --cfg job` prints the resolved config. train.batch_size counts sequences (prompts x
train.group_size), not prompts as verl's data.train_batch_size does. Each run ends with a result line (final
eval accuracy, mean KL(mu||pi_old), steps, wall time, run directory); a sweep's runs write theirs to run.log.
Exit codes: `qrl-bench --exit-codes`.
"""

#: `qrl-bench sync SWEEP_DIR...`: upload a sweep's offline W&B runs (bench/run/wandb_sync.py)
SYNC = "sync"
#: the quick check's verdicts (the child's exit status): the command line is fine / an error was printed
PASSED, FAILED = 0, 2
#: the flags qrl-bench itself answers, and Hydra's (hydra/_internal/utils.py get_args_parser)
OWN_FLAGS = ("-m", "--multirun", "--dry-run", "--preflight", "--exit-codes", "--help", "-h")
HYDRA_ARGPARSE_FLAGS = ("--cfg", "-c", "--resolve", "--package", "-p", "--run", "-r", "--shell-completion", "-sc",
                        "--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd", "--info", "-i",
                        "--experimental-rerun", "--hydra-help", "--version")


def unknown_flag(args: list[str]) -> str | None:
    """The one-line error for a flag neither qrl-bench nor Hydra has (Hydra's own answer is its usage screen,
    which lists neither -m's sweeps nor --dry-run), or None."""
    import difflib

    for arg in args:
        flag = arg.split("=", 1)[0]
        if arg.startswith("-") and flag not in OWN_FLAGS + HYDRA_ARGPARSE_FLAGS:
            close = difflib.get_close_matches(flag, OWN_FLAGS + HYDRA_ARGPARSE_FLAGS, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            return (f"unknown option {arg!r}{hint}; qrl-bench's: {', '.join(OWN_FLAGS)}; Hydra's: --cfg job|hydra|all, "
                    "--info, --config-name, ... (--hydra-help); `qrl-bench --help` for the usage")
    return None


def help_text() -> str:
    """The help: usage examples and every config group with its options (the yaml files of conf/)."""
    from bench.launch.overrides import group_options

    from bench import CONFIG_GROUPS

    lines = [f"{group}: {', '.join(group_options(group))}" for group in CONFIG_GROUPS]
    return HELP.format(groups="\n".join(lines))


def main() -> None:
    # A W&B service inherited from the launching process (wandb exports WANDB_SERVICE to its children) would
    # carry this run's W&B stream: a resumed run then writes into the stream its killed attempt left open in
    # that service, and its own offline run directory stays empty. Nothing in this process has started W&B
    # yet, so any WANDB_SERVICE here is inherited: every qrl-bench process starts its own.
    os.environ.pop("WANDB_SERVICE", None)
    args = sys.argv[1:]
    if args[:1] == [SYNC]:  # a subcommand, not a config override: it never composes a config
        from bench.run.wandb_sync import main as sync

        sys.exit(sync(args[1:]))
    if "--help" in args or "-h" in args:
        return page(help_text())
    if "--exit-codes" in args:
        return page(EXIT_CODES.rstrip())
    error = unknown_flag(args)
    if error:
        print(f"qrl-bench: error: {error}", file=sys.stderr)
        sys.exit(FAILED)
    verdict = quick_check(args)
    if verdict == FAILED:
        sys.exit(FAILED)
    from bench.run.progress import quiet_hf_bars

    quiet_hf_bars()  # a log file gets plain progress lines, no carriage-return frames
    from bench.launch import cli

    cli.run(args, checked=verdict == PASSED)


def page(text: str) -> None:
    """Print a page of text; a reader that stops early (`qrl-bench --help | head`) ends it quietly, as a pipe should
    (Python's documented handling of SIGPIPE: stdout pointed at devnull so the exit flush does not fail again)."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def quick_check(args: list[str]) -> int | None:
    """PASSED or FAILED (the error printed) from a forked child that checks the command line without torch;
    None when it could not decide (or cannot run: torch is imported already, no fork), and the run checks."""
    if "torch" in sys.modules or not hasattr(os, "fork"):
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = None
        try:
            code = _check(args)
        except BaseException:  # noqa: BLE001 -- undecided: the run checks the command line itself
            code = None
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(3 if code is None else code)
    try:
        _, status = os.waitpid(pid, 0)
    except KeyboardInterrupt:  # Ctrl-C reached the child too
        sys.exit(130)
    code = os.waitstatus_to_exitcode(status)
    return code if code in (PASSED, FAILED) else None


def _check(args: list[str]) -> int:
    """In the child: import the suite with stand-ins, then every check of the command line (exit code)."""
    from bench.launch.stubs import NeedsTorch, strict, stubbed

    with stubbed():
        from bench.registry import REGISTRIES, RegistryError

        try:
            for registry in REGISTRIES:  # their modules, imported now rather than in a check
                registry.discover()
        except RegistryError as e:  # two components under one name: nothing can start until one is renamed
            print(f"qrl-bench: error: {e}", file=sys.stderr)
            return FAILED
        from bench.launch.config import checks
        from bench.launch import cli
        from bench.launch.overrides import without_printing_flags, check_overrides

        strict()  # from here, a check that asks torch anything is left to the run

        def values(cfg) -> str | None:
            for check in checks(cfg):
                try:
                    check()
                except NeedsTorch:
                    continue
                except ValueError as e:
                    return str(e)
            return None

        plain = [a for a in without_printing_flags(args) if not a.startswith("-")]  # (not --cfg's `job`)
        error = cli.config_error(args, plain) or check_overrides(args, values)
    if error:
        print(f"qrl-bench: error: {error}", file=sys.stderr)
        return FAILED
    return PASSED


if __name__ == "__main__":
    main()
