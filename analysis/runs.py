"""One row per run: the numbers every table, comparison, aggregate and figure of a report reads.

The per-run quantities (severity, mismatch, T·KL, sampler accuracy, final accuracy, AUC, collapse) are defined in
analysis/severity.py's docstring; this module computes them, labels the severities, and names the report's roles
(`SeverityOptions`: the naive method, the baseline, the control, the collapse rule's k, the pre-registered arms).
It sits under the tables, the paired comparisons and the severity analysis, which all build on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from .arms import BASELINE, CONTROL, NAIVE
from .collapse import collapse_step
from .load import SEVERITY_OPTIONS, Run, Sweep, get

KL_METRICS = ("mismatch/kl_k3", "mismatch/kl_k1")


@dataclass(frozen=True)
class SeverityOptions:
    """Which method is the naive form, the baseline and the on-policy control, the collapse rule's k, and the
    pre-registered primary arms (each tested > naive, one-sided, in its own Holm family: analysis/comparisons.py)."""

    naive: str = NAIVE
    baseline: str = BASELINE
    collapse_k: int = 3
    control: str = CONTROL
    primary: tuple[str, ...] = ()


# --------------------------------------------------------------------------------------------- per run
def n_test(run: Run) -> float:
    """The number of test problems each evaluation of the run scored (config task.n_test); NaN when unknown."""
    n = get(run.config, "task.n_test")
    return float(n) if isinstance(n, (int, float)) and not isinstance(n, bool) and n > 0 else float("nan")


def eval_curve(run: Run) -> pd.DataFrame | None:
    """The run's evaluations that have an accuracy, by step; None when it has none."""
    if run.evals.empty or "eval/accuracy" not in run.evals:
        return None
    e = run.evals.dropna(subset=["eval/accuracy"]).sort_values("step")
    return None if e.empty else e


def sampler_accuracy0(run: Run) -> float:
    """The step-0 training batch's reward/accuracy in % (mu's own accuracy before any update); NaN if not logged."""
    m = run.metrics
    if "reward/accuracy" not in m or m.empty or (m["step"] != 0).all():
        return float("nan")
    return 100 * float(m.loc[m["step"] == 0, "reward/accuracy"].iloc[0])


def eval_auc(steps: Sequence[float], values: Sequence[float]) -> float:
    """Trapezoid area under (steps, values) divided by the step span: the time-average (one point: its value)."""
    s, v = np.asarray(steps, dtype=float), np.asarray(values, dtype=float)
    if s.size == 0:
        return float("nan")
    if s.size == 1 or s[-1] == s[0]:
        return float(v[-1])
    return float(np.sum((v[1:] + v[:-1]) / 2 * np.diff(s)) / (s[-1] - s[0]))


def run_mismatch(run: Run) -> float:
    """Mean over the run's steps of its KL(mu || pi_old) estimate (k3, else k1); NaN when neither was logged."""
    for key in KL_METRICS:
        if key in run.metrics and run.metrics[key].notna().any():
            return float(run.metrics[key].mean())
    return float("nan")


def run_seq_mismatch(run: Run) -> float:
    """Mean over the run's steps of response length x per-token KL (T·KL, nats); NaN without both metrics."""
    m = run.metrics
    kl = next((k for k in KL_METRICS if k in m and m[k].notna().any()), None)
    if kl is None or "reward/response_length" not in m:
        return float("nan")
    return float((m["reward/response_length"] * m[kl]).mean())


def run_rows(sweep: Sweep, k: int = 3) -> pd.DataFrame:
    """One row per run with an eval: identity, severity, mismatch, final accuracy, AUC (%) and collapse."""
    rows = []
    for r in sweep.runs:
        e = eval_curve(r)
        if e is None or r.final_accuracy is None:
            continue
        step = collapse_step(e["step"].tolist(), e["eval/accuracy"].tolist(), k, n_test(r))
        rows.append({
            "run_id": r.run_id, "model": r.model, "task": r.task, "method": r.method, "precision": r.precision,
            "severity": r.severity, "seed": r.seed, "status": r.status, "kl": run_mismatch(r),
            "seq_kl": run_seq_mismatch(r), "sampler_acc0": sampler_accuracy0(r),
            "final_acc": 100 * r.final_accuracy,
            "auc": 100 * eval_auc(e["step"].tolist(), e["eval/accuracy"].tolist()),
            "collapsed": step is not None, "collapse_step": step, "n_test": n_test(r),
        })
    cols = ["run_id", "model", "task", "method", "precision", "severity", "seed", "status", "kl", "seq_kl",
            "sampler_acc0", "final_acc", "auc", "collapsed", "collapse_step", "n_test"]
    return pd.DataFrame(rows, columns=cols)


# --------------------------------------------------------------------------------------------- severity labels
def _options(key: str) -> tuple[str, dict[str, str]]:
    precision, *parts = key.split(";")
    return precision, dict(p.split("=", 1) for p in parts)


def _explicit(run: Run) -> set[str]:
    """The severity options this run's config sets away from the engine's default (null / false)."""
    out = set()
    for short, (config_key, _) in SEVERITY_OPTIONS.items():
        value = get(run.config, config_key)
        if value not in (None, False) and not (isinstance(value, str) and "${" in value):
            out.add(short)
    return out


def severity_labels(runs: Iterable[Run]) -> dict[str, str]:
    """severity key -> readable label: the precision, plus each option that the runs set explicitly or that
    varies between the sweep's severities of the same precision ("int8 (w=per_tensor, a=per_tensor)")."""
    runs = list(runs)
    explicit: dict[str, set[str]] = {}
    for r in runs:
        explicit.setdefault(r.severity, set()).update(_explicit(r))
    parsed = {key: _options(key) for key in explicit}
    labels: dict[str, str] = {}
    for key, (precision, opts) in parsed.items():
        siblings = [o for p, o in parsed.values() if p == precision]
        shown = []
        for short in SEVERITY_OPTIONS:
            value = opts.get(short, "None")
            varies = len({o.get(short) for o in siblings}) > 1
            if value in ("None", "False") or not (varies or short in explicit[key]):
                continue
            shown.append(short if value == "True" else f"{short}={value}")
        labels[key] = precision + (f" ({', '.join(shown)})" if shown else "")
    if len(set(labels.values())) < len(labels):  # two severities that no option tells apart: show the keys
        return {key: key for key in labels}
    return labels


def has_severity_axis(sweep: Sweep) -> bool:
    """True when the sweep's runs span at least two severities (then the report has a severity section)."""
    return len({r.severity for r in sweep.runs}) >= 2


def baseline_group(g: pd.DataFrame, severity: str, baseline: str) -> tuple[pd.DataFrame, str | None]:
    """The baseline's runs for a cell at `severity`: at that severity, else at its only severity; or a reason."""
    base = g[g["method"] == baseline]
    if base.empty:
        return base, f"no {baseline} run"
    same = base[base["severity"] == severity]
    if not same.empty:
        return same, None
    if base["severity"].nunique() == 1:
        return base, None
    return base.iloc[0:0], f"{baseline} ran at several severities, not this one"


__all__ = ["KL_METRICS", "SeverityOptions", "baseline_group", "eval_auc", "eval_curve", "has_severity_axis", "n_test",
           "run_mismatch", "run_rows", "run_seq_mismatch", "sampler_accuracy0", "severity_labels"]
