"""`--dry-run` lists a sweep's jobs, marks completed ones as skipped, and launches nothing."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from bench.launch.cli import execute
from bench.run.store import RunDir
from tests.helpers import cli, make_cfg

pytestmark = pytest.mark.slow


def test_dry_run_lists_jobs_and_skips_completed(tmp_path):
    # a completed run of one of the sweep's jobs (its config exactly the job's: another config would be refused)
    done = make_cfg(tmp_path, "+experiment=smoke", "method=tis", "task=countdown", "seed=1", fast=False)
    RunDir.of(done).start(OmegaConf.to_yaml(done, resolve=True), RunDir.name_of(done))
    RunDir.of(done).finish("completed")
    proc = cli("-m", "+experiment=smoke", f"out_root={tmp_path}", "--dry-run")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 36  # 6 arms x 2 tasks x 3 seeds
    skipped = [line for line in lines if line.startswith("skip")]
    assert len(skipped) == 1 and "tis@fp8_e4m3-countdown-tiny-s1" in skipped[0]
    assert str(RunDir.of(done).path) in skipped[0]
    assert "36 jobs: 35 to launch, 1 already finished" in proc.stderr
    assert sum(1 for _ in tmp_path.rglob("run.json")) == 1  # nothing was launched
    # a changed key: that job would be refused, and the summary says why (the launch's reason), not another one
    proc = cli("-m", "+experiment=smoke", f"out_root={tmp_path}", "train.lr=5e-4", "--dry-run")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [line.split()[0] for line in proc.stdout.splitlines()].count("refuse") == 1
    assert "36 jobs: 35 to launch, 0 already finished, 1 refused" in proc.stderr
    assert "refused (1): the run directory holds a run of another configuration (train.lr: " in proc.stderr
    # the way on works for a sweep's job: launched alone (a sweep refuses train.overwrite=true)
    assert "launch this run alone with train.overwrite=true" in proc.stderr
