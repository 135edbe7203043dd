"""`qrl-analyze RESULTS --paper NAME`: a paper's table with our numbers beside the paper's, and the difference.

The layout comes from the recipe's reference CSV (conf/experiment/paper/<NAME>.reference.csv, or any CSV path):
one line per (table row, benchmark) with

    method, bitwidth   which of our runs fill the row: the arm (method.name) at a rollout precision whose
                       Bitwidth cell (analysis.arms.bitwidth: "BF16", "INT8 W8A8", ...) is this one
    benchmark          the column
    value              the paper's number (empty: the paper shows it only as a figure)
    paper_label        the row's label in the paper ("RL", "FlashRL", "QuRL (Ours)")
    unit               the paper's unit; our fractions are shown in percent
    metric             our eval key (eval/accuracy, eval/aime24/avg@32, ...); `a+b+c` = the mean of several;
                       `mean` = the mean of this row's other columns (Table 3's "Avg")
    task, model        the paper's task and model as our recipe runs them (the run's task.name and model.name):
                       required in every line, as a run of another task or model is no comparison with the paper
                       (an empty cell matched any run: a tiny model's synthetic task stood beside a GSM8K number)
    config             optional: space-separated `key=value` settings of the run's config (QuRL Table 4's
                       learning rates, P3O's clip ranges)

A recipe's CPU mini variant (NAME `<recipe>_mini`: the recipe's pipeline on a random-init tiny model and fixture
data) fills the recipe's layout with its own runs, matched on its model (the mini yaml's `override /model`) instead
of the paper's: the table shows that the pipeline ends in the paper's table, and leaves Δ empty, since a random-init
tiny model is no comparison with the paper.

Our cell is the metric at the run's last evaluation, averaged over the matching runs (seeds): mean ± std over
seeds and the number of runs. Method `base` (QuRL Table 3's "Base") is the bf16 runs' evaluation at step 0,
before any RL. Δ = ours - paper, in the paper's unit (percentage points). Every run directory under RESULTS is
read (not de-duplicated by arm: a recipe's rows may share an arm and differ in a setting); runs that did not
finish are left out, as in the other tables. No torch import: the analysis runs anywhere.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf

from bench.eval_config import eval_setup

from .arms import BASELINE, bitwidth  # BASELINE: the arm whose step-0 evaluation is the "base" row
from .load import Run, RunError, discover, get, load_run, log
from .tables import MISSING, Table, fmt_num, fmt_pm

PAPER_DIR = Path(__file__).resolve().parents[1] / "conf" / "experiment" / "paper"
REQUIRED = ("method", "bitwidth", "benchmark", "value", "paper_label", "metric", "task", "model")


MINI = "_mini"


@dataclass(frozen=True)
class Mini:
    """What a mini variant changes that its runs are matched on: the model, and the samples per problem (eval.k)."""

    model: str
    eval_k: int | None


def mini_variant(name: str) -> Mini | None:
    """The mini variant NAME's model (its yaml's `override /model`) and eval.k, or None when NAME is no mini variant."""
    path = PAPER_DIR / f"{name}.yaml"
    if not name.endswith(MINI) or not path.exists():
        return None
    recipe = OmegaConf.load(path)
    models = [str(e["override /model"]) for e in recipe.get("defaults", [])
              if isinstance(e, DictConfig) and "override /model" in e]
    k = OmegaConf.select(recipe, "eval.k")
    return Mini(models[0], None if k is None else int(k)) if models else None


def mini_metric(metric: str, k: int | None) -> str:
    """The key a mini evaluating k samples per problem logs for the recipe's `metric`: avg@32 -> avg@k (k < 32)."""
    return metric if k is None else re.sub(r"@(\d+)", lambda m: f"@{min(int(m[1]), k)}", metric)


def reference_path(name: str) -> Path:
    """NAME (a recipe of conf/experiment/paper/, or its mini variant: the recipe's) or a path to a reference CSV."""
    path = Path(name)
    if path.suffix == ".csv":
        if not path.exists():
            raise FileNotFoundError(f"reference CSV {path} does not exist")
        return path
    path = PAPER_DIR / f"{name.removesuffix(MINI) if mini_variant(name) else name}.reference.csv"
    if not path.exists():
        known = sorted(p.name.removesuffix(".reference.csv") for p in PAPER_DIR.glob("*.reference.csv"))
        raise FileNotFoundError(f"no reference table for paper {name!r}; known: {', '.join(known)}, each also as its "
                                f"CPU mini variant <name>{MINI} (or give a .csv path)")
    return path


def load_reference(path: Path) -> pd.DataFrame:
    ref = pd.read_csv(path, dtype=str, keep_default_na=False)
    missing = [c for c in REQUIRED if c not in ref.columns]
    if missing:
        raise ValueError(f"{path}: missing column(s) {', '.join(missing)}")
    for col in ("task", "model"):
        empty = [i + 2 for i, v in enumerate(ref[col]) if not v.strip()]  # line numbers: the header is line 1
        if empty:
            raise ValueError(f"{path}: empty {col} on line(s) {', '.join(map(str, empty))}; every line names the "
                             f"paper's task and model (an empty cell would match a run of any {col})")
    for col in ("config", "unit", "source"):
        if col not in ref.columns:
            ref[col] = ""
    ref["value"] = pd.to_numeric(ref["value"].replace("", np.nan), errors="coerce")
    return ref


def load_runs(roots: list[Path], exclude: list[Path] | None = None) -> list[Run]:
    """Every finished run under the roots; unusable directories are logged and left out."""
    runs = []
    for root in roots:
        if not Path(root).is_dir():
            raise FileNotFoundError(f"results directory {root} does not exist")
        for d in discover(Path(root), exclude or []):
            try:
                runs.append(load_run(d, Path(root)))
            except RunError as e:
                log(f"  left out {d}: {e}")
    return runs


def _same(actual: Any, wanted: str) -> bool:
    """A config value equals a `key=value` setting: numerically when both are numbers, else as text."""
    try:
        return math.isclose(float(actual), float(wanted), rel_tol=1e-9)
    except (TypeError, ValueError):
        return str(actual) == wanted


def matches(run: Run, method: str, bits: str, task: str, model: str, config: str) -> bool:
    """Whether the run fills a line: its arm at the line's bitwidth, on the paper's task and model, with the line's
    settings. Task and model always count: an empty one matches nothing (load_reference refuses it)."""
    method = BASELINE if method == "base" else method
    # the configured method: a recipe's rows of one arm differ in a setting (`config`), which the sweep made variants
    if run.method_name != method or bitwidth(run.precision, get(run.config, "rollout.act_granularity")) != bits:
        return False
    if run.task_name != task or run.model != model:  # the configured name: a recipe's rows may vary task settings
        return False
    for setting in config.split():
        key, _, value = setting.partition("=")
        if not _same(get(run.config, key), value):
            return False
    return True


def run_value(run: Run, metric: str, at_start: bool) -> float:
    """The metric (or the mean of `a+b+c`) at the run's final evaluation (`Run.final`: its finite values only), or at
    step 0; NaN when absent."""
    keys = metric.split("+")
    if not at_start:
        values = [run.final.get(k, np.nan) for k in keys]
        return float(np.mean(values)) if all(np.isfinite(values)) else np.nan
    e = run.evals
    row = e[e["step"] == 0] if not e.empty else e
    if row.empty:
        return np.nan
    values = [float(row[k].iloc[0]) if k in row and pd.notna(row[k].iloc[0]) else np.nan for k in keys]
    return float(np.mean(values)) if all(np.isfinite(values)) else np.nan


@dataclass
class Cell:
    mean: float
    std: float
    n: int


def our_cell(runs: list[Run], line: pd.Series, scale: float) -> Cell:
    picked = [r for r in runs
              if matches(r, line["method"], line["bitwidth"], line["task"], line["model"], line["config"])]
    values = [scale * v for r in picked if np.isfinite(v := run_value(r, line["metric"], line["method"] == "base"))]
    if not values:
        return Cell(np.nan, np.nan, 0)
    return Cell(float(np.mean(values)), float(np.std(values, ddof=1)) if len(values) > 1 else np.nan, len(values))


def evaluation_of(run: Run) -> str:
    """How a run's accuracy was measured: its evaluation's engine and precision (bench.eval_config.eval_setup)."""
    return eval_setup(str(get(run.config, "eval.engine") or "auto"), run.engine)


def engines_of(runs: list[Run]) -> str:
    """A row's rollout engine(s) and evaluation(s) for the caption, e.g. 'embedded, evaluated on embedded fp32'."""
    if not runs:
        return "no run"
    rollout = "/".join(sorted({r.engine for r in runs}))
    return f"{rollout}, evaluated on {'/'.join(sorted({evaluation_of(r) for r in runs}))}"


def row_cells(runs: list[Run], lines: pd.DataFrame) -> dict[str, Cell]:
    """Our cell of each benchmark of one row of the reference (`lines`), in %; a `mean` column is the row's average
    over its other columns (computed, not matched to a metric)."""
    cells = {line["benchmark"]: our_cell(runs, line, 100.0) for _, line in lines.iterrows() if line["metric"] != "mean"}
    for _, line in lines.iterrows():
        if line["metric"] == "mean":
            others = [c.mean for c in cells.values()]
            n = min((c.n for c in cells.values()), default=0)
            cells[line["benchmark"]] = Cell(float(np.mean(others)) if others and all(np.isfinite(others)) else np.nan,
                                            np.nan, n)
    return cells


def paper_table(name: str, runs: list[Run]) -> Table:
    """The paper's layout: one row per (paper label, method, bitwidth, config), per benchmark ours | paper | Δ."""
    ref = load_reference(reference_path(name))
    mini = mini_variant(name)
    if mini is not None:  # the mini's runs: the recipe's task names, the mini's model and samples per problem
        ref["model"] = mini.model
        ref["paper_metric"] = ref["metric"]
        ref["metric"] = [mini_metric(m, mini.eval_k) for m in ref["metric"]]
    benchmarks = list(dict.fromkeys(ref["benchmark"]))
    rows: list[dict[str, Any]] = []
    data: list[dict[str, Any]] = []
    engines: list[str] = []  # each row's rollout engine(s) and evaluation(s), from the runs filling it: the caption
    evaluations: set[str] = set()  # every row's
    order = list(dict.fromkeys(tuple(r) for r in ref[["paper_label", "method", "bitwidth", "config"]].itertuples(index=False)))
    for label, method, bits, config in order:
        lines = ref[(ref.paper_label == label) & (ref.method == method) & (ref.bitwidth == bits) & (ref.config == config)]
        shown = {"Bitwidth": bits, "Method": f"{label} [{method}]"}
        cells = row_cells(runs, lines)
        for bench in benchmarks:
            line = lines[lines.benchmark == bench]
            if line.empty:
                shown |= {f"{bench} ours": "", f"{bench} paper": "", f"{bench} Δ": ""}
                continue
            ours, paper = cells[bench], float(line["value"].iloc[0])
            diff = ours.mean - paper if mini is None and np.isfinite(ours.mean) and np.isfinite(paper) else np.nan
            measured = line["metric"].iloc[0]
            changed = mini is not None and measured != line["paper_metric"].iloc[0]
            shown |= {f"{bench} ours" + (f" ({measured.rsplit('/', 1)[-1]})" if changed else ""):
                      fmt_pm(ours.mean, ours.std, 2),
                      f"{bench} paper": fmt_num(paper, 2), f"{bench} Δ": fmt_num(diff, 2, signed=True)}
            data.append({"paper_label": label, "method": method, "bitwidth": bits, "config": config,
                         "task": line["task"].iloc[0], "model": line["model"].iloc[0], "benchmark": bench,
                         "metric": line["metric"].iloc[0],
                         "ours_mean": ours.mean, "ours_std": ours.std, "n_runs": ours.n, "paper": paper, "delta": diff,
                         "unit": line["unit"].iloc[0], "source": line["source"].iloc[0]})
        filled = [r for r in runs
                  if any(matches(r, method, bits, line["task"], line["model"], config) for _, line in lines.iterrows())]
        engines.append(f"{label} [{method}] {bits}: {engines_of(filled)}")
        evaluations |= {evaluation_of(r) for r in filled}
        runs_n = [c.n for c in cells.values()]
        shown["Runs"] = str(min(runs_n)) if runs_n and min(runs_n) == max(runs_n) else "/".join(map(str, runs_n))
        rows.append(shown)
    display = pd.DataFrame(rows).fillna("")
    sources = ", ".join(sorted(set(ref["source"]) - {""}))
    caption = (f"{name}: our final-evaluation numbers (%, mean ± std over seeds; Runs = seeds per cell) beside the "
               f"paper's ({sources}); Δ = ours - paper. 'base' = the bf16 run at step 0. {MISSING} = no run or no "
               f"paper number. Rollout engine and evaluation of each row's runs: {'; '.join(engines)}.")
    if mini is not None:
        caption = (f"{name}: the pipeline check of {name.removesuffix(MINI)} on a random-init {mini.model} and fixture data, "
                   f"in the paper's layout; its numbers are no comparison with the paper's (Δ left empty). ") + caption
    if len(evaluations) > 1:
        caption += (f" The rows are evaluated with different engines or precisions ({', '.join(sorted(evaluations))}): "
                    "a difference between two of them is partly the evaluation's.")
    return Table(f"paper_{Path(name).stem.removesuffix('.reference')}", pd.DataFrame(data), display, caption)


__all__ = ["load_reference", "load_runs", "paper_table", "reference_path"]
