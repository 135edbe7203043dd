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
rows this is exactly the basic sweeper. `bench.dryrun` expands a sweep with the same `expand_rows`.
"""

from __future__ import annotations

import shlex
from typing import Any, Iterable, List, Optional, Sequence

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.types import Override


def override_key(override: str) -> str:
    """The key an override sets: `+a.b=1` -> `a.b`."""
    return override.split("=", 1)[0].lstrip("+~")


def expand_rows(rows: Iterable[str], jobs: Sequence[Sequence[str]]) -> list[list[str]]:
    """Every job: each row's overrides followed by each job of the Cartesian part; the job's keys win."""
    rows = [shlex.split(str(r)) for r in rows]
    if not rows:
        return [list(j) for j in jobs]
    out = []
    for row in rows:
        for job in jobs:
            keys = {override_key(o) for o in job}
            out.append([o for o in row if override_key(o) not in keys] + list(job))
    return out


class RowSweeper(BasicSweeper):
    """The basic sweeper with `rows` (see the module docstring)."""

    def __init__(self, max_batch_size: Optional[int] = None, params: Optional[dict] = None,
                 rows: Optional[Sequence[Any]] = None) -> None:
        super().__init__(max_batch_size=max_batch_size, params=params)
        self.rows = [str(r) for r in (rows or [])]

    def split_arguments(self, overrides: List[Override], max_batch_size: Optional[int]) -> List[List[List[str]]]:  # type: ignore[override]
        jobs = expand_rows(self.rows, BasicSweeper.split_arguments(overrides, None)[0])
        return [list(chunk) for chunk in BasicSweeper.split_overrides_to_chunks(jobs, max_batch_size)]


__all__ = ["RowSweeper", "expand_rows", "override_key"]
