"""One run on two processes (FSDP2 over gloo, CPU) trains the same numbers as on one, for every arm.

Both world sizes sample with `train.sampling_shards=2` (two prompt blocks with their own streams, bench/
distributed/engines.py), and the one-process run cuts its minibatch into the same two micro-batches each rank computes
(`train.micro_batch_size` = half the batch), so the forwards have the same shapes at both world sizes. What
differs is only where the gradient of the two halves is summed (FSDP's reduce-scatter instead of accumulation:
a + b either way) and the order of the sums behind the gradient norm and the weight-update diagnostics
(per shard, then across ranks): those agree to ~1e-7, everything else is identical.

Every arm runs once, the estimators taking turns (GRPO's and GAE's, each with about half the arms: the critic is
sharded and reduced like the policy whichever arm trains beside it), all in the same two processes, one launch, to
keep the test within a few minutes (every arm with both estimators took 442 s of a 2-core Xeon's CI run).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from bench.launch.cli import execute
from bench.registry import METHODS
from bench.run.store import RunDir
from tests.helpers import make_cfg, strip_times

pytestmark = pytest.mark.slow

ESTIMATORS = ("grpo", "gae")
SMALL = ["train.steps=2", "train.batch_size=8", "train.group_size=4", "train.eval_every=2", "train.checkpoint_every=1",
         "train.grad_clip=1e6", "algo.critic_lr=1e-4",
         "task.n_test=8", "tracking=disabled", "train.threads=1", "train.sampling_shards=2", "train.micro_batch_size=4"]
RTOL = 1e-6


def cases() -> list[tuple[str, str]]:
    return [(method, ESTIMATORS[i % len(ESTIMATORS)]) for i, method in enumerate(METHODS.names())]


def case_cfg(out_root: Path, method: str, adv: str):
    return make_cfg(out_root, *SMALL, f"method={method}", f"algo.advantage={adv}", f"sweep={method}-{adv}", fast=False)


def run_all(out_root: str) -> dict[str, str]:
    """Every case in this process (one rank of a group, or alone); returns {case: outcome}."""
    out = {}
    for method, adv in cases():
        out[f"{method}-{adv}"] = execute(case_cfg(Path(out_root), method, adv))  # an Outcome: the ranks leave together
    return out


def close(a: float, b: float) -> bool:
    return a == b or (math.isfinite(a) and math.isfinite(b) and abs(a - b) <= RTOL * max(abs(a), abs(b)))


def test_two_processes_train_what_one_does(tmp_path):
    from bench.distributed.group import launch_local

    one = run_all(str(tmp_path / "one"))
    two = launch_local(2, run_all, str(tmp_path / "two"))
    assert set(one.values()) == {"completed"} and two == one
    for method, adv in cases():
        runs = [RunDir.of(case_cfg(tmp_path / w, method, adv)) for w in ("one", "two")]
        for kind in ("metrics", "evals"):
            rows_1, rows_2 = (strip_times(getattr(r, kind)()) for r in runs)
            assert len(rows_1) == len(rows_2) > 0, (method, adv, kind)
            for r1, r2 in zip(rows_1, rows_2):
                assert r1.keys() == r2.keys(), (method, adv, set(r1) ^ set(r2))
                bad = {k: (r1[k], r2[k]) for k in r1 if not close(r1[k], r2[k])}
                assert not bad, (method, adv, r1["step"], bad)
        assert runs[0].info()["status"] == runs[1].info()["status"] == "completed"


#: settings the arms' sweep above leaves at their defaults, each run at both world sizes too: DAPO's refill rounds; a
#: reference model, sharded like the policy; gradient checkpointing under FSDP2, as every multi-GPU recipe runs it
#: (two arms, both estimators: the critic is checkpointed too)
EXTRA = {"dynamic": ["algo.dynamic_sampling=true", "algo.dynamic_sampling_max_rounds=3"],
         "reference": ["algo.kl_ref_beta=0.05", "train.steps=3"],
         "checkpointing-tis-grpo": ["train.gradient_checkpointing=true"],
         "checkpointing-ess-gae": ["method=ess", "algo.advantage=gae", "train.gradient_checkpointing=true"]}


def extra_cfg(out_root: Path, name: str):
    return make_cfg(out_root, *SMALL, "method=tis", *EXTRA[name], f"sweep=extra-{name}", fast=False)


def run_extra(out_root: str) -> dict[str, str]:
    return {name: execute(extra_cfg(Path(out_root), name)) for name in EXTRA}


def test_dynamic_sampling_a_reference_model_and_checkpointing_on_two_processes(tmp_path):
    from bench.distributed.group import launch_local

    one = run_extra(str(tmp_path / "one"))
    two = launch_local(2, run_extra, str(tmp_path / "two"))
    assert set(one.values()) == {"completed"} and two == one
    for name in EXTRA:
        runs = [RunDir.of(extra_cfg(tmp_path / w, name)) for w in ("one", "two")]
        rows_1, rows_2 = (strip_times(r.metrics()) for r in runs)
        assert len(rows_1) == len(rows_2) >= 2, name
        for r1, r2 in zip(rows_1, rows_2):
            assert r1.keys() == r2.keys(), (name, set(r1) ^ set(r2))
            bad = {k: (r1[k], r2[k]) for k in r1 if not close(r1[k], r2[k])}
            assert not bad, (name, r1["step"], bad)
        if name == "dynamic":
            assert all("sampling/rounds" in r for r in rows_1)
        elif name == "reference":  # the reference is the policy until the first update moves the policy away from it
            for i, r in enumerate(rows_1):
                moved = any(q["train/grad_norm"] > 0 for q in rows_1[:i])
                assert (r["method/tis/kl_ref"] != 0) == moved, (i, r["method/tis/kl_ref"], moved)


def rank_pids(parent: int) -> list[int]:
    """The rank processes a local launch spawned (children of `parent`, in start order; not the
    multiprocessing resource tracker)."""
    kids = []
    for task in Path(f"/proc/{parent}/task").iterdir():
        kids += [int(c) for c in (task / "children").read_text().split()]
    ranks = [k for k in sorted(kids) if b"resource_tracker" not in Path(f"/proc/{k}/cmdline").read_bytes()]
    return ranks


def test_signal_to_one_rank_checkpoints_all_and_resumes_at_another_world_size(tmp_path):
    """SIGUSR1 to rank 1 alone: both ranks checkpoint after the same step (the checkpoint is a collective:
    disagreeing ranks would hang), rank 0 marks the run preempted and the launch exits 128 + 10. The relaunch
    at world size 1 resumes from that checkpoint (model, optimizer, generator) and ends with the metrics of a
    one-process run that was never interrupted."""
    import signal
    import subprocess
    import sys

    from tests.hang import HANG_S, wait_until
    from tests.helpers import REPO

    args = [*SMALL, "train.steps=4", "method=tis", "algo.advantage=gae", "sweep=pre"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "disabled"}
    run = RunDir.of(make_cfg(tmp_path / "two", *args, fast=False))
    proc = subprocess.Popen([sys.executable, "-m", "bench", *args, "train.nproc_per_node=2",
                             f"out_root={tmp_path / 'two'}"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    wait_until("a first row", lambda: len(run.metrics()) >= 1, proc, every=0.2)
    ranks = rank_pids(proc.pid)
    assert len(ranks) == 2, ranks
    os.kill(ranks[1], signal.SIGUSR1)
    _, err = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 128 + signal.SIGUSR1, err[-3000:]
    info, ckpt = run.info(), run.load_checkpoint()
    assert info["status"] == "preempted" and ckpt["world_size"] == 2
    assert 1 <= ckpt["step"] < 4 and len(run.metrics()) == ckpt["step"]

    resumed = make_cfg(tmp_path / "two", *args, fast=False)  # the same run, now on one process
    assert execute(resumed) == "completed"
    reference = make_cfg(tmp_path / "one", *args, fast=False)
    assert execute(reference) == "completed"
    rows = [strip_times(RunDir.of(c).metrics()) for c in (resumed, reference)]
    assert len(rows[0]) == len(rows[1]) == 4
    for r1, r2 in zip(*rows):
        assert r1.keys() == r2.keys()
        assert not {k: (r1[k], r2[k]) for k in r1 if not close(r1[k], r2[k])}, r1["step"]
