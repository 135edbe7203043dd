"""How many seeds a sweep needs: the paired t-test's power at a target effect, printed by `--dry-run`.

A comparison of two arms is paired by seed (a seed fixes the warm start and the prompt order), so its noise is the
standard deviation of the per-seed differences, sigma_d. With n seeds the paired t statistic has n - 1 degrees of
freedom and noncentrality effect * sqrt(n) / sigma_d; the power at level alpha is the chance it exceeds the critical
value. `seeds_needed` is the smallest n >= 2 whose power reaches the target. A family of m comparisons corrected by
Holm's method is planned at alpha / m, the level of Holm's first step (conservative: the later steps are easier).

sigma_d comes, in this order, from `power.paired_sd_pp`, from the sweep's own prior report (report/tables/paired.csv,
the paired SD of every comparison, analysis/decomposition.py; else report/tables/severity.csv, whose gap intervals
give it back: sd = half-width x sqrt(n) / t(0.975, n - 1); the median over the comparisons), or DEFAULT_PAIRED_SD_PP: the quickstart's measured paired
SD of naive - bf16 final accuracy, 7.7 pp over n = 8 seeds (seeds 0-3 and 10-13; issue 35's replication).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

from bench.domains import num

#: sigma_d (pp) when no prior report of the sweep gives one (module docstring)
DEFAULT_PAIRED_SD_PP = 7.7
SIDED = (1, 2)


@dataclass
class PowerConfig:
    """`power.*`: what `--dry-run` plans the seed count for (bench/launch/power.py). Not part of a run's identity."""

    effect_pp: float = num(5.0, "(0, 100]")  # the smallest paired difference worth detecting, in pp of final accuracy
    # sigma_d, the SD of per-seed differences (pp)
    paired_sd_pp: Optional[float] = num(None, "(0, 100]", {None: "from the sweep's prior report, else 7.7"})
    alpha: float = num(0.05, "(0, 1)")  # family-wise level
    power: float = num(0.8, "(0, 1)")  # the chance to detect effect_pp
    # comparisons in the family (Holm): planned at alpha / tests
    tests: Optional[int] = num(None, "[1, 10000]", {None: "the sweep's own: its comparisons with naive (`naive_family`)"})
    sided: int = num(2, "[1, 2]")  # 1: directional hypotheses (arm > naive), 2: two-sided
    # the prior report whose paired SDs plan the seeds; None: <out_root>/<sweep>/report
    report: Optional[str] = None

    def check(self) -> None:
        if self.sided not in SIDED:
            raise ValueError(f"power.sided={self.sided} is not valid; choose one of: 1, 2")


def paired_power(n: int, effect: float, sd: float, alpha: float = 0.05, sided: int = 2) -> float:
    """The power of a paired t-test over n seed pairs to detect a mean difference `effect` (same units as sd)."""
    from scipy.stats import nct, t

    if n < 2 or not sd > 0 or not math.isfinite(effect):
        return float("nan")
    df, nc = n - 1, effect * math.sqrt(n) / sd
    crit = t.ppf(1 - alpha / sided, df)
    # the lower tail P(T < -crit) as the upper tail of -T (noncentrality -nc): scipy's nct.cdf(-crit, df, nc) is NaN
    # where that tail is negligible (nct.cdf(-12.7, 1, 8)), which made every two-sided plan there a NaN, read as
    # "not yet reached" by one search and "reached" by the other
    return float(nct.sf(crit, df, nc) + (nct.sf(crit, df, -nc) if sided == 2 else 0.0))


def _power(n: int, effect: float, sd: float, alpha: float, sided: int) -> float:
    """`paired_power`, refusing a NaN (a search that compares it would stop anywhere)."""
    value = paired_power(n, effect, sd, alpha, sided)
    if not math.isfinite(value):
        raise ValueError(f"no power for n={n}, effect {effect}, paired SD {sd}, alpha {alpha}, {sided}-sided")
    return value


def seeds_needed(effect: float, sd: float, alpha: float = 0.05, power: float = 0.8, sided: int = 2,
                 tests: int = 1, cap: int = 10_000) -> int:
    """The smallest n >= 2 whose paired t-test at alpha / tests reaches `power` for `effect` (module docstring)."""
    if not effect > 0:
        raise ValueError(f"effect {effect} must be > 0: there is no power to detect no difference")
    n = 2
    while _power(n, effect, sd, alpha / tests, sided) < power:
        n += 1
        if n > cap:
            raise ValueError(f"more than {cap} seeds needed for effect {effect} at paired SD {sd}")
    return n


def detectable_effect(n: int, sd: float, alpha: float = 0.05, power: float = 0.8, sided: int = 2, tests: int = 1) -> float:
    """The smallest effect n seed pairs detect with `power` (the inverse of seeds_needed), by bisection."""
    lo, hi = 0.0, 100.0 * sd
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _power(n, mid, sd, alpha / tests, sided) < power else (lo, mid)
    return hi


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _float(x: Any) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return float("nan")


def naive_family(configs: Iterable[Any]) -> int:
    """How many comparisons with naive a sweep's report will Holm-correct together (analysis/comparisons.py's "vs
    naive" family, per endpoint): every arm but naive and the baseline, at each rollout setting (sweep, precision,
    task, model) where naive runs too. A plan for one test, while the report corrects over 5 (the quickstart) or 9
    (the separation slice), promised 80 % power where the report's test has 35-46 %."""
    from bench.run.identity import BASELINE, NAIVE, RunId

    arms: dict[tuple, set] = {}
    for cfg in configs:
        rid = RunId.of(cfg)
        arms.setdefault((rid.sweep, rid.precision, rid.task, rid.model), set()).add((rid.method, rid.variant))
    return sum(len({a for a in here if a[0] not in (NAIVE, BASELINE)})
               for here in arms.values() if any(m == NAIVE for m, _ in here))


def prior_paired_sd(report_dir: Path) -> tuple[float, str] | None:
    """(sigma_d in pp, where it came from) from a prior report of the sweep, or None: the pooled SD (root mean square)
    of the per-seed differences of its final-accuracy comparisons with naive (paired.csv; every comparison where it
    has none with naive), else of those its paired gap intervals imply (severity.csv).

    Pooled, not the median: a sample SD from 4 seeds sits ~10 % below sigma on average (its variance is unbiased),
    and the comparisons planned for are those with naive, not the gaps to bf16 nor a collapsed arm's."""
    from scipy.stats import t

    from bench.run.identity import NAIVE

    paired, severity = report_dir / "tables" / "paired.csv", report_dir / "tables" / "severity.csv"
    sds: list[float] = []
    if paired.is_file():
        rows = [r for r in _rows(paired) if r.get("metric") == "sd_diff" and r.get("endpoint") == "final"]
        with_naive = [r for r in rows if r.get("b") == NAIVE]
        sds = [_float(r.get("value")) for r in (with_naive or rows)]  # long format: metric, value
        source = paired
    elif severity.is_file():
        for r in _rows(severity):  # long format: metric, value, lo, hi, n, interval
            lo, hi, n = (_float(r.get(k)) for k in ("lo", "hi", "n"))
            if r.get("metric") == "gap_to_bf16" and r.get("interval") == "paired t" and n >= 2:
                sds.append((hi - lo) / 2 * math.sqrt(n) / t.ppf(0.975, n - 1))
        source = severity
    sds = [s for s in sds if math.isfinite(s) and s > 0]
    if not sds:
        return None
    pooled = math.sqrt(sum(s * s for s in sds) / len(sds))
    return pooled, f"{source} (pooled over {len(sds)} paired comparisons)"


def power_lines(cfg: Any, seeds_per_arm: int, report_dir: Path, family: int = 1) -> tuple[list[str], bool]:
    """The dry run's lines about seeds and power, and whether the sweep has fewer seeds than it needs; `family`: the
    sweep's comparisons with naive (`naive_family`), the Holm family planned for unless power.tests says another."""
    p = cfg.power
    if p.report:
        report_dir = Path(str(p.report))
    if p.paired_sd_pp is not None:
        sd, source = float(p.paired_sd_pp), "power.paired_sd_pp"
    else:
        sd, source = prior_paired_sd(report_dir) or (DEFAULT_PAIRED_SD_PP, "the stated default (quickstart, n = 8)")
    tests = int(p.tests) if p.tests is not None else max(1, family)
    need = seeds_needed(p.effect_pp, sd, p.alpha, p.power, p.sided, tests)
    whose = "" if p.tests is not None else f", the sweep's {tests} comparison{'s' if tests > 1 else ''} with naive"
    level = f"{p.sided}-sided alpha {p.alpha:g}" + (f" / {tests} (Holm's first step{whose})" if tests > 1 else "")
    if seeds_per_arm >= 2:
        mde = detectable_effect(seeds_per_arm, sd, p.alpha, p.power, p.sided, tests)
        reach = f"which detect {mde:.1f} pp"
    else:  # one pair has no spread to estimate: a paired t-test needs n >= 2
        reach = "which allow no paired test (it needs 2 or more)"
    lines = [f"power: paired SD {sd:.2f} pp from {source}; {need} seeds give {100 * p.power:g} % power to detect "
             f"{p.effect_pp:g} pp (paired t, {level}); this sweep runs {seeds_per_arm} seed(s) per arm, {reach}"]
    if p.alpha != 0.05:  # qrl-analyze tests at 0.05 (analysis/inference.py ALPHA)
        lines.append(f"WARNING: power.alpha={p.alpha:g} plans a test the report does not make: qrl-analyze's "
                     "comparisons and their 'differs' are at alpha 0.05")
    short = seeds_per_arm < need
    if short:
        lines.append(f"WARNING: {seeds_per_arm} seed(s) per arm is fewer than the {need} needed for "
                     f"{p.effect_pp:g} pp (power.effect_pp): a difference that size is likely missed")
    return lines, short


__all__ = ["DEFAULT_PAIRED_SD_PP", "PowerConfig", "detectable_effect", "naive_family", "paired_power", "power_lines",
           "prior_paired_sd", "seeds_needed"]
