"""A local sweep of vLLM runs on one worker (bench/launch/sweep_pool.py): each vLLM job runs in a fresh worker
process, so the second job's preflight (step (e): the rollout engine closed, the evaluation's engine built and
closed, the memory back) is not measured in a process that has already trained through vLLM, where a closed
engine's memory does not come back (docs/gpu.md, the vLLM preflight). Both jobs complete, each with every
preflight step a CPU runs passing."""

from __future__ import annotations

import re

import pytest

from tests.helpers import cli

pytestmark = pytest.mark.vllm

# fp8 rollouts (the naive arm's default precision) and the evaluation through vLLM at fp32: step (e) applies
RUN = ["rollout=vllm", "method=naive", "train.steps=1", "model.warmstart_steps=40", "model.warmstart_target_acc=null",
       "train.device=cpu", "train.threads=1", "tracking=disabled"]


def test_a_local_sweep_runs_each_vllm_job_in_a_fresh_worker(tmp_path):
    proc = cli("-m", *RUN, "seed=0,1", f"out_root={tmp_path}", "hydra.launcher.n_jobs=1", timeout=1500)
    logs = sorted(tmp_path.rglob("run.log"))
    texts = [log.read_text() for log in logs]
    assert proc.returncode == 0, proc.stderr[-3000:] + "".join(t[-3000:] for t in texts)
    assert len(logs) == 2
    pids = [re.findall(r"\(worker pid (\d+)\)", t) for t in texts]
    assert all(len(p) == 1 for p in pids) and pids[0] != pids[1], pids  # one job per worker process
    for text in texts:
        steps = re.findall(r"vLLM preflight \((\w)\) [^:]+: (\w+) \(", text)
        assert ("e", "ok") in steps and ("c", "ok") in steps, steps
