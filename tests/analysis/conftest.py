"""Fixtures: a synthetic sweep with known values (+ broken run directories), and one CLI run over it.

The CLI run is session-scoped: rendering every figure takes seconds on the 2-core CI machine, and the
report, tables and figure tests all read the same output.
"""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pytest

from analysis import arms
from analysis.cli import main

from .synth import add_broken_runs, make_sweep


@pytest.fixture(autouse=True)
def _fresh_arm_declarations():
    """Each test starts with no arm/precision declarations learnt from run.json files of earlier tests."""
    arms.forget()
    yield
    arms.forget()


@pytest.fixture
def clean_sweep(tmp_path: Path) -> Path:
    """Only good runs (plus the diverged one and the truncated last line), function-scoped: tests may edit it."""
    return make_sweep(tmp_path / "sweep")


@pytest.fixture
def broken_sweep(tmp_path: Path) -> Path:
    root = make_sweep(tmp_path / "sweep")
    add_broken_runs(root)
    return root


@dataclass
class CliResult:
    rc: int
    stdout: str
    stderr: str
    sweep: Path
    out: Path


@pytest.fixture(scope="session")
def cli_run(tmp_path_factory: pytest.TempPathFactory) -> CliResult:
    root = make_sweep(tmp_path_factory.mktemp("cli") / "sweep")
    add_broken_runs(root)
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main([str(root)])
    return CliResult(rc, out.getvalue(), err.getvalue(), root, root / "report")
