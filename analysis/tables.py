"""Tables: final accuracy per arm x task, throughput per arm and precision, a paper-style results table, and the
table of every paired comparison (its numbers: analysis/comparisons.py).

Every table is a `Table` with two faces built from the same numbers: `data` (tidy, numeric, full precision)
goes to CSV for anyone who wants to recompute or re-plot, and `display` (formatted strings) goes through
one function, `render`, to both Markdown and LaTeX, so the two can never disagree (lm-eval-harness's
`make_table` pattern, without its pytablewriter dependency).

Accuracies are shown in percent; "Δ vs bf16" is in percentage points, against the baseline arm on the same
task and model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from .arms import BASELINE, NAIVE, arm_labels, arm_sort_key, bitwidth, is_emulated, rollout_label, sorted_arms
from .comparisons import differs, family_name, is_primary, p_columns, paired_comparisons
from .inference import ALPHA, fmt_p
from .load import Run, Sweep, get
from .runs import SeverityOptions, baseline_group, eval_curve, n_test, sampler_accuracy0, severity_labels
from .stats import METHOD_SENTENCE, diff_interval, gap_binomial_se, method_mark, summarize

MISSING = "–"
TIME_PARTS = ["rollout_s", "sync_s", "recompute_s", "train_s"]


@dataclass
class Table:
    """A table's numbers (`data`, for CSV) and their formatted face (`display`, for Markdown and LaTeX)."""

    name: str
    data: pd.DataFrame
    display: pd.DataFrame
    caption: str
    bold: pd.DataFrame | None = None  # same shape as display; True = emphasise (best of a column)
    wide: tuple[str, ...] = ()  # data columns named <task>_<metric> (a column per task, or per benchmark)
    wide_column: str = "task"  # what `wide` names: the long CSV's column for it


# --------------------------------------------------------------------------------------------- long CSV
#: interval parts of a metric X in a table's data: X_lo, X_hi, X_n, X_ci -> columns of X's long row
INTERVAL_PARTS = {"_lo": "lo", "_hi": "hi", "_n": "n", "_ci": "interval"}
#: the long CSV's columns after a table's identity columns
LONG_COLUMNS = ["metric", "value", "lo", "hi", "n", "interval"]
#: the task of a results-table average over tasks
ALL_TASKS = "mean over tasks"


def long_format(data: pd.DataFrame, wide: Sequence[str] = (), wide_column: str = "task") -> pd.DataFrame:
    """One row per arm x task x metric: the identity columns (every non-numeric column: model, task, method,
    precision, labels and notes), then metric, value and, where the table has them, the 95 % interval (lo, hi),
    its n and its method; values rounded to what they mean (`round_value`). A table laid out with a column per
    task or benchmark (`wide`: <task>_mean, ...) gets it back as a column (`wide_column`). Where the table has a
    `metric` of its own (a benchmark's avg@k), the long one is called `statistic`."""
    if data.empty:
        return pd.DataFrame(columns=LONG_COLUMNS)
    numeric = [c for c in data.columns if pd.api.types.is_numeric_dtype(data[c]) and not pd.api.types.is_bool_dtype(data[c])]
    parts = {c for c in data.columns for suffix in INTERVAL_PARTS if c.endswith(suffix) and c[: -len(suffix)] in data}
    ids = [c for c in data.columns if c not in numeric and c not in parts]
    metrics = [c for c in numeric if c not in parts]
    label = "statistic" if "metric" in ids else "metric"
    rows = []
    for rec in data.to_dict("records"):
        for m in metrics:
            row = {k: rec[k] for k in ids}
            where, metric = _split_task(m, wide)
            if where is not None:
                row[wide_column] = where
            row |= {label: metric, "value": round_value(metric, rec[m])}
            for suffix, col in INTERVAL_PARTS.items():
                if m + suffix in parts:
                    v = rec[m + suffix]
                    row[col] = v if col == "interval" else round_value(metric if col != "n" else "n", v)
            rows.append(row)
    out = pd.DataFrame(rows, dtype=object)  # object: a count stays "3", not "3.0"
    front = [c for c in ids if c in out] + ([wide_column] if wide_column in out and wide_column not in ids else [])
    out = out[front + [label] + [c for c in LONG_COLUMNS[1:] if c in out]]
    return out.dropna(subset=["value"]).reset_index(drop=True)


def _split_task(column: str, tasks: Sequence[str]) -> tuple[str | None, str]:
    if not tasks:
        return None, column
    for t in sorted(tasks, key=len, reverse=True):
        if column.startswith(f"{t}_"):
            return t, column[len(t) + 1:]
    return ALL_TASKS, column


def round_value(metric: str, value: Any) -> Any:
    """A value rounded to what it means: accuracies, AUCs and gaps in % or pp to 0.1 (one test problem in a few
    hundred is 0.2-0.5 pp; a paper table's cells to 0.01, as papers print them), standard errors, shares and
    speed-ups to 0.01, seconds to 0.001, tokens/s to
    1, counts to integers, KL and other small magnitudes to 3 significant digits."""
    if value is None or isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        return value
    x = float(value)
    if not np.isfinite(x):
        return np.nan
    name = metric.lower()
    if name == "n" or name.startswith("n_") or name.endswith("_n"):
        return int(round(x))
    if "tokens_per_s" in name:
        return round(x)
    if name.endswith("_se") or "speedup" in name or "recovered" in name or name.startswith(("ours", "paper", "delta")):
        return round(x, 2)  # a paper's table gives two decimals; ours beside it the same
    if name.endswith("_s"):
        return round(x, 3)
    if any(k in name for k in ("acc", "auc", "gap", "mean", "std", "avg", "accuracy", "delta", "ours", "paper")):
        return round(x, 1)
    return float(f"{x:.3g}")


# --------------------------------------------------------------------------------------------- rendering
_LATEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "±": r"$\pm$",
    "Δ": r"$\Delta$",
    "–": "--",
    "−": "$-$",
    "×": r"$\times$",
    "μ": r"$\mu$",
    "π": r"$\pi$",
    "†": r"$^\dagger$",
    "‖": r"$\|$",
    "≥": r"$\geq$",
    "≤": r"$\leq$",
    "·": r"$\cdot$",
    "→": r"$\rightarrow$",
    "…": r"\ldots{}",
    "—": "---",
    "≈": r"$\approx$",
    "ρ": r"$\rho$",
    "θ": r"$\theta$",
    "χ": r"$\chi$",
    "²": r"$^2$",
    "’": "'",
}
# A number, optionally "± std", a unit (×, %, s) and a parenthesised note ("3 (1 div.)"); "–" and "" count too.
_NUMERIC = re.compile(r"^\s*(?:[+\-−]?\d+(?:\.\d+)?(?:\s*±\s*\d+(?:\.\d+)?)?\s*(?:×|%|s)?(?:\s*\(.*\))?|–|)\s*$")


#: What an exported .tex table needs, stated in its header: booktabs' rules and graphicx's \\resizebox. On TeX Live,
#: booktabs.sty is in texlive-latex-recommended (texlive-latex-base lacks it), graphicx in texlive-latex-base.
LATEX_NEEDS = ("% requires \\usepackage{booktabs} (\\toprule, \\midrule, \\bottomrule) and \\usepackage{graphicx} "
               "(\\resizebox)",
               "% TeX Live: texlive-latex-recommended (booktabs; texlive-latex-base lacks it) and texlive-latex-base")
#: Rows per float: a table of more rows continues in further floats ("Table n, continued"), each scaled to the line
#: width as any table: a float taller than the page is placed nowhere ("Float too large for page"; a 56-row
#: mismatch-ranges table did that), and a longtable cannot be scaled to the line width
LONG_ROWS = 35
#: Every table fits its page: a tabular wider than the line is scaled down to it, a narrower one keeps its size
#: (graphicx's \\width is the tabular's natural width; the closing brace follows \\end{tabular}).
FIT_WIDTH = "\\resizebox{\\ifdim\\width>\\linewidth\\linewidth\\else\\width\\fi}{!}{%\n"


def latex_escape(text: str) -> str:
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in str(text))


def _alignment(df: pd.DataFrame) -> list[str]:
    """Right-align columns whose every cell looks like a number (so digits line up), left-align the rest."""
    return ["r" if all(_NUMERIC.match(str(v)) for v in df[c]) else "l" for c in df.columns]


def render(
    df: pd.DataFrame,
    fmt: str,
    caption: str = "",
    label: str | None = None,
    bold: pd.DataFrame | None = None,
) -> str:
    """Render a DataFrame of display strings as Markdown ("md") or LaTeX ("tex": booktabs, scaled down to the line
    width when wider, its header saying which packages it needs: LATEX_NEEDS, FIT_WIDTH; LONG_ROWS rows a float).

    The single entry point for both formats: cells, order and emphasis come from the same frame.
    """
    if fmt not in ("md", "tex"):
        raise ValueError(f"fmt={fmt!r}: choose 'md' or 'tex'")
    align = _alignment(df)
    cells = [[str(v) for v in row] for row in df.itertuples(index=False)]
    emph = bold.to_numpy(dtype=bool) if bold is not None else np.zeros((len(cells), len(df.columns)), dtype=bool)

    if fmt == "md":
        def cell(s: str, strong: bool) -> str:
            s = s.replace("|", r"\|")
            return f"**{s}**" if strong and s else s

        lines = []
        if caption:
            lines += [f"*{caption}*", ""]
        lines.append("| " + " | ".join(cell(str(c), False) for c in df.columns) + " |")
        lines.append("|" + "|".join("---:" if a == "r" else ":---" for a in align) + "|")
        for i, row in enumerate(cells):
            lines.append("| " + " | ".join(cell(s, emph[i, j]) for j, s in enumerate(row)) + " |")
        return "\n".join(lines) + "\n"

    def tcell(s: str, strong: bool) -> str:
        s = latex_escape(s)
        return f"\\textbf{{{s}}}" if strong and s else s

    header = " & ".join(tcell(str(c), False) for c in df.columns) + r" \\"
    body = [" & ".join(tcell(s, emph[i, j]) for j, s in enumerate(row)) + r" \\" for i, row in enumerate(cells)]
    lines = list(LATEX_NEEDS)
    for start in range(0, max(1, len(body)), LONG_ROWS):  # a float no taller than a page: more rows, more floats
        lines += ["\\begin{table}[t]" if start == 0 else "\\begin{table}[p]", "\\centering"]
        if start == 0 and caption:
            lines.append(f"\\caption{{{latex_escape(caption)}}}")
        if start == 0 and label:
            lines.append(f"\\label{{{label}}}")
        if start > 0:
            lines.append("\\textit{" + (f"Table~\\ref{{{label}}}" if label else "The table") + ", continued}\\par\\medskip")
        lines += [FIT_WIDTH + f"\\begin{{tabular}}{{{''.join(align)}}}", "\\toprule", header, "\\midrule",
                  *body[start:start + LONG_ROWS], "\\bottomrule", "\\end{tabular}}", "\\end{table}"]
    return "\n".join(lines) + "\n"


def write_table(table: Table, out_dir: Path) -> dict[str, Path]:
    """<name>.csv (the numbers, long format: `long_format`), <name>.md and <name>.tex (the display face, same cells;
    not for a table without rows)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"csv": out_dir / f"{table.name}.csv", "md": out_dir / f"{table.name}.md", "tex": out_dir / f"{table.name}.tex"}
    long_format(table.data, table.wide, table.wide_column).to_csv(paths["csv"], index=False)
    if table.display.empty:  # no rows (a sweep without eval sets): no Markdown or LaTeX table of nothing
        for fmt in ("md", "tex"):
            paths.pop(fmt).unlink(missing_ok=True)
        return paths
    paths["md"].write_text(render(table.display, "md", caption=table.caption, bold=table.bold))
    paths["tex"].write_text(render(table.display, "tex", caption=table.caption, label=f"tab:{table.name}", bold=table.bold))
    return paths


# --------------------------------------------------------------------------------------------- formatting
def fmt_num(x: float, digits: int = 1, signed: bool = False) -> str:
    if x is None or not np.isfinite(x):
        return MISSING
    return f"{x:+.{digits}f}" if signed else f"{x:.{digits}f}"


def fmt_pm(mean: float, std: float, digits: int = 1) -> str:
    """'mean ± std'; just the mean when std is undefined (one seed), '–' when there is no value."""
    if mean is None or not np.isfinite(mean):
        return MISSING
    if std is None or not np.isfinite(std):
        return fmt_num(mean, digits)
    return f"{fmt_num(mean, digits)} ± {fmt_num(std, digits)}"


def fmt_ci(value: float, lo: float, hi: float, digits: int = 1, signed: bool = False, scale: float = 1.0,
           n: Any = None, note: str = "", method: Any = "") -> str:
    """'v [lo, hi] n=k' (n: seeds or seed pairs); 'v (1 seed)' where one seed gives no interval, 'v (no interval,
    n=k)' where k >= 2 give none (differences with no spread, an unbounded ratio: `note` says which); '–' no value.
    A gap between arms that share no seed (`method` "Welch", analysis.stats.gap) says so: 'v [lo, hi] n=k, Welch'
    (n the smaller arm), where the same text would otherwise read as paired.

    A number that rounds to 0 keeps its sign ("-0.0" for -0.04), as the CSV's and the verdict's numbers do: an
    interval [-0.04, 4.9] printed "[+0.0, +4.9]" would read as excluding 0."""
    if value is None or not np.isfinite(value):
        return MISSING
    mark = method_mark(method)

    def f(x: float) -> str:
        v = round(scale * x, digits)
        v = v if v != 0 else (-0.0 if scale * x < 0 else 0.0)  # an exact 0 (or -0.0) prints "0.0", a tiny -x "-0.0"
        return f"{v:+.{digits}f}" if signed else f"{v:.{digits}f}"

    n_ok = n is not None and np.isfinite(n)
    if lo is not None and hi is not None and np.isfinite(lo) and np.isfinite(hi):
        return f(value) + f" [{f(lo)}, {f(hi)}]" + (f" n={int(n)}" if n_ok else "") + mark
    if n_ok and int(n) >= 2:
        return f(value) + f" ({note or 'no interval'}, n={int(n)}{mark})"
    return f(value) + (f" (1 seed{mark})" if n_ok and int(n) == 1 else mark)


def fmt_share(value: float, lo: float, hi: float, n: Any, note: str) -> str:
    """A recovered share in %: '50 % [33, 71] n=3', '24 % (interval unbounded, n=3)', or 'n/a (why)' where it is not
    defined (`note`), '–' where nothing says why."""
    if value is None or not np.isfinite(value):
        return f"n/a ({note})" if note else MISSING
    text = fmt_ci(value, lo, hi, digits=0, scale=100, n=n, note=note)
    return text.replace(" ", " % ", 1) if " " in text else text + " %"


def fmt_se(se: float, digits: int = 1) -> str:
    """'±se' (a standard error beside a gap), '–' when unknown."""
    return MISSING if se is None or not np.isfinite(se) else f"±{se:.{digits}f}"


def gap_eval_se(a: pd.Series, b: pd.Series, n_tests: pd.Series) -> float:
    """The binomial SE (pp) the test set alone puts on mean(a) - mean(b), accuracies in %, k seeds each; NaN when
    the runs' n_test is unknown or differs."""
    n = n_tests.astype(float)
    if n.empty or not np.isfinite(n).all() or n.nunique() != 1 or a.empty or b.empty:
        return float("nan")
    return 100 * gap_binomial_se(a.mean() / 100, len(a), b.mean() / 100, len(b), float(n.iloc[0]))


# --------------------------------------------------------------------------------------------- accuracy
def final_accuracy(sweep: Sweep) -> pd.DataFrame:
    """One row per run with an eval: identity, status, final_step and final eval accuracy (fraction).

    "Final" is the run's final evaluation (`Run.final_accuracy`: the row at train.steps, or for a diverged run the
    last one before it stopped), a finite number by construction (analysis.load.final_eval): a run whose final
    row lacks one was left out at load, never read from an earlier row.
    """
    rows = []
    for r in sweep.runs:
        e = eval_curve(r)
        if e is None or r.final_accuracy is None:
            continue
        rows.append(
            {
                "method": r.method, "precision": r.precision, "severity": r.severity, "task": r.task, "model": r.model,
                "seed": r.seed, "status": r.status, "final_step": r.final_step, "accuracy": r.final_accuracy,
                "initial_accuracy": float(e["eval/accuracy"].iloc[0]) if int(e["step"].iloc[0]) == 0 else np.nan,
                "act_granularity": get(r.config, "rollout.act_granularity"), "n_test": n_test(r),
                "sampler_accuracy0": sampler_accuracy0(r),
            }
        )
    return pd.DataFrame(
        rows,
        columns=["method", "precision", "severity", "task", "model", "seed", "status", "final_step", "accuracy",
                 "initial_accuracy", "act_granularity", "n_test", "sampler_accuracy0"],
    )


def _baseline_arm(arms: list[tuple[str, str]], baseline: str) -> tuple[str, str] | None:
    matches = [a for a in sorted_arms(arms) if a[0] == baseline]
    return matches[0] if matches else None


def arm_severities(fa: pd.DataFrame) -> list[tuple[str, str, str]]:
    """(method, precision, severity) of a cell's runs in the report's order: an arm that ran at two rollout settings
    of one precision (int8 per tensor and per channel) is two rows, never one row pooling both (its seeds twice)."""
    keys = fa[["method", "precision", "severity"]].drop_duplicates().itertuples(index=False, name=None)
    return sorted(keys, key=lambda k: (arm_sort_key((k[0], k[1])), k[2]))


def rollout_names(fa: pd.DataFrame, labels: dict[str, str]) -> dict[tuple[str, str, str], str]:
    """(method, precision, severity) -> what the table calls its rollout: the precision, or the severity's label
    ("int8 (w=per_tensor)") where the arm ran at more than one severity of that precision."""
    keys = arm_severities(fa)
    count = pd.Series([(m, p) for m, p, _ in keys]).value_counts().to_dict() if keys else {}
    return {(m, p, sev): (labels.get(sev, sev) if count[(m, p)] > 1 else p) for m, p, sev in keys}


def accuracy_summary(sweep: Sweep, baseline: str = BASELINE) -> pd.DataFrame:
    """Tidy numbers: per (model, task, arm, rollout severity) mean/std over seeds (percent), n, diverged count, gap
    to baseline with its interval (analysis.stats.gap: paired on the seeds both arms ran) and the eval's binomial
    SE. The baseline is its runs at the row's severity, else at its only one (runs.baseline_group)."""
    fa = final_accuracy(sweep)
    g_ = f"gap_to_{baseline}"
    cols = ["model", "task", "method", "precision", "severity", "rollout", "acc_mean", "acc_std", "n_seeds",
            "n_diverged", g_, f"{g_}_lo", f"{g_}_hi", f"{g_}_n", f"{g_}_ci", f"{g_}_eval_se", "seeds"]
    if fa.empty:
        return pd.DataFrame(columns=cols)
    labels = severity_labels(sweep.runs)
    rows = []
    for (model, task), g in fa.groupby(["model", "task"], sort=True):
        names = rollout_names(g, labels)
        for method, precision, severity in arm_severities(g):
            a = g[(g.method == method) & (g.severity == severity)]
            b, _ = baseline_group(g, severity, baseline)
            if method == baseline and severity in set(b["severity"]):
                b = b.iloc[0:0]  # the baseline's row has no gap to itself (its CSV said 0.0 [0.0, 0.0] with an SE)
            s = summarize(100 * a["accuracy"])
            gap = diff_interval(100 * a["accuracy"], 100 * b["accuracy"], list(a["seed"]), list(b["seed"]))
            se = gap_eval_se(100 * a["accuracy"], 100 * b["accuracy"], pd.concat([a["n_test"], b["n_test"]]))
            rows.append(
                {
                    "model": model, "task": task, "method": method, "precision": precision, "severity": severity,
                    "rollout": names[(method, precision, severity)],
                    "acc_mean": s.mean, "acc_std": s.std, "n_seeds": s.n,
                    "n_diverged": int((a["status"] == "diverged").sum()),
                    g_: gap.value, f"{g_}_lo": gap.lo, f"{g_}_hi": gap.hi, f"{g_}_n": gap.n, f"{g_}_ci": gap.method,
                    f"{g_}_eval_se": se,
                    "seeds": " ".join(str(x) for x in sorted(a["seed"])),
                }
            )
    return pd.DataFrame(rows, columns=cols)


def accuracy_table(sweep: Sweep, baseline: str = BASELINE) -> Table:
    """Final eval accuracy per arm x task: mean ± std over seeds, number of seeds, gap to the baseline."""
    data = accuracy_summary(sweep, baseline)
    labels = arm_labels(zip(data["method"], data["precision"]))
    multi_model = data["model"].nunique() > 1
    opts = SeverityOptions(baseline=baseline)
    p_final = p_columns(paired_comparisons(sweep, opts), family_name("base", opts), "final", ("model", "task", "severity"))
    rows = []
    prev: tuple | None = None
    for r in data.itertuples(index=False):
        key = (r.model, r.task)
        n = str(r.n_seeds) + (f" ({r.n_diverged} div.)" if r.n_diverged else "")
        row = {
            "Task": r.task if key != prev else "",
            "Model": r.model if key != prev else "",
            "Method": labels[(r.method, r.precision)],
            "Rollout": r.rollout,
            "Accuracy (%)": fmt_pm(r.acc_mean, r.acc_std),
            "Seeds": n,
            f"Δ vs {baseline} (pp)": MISSING if r.method == baseline else fmt_ci(
                getattr(r, f"gap_to_{baseline}"), getattr(r, f"gap_to_{baseline}_lo"), getattr(r, f"gap_to_{baseline}_hi"),
                signed=True, n=getattr(r, f"gap_to_{baseline}_n"), method=getattr(r, f"gap_to_{baseline}_ci")),
            "p / Holm": p_final.get((r.model, r.task, r.severity, r.method), MISSING),
            "eval SE (pp)": MISSING if r.method == baseline else fmt_se(getattr(r, f"gap_to_{baseline}_eval_se")),
        }
        if not multi_model:
            row.pop("Model")
        rows.append(row)
        prev = key
    display = pd.DataFrame(rows)
    caption = (
        f"Final eval accuracy (%), mean ± sample std over seeds; Δ = difference to {baseline} on the same "
        f"task and model, in percentage points, with its 95 % interval and n; p / Holm: its paired t-test p and the "
        f"Holm-adjusted p over every gap to {baseline} (the paired comparisons table). {METHOD_SENTENCE} eval SE: the "
        "binomial standard error the test set alone puts on Δ; 'div.' = seeds that diverged (their last eval is used)."
    )
    return Table("accuracy", data, display, caption)


def paired_table(sweep: Sweep, opts: SeverityOptions = SeverityOptions()) -> Table:
    """The report's table of every paired comparison: Δ with its 95 % interval and n, raw p, Holm-adjusted p."""
    data = paired_comparisons(sweep, opts)
    multi = data["task"].nunique() > 1 or data["model"].nunique() > 1 if not data.empty else False
    rows = []
    for r in data.itertuples(index=False):
        row = {"Task / model": f"{r.task} / {r.model}"} if multi else {}
        row |= {"Family": ("primary (pre-registered)" if is_primary(r) else r.family), "Severity": r.severity_label,
                "Comparison": r.comparison, "Endpoint": "final accuracy" if r.endpoint == "final" else "AUC",
                "Δ (pp)": fmt_ci(r.gap, r.gap_lo, r.gap_hi, signed=True, n=r.gap_n, method=r.gap_ci),
                "p": fmt_p(r.p_raw) + (" (1-sided)" if r.alternative == "greater" else ""),
                "p (Holm)": fmt_p(r.p_holm), "differs": "yes" if differs(r) else ("–" if not np.isfinite(r.p_holm) else "no")}
        rows.append(row)
    caption = (
        "Every paired comparison the report states: Δ = mean difference (pp) with its 95 % interval and n (paired t "
        "over per-seed differences on the seeds both arms ran, Welch (marked) where they share none; the exact "
        "permutation p where the differences have no spread), the test's raw p (two-sided; "
        "one-sided for a pre-registered directional hypothesis) and its Holm-adjusted p within its family and endpoint: "
        f"'vs {opts.baseline}' (every arm and severity against the baseline), 'vs {opts.naive}' (every other arm at "
        f"the same severity), 'primary (pre-registered)' (arm > {opts.naive}, final accuracy and AUC together: the "
        f"pre-registered family, which needs no further correction). 'differs': Holm-adjusted p ≤ {ALPHA}."
    )
    display = pd.DataFrame(rows) if rows else pd.DataFrame(columns=["Comparison"])
    return Table("paired", data, display.fillna(MISSING), caption)


def results_table(sweep: Sweep, baseline: str = BASELINE, naive: str = NAIVE) -> Table:
    """Paper layout: one row per arm (method, bitwidth), one column per task, and their average.

    The average is the mean over tasks of the per-task means, shown only for arms that ran every task (an
    average over a different task set would not be comparable). The best mean of each column is bold. A
    first row gives the baseline's accuracy before RL (eval at step 0), the reference the gains are read against.
    """
    blocks, tasks = results_numbers(sweep, baseline, naive)
    n = seeds_per_cell([r for rows in blocks.values() for r in rows], tasks)
    rows_num: list[dict[str, Any]] = []
    rows_disp: list[dict[str, Any]] = []
    bold_rows: list[dict[str, bool]] = []
    for model, block_num in blocks.items():
        disp, flags = results_display(model, block_num, tasks, multi_model=len(blocks) > 1, show_n=n is None)
        rows_num += block_num
        rows_disp += disp
        bold_rows += flags
    data_out = pd.DataFrame(rows_num)
    display = pd.DataFrame(rows_disp)
    bold = pd.DataFrame(bold_rows, columns=display.columns) if rows_disp else None
    caption = (
        "Final eval accuracy (%) per task, mean ± std over "
        + (f"n = {n} seeds per cell" if n is not None else "seeds (n beside each cell)")
        + "; Avg. = mean over tasks of the per-task means; "
        f"best arm per column in bold; '{baseline} @ step 0' = accuracy before RL; 'μ @ step 0' = the rollout policy's "
        f"own accuracy at that bitwidth on the step-0 training batch (sampled, before any update), from the {naive} "
        f"arm's runs there (the {baseline} arm's at its own precision): the uncorrected sampler, one batch per seed "
        "(an arm such as acr_uaq rescales the policy before sampling); "
        "'div.' = seeds that diverged "
        "(their last eval before diverging is used; such a cell, and the Avg. of its arm, is never bold)."
    )
    return Table("results", data_out, display, caption, bold, wide=tuple(tasks))


def results_numbers(sweep: Sweep, baseline: str, naive: str = NAIVE) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """The results table's frame: {model: its rows of numbers (the step-0 references, then one per arm)}, and the
    tasks (its columns)."""
    fa = final_accuracy(sweep)
    data = accuracy_summary(sweep, baseline)
    tasks = sorted(data["task"].unique()) if not data.empty else []
    models = sorted(data["model"].unique()) if not data.empty else []
    return {model: _model_results(data[data.model == model], fa[fa.model == model], model, tasks, baseline, naive)
            for model in models}, tasks


def _model_results(dm: pd.DataFrame, fm: pd.DataFrame, model: str, tasks: list[str],
                   baseline: str, naive: str) -> list[dict[str, Any]]:
    """One model's rows of the results table: `dm` its accuracy summary, `fm` its runs' final accuracy."""
    arms = sorted_arms(zip(dm["method"], dm["precision"]))
    labels = arm_labels(arms)
    base = _baseline_arm(arms, baseline)
    block_num: list[dict[str, Any]] = []
    if base is not None:
        init = fm[(fm.method == base[0]) & (fm.precision == base[1])]
        num = {"model": model, "method": f"{baseline} @ step 0", "precision": base[1], "bitwidth": bitwidth(base[1])}
        for t in tasks:
            s = summarize(100 * init[init.task == t]["initial_accuracy"])
            num[f"{t}_mean"], num[f"{t}_std"], num[f"{t}_n"] = s.mean, s.std, s.n
        block_num.append(num)
    rows = arm_severities(dm)
    rollout = {(m, sev): _rollout_of(dm[(dm.method == m) & (dm.severity == sev)], p) for m, p, sev in rows}
    for precision, severity in dict.fromkeys((p, sev) for _, p, sev in rows):
        here = fm[fm.severity == severity]
        # the uncorrected sampler's own runs, one batch per seed: pooling every arm's counted each seed once per arm
        # and took in arms whose sampler differs (acr_uaq rescales the weights it quantizes)
        runs = next((r for r in (here[here.method == m] for m in (naive, baseline)) if not r.empty), here.iloc[0:0])
        if not np.isfinite(runs["sampler_accuracy0"]).any():
            continue  # no run logged its step-0 training batch
        named = next((r for (_, sev), r in rollout.items() if sev == severity and r != precision), None)
        num = {"model": model, "method": "μ @ step 0" + (f", {named}" if named else ""), "precision": precision,
               "bitwidth": bitwidth(precision)}
        for t in tasks:
            s = summarize(runs[runs.task == t]["sampler_accuracy0"].dropna())
            num[f"{t}_mean"], num[f"{t}_std"], num[f"{t}_n"] = s.mean, s.std, s.n
        block_num.append(num)
    for method, precision, severity in rows:
        d = dm[(dm.method == method) & (dm.severity == severity)]
        act = fm[(fm.method == method) & (fm.severity == severity)]["act_granularity"]
        named = rollout[(method, severity)]
        num = {
            "model": model, "method": labels[(method, precision)] + (f", {named}" if named != precision else ""),
            "precision": precision, "bitwidth": bitwidth(precision, act.mode().iloc[0] if act.notna().any() else None),
        }
        for t in tasks:
            cell = d[d.task == t]
            num[f"{t}_mean"] = float(cell["acc_mean"].iloc[0]) if len(cell) else np.nan
            num[f"{t}_std"] = float(cell["acc_std"].iloc[0]) if len(cell) else np.nan
            num[f"{t}_n"] = int(cell["n_seeds"].iloc[0]) if len(cell) else 0
            num[f"{t}_n_diverged"] = int(cell["n_diverged"].iloc[0]) if len(cell) else 0
        block_num.append(num)
    for num in block_num:
        means = [num[f"{t}_mean"] for t in tasks]
        num["avg"] = float(np.mean(means)) if tasks and all(np.isfinite(means)) else np.nan
    return block_num


def _rollout_of(d: pd.DataFrame, precision: str) -> str:
    """An arm-severity's rollout name over the tasks it ran: its severity's label wherever a task needed one
    (the arm ran at two settings of one precision there), else the precision."""
    return next((r for r in d["rollout"] if r != precision), precision)


def seeds_per_cell(rows: list[dict[str, Any]], tasks: list[str]) -> int | None:
    """The results table's one number of seeds per cell, said once in its caption; None where cells differ (then
    each cell shows its own n)."""
    ns = {int(r[f"{t}_n"]) for r in rows for t in tasks if np.isfinite(r[f"{t}_mean"]) and f"{t}_n" in r}
    return ns.pop() if len(ns) == 1 else None


def results_display(model: str, block_num: list[dict[str, Any]], tasks: list[str],
                    multi_model: bool, show_n: bool = False) -> tuple[list[dict[str, Any]], list[dict[str, bool]]]:
    """The results table's rendering of one model's rows: the cells as shown (with their n where `show_n`: the
    table's cells rest on different numbers of seeds), and which are bold."""
    # Bold the best arm per column among its contenders (contends, below); a winner needs a contest: at
    # least two contenders with a value in the column.
    columns = [f"{t}_mean" for t in tasks] + ["avg"]
    best = {}
    for c in columns:
        values = [n[c] for n in block_num if contends(n, c, tasks) and np.isfinite(n[c])]
        best[c] = max(values) if len(values) > 1 else np.nan
    rows_disp: list[dict[str, Any]] = []
    bold_rows: list[dict[str, bool]] = []
    for num in block_num:
        disp = {"Model": model, "Method": num["method"], "Bitwidth": num["bitwidth"]}
        flags = {"Model": False, "Method": False, "Bitwidth": False}
        for t in tasks:
            n_div = num.get(f"{t}_n_diverged", 0)
            n = f" n={num[f'{t}_n']}" if show_n and np.isfinite(num[f"{t}_mean"]) else ""
            disp[t] = fmt_pm(num[f"{t}_mean"], num[f"{t}_std"]) + n + (f" ({n_div} div.)" if n_div else "")
            flags[t] = bool(contends(num, f"{t}_mean", tasks) and num[f"{t}_mean"] == best[f"{t}_mean"])
        if len(tasks) > 1:  # with one task the average would repeat its column
            disp["Avg."] = fmt_num(num["avg"])
            flags["Avg."] = bool(contends(num, "avg", tasks) and num["avg"] == best["avg"])
        if not multi_model:
            disp.pop("Model")
            flags.pop("Model")
        rows_disp.append(disp)
        bold_rows.append(flags)
    return rows_disp, bold_rows


def contends(num: dict[str, Any], column: str, tasks: list[str]) -> bool:
    """Whether a results-table cell may be bold as the best of its column: never the step-0 reference row, and
    never a mean over a seed that diverged (its last eval before diverging, often its step-0 accuracy, is no
    result of training); for Avg., never an arm with a diverged seed in any task."""
    if num["method"].endswith("@ step 0"):
        return False
    diverged = [num.get(f"{t}_n_diverged", 0) for t in (tasks if column == "avg" else [column[: -len("_mean")]])]
    return not any(diverged)


# --------------------------------------------------------------------------------------------- throughput
#: What each time/* part of a step measures (bench/train.py `step_metrics`); they add up to time/step_s.
PART_LABELS = {"rollout_s": "generation", "sync_s": "sync + requant", "recompute_s": "recompute", "train_s": "train",
               "other_s": "other"}
RUNTIME_COLUMNS = ["engine", "device"]


def _train_includes_recompute(steady: pd.DataFrame) -> bool:
    """True for runs of a trainer that timed the recompute pass inside time/train_s (step = sync + rollout +
    train); since the split, step = sync + rollout + recompute + train. Decided on the data, per run."""
    cols = [f"time/{k}" for k in ("step_s", "sync_s", "rollout_s", "recompute_s", "train_s")]
    if not all(c in steady for c in cols) or steady[cols].isna().any(axis=None):
        return False
    if not (steady["time/recompute_s"] > 0).any():
        return False
    step, sync, roll, rec, train = (steady[c] for c in cols)
    return bool(((step - (sync + roll + train)).abs().mean()) < ((step - (sync + roll + rec + train)).abs().mean()))


def run_timings(sweep: Sweep, warmup: int = 1) -> pd.DataFrame:
    """Per run: mean over steps >= `warmup` of rollout tokens/s and of each time/* part, with its engine and device.

    The first step(s) pay one-off costs (compilation, allocator warm-up, first weight quantization) that
    say nothing about steady-state speed; a run shorter than the warm-up keeps all its steps. `train_s` is the
    optimizer steps alone (an older trainer's train_s, which included the recompute pass, is corrected).
    """
    rows = []
    for r in sweep.runs:
        m = r.metrics
        steady = m[m["step"] >= warmup] if (m["step"] >= warmup).any() else m
        row: dict[str, Any] = {"method": r.method, "precision": r.precision, "engine": r.engine, "device": r.device,
                               "task": r.task, "model": r.model, "seed": r.seed}
        for key in ["rollout_tokens_per_s", "step_s", *TIME_PARTS]:
            col = f"time/{key}"
            row[key] = float(steady[col].mean()) if col in steady and steady[col].notna().any() else np.nan
        if _train_includes_recompute(steady):
            row["train_s"] -= row["recompute_s"]
        rows.append(row)
    return pd.DataFrame(rows, columns=["method", "precision", *RUNTIME_COLUMNS, "task", "model", "seed",
                                       "rollout_tokens_per_s", "step_s", *TIME_PARTS])


def throughput_summary(sweep: Sweep, baseline: str = BASELINE, warmup: int = 1) -> pd.DataFrame:
    """Per (model, engine, device, task, arm): tokens/s mean ± std over runs (seeds), mean seconds per step by
    part, and the speed-ups against the baseline arm on the same model, engine, device and task.

    Like with like: an FP8 GPU rollout against a BF16 CPU one would say nothing about FP8, and tasks differ in
    response length (tokens/s and seconds per step with them), so a number pooled over tasks would weight an arm
    by the tasks it happened to run; every row and every ratio here is one task's. `emulated` marks a quantized
    precision on a CPU (analysis.arms.is_emulated).
    """
    t = run_timings(sweep, warmup)
    cols = ["model", *RUNTIME_COLUMNS, "task", "method", "precision", "emulated", "n_runs", "tokens_per_s_mean",
            "tokens_per_s_std", *TIME_PARTS, "other_s", "step_s", "rollout_speedup", "step_speedup"]
    if t.empty or t["rollout_tokens_per_s"].isna().all() and t["step_s"].isna().all():
        return pd.DataFrame(columns=cols)
    rows = []
    for (model, engine, device, task), g in t.groupby(["model", *RUNTIME_COLUMNS, "task"], sort=True):
        arms = sorted_arms(zip(g["method"], g["precision"]))
        base = _baseline_arm(arms, baseline)
        b = g[(g.method == base[0]) & (g.precision == base[1])] if base is not None else g.iloc[0:0]
        for arm in arms:
            a = g[(g.method == arm[0]) & (g.precision == arm[1])]
            tps = summarize(a["rollout_tokens_per_s"])
            parts = {p: float(a[p].mean()) for p in TIME_PARTS}
            step_s = float(a["step_s"].mean())
            known = np.nansum(list(parts.values()))
            other = step_s - known if np.isfinite(step_s) and step_s - known > 1e-9 else 0.0
            rows.append(
                {
                    "model": model, "engine": engine, "device": device, "task": task, "method": arm[0],
                    "precision": arm[1], "emulated": is_emulated(arm[1], device), "n_runs": len(a),
                    "tokens_per_s_mean": tps.mean, "tokens_per_s_std": tps.std, **parts, "other_s": other,
                    "step_s": step_s,
                    "rollout_speedup": _ratio(tps.mean, b["rollout_tokens_per_s"].mean()),
                    "step_speedup": _ratio(b["step_s"].mean(), step_s),
                }
            )
    return pd.DataFrame(rows, columns=cols)


def _ratio(a: float, b: float) -> float:
    return float(a / b) if np.isfinite(a) and np.isfinite(b) and b > 0 else float("nan")


def throughput_table(sweep: Sweep, baseline: str = BASELINE, warmup: int = 1) -> Table:
    """Rollout throughput and where a training step's time goes, per task, arm, rollout precision, engine and device."""
    data = throughput_summary(sweep, baseline, warmup)
    multi_model = data["model"].nunique() > 1
    labels = arm_labels(zip(data["method"], data["precision"]))
    rows, prev = [], None
    for r in data.itertuples(index=False):
        row = {
            "Model": r.model,
            "Task": r.task if (r.model, r.task) != prev else "",
            "Method": labels[(r.method, r.precision)],
            "Rollout": rollout_label(r.precision, r.device),
            "Engine": f"{r.engine} ({r.device})",
            "Rollout tok/s": fmt_pm(r.tokens_per_s_mean, r.tokens_per_s_std, 0)
                             + (f" n={r.n_runs}" if np.isfinite(r.tokens_per_s_mean) else ""),
            "Rollout speed-up": MISSING if not np.isfinite(r.rollout_speedup) else f"{r.rollout_speedup:.2f}×",
            **{f"{PART_LABELS[p]} s": fmt_num(getattr(r, p), 3) for p in TIME_PARTS},
            "step s": fmt_num(r.step_s, 3),
            "Step speed-up": MISSING if not np.isfinite(r.step_speedup) else f"{r.step_speedup:.2f}×",
        }
        if not multi_model:
            row.pop("Model")
        rows.append(row)
        prev = (r.model, r.task)
    caption = (
        f"Throughput per arm, rollout precision, engine and device: rollout tokens/s (mean ± std over runs) and "
        f"seconds per training step by part (generation; weight sync incl. re-quantization; recompute of log π_old; "
        f"optimizer steps), averaged over steps >= {warmup} (warm-up excluded), per task (tasks differ in response "
        f"length); speed-ups vs {baseline} on the same task, model, engine and device are ratios of means (step "
        "speed-up = ratio of step times). 'emulated': a quantized precision on a CPU, computed by fake quantization "
        "in fp32, whose speed says nothing about FP8/INT8 hardware."
    )
    return Table("throughput", data, pd.DataFrame(rows), caption)

