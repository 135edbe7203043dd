"""Preemption and resume with the real trainer: signal a run mid-way, relaunch, compare with an uninterrupted run.

The trainer (bench/train.py) polls bench.run.preempt.PreemptionGuard after every step: on SIGUSR1/SIGTERM it
checkpoints, marks run.json "preempted" and exits non-zero (outside SLURM; under SLURM submitit requeues it,
see test_slurm.py). Relaunching the same command resumes from the checkpoint and must end with exactly the
metrics of a run that was never interrupted (all keys but the wall-clock time/* namespace).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bench.run.store import RunDir
from bench.methods import arm_precision
from tests.hang import HANG_S
from tests.helpers import FAST, REPO, strip_times
from tests.integration import signals
from tests.integration.wandb_readback import history, offline_runs

pytestmark = pytest.mark.slow

STEPS = 10
ARGS = [a for a in FAST if not a.startswith(("train.steps=", "train.checkpoint_every=", "tracking="))]
ARGS += [f"train.steps={STEPS}", "train.checkpoint_every=100", "tracking=offline"]  # no periodic checkpoint


def env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "WANDB_MODE": "offline", "WANDB_SILENT": "true"}


def bench_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "bench", *args]


def run_dir(out_root: Path, method: str = "bf16") -> RunDir:
    return RunDir(out_root / "default" / f"{method}@{arm_precision(method)}" / "arithmetic" / "tiny" / "seed0")


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, RunDir]:
    """Uninterrupted runs, one per method used below."""
    out = tmp_path_factory.mktemp("reference")
    refs = {}
    for method in ("bf16", "tis"):
        proc = subprocess.run(bench_cmd(*ARGS, f"method={method}", f"out_root={out}"), cwd=REPO, env=env(),
                              capture_output=True, text=True, timeout=HANG_S)
        assert proc.returncode == 0, proc.stderr[-3000:]
        refs[method] = run_dir(out, method)
        assert refs[method].status == "completed" and len(refs[method].metrics()) == STEPS
    return refs


def interrupt(cmd: list[str], run: RunDir, sig: signal.Signals, after_rows: int = 3) -> subprocess.CompletedProcess:
    """Start `cmd`, send `sig` once metrics.jsonl has `after_rows` rows (frozen meanwhile), wait for it to exit."""
    return signals.interrupt(cmd, run, sig, after_rows, env=env())


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM], ids=["SIGUSR1", "SIGTERM"])
def test_interrupted_run_resumes_to_the_uninterrupted_result(tmp_path, reference, sig):
    cmd = bench_cmd(*ARGS, "method=bf16", f"out_root={tmp_path}")
    run = run_dir(tmp_path)

    first = interrupt(cmd, run, sig)
    assert first.returncode == 128 + sig, first.stderr[-3000:]
    info = run.info()
    assert info["status"] == "preempted" and sig.name in info["reason"], info
    done = len(run.metrics())
    assert 3 <= done < STEPS  # stopped mid-way, after the step it was in
    ckpt = run.load_checkpoint()
    assert ckpt is not None and ckpt["step"] == done  # the checkpoint is the preemption's, not a periodic one
    wandb_id = info["wandb_id"]

    second = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=HANG_S)
    assert second.returncode == 0, second.stderr[-3000:]
    info = run.info()
    assert info["status"] == "completed" and info["attempts"] == 2
    ref = reference["bf16"]
    assert strip_times(run.metrics()) == strip_times(ref.metrics())
    assert run.evals() == ref.evals()

    # the W&B mirror: one run id across both attempts, and together they hold exactly metrics.jsonl
    assert info["wandb_id"] == wandb_id
    attempts = offline_runs(run.path)
    assert len(attempts) == 2 and all(wandb_id in a.name for a in attempts)
    rows = run.metrics()
    logged = {h["_step"]: h for a in attempts for h in history(a)}
    assert [{k: logged[r["step"]][k] for k in r} for r in rows] == rows

    # relaunching a completed run skips it and changes nothing
    before = (run.metrics_file.read_text(), run.info()["attempts"])
    third = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=HANG_S)
    assert third.returncode == 0 and "already completed" in third.stderr, third.stderr[-2000:]
    assert (run.metrics_file.read_text(), run.info()["attempts"]) == before


def test_relaunched_sweep_skips_completed_and_resumes_interrupted(tmp_path, reference):
    """Through the default (local, parallel) launcher: bf16 already completed, tis preempted mid-way."""
    done = subprocess.run(bench_cmd(*ARGS, "method=bf16", f"out_root={tmp_path}"), cwd=REPO, env=env(),
                          capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stderr[-3000:]
    bf16, tis = run_dir(tmp_path, "bf16"), run_dir(tmp_path, "tis")
    bf16_before = bf16.metrics_file.read_text()
    first = interrupt(bench_cmd(*ARGS, "method=tis", f"out_root={tmp_path}"), tis, signal.SIGTERM)
    assert first.returncode == 128 + signal.SIGTERM and tis.status == "preempted", first.stderr[-3000:]

    sweep = subprocess.run(bench_cmd("-m", *ARGS, "method=bf16,tis", f"out_root={tmp_path}"), cwd=REPO, env=env(),
                           capture_output=True, text=True, timeout=HANG_S)
    assert sweep.returncode == 0, sweep.stdout[-2000:] + sweep.stderr[-3000:]
    assert "local worker processes" in sweep.stdout + sweep.stderr  # the local launcher ran it
    assert bf16.metrics_file.read_text() == bf16_before and bf16.info()["attempts"] == 1
    assert tis.status == "completed" and tis.info()["attempts"] == 2
    assert strip_times(tis.metrics()) == strip_times(reference["tis"].metrics())
