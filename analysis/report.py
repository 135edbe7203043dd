"""report.md: one page per sweep that opens with its answer — a verdict from the numbers, the headline figure, the
tables, the other figures — and appendix.md beside it with the provenance and configuration to trust them.

A table without its config, seeds, code version and the list of runs that were left out cannot be checked
(lm-eval-harness attaches config, git hash and versions to every result for this reason). The report
states: where the runs came from, which commits and package versions produced them, the settings that are
common to the sweep and those that vary, the seeds, every run used and every run left out with its reason.
It embeds the figures (PNG, with a link to the PDF) and the Markdown tables (with links to CSV and LaTeX).

The output is deterministic for a given set of runs (no generation timestamp), so a committed reference
report only changes when the results do.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from .arms import BASELINE, arm_labels, sorted_arms
from .lockfile import LOCK_FILE, drift, lock_sha256, read_lock
from .load import Sweep, compared_apart, flatten, get
from .plots import FigureFile
from .runs import SeverityOptions
from .tables import Table, accuracy_summary, render
from .verdict import verdict

# Flattened config keys that identify a run rather than configure it (shown elsewhere in the report).
IDENTITY_KEYS = {"seed", "method.name", "task.name", "model.name", "sweep"}
#: The sections whose first figure leads the report: the naive gap split by the on-policy control (`decomposition`)
#: where one ran; else every cell on one T·KL axis (`tkl`, a "recovered" figure), first in severity_figures' list when
#: there is one; else the first accuracy-against-mismatch figure.
HEADLINE_SECTIONS = ("decomposition", "severity", "recovered")
# Keys whose value is a machine-local path or output location: noise in a comparison of settings.
LOCAL_KEYS = ("out_root", "model.cache_dir", "hydra.")
SECTIONS = [
    ("decomposition", "The naive gap split by the on-policy control"),
    ("severity", "Accuracy against mismatch across severities"),
    ("recovered", "Recovered share of the naive gap against T·KL"),
    ("curves", "Learning curves"),
    ("mismatch", "Rollout–training mismatch"),
    ("diagnostics", "Method diagnostics"),
    ("throughput", "Throughput"),
    ("quant", "Weight update vs quantization error (QuRL Eq. 13–14)"),
]


def _rel(path: Path, base: Path) -> str:
    try:
        return path.resolve().relative_to(base.resolve()).as_posix()
    except ValueError:
        return str(path)


def _fmt_value(v: Any) -> str:
    s = json.dumps(v, default=str) if not isinstance(v, str) else v
    return s if len(s) <= 60 else s[:57] + "..."


def _md(df: pd.DataFrame) -> str:
    return render(df.fillna("").astype(str), "md") if not df.empty else "_(none)_\n"


def config_sections(sweep: Sweep) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(per-arm settings that differ between arms, other varying settings, settings common to all runs)."""
    flat = {r.run_id: {k: v for k, v in flatten(r.config).items()
                       if k not in IDENTITY_KEYS and not k.startswith(LOCAL_KEYS)} for r in sweep.runs}
    keys = sorted({k for f in flat.values() for k in f})
    varying, common = [], []
    for k in keys:
        values = {json.dumps(f.get(k), sort_keys=True, default=str) for f in flat.values()}
        (varying if len(values) > 1 else common).append(k)
    arm_keys = [k for k in varying if k.startswith(("method.", "rollout."))]
    other_keys = [k for k in varying if k not in arm_keys]

    arms = sorted_arms(r.arm for r in sweep.runs)
    labels = arm_labels(arms)
    arm_rows = []
    for arm in arms:
        row: dict[str, Any] = {"arm": labels[arm]}
        runs = [r for r in sweep.runs if r.arm == arm]
        for k in arm_keys:
            vals = sorted({_fmt_value(flat[r.run_id].get(k)) for r in runs})
            row[k] = " / ".join(vals)
        arm_rows.append(row)
    other_rows = []
    for k in other_keys:
        vals = Counter(_fmt_value(f.get(k)) for f in flat.values())
        other_rows.append({"key": k, "values (runs)": ", ".join(f"{v} ({n})" for v, n in sorted(vals.items()))})
    any_flat = next(iter(flat.values()), {})
    common_rows = [{"key": k, "value": _fmt_value(any_flat.get(k))} for k in common]
    return pd.DataFrame(arm_rows), pd.DataFrame(other_rows), pd.DataFrame(common_rows)


def _cpu(runtime: Any) -> str:
    """'AMD EPYC [avx2 avx512f ...] · cpu (AVX512)': the CPU and the ISA torch's kernels used (run.json runtime)."""
    if not isinstance(runtime, dict):
        return "not recorded"
    if runtime.get("device") == "cuda":
        return str(runtime.get("device_name"))
    return " · ".join(str(runtime[k]) for k in ("cpu_model", "device_name") if runtime.get(k)) or "not recorded"


def provenance(sweep: Sweep, lock_file: Path = LOCK_FILE) -> dict[str, Any]:
    """Commits, dirty flags, package versions, hosts and CPUs of the runs used (as counts, so a mix stands out),
    and the runs whose versions differ from requirements.lock (analysis.lockfile)."""
    shas = Counter(str(r.info.get("git_sha")) for r in sweep.runs)
    dirty = sum(bool(r.info.get("git_dirty")) for r in sweep.runs)
    versions: dict[str, Counter] = {}
    for r in sweep.runs:
        for pkg, ver in (r.info.get("versions") or {}).items():
            versions.setdefault(pkg, Counter())[str(ver)] += 1
    hosts = Counter(str(r.info.get("host")) for r in sweep.runs)
    cpus = Counter(_cpu(r.info.get("runtime")) for r in sweep.runs)
    pins = read_lock(lock_file)
    started = sorted(str(r.info["started_at"]) for r in sweep.runs if r.info.get("started_at"))
    finished = sorted(str(r.info["finished_at"]) for r in sweep.runs if r.info.get("finished_at"))
    return {
        "git_sha": dict(shas),
        "git_dirty_runs": dirty,
        "versions": {k: dict(v) for k, v in sorted(versions.items())},
        "hosts": dict(hosts),
        "cpus": dict(cpus),
        "lock": {"file": lock_file.name, "sha256": lock_sha256(lock_file)},
        "off_lock": drift(sweep.runs, pins) if pins else {},
        "started": (started[0], started[-1]) if started else None,
        "finished": (finished[0], finished[-1]) if finished else None,
        "sweep_names": sorted({str(r.config.get("sweep")) for r in sweep.runs if r.config.get("sweep") is not None}),
    }


def _counts(items: Iterable[Any]) -> str:
    c = Counter(items)
    return ", ".join(f"`{k}` ({n})" if n > 1 else f"`{k}`" for k, n in c.most_common())


def write_report(
    sweep: Sweep,
    out_dir: Path,
    tables: list[tuple[Table, dict[str, Path]]],
    figures: list[FigureFile],
    command: str,
    baseline: str = BASELINE,
    settings: dict[str, Any] | None = None,
    opts: SeverityOptions | None = None,
) -> Path:
    """Write out_dir/report.md, its appendix (appendix.md: provenance, configuration, every run) and results.json
    (the same facts for machines); returns the report path.

    The report opens with its answer: the verdict (analysis.verdict), the headline figure (accuracy against
    mismatch when the sweep spans severities, else the first learning curves), then the tables, the other
    figures, a short summary and the runs left out."""
    out_dir.mkdir(parents=True, exist_ok=True)
    opts = opts or SeverityOptions(baseline=baseline)
    prov = provenance(sweep)
    name = ", ".join(prov["sweep_names"]) or ", ".join(Path(s).name for s in sweep.sources) or "sweep"
    headline = next((f for f in figures if f.section in HEADLINE_SECTIONS), None) or \
        next((f for f in figures if f.section == "curves"), None)
    L = _opening_lines(sweep, name, headline, out_dir, opts)
    L += _table_lines(tables, out_dir, baseline)
    L += _figure_section_lines(sweep, figures, headline, out_dir)
    L += _closing_lines(sweep, prov, command, settings)
    path = out_dir / "report.md"
    path.write_text("\n".join(L).rstrip() + "\n")
    write_appendix(sweep, out_dir, prov, name)
    _write_results_json(sweep, out_dir, prov, command, baseline)
    return path


def _opening_lines(sweep: Sweep, name: str, headline: FigureFile | None, out_dir: Path,
                   opts: SeverityOptions) -> list[str]:
    """The report's title, its verdict and its headline figure."""
    L: list[str] = [f"# qrl-bench report — {name}", ""]
    if sweep.runs:
        L += [" ".join(verdict(sweep, opts)), ""]
    else:
        L += ["**No usable runs**: nothing to tabulate or plot. The runs found are listed below.", ""]
    if headline is not None:  # under its own title: its section's heading, further down, is over the others
        L += [f"## {headline.title}", ""] + _figure_lines(headline, out_dir)
    return L


def _table_lines(tables: list[tuple[Table, dict[str, Path]]], out_dir: Path, baseline: str) -> list[str]:
    """Every table with rows, under its title, with its caption and the links to its files."""
    table_titles = {
        "decomposition": "The naive gap: sampler-and-capacity cost and mismatch cost (on-policy control)",
        "severity": f"Severity ladder: gap to {baseline} and the recovered share of the naive gap",
        "paired": "Paired comparisons: intervals, raw and Holm-adjusted p",
        "aggregates": "Probability of improvement and IQM (rliable)",
        "results": "Results",
        "accuracy": f"Final eval accuracy per arm and task (gap to {baseline})",
        "benchmarks": "Benchmarks (eval sets: accuracy, avg@k, pass@k)",
        "throughput": "Throughput per task, arm, precision, engine and device",
        "mismatch_ranges": "Healthy ranges of the mismatch metrics (step 0 and end, per precision)",
    }
    L: list[str] = []
    for table, paths in tables:
        if table.display.empty:
            continue
        L += [f"## {table_titles.get(table.name, table.name)}", ""]
        L += [render(table.display, "md", bold=table.bold)]
        L += [f"*{table.caption}*", ""]
        L += ["Files: " + " · ".join(f"[{fmt.upper()}]({_rel(p, out_dir)})" for fmt, p in paths.items()), ""]
    return L


def _figure_section_lines(sweep: Sweep, figures: list[FigureFile], headline: FigureFile | None,
                          out_dir: Path) -> list[str]:
    """The figures other than the headline, by section."""
    L: list[str] = []
    for section, title in SECTIONS:
        figs = [f for f in figures if f.section == section and f is not headline]
        if not figs:
            continue
        L += [f"## {title}", ""]
        for f in figs:
            L += _figure_lines(f, out_dir)
    if sweep.runs and not any(f.section == "quant" for f in figures):
        L += ["_No run logged quant/weight_update/* or quant/quant_error/*: no weight-update figure._", ""]
    return L


def _closing_lines(sweep: Sweep, prov: dict[str, Any], command: str, settings: dict[str, Any] | None) -> list[str]:
    """The summary (the command, the sweep in numbers) and the runs left out, with why."""
    L = ["## Summary", ""]
    L.append(f"Generated by `{command}`. Provenance, the configuration and every run used: [appendix](appendix.md).")
    L.append("")
    L += summary_lines(sweep, prov, settings)
    L.append("")

    L += ["## Runs left out", ""]
    if sweep.skipped:
        sk = pd.DataFrame([{"run directory": s.name, "status": s.status or "", "reason": s.reason} for s in sweep.skipped])
        L += [_md(sk)]
    else:
        L += ["None: every run directory found was complete and readable.", ""]
    return L


def _figure_lines(f: FigureFile, out_dir: Path) -> list[str]:
    png = f.paths.get("png")
    lines = [f"![{f.title}]({_rel(png, out_dir)})", ""] if png is not None else []
    links = " · ".join(f"[{fmt.upper()}]({_rel(p, out_dir)})" for fmt, p in f.paths.items())
    return lines + [f"*{f.caption}* ({links})", ""]


def summary_lines(sweep: Sweep, prov: dict[str, Any], settings: dict[str, Any] | None) -> list[str]:
    """Where the runs came from and what they are, and every warning a reader must see, as bullets."""
    arms = sorted_arms(r.arm for r in sweep.runs)
    labels = arm_labels(arms)
    L = ["- **Sources**: " + "; ".join(f"`{s}`" for s in sweep.sources)]
    L.append(f"- **Runs used**: {len(sweep.runs)} — left out: {len(sweep.skipped)}"
             + (" (see [Runs left out](#runs-left-out))" if sweep.skipped else ""))
    if sweep.runs:
        L.append("- **Arms** (method → rollout precision): "
                 + ", ".join(f"`{labels[a]}` → {a[1]}" for a in arms))
        L.append(f"- **Tasks**: {', '.join(f'`{t}`' for t in sweep.tasks)}; **models**: {', '.join(f'`{m}`' for m in sweep.models)}")
        L.append(f"- **Seeds**: {', '.join(str(s) for s in sweep.seeds)}")
        steps = Counter(str(get(r.config, "train.steps", "?")) for r in sweep.runs)
        L.append(f"- **Training steps** (train.steps): {_counts(steps)}")
        statuses = Counter(r.status for r in sweep.runs)
        L.append(f"- **Status of runs used**: {_counts(statuses.elements())}")
        L.append(f"- **Git commit**: {_counts(Counter(prov['git_sha']).elements())}"
                 + (f" — **{prov['git_dirty_runs']} run(s) from a dirty working tree**" if prov["git_dirty_runs"] else ""))
        if prov["off_lock"]:
            pkgs = sorted({f"{p} {v[0]} (lock {v[1]})" for d in prov["off_lock"].values() for p, v in d.items()})
            L.append(f"- **Warning**: {len(prov['off_lock'])} run(s) recorded package versions that differ from "
                     f"`{prov['lock']['file']}`: {', '.join(pkgs)}; their numbers may differ for that reason alone.")
        if len(prov["cpus"]) > 1:
            L.append("- **Warning**: the runs computed on more than one CPU / instruction set (appendix, Provenance); "
                     "float kernels differ between them (docs/reproducibility.md).")
        if len(prov["git_sha"]) > 1:
            L.append("- **Warning**: the runs come from more than one commit; differences between arms may "
                     "include code changes.")
        diverged = [r for r in sweep.runs if r.status == "diverged"]
        if diverged:
            L.append("- **Diverged runs** (kept; their last eval counts as final): "
                     + ", ".join(f"`{r.run_id}` ({r.reason or 'no reason given'})" for r in diverged))
        apart = compared_apart(sweep)
        if apart:
            L.append("- **Warning**: runs compared with each other differ in settings other than their arm's own "
                     f"(method, rollout) and the seed; their gaps include these differences: {'; '.join(apart)}.")
        warned = sum(len(r.warnings) for r in sweep.runs)
        if warned:
            L.append(f"- **Warnings on runs used**: {warned} (listed in the appendix)")
    if settings:
        L.append("- **Analysis settings**: " + ", ".join(f"{k}={v}" for k, v in settings.items()))
    return L


def write_appendix(sweep: Sweep, out_dir: Path, prov: dict[str, Any], name: str) -> Path:
    """appendix.md: provenance (commits, versions, hosts, CPUs), the configuration (what differs between arms,
    what varies, what is common) and every run used, with its warnings."""
    L: list[str] = [f"# qrl-bench report — {name}: appendix", "", "Back to the [report](report.md).", ""]
    if sweep.runs:
        L += ["## Provenance", ""]
        rows = [{"what": "git sha", "value": ", ".join(f"{k} ({v})" for k, v in prov["git_sha"].items())},
                {"what": "runs from a dirty tree", "value": str(prov["git_dirty_runs"])}]
        rows += [{"what": pkg, "value": ", ".join(f"{v} ({n})" for v, n in vals.items())} for pkg, vals in prov["versions"].items()]
        rows.append({"what": "hosts", "value": ", ".join(f"{k} ({v})" for k, v in prov["hosts"].items())})
        rows.append({"what": "CPU · kernel ISA", "value": ", ".join(f"{k} ({v})" for k, v in prov["cpus"].items())})
        lock = prov["lock"]
        rows.append({"what": "lock file", "value": f"{lock['file']} sha256 {lock['sha256']}: "
                     + (f"{len(prov['off_lock'])} run(s) off the lock" if prov["off_lock"] else "every run's versions match")
                     if lock["sha256"] else "none found"})
        if prov["started"]:
            rows.append({"what": "started", "value": f"{prov['started'][0]} … {prov['started'][1]}"})
        if prov["finished"]:
            rows.append({"what": "finished", "value": f"{prov['finished'][0]} … {prov['finished'][1]}"})
        L += [_md(pd.DataFrame(rows)), "(counts of runs in parentheses)", ""]

        arm_cfg, other_cfg, common_cfg = config_sections(sweep)
        L += ["## Configuration", ""]
        L += ["Settings that differ between arms (method.* / rollout.*):", "", _md(arm_cfg)]
        if not other_cfg.empty:
            L += ["Other settings that vary across runs:", "", _md(other_cfg)]
        L += [f"Settings common to all runs used ({len(common_cfg)} keys):", "", _md(common_cfg)]

        L += ["## Runs used", "", f"{len(sweep.runs)} runs (also in tables/runs.csv):", ""]
        idx = sweep.index[["run_id", "status", "steps", "final_eval_step", "final_eval_accuracy", "git_sha"]].copy()
        idx["git_sha"] = idx["git_sha"].astype(str).str[:10]
        idx["final_eval_accuracy"] = idx["final_eval_accuracy"].map(lambda x: "" if pd.isna(x) else f"{100 * x:.1f}")
        L += [_md(idx)]
        warned = [(r.run_id, w) for r in sweep.runs for w in r.warnings]
        if warned:
            L += ["Warnings on runs used:", ""]
            L += [f"- `{rid}`: {w}" for rid, w in warned]
            L.append("")
    path = out_dir / "appendix.md"
    path.write_text("\n".join(L).rstrip() + "\n")
    return path


def _write_results_json(sweep: Sweep, out_dir: Path, prov: dict[str, Any], command: str, baseline: str) -> None:
    """The report's facts for machines (lm-eval's results JSON idea): provenance + per-cell accuracy."""
    acc = accuracy_summary(sweep, baseline)
    doc = {
        "command": command,
        "sources": sweep.sources,
        "provenance": prov,
        "n_runs": len(sweep.runs),
        "skipped": [{"run": s.name, "status": s.status, "reason": s.reason} for s in sweep.skipped],
        "accuracy": json.loads(acc.to_json(orient="records")),
    }
    (out_dir / "results.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
