"""`--dry-run` lists a sweep's jobs, marks completed ones as skipped, and launches nothing."""

from __future__ import annotations

import pytest

from bench.cli import execute
from bench.store import RunDir
from tests.helpers import cli, make_cfg

pytestmark = pytest.mark.slow


def test_dry_run_lists_jobs_and_skips_completed(tmp_path):
    done = make_cfg(tmp_path, "sweep=smoke", "method=tis", "task=countdown", "seed=1")
    assert execute(done) == "completed"
    proc = cli("-m", "+experiment=smoke", f"out_root={tmp_path}", "--dry-run", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 36  # 6 arms x 2 tasks x 3 seeds
    skipped = [line for line in lines if line.startswith("skip")]
    assert len(skipped) == 1 and "tis-countdown-tiny-s1" in skipped[0]
    assert str(RunDir.of(done).path) in skipped[0]
    assert "36 jobs: 35 to launch, 1 already finished" in proc.stderr
    assert sum(1 for _ in tmp_path.rglob("run.json")) == 1  # nothing was launched
