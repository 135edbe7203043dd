"""`qrl-analyze SWEEP_DIR... [--wandb ENTITY/PROJECT --group G] [--out DIR]` — a sweep to a report.

`qrl-analyze RESULTS --paper NAME` instead writes one table, a paper's layout with our numbers beside the paper's
(analysis/paper.py), as tables/paper_NAME.{md,csv,tex} under --out, and prints its Markdown.

Progress goes to stderr; stdout carries only the path of report.md, so a script can do
`report=$(qrl-analyze results/smoke)`. Exit status: 0 with a report, 1 when no run was usable (the report
listing what was found is still written), 2 for a usage error (missing directory, W&B unreachable with no
cache, a --baseline or --naive that names no method of the loaded runs).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from .arms import BASELINE, CONTROL, NAIVE, method_sort_key
from .load import Sweep, compared_apart, load_sweeps, log, merge
from .wandb_source import WandbUnavailable, default_cache, load_wandb

FIGURE_FORMATS = {"png", "pdf", "svg", "eps"}


class OneLineParser(argparse.ArgumentParser):
    """A usage error is one line naming the bad option and value, exit 2, as qrl-bench's are (argparse prints the
    whole usage above it); `-h` still shows the usage."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} ({self.prog} -h: usage)\n")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="qrl-analyze",
        description="Turn qrl-bench run directories (and/or a W&B group) into figures, tables and report.md.",
    )
    p.add_argument("sweep_dirs", nargs="*", type=Path, metavar="SWEEP_DIR",
                   help="sweep directories (results/<sweep>/); every run directory below is found")
    p.add_argument("--out", type=Path, default=None,
                   help="output directory (default: <first SWEEP_DIR>/report/, or ./report-<project>-<group>/)")
    p.add_argument("--wandb", metavar="ENTITY/PROJECT", default=None, help="also load runs from this W&B project")
    p.add_argument("--group", default=None, help="W&B run group to load (default: all runs of the project)")
    p.add_argument("--cache", type=Path, default=None,
                   help=f"W&B cache directory (default: {default_cache()})")
    p.add_argument("--offline", action="store_true", help="read the W&B cache only; never contact the API")
    # default None: a value the user gave must name a loaded method (`unknown_method`); a default need not
    p.add_argument("--baseline", default=None,
                   help=f"method the gaps and speed-ups are relative to (default: {BASELINE})")
    p.add_argument("--naive", default=None,
                   help="the uncorrected low-precision method whose gap to the baseline the corrections are measured "
                        f"against, per severity (default: {NAIVE})")
    p.add_argument("--control", default=None,
                   help="the on-policy control (the trainer at the rollout's precision) that splits the naive gap into "
                        f"its sampler and mismatch costs (default: {CONTROL})")
    p.add_argument("--primary", default=None, metavar="ARM[,ARM...]",
                   help="pre-registered arms, each tested > naive (one-sided paired t, final accuracy and AUC, Holm "
                        "over these tests alone) and marked as the primary comparisons")
    p.add_argument("--collapse-k", type=int, default=3,
                   help="a run collapses when its eval accuracy stays below its step-0 value by more than the "
                        "evaluation's binomial noise for this many consecutive evals (default: 3)")
    p.add_argument("--smooth", type=int, default=1,
                   help="centred moving-average window (steps) for per-step curves; 1 = raw (default)")
    p.add_argument("--warmup", type=int, default=1,
                   help="steps excluded from throughput averages as warm-up (default: 1)")
    p.add_argument("--formats", default="png,pdf", help="figure formats, comma-separated (default: png,pdf)")
    p.add_argument("--paper", metavar="NAME", default=None,
                   help="only the table of a paper recipe (conf/experiment/paper/NAME.reference.csv, or a CSV path) "
                        "with our numbers beside the paper's; prints its Markdown")
    return p


def _default_out(args: argparse.Namespace) -> Path:
    if args.sweep_dirs:
        return args.sweep_dirs[0] / "report"
    project = args.wandb.replace("/", "-")
    return Path(f"report-{project}" + (f"-{args.group}" if args.group else ""))


def load_sources(args: argparse.Namespace, out: Path) -> Sweep:
    sweeps = []
    if args.sweep_dirs:
        sweeps.append(load_sweeps(args.sweep_dirs, exclude=[out]))
    if args.wandb:
        sweeps.append(load_wandb(args.wandb, args.group, args.cache or default_cache(), offline=args.offline, log=log))
    return merge(sweeps)


def unknown_method(sweep: Sweep, option: str, value: str | None) -> str | None:
    """The error message when `value` (given as `option`) names no method of the loaded runs, else None.

    A misspelt --baseline or --naive matches no run, and every gap and recovered share would silently read "no
    <method> run" in a report that looks complete. Only a value the user gave is checked: the default names a
    method a sweep may simply not have (a sweep without a naive arm still gets its report)."""
    methods = sorted({r.method for r in sweep.runs}, key=method_sort_key)
    if value is None or not methods or value in methods:
        return None
    return f"{option} {value!r} names no method of the loaded runs; choose from: {', '.join(methods)}"


def untestable_primary(sweep: Sweep, primary: tuple[str, ...], naive: str) -> str | None:
    """The error message when a `--primary` arm can have no test: each is tested > naive at a rollout setting (task,
    model, severity) where both have a final accuracy, so the naive arm itself, or an arm never run beside it (bf16
    runs at its own precision) or whose runs there all ended without an evaluation, would leave a pre-registered
    hypothesis silently untested in a report that names it."""
    cells: dict[str, set] = {}
    for r in sweep.runs:
        if r.final_accuracy is not None:  # the runs the comparisons test (analysis.runs.run_rows)
            cells.setdefault(r.method, set()).add((r.model, r.task, r.severity))
    testable = sorted((m for m in cells if m != naive and cells[m] & cells.get(naive, set())), key=method_sort_key)
    for arm in primary:
        if arm not in testable:
            why = "is the arm each primary one is tested against" if arm == naive else \
                f"has no evaluated run at a rollout setting where {naive!r} has one, so it has no test"
            return (f"--primary {arm!r} {why}; arms with a test against {naive!r}: "
                    f"{', '.join(testable) or 'none'}")
    return None


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    formats = check_options(parser, args)
    out = args.out or _default_out(args)
    if args.paper:
        if args.wandb or not args.sweep_dirs:
            parser.error("--paper reads run directories: give RESULTS directories (no --wandb)")
        return paper_main(args.paper, args.sweep_dirs, out)
    command = "qrl-analyze " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))

    try:
        sweep = load_sources(args, out)
    except (FileNotFoundError, WandbUnavailable, ValueError) as e:
        print(f"qrl-analyze: error: {e}", file=sys.stderr)
        return 2

    primary = tuple(a.strip() for a in (args.primary or "").split(",") if a.strip())
    for option, value in (("--baseline", args.baseline), ("--naive", args.naive), ("--control", args.control),
                          *(("--primary", a) for a in primary)):
        if (error := unknown_method(sweep, option, value)) is not None:
            print(f"qrl-analyze: error: {error}", file=sys.stderr)
            return 2
    args.baseline, args.naive, args.control = args.baseline or BASELINE, args.naive or NAIVE, args.control or CONTROL
    if (error := untestable_primary(sweep, primary, args.naive)) is not None:
        print(f"qrl-analyze: error: {error}", file=sys.stderr)
        return 2

    log(f"{len(sweep.runs)} run(s) used, {len(sweep.skipped)} left out")
    for s in sweep.skipped:
        log(f"  left out {s.path}: {s.reason}")
    for r in sweep.runs:
        for w in r.warnings:
            log(f"  warning {r.run_id}: {w}")
    for line in compared_apart(sweep):
        log(f"  warning: runs compared with each other differ in {line}")
    report = write_analysis(sweep, args, out, formats, primary, command)
    log(f"report: {report}")
    print(report)
    return 0 if sweep.runs else 1


def check_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """A usage error (exit 2) for options that cannot go together or out of range; returns the figure formats,
    PNG first (the report embeds PNGs)."""
    if not args.sweep_dirs and not args.wandb:
        parser.error("give at least one SWEEP_DIR or --wandb ENTITY/PROJECT")
    if (args.group or args.offline) and not args.wandb:
        parser.error("--group/--offline need --wandb ENTITY/PROJECT")
    bounds = (("--smooth", args.smooth, 1), ("--collapse-k", args.collapse_k, 1), ("--warmup", args.warmup, 0))
    for flag, value, least in bounds:
        if value < least:
            parser.error(f"{flag} {value}: must be >= {least}")
    formats = [f.strip().lower() for f in args.formats.split(",") if f.strip()]
    if not set(formats) <= FIGURE_FORMATS:
        parser.error(f"--formats {args.formats!r}: choose from {', '.join(sorted(FIGURE_FORMATS))}")
    if "png" not in formats:
        formats.insert(0, "png")  # the report embeds PNGs
    return formats


def write_analysis(sweep: Sweep, args: argparse.Namespace, out: Path, formats: list[str], primary: tuple[str, ...],
                   command: str) -> Path:
    """The tables, figures and report of a loaded sweep under `out`; returns the report's path."""
    # Imported here: matplotlib is the slow import, and `--help` or a usage error should not pay for it.
    from .plots import make_figures
    from .report import write_report
    from .runs import SeverityOptions, has_severity_axis
    from .severity import severity_figures, severity_table
    from .benchmarks import benchmark_table
    from .ranges import ranges_table
    from .tables import accuracy_table, paired_table, results_table, throughput_table, write_table

    from .aggregate import aggregate_table
    from .decomposition import decomposition_table, plot_decomposition

    sev = SeverityOptions(naive=args.naive, baseline=args.baseline, collapse_k=args.collapse_k, control=args.control,
                          primary=primary)
    # the report's tables, in the order it shows them; a severity ladder's table leads, the decomposition before it
    built = [results_table(sweep, args.baseline, args.naive), accuracy_table(sweep, args.baseline), paired_table(sweep, sev),
             aggregate_table(sweep, sev), benchmark_table(sweep), throughput_table(sweep, args.baseline, args.warmup),
             ranges_table(sweep)]
    if has_severity_axis(sweep):
        built.insert(0, severity_table(sweep, sev))
        built.insert(0, decomposition_table(sweep, sev))
    tables = [(t, write_table(t, out / "tables")) for t in built]
    sweep.index.to_csv(out / "tables" / "runs.csv", index=False)
    # in report order, each logged as it is written
    figures = []
    if has_severity_axis(sweep):
        if (fig := plot_decomposition(sweep, out / "figures", sev, formats)) is not None:
            figures.append(fig)
            log(f"figure {fig.name}")
        figures += severity_figures(sweep, out / "figures", sev, formats, log=log)
    if sweep.runs:
        figures += make_figures(sweep, out / "figures", smooth=args.smooth, baseline=args.baseline,
                                warmup=args.warmup, formats=formats, log=log)
    settings = {"baseline": args.baseline, "naive": args.naive, "collapse_k": args.collapse_k, "smooth": args.smooth,
                "warmup": args.warmup, "control": args.control, **({"primary": ",".join(primary)} if primary else {})}
    return write_report(sweep, out, tables, figures, command, baseline=args.baseline, settings=settings, opts=sev)


def paper_main(name: str, roots: list[Path], out: Path) -> int:
    """The paper table: written under out/tables/, its Markdown on stdout. 1 when no run matched any row (a run
    matches only the paper's own task and model, analysis.paper.matches), saying which task and model it wanted."""
    from .paper import load_runs, paper_table
    from .tables import render, write_table

    try:
        runs = load_runs(roots, exclude=[out])
        table = paper_table(name, runs)
    except (FileNotFoundError, ValueError) as e:
        print(f"qrl-analyze: error: {e}", file=sys.stderr)
        return 2
    paths = write_table(table, out / "tables")
    log(f"{len(runs)} finished run(s) read; wrote " + ", ".join(str(p) for p in paths.values()))
    print(render(table.display, "md", caption=table.caption), end="")
    if not table.data.empty and (table.data["n_runs"] > 0).any():
        return 0
    wanted = sorted({f"{t} / {m}" for t, m in zip(table.data["task"], table.data["model"])})
    read = sorted({f"{r.task_name} / {r.model}" for r in runs})
    log(f"nothing to compare: no run matched any row of {name} (its rows are for {', '.join(wanted) or 'no task'}; "
        f"the runs read are of {', '.join(read) or 'nothing'})")
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
