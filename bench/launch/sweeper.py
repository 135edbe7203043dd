"""`hydra/sweeper=rows`: a sweep given as explicit rows, each row crossed with the usual comma-separated params.

A paper's table is not a Cartesian product: QuRL Table 1 is BF16 once plus three arms at INT8 and at FP8, and its
Table 4 varies the learning rate for one arm and the UAQ scale for another. Hydra's basic sweeper can only
multiply lists, so a recipe lists its table's rows instead, each in command-line override syntax:

    hydra:
      sweeper:
        rows:
          - method=bf16
          - method=fp8 rollout.precision=int8
        params:
          seed: 0,1,2          # crossed with every row (and so is a comma list on the command line)

Jobs = for each row, for each combination of `params` and command-line overrides: the row's overrides, then the
combination's. A command-line override of a key that a row sets replaces the row's value for that key. With no
rows this is exactly the basic sweeper. It is the default sweeper (conf/config.yaml), so every multirun gets:

Variants. Jobs that agree on every identity axis (method, rollout precision, task, model, seed, sweep) but set
another result-changing key differently (`-m train.lr=1e-4,3e-4`, or QuRL Table 4's rows) would share one run
directory. `assign_variants` gives each of them `variant=<key>=<value>[,...]` (the keys they differ in), which
bench/run/identity.py makes a level of the run path: `.../tis@int8/arithmetic/tiny/train.lr=3e-4/seed0`.
Arms of a fixed precision. `bf16` and `fp16` roll out in their own precision (METHODS meta `precision`), so a
sweep over arms x precisions (`-m method=bf16,naive,tis rollout.precision=int8,fp8_e4m3`) runs each of them once,
at its own precision, beside every other arm at every swept precision (`fold_fixed_precisions`): 1 + 2 x 2 jobs,
and a note says so. A single run that asks `method=bf16 rollout.precision=int8` is still refused
(bench/launch/config.py check_across): there the user named that combination.

`sweep_jobs` is the whole expansion (rows, fixed precisions, variants): the sweeper launches its jobs, the dry run
lists them and the pre-launch check (bench/launch/overrides.py) validates them, so all three see the same jobs.
"""

from __future__ import annotations

import re
import shlex
import sys
from collections import defaultdict
from typing import Any, Callable, Iterable, List, Optional, Sequence

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.types import Override
from omegaconf import OmegaConf

from bench.run.identity import is_semantic

#: override keys that make up a run's identity (besides `variant` itself): jobs differing here never collide
IDENTITY_OVERRIDES = ("method", "rollout.precision", "task", "model", "seed", "sweep", "out_root", "variant")
_UNSAFE = re.compile(r"[^A-Za-z0-9._=,+-]")


def override_key(override: str) -> str:
    """The key an override sets: `+a.b=1` -> `a.b`."""
    return override.split("=", 1)[0].lstrip("+~")


def as_hydra_renders(override: str) -> str:
    """An override with its value as Hydra writes a command line's (`train.lr=1.5e-6` -> `train.lr=1.5e-06`), so that a
    row and a command line that set one value name one variant folder; an override it cannot parse stays as written
    (Hydra reports it)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    if "=" not in override:
        return override
    try:
        parsed = OverridesParser.create().parse_override(override)
    except HydraException:
        return override
    if parsed.is_sweep_override():
        return override
    return f"{override.split('=', 1)[0]}={parsed.get_value_element_as_str()}"


def expand_rows(rows: Iterable[str], jobs: Sequence[Sequence[str]]) -> list[list[str]]:
    """Every job: each row's overrides (as Hydra renders them) followed by each job of the Cartesian part; the job's
    keys win."""
    rows = [[as_hydra_renders(o) for o in shlex.split(str(r))] for r in rows]
    if not rows:
        return [list(j) for j in jobs]
    out = []
    for row in rows:
        for job in jobs:
            keys = {override_key(o) for o in job}
            out.append([o for o in row if override_key(o) not in keys] + list(job))
    return out


def _settings(job: Sequence[str]) -> dict[str, str]:
    """{key: value} of a job's overrides (the last one of a key wins)."""
    out = {}
    for o in job:
        if "=" in o:
            key, value = o.split("=", 1)
            out[key.lstrip("+~")] = value
    return out


def assign_variants(jobs: Sequence[Sequence[str]], default_of: Callable[[str], Any]) -> list[list[str]]:
    """Each job, with `variant=...` appended where it would otherwise share its run directory with another job.

    Jobs are grouped by their identity overrides; within a group, the semantic keys (bench.run.identity.is_semantic)
    whose values are not all equal name the variant, `<key>=<value>` joined by commas, sorted by key. A job that
    does not set such a key shows the sweep's value for it (`default_of(key)`), or 'default' where the sweep's config
    has no such key (a key of another arm's schema: a row that means a value should name it).
    """
    out = [list(j) for j in jobs]
    settings = [_settings(j) for j in jobs]
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, s in enumerate(settings):
        groups[tuple(s.get(k) for k in IDENTITY_OVERRIDES)].append(i)
    for idxs in groups.values():
        if len(idxs) < 2:
            continue
        others = [{k: v for k, v in settings[i].items()
                   if k not in IDENTITY_OVERRIDES and is_semantic(k) and not k.startswith(("hydra", "experiment"))}
                  for i in idxs]
        keys = sorted(k for k in set().union(*others) if len({o.get(k) for o in others}) > 1)
        for i, o in zip(idxs, others):
            if keys:
                label = ",".join(f"{k}={o[k] if k in o else default_of(k)}" for k in keys)
                out[i].append(f"variant='{_UNSAFE.sub('_', label)}'")
    return out


def fold_fixed_precisions(jobs: Sequence[Sequence[str]], default_of: Callable[[str], Any],
                          fixed_precision: Callable[[str], str | None]) -> tuple[list[list[str]], list[str]]:
    """The jobs with each fixed-precision arm at its own precision, duplicates dropped (first kept), and one note
    per such arm that a swept precision did not apply to. `fixed_precision(method)` is the arm's precision or None;
    a job that does not set `method` runs the sweep's (`default_of("method.name")`)."""
    out, seen, asked = [], set(), defaultdict(list)
    for job in jobs:
        settings = _settings(job)
        method = str(settings.get("method") or default_of("method.name"))
        fixed = fixed_precision(method)
        precision = settings.get("rollout.precision")
        if fixed is not None and precision is not None and precision != fixed:
            if precision not in asked[method]:
                asked[method].append(precision)
            job = [f"rollout.precision={fixed}" if override_key(o) == "rollout.precision" else o for o in job]
        if tuple(job) not in seen:
            seen.add(tuple(job))
            out.append(list(job))
    notes = [f"method={m} rolls out in {fixed_precision(m)} only: it runs once at rollout.precision="
             f"{fixed_precision(m)} instead of at rollout.precision={','.join(p)}" for m, p in asked.items()]
    return out, notes


def arm_fixed_precision(method: str) -> str | None:
    """The precision an arm is fixed to (`@METHODS.register(..., precision=...)`), None for the others and for a
    name that is no arm (Hydra reports that one)."""
    from bench.registry import METHODS

    return METHODS.entry(method).meta.get("precision") if method in METHODS else None


def sweep_jobs(rows: Iterable[str], jobs: Sequence[Sequence[str]], config: Any) -> tuple[list[list[str]], list[str]]:
    """Every job a sweep launches, in order, and the notes to print: `rows` crossed with the Cartesian `jobs`,
    fixed-precision arms folded, variants assigned (see the module docstring). `config`: the sweep's own config."""
    default_of = sweep_default(config)
    folded, notes = fold_fixed_precisions(expand_rows(rows, jobs), default_of, arm_fixed_precision)
    return assign_variants(folded, default_of), notes


def expand(overrides: Sequence[str], compose: Callable[..., Any], cfg: Any = None) -> tuple[list[list[str]], list[str]]:
    """`sweep_jobs` of a command line (the -m overrides), as the sweeper will expand it: its config `cfg` (composed
    here from the overrides that are not swept when not given, with `compose`, inside Hydra's initialize_config_dir)
    gives the rows and `hydra.sweeper.params`; params come first, then the command line's overrides (Hydra's
    BasicSweeper.sweep)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    if cfg is None:
        fixed = [o for o in overrides if not parser.parse_override(o).is_sweep_override()]
        cfg = compose("config", overrides=fixed, return_hydra_config=True)
    params = [f"{k}={v}" for k, v in (cfg.hydra.sweeper.get("params") or {}).items()]
    rows = [str(r) for r in (cfg.hydra.sweeper.get("rows") or [])]
    jobs = BasicSweeper.split_arguments(parser.parse_overrides(params + list(overrides)), max_batch_size=None)[0]
    return sweep_jobs(rows, jobs, cfg)


def sweep_default(config: Any) -> Callable[[str], Any]:
    """The value a key has in the sweep's own config (for a job that does not override it), or 'default'."""
    return lambda key: OmegaConf.select(config, key, default="default", throw_on_missing=False) if config is not None else "default"


class RowSweeper(BasicSweeper):
    """The basic sweeper with `rows` (see the module docstring)."""

    def __init__(self, max_batch_size: Optional[int] = None, params: Optional[dict] = None,
                 rows: Optional[Sequence[Any]] = None) -> None:
        super().__init__(max_batch_size=max_batch_size, params=params)
        self.rows = [str(r) for r in (rows or [])]

    def split_arguments(self, overrides: List[Override], max_batch_size: Optional[int]) -> List[List[List[str]]]:  # type: ignore[override]
        jobs, notes = sweep_jobs(self.rows, BasicSweeper.split_arguments(overrides, None)[0], getattr(self, "config", None))
        for note in notes:
            print(f"qrl-bench: note: {note}", file=sys.stderr, flush=True)
        return [list(chunk) for chunk in BasicSweeper.split_overrides_to_chunks(jobs, max_batch_size)]


__all__ = ["RowSweeper", "as_hydra_renders", "assign_variants", "expand", "expand_rows", "fold_fixed_precisions",
           "override_key", "sweep_default", "sweep_jobs"]
