"""PPO (critic + GAE) and DAPO's knobs in real runs on the embedded default (tiny Qwen2, arithmetic, CPU).

* A run interrupted by a preemption signal and relaunched ends with exactly the metrics and evaluations of an
  uninterrupted run, for PPO (the critic and its optimizer are in the checkpoint) and for DAPO (dynamic sampling's
  refill rounds are a pure function of seed, step and round). The same procedure as test_preemption.py.
* A short PPO run learns: greedy test accuracy rises. Measured (this machine, torch 2.13 CPU, one thread, 2-core
  box shared with other jobs): 39.2 % -> 45.4 % on 500 test problems after 60 steps of 64 prompts x 1 response,
  2 PPO epochs, critic lr 1e-3, ~100-210 s depending on the load. The run is deterministic for a given torch
  build, so the numbers repeat here; elsewhere the threshold leaves room (3 points, about 2 standard errors).
"""

from __future__ import annotations

import signal
import subprocess

import pytest

from bench.store import RunDir
from tests.helpers import FAST, REPO, strip_times
from tests.integration.test_preemption import bench_cmd, env, interrupt

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STEPS = 8
BASE = [a for a in FAST if not a.startswith(("train.steps=", "train.checkpoint_every=", "train.group_size=",
                                             "train.batch_size="))]
BASE += [f"train.steps={STEPS}", "train.checkpoint_every=100"]  # only the preemption checkpoint
CONFIGS = {
    "ppo": ["algo.advantage=gae", "train.group_size=1", "train.batch_size=16", "train.minibatches=2",
            "algo.critic_lr=1e-3"],
    "dapo": ["train.group_size=4", "train.batch_size=16", "algo.clip_eps_high=0.28", "algo.loss_agg=token-mean",
             "algo.dynamic_sampling=true", "algo.dynamic_sampling_max_rounds=3", "algo.overlong_penalty=true",
             "algo.overlong_buffer_len=3", "rollout.temperature=2.0"],
}


def run_dir(out_root) -> RunDir:
    return RunDir(out_root / "default" / "bf16" / "arithmetic" / "tiny" / "seed0")


@pytest.mark.parametrize("algo", list(CONFIGS))
def test_interrupted_run_resumes_to_the_uninterrupted_result(algo, tmp_path):
    args = [*BASE, *CONFIGS[algo]]
    ref_out, out = tmp_path / "ref", tmp_path / "run"
    done = subprocess.run(bench_cmd(*args, f"out_root={ref_out}"), cwd=REPO, env=env(), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    ref = run_dir(ref_out)
    assert ref.status == "completed" and len(ref.metrics()) == STEPS

    run = run_dir(out)
    first = interrupt(bench_cmd(*args, f"out_root={out}"), run, signal.SIGUSR1)
    assert first.returncode == 128 + signal.SIGUSR1, first.stderr[-3000:]
    ckpt = run.load_checkpoint()
    assert ckpt is not None and 3 <= ckpt["step"] < STEPS
    if algo == "ppo":
        assert set(ckpt["advantage"]["critic"]) == {"model", "optimizer", "grad_scaler"}
        assert ckpt["advantage"]["critic"]["optimizer"]["state"]  # Adam moments, not a fresh optimizer

    second = subprocess.run(bench_cmd(*args, f"out_root={out}"), cwd=REPO, env=env(), capture_output=True,
                            text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    assert run.info()["status"] == "completed" and run.info()["attempts"] == 2
    rows = run.metrics()
    assert strip_times(rows) == strip_times(ref.metrics())
    assert run.evals() == ref.evals()
    keys = set().union(*rows)
    if algo == "ppo":
        assert {"critic/vf_loss", "critic/vf_clipfrac", "critic/values_mean", "critic/returns_mean"} <= keys
    else:
        assert {"sampling/kept", "sampling/dropped", "sampling/rounds", "sampling/overlong_penalty_mean"} <= keys
        assert any(r["sampling/dropped"] > 0 for r in rows)  # the filter did something


def test_ppo_learns_on_the_embedded_default(tmp_path):
    args = ["algo.advantage=gae", "train.group_size=1", "train.batch_size=64", "train.steps=60", "train.epochs=2",
            "algo.critic_lr=1e-3", "train.eval_every=60", "task.n_test=500", "tracking=disabled", "train.threads=1",
            f"out_root={tmp_path}"]
    proc = subprocess.run(bench_cmd(*args), cwd=REPO, env=env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    evals = run_dir(tmp_path).evals()
    before, after = evals[0]["eval/accuracy"], evals[-1]["eval/accuracy"]
    assert [e["step"] for e in evals] == [0, 60]
    assert after >= before + 0.03, (before, after)
