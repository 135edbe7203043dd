"""Per-benchmark results: the eval sets a run evaluated besides its training task (`eval/<set>/<metric>`, e.g.
eval/aime24/avg@32, eval/math500/pass@16; bench/evaluation.py), tabulated as the papers do.

One row per arm and metric, one column per benchmark and their average (QuRL Table 3, DeepScaleR's Avg@32 on
AIME/MATH-500/AMC...): the value in each run's final evaluation (never an earlier one: analysis.load.final_eval),
mean ± sample std over seeds, in percent. The average is over the benchmarks of the row's metric and shown only when the arm has all
of them. The best arm per column (of one metric, model and training task) is bold when at least two compete.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from .arms import arm_labels, bitwidth, sorted_arms
from .load import Sweep
from .stats import summarize
from .tables import MISSING, Table, contends, fmt_num, fmt_pm

#: eval/<set>/<metric>; only the correctness metrics are tabulated (not reward_mean, lengths, scorer counts)
BENCH_KEY = re.compile(r"^eval/(?P<set>[^/]+)/(?P<metric>accuracy|avg@\d+|pass@\d+)$")


def metric_order(metric: str) -> tuple[int, int]:
    """accuracy (greedy), then avg@k, then pass@k, each by k."""
    kind, _, k = metric.partition("@")
    return ({"accuracy": 0, "avg": 1, "pass": 2}.get(kind, 3), int(k) if k.isdigit() else 0)


def final_benchmarks(sweep: Sweep) -> pd.DataFrame:
    """One row per (run, benchmark, metric): its value in the run's final evaluation (a fraction); a benchmark the
    final row has no finite value for is left out for that run (analysis.load.final_eval warns), never read from
    an earlier row."""
    rows = []
    for r in sweep.runs:
        for col, value in r.final.items():
            m = BENCH_KEY.match(col)
            if m is None:
                continue
            rows.append({"method": r.method, "precision": r.precision, "task": r.task, "model": r.model, "seed": r.seed,
                         "status": r.status, "benchmark": m["set"], "metric": m["metric"],
                         "step": r.final_step, "value": value})
    return pd.DataFrame(rows, columns=["method", "precision", "task", "model", "seed", "status", "benchmark", "metric",
                                       "step", "value"])


def benchmark_summary(sweep: Sweep) -> pd.DataFrame:
    """Tidy numbers: per (model, task, metric, arm, benchmark) mean/std over seeds in percent, and n."""
    fb = final_benchmarks(sweep)
    cols = ["model", "task", "metric", "method", "precision", "benchmark", "mean", "std", "n_seeds", "n_diverged", "seeds"]
    if fb.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for (model, task, metric, method, precision, bench), g in fb.groupby(
            ["model", "task", "metric", "method", "precision", "benchmark"], sort=True):
        s = summarize(100 * g["value"])
        rows.append({"model": model, "task": task, "metric": metric, "method": method, "precision": precision,
                     "benchmark": bench, "mean": s.mean, "std": s.std, "n_seeds": s.n,
                     "n_diverged": int((g["status"] == "diverged").sum()),
                     "seeds": " ".join(str(x) for x in sorted(g["seed"]))})
    return pd.DataFrame(rows, columns=cols)


def benchmark_table(sweep: Sweep) -> Table:
    """Per arm and metric: each benchmark's final value (%, mean ± std over seeds) and the average."""
    data = benchmark_summary(sweep)
    benches = sorted(data["benchmark"].unique()) if not data.empty else []
    multi_model, multi_task = data["model"].nunique() > 1, data["task"].nunique() > 1
    labels = arm_labels(zip(data["method"], data["precision"]))
    num_rows: list[dict[str, Any]] = []
    disp_rows: list[dict[str, str]] = []
    bold_rows: list[dict[str, bool]] = []
    blocks = data[["model", "task", "metric"]].drop_duplicates().values.tolist() if not data.empty else []
    blocks.sort(key=lambda b: (b[0], b[1], metric_order(b[2])))
    for model, task, metric in blocks:
        block = data[(data.model == model) & (data.task == task) & (data.metric == metric)]
        arms = sorted_arms(zip(block["method"], block["precision"]))
        nums = []
        for arm in arms:
            a = block[(block.method == arm[0]) & (block.precision == arm[1])]
            num: dict[str, Any] = {"model": model, "task": task, "metric": metric, "method": arm[0], "precision": arm[1]}
            for b in benches:
                cell = a[a.benchmark == b]
                num[f"{b}_mean"] = float(cell["mean"].iloc[0]) if len(cell) else np.nan
                num[f"{b}_std"] = float(cell["std"].iloc[0]) if len(cell) else np.nan
                num[f"{b}_n_diverged"] = int(cell["n_diverged"].iloc[0]) if len(cell) else 0
            present = [b for b in benches if b in set(block["benchmark"])]
            means = [num[f"{b}_mean"] for b in present]
            num["avg"] = float(np.mean(means)) if present and all(np.isfinite(means)) else np.nan
            nums.append(num)
        cols = [f"{b}_mean" for b in benches] + ["avg"]
        # a mean over a diverged seed is never bold (analysis.tables.contends); a winner needs two contenders
        best = {}
        for c in cols:
            values = [n[c] for n in nums if contends(n, c, benches) and np.isfinite(n[c])]
            best[c] = max(values) if len(values) > 1 else np.nan
        for i, num in enumerate(nums):
            first = i == 0
            disp = {"Model": model if first else "", "Task": task if first else "", "Metric": metric if first else "",
                    "Method": labels[(num["method"], num["precision"])], "Bitwidth": bitwidth(num["precision"])}
            flags = {k: False for k in disp}
            for b in benches:
                n_div = num[f"{b}_n_diverged"]
                disp[b] = fmt_pm(num[f"{b}_mean"], num[f"{b}_std"]) + (f" ({n_div} div.)" if n_div else "")
                flags[b] = bool(contends(num, f"{b}_mean", benches) and num[f"{b}_mean"] == best[f"{b}_mean"])
            if len(benches) > 1:
                disp["Avg."] = fmt_num(num["avg"]) if np.isfinite(num["avg"]) else MISSING
                flags["Avg."] = bool(contends(num, "avg", benches) and num["avg"] == best["avg"])
            for key, keep in (("Model", multi_model), ("Task", multi_task)):
                if not keep:
                    disp.pop(key)
                    flags.pop(key)
            disp_rows.append(disp)
            bold_rows.append(flags)
            num_rows.append(num)
    display = pd.DataFrame(disp_rows)
    bold = pd.DataFrame(bold_rows, columns=display.columns) if disp_rows else None
    caption = ("Benchmarks evaluated besides the training task (eval.sets), final evaluation of each run, % mean ± "
               "sample std over seeds; accuracy = greedy, avg@k = mean correctness of k samples, pass@k = unbiased "
               "estimator from n >= k samples (Chen et al. 2021); Avg. = mean over the benchmarks; best arm per "
               "column in bold, never a cell with a seed that diverged ('div.': its last eval before diverging is used).")
    return Table("benchmarks", pd.DataFrame(num_rows), display, caption, bold, wide=tuple(benches),
                 wide_column="benchmark")
