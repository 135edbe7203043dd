"""Checkpoints of a multi-process run: DCP directories written atomically, kill -9 of one rank, resume at the same
and at another world size (CPU, gloo, 2 ranks, the tiny model).

The reference for "resumes identically" is a one-process run with the same `train.sampling_shards=2` (it trains
the numbers of a 2-process run to ~1e-7, tests/integration/test_distributed.py), so each test runs one
2-process launch fewer.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import torch

from bench.launch.cli import execute
from bench.run.store import RunDir
from tests.hang import HANG_S, wait_until
from tests.helpers import REPO, make_cfg, strip_times
from tests.integration.test_distributed import SMALL, close, rank_pids

pytestmark = pytest.mark.slow

ARGS = [*SMALL, "train.steps=3", "method=tis", "algo.advantage=gae"]  # gae: the critic is checkpointed too
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "disabled",
       "QRL_DIST_TIMEOUT_MIN": str(10 * HANG_S // 60)}  # a rank waiting on a dead one: the hang guard trips first


def launch(out_root, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "bench", *ARGS, *extra, f"out_root={out_root}"], cwd=REPO, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def assert_same_rows(a: list[dict], b: list[dict]) -> None:
    a, b = strip_times(a), strip_times(b)
    assert len(a) == len(b) > 0
    for r1, r2 in zip(a, b):
        assert r1.keys() == r2.keys()
        assert not {k: (r1[k], r2[k]) for k in r1 if not close(r1[k], r2[k])}, r1["step"]


def test_kill_9_of_one_rank_ends_the_run_and_the_relaunch_resumes_identically(tmp_path):
    """kill -9 of rank 1 after the first checkpoints: the launch ends (no hang; its collective timeout is out of
    reach), the last checkpoint is a whole DCP directory (a torn one would be a temporary), and relaunching the
    same command on 2 processes finishes with the metrics of a run that was never interrupted."""
    run = RunDir.of(make_cfg(tmp_path / "two", *ARGS, "sweep=kill", fast=False))
    proc = launch(tmp_path / "two", "sweep=kill", "train.nproc_per_node=2")
    wait_until("2 rows", lambda: len(run.metrics()) >= 2, proc, every=0.1)
    ranks = rank_pids(proc.pid)
    assert len(ranks) == 2, ranks
    os.kill(ranks[1], signal.SIGKILL)
    # no hang: the launcher ends rank 0 when rank 1 dies. ENV's collective timeout is longer than the hang guard,
    # so only the launcher can end this launch before the guard trips (no wall-clock bound asserted)
    _, err = proc.communicate(timeout=HANG_S)
    assert proc.returncode != 0 and "SIGKILL" in err, err[-3000:]
    assert run.ckpt_file.is_dir() and run.ckpt_file.name == "last.dcp"
    ckpt = run.load_checkpoint()
    assert ckpt["world_size"] == 2 and 1 <= ckpt["step"] <= 2

    again = launch(tmp_path / "two", "sweep=kill", "train.nproc_per_node=2")
    _, err = again.communicate(timeout=HANG_S)
    assert again.returncode == 0, err[-3000:]
    assert f"resuming from step {ckpt['step']} (ckpt/last.dcp)" in err
    assert not list(run.path.glob("ckpt/*.tmp*"))

    reference = make_cfg(tmp_path / "one", *ARGS, "sweep=kill", fast=False)
    assert execute(reference) == "completed"
    assert_same_rows(run.metrics(), RunDir.of(reference).metrics())
    assert_same_rows(run.evals(), RunDir.of(reference).evals())


def test_one_process_checkpoint_resumes_on_two_processes(tmp_path):
    """1 -> 2: a one-process run's ckpt/prev.pt (step 2) resumed on 2 processes recomputes step 2 as the one
    process did (model, optimizer, critic, generator restored; sharded on load) and then checkpoints as a DCP
    directory, the one-process file rotating to prev. (2 -> 1 from a DCP directory: test_distributed.py's
    signal test.)"""
    args = [*ARGS, "sweep=across", "train.keep_checkpoint=true"]
    cfg = make_cfg(tmp_path, *args, fast=False)
    assert execute(cfg) == "completed"
    run = RunDir.of(cfg)
    reference = run.metrics()
    assert run.ckpt_file.name == "last.pt" and run.load_checkpoint(run.prev_ckpt_file)["step"] == 2
    run.update_info(status="failed")  # as if it had died during step 2

    two = launch(tmp_path, *args[len(ARGS):], "train.resume_from=previous", "train.nproc_per_node=2")
    _, err = two.communicate(timeout=HANG_S)
    assert two.returncode == 0, err[-3000:]
    assert "resuming from step 2 (ckpt/prev.pt)" in err
    assert run.ckpt_file.name == "last.dcp" and run.load_checkpoint()["world_size"] == 2
    assert run.prev_ckpt_file.name == "prev.pt" and not (run.path / "ckpt" / "last.pt").exists()
    assert_same_rows(run.metrics(), reference)


def test_dcp_directory_commit_is_atomic_and_loads_without_a_process_group(tmp_path):
    """RunDir's side: a DCP directory becomes ckpt/last.dcp only by a rename, the one before becomes prev.dcp,
    a directory without DCP's .metadata is refused as unreadable, and temporaries (torn directories) are
    removed at the next start."""
    import torch.distributed.checkpoint as dcp

    from bench.run.store import CheckpointError

    run = RunDir(tmp_path / "run")
    for step in (1, 2):
        tmp = run.path / "ckpt" / f"last.dcp.tmp{step}"
        dcp.save({"w": torch.full((3,), float(step))}, checkpoint_id=tmp)  # no process group: one writer
        torch.save({"step": step}, tmp / "extra.pt")
        run.commit_checkpoint(tmp)
    assert run.load_checkpoint()["step"] == 2 and run.load_checkpoint(run.prev_ckpt_file)["step"] == 1
    state = {"w": torch.zeros(3)}
    dcp.load(state, checkpoint_id=run.load_checkpoint()["dcp"])
    assert state["w"].tolist() == [2.0] * 3

    torn = run.path / "ckpt" / "last.dcp.tmp3"
    torn.mkdir()
    (torn / "__0_0.distcp").write_bytes(b"half")
    assert run.load_checkpoint()["step"] == 2  # the temporary is never read
    assert torn in run.clean_temporaries() and not torn.exists()

    (run.ckpt_file / ".metadata").unlink()
    with pytest.raises(CheckpointError, match="last.dcp is unreadable"):
        run.load_checkpoint()
    run.drop_checkpoint()
    assert not list((run.path / "ckpt").iterdir())


def test_tensor_states_round_trip_and_an_unstepped_optimizer_stays_unstepped(tmp_path):
    """The DCP state dicts of a run, saved and read back by one process (no process group, as a 2 -> 1 resume
    reads them): weights and AdamW moments come back exactly. An optimizer that has not stepped yet (dynamic
    sampling kept no group) is given back its empty state after the save and after the load, so that its next
    step's bias correction is the uninterrupted run's."""
    from types import SimpleNamespace

    import torch.distributed.checkpoint as dcp

    from bench.advantages import GRPOAdvantage
    from bench.checkpoint import TrainState, load_shards
    from bench.compute import TrainerCompute

    def run_state(seed: int) -> TrainState:
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
        return TrainState(policy=model, optimizer=torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.1),
                          generator=torch.Generator().manual_seed(seed), seed=seed,
                          compute=TrainerCompute(torch.device("cpu"), "fp32", 1.0),
                          advantage=GRPOAdvantage(SimpleNamespace(), SimpleNamespace(group_size=2)))

    p = run_state(0)
    before = [t.clone() for t in p.policy.parameters()]
    fresh = p.unstepped()
    dcp.save(p.tensor_states(), checkpoint_id=tmp_path / "a")
    p.forget_states(fresh)
    assert fresh == ["optimizer"] and not p.optimizer.state
    assert all(torch.equal(a, b) for a, b in zip(before, p.policy.parameters()))  # the zero-lr step moved nothing

    p.policy(torch.randn(5, 4)).sum().backward()
    p.optimizer.step()
    dcp.save(p.tensor_states(), checkpoint_id=tmp_path / "b")
    q = run_state(1)
    load_shards(q, {"dcp": str(tmp_path / "b"), "unstepped": []})
    assert all(torch.equal(a, b) for a, b in zip(p.policy.parameters(), q.policy.parameters()))
    for a, b in zip(p.optimizer.state.values(), q.optimizer.state.values()):
        assert all(torch.equal(a[k], b[k]) for k in ("exp_avg", "exp_avg_sq", "step"))
    r = run_state(2)
    load_shards(r, {"dcp": str(tmp_path / "a"), "unstepped": ["optimizer"]})
    assert not r.optimizer.state and all(torch.equal(a, b) for a, b in zip(before, r.policy.parameters()))


# ----------------------------------------------------------------------- signals to the launcher of a local run
def _launched(out_root, sweep: str) -> tuple[subprocess.Popen, RunDir, list[int]]:
    """A 2-rank run of many steps, in a session of its own (so that a test can signal its process group as a
    terminal's Ctrl-C does), once it has trained 2 steps; with its rank PIDs."""
    args = [*SMALL, "train.steps=200", "train.checkpoint_every=50", "method=tis", f"sweep={sweep}"]
    run = RunDir.of(make_cfg(out_root, *args, fast=False))
    proc = subprocess.Popen([sys.executable, "-m", "bench", *args, "train.nproc_per_node=2", f"out_root={out_root}"],
                            cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    wait_until("2 rows", lambda: len(run.metrics()) >= 2, proc, every=0.1)
    ranks = rank_pids(proc.pid)
    assert len(ranks) == 2, ranks
    return proc, run, ranks


def _gone(pids: list[int]) -> bool:
    return not any(os.path.exists(f"/proc/{p}") and open(f"/proc/{p}/stat").read().split()[2] != "Z" for p in pids)


@pytest.mark.parametrize("how", ["kill_launcher", "ctrl_c_to_the_group"])
def test_a_signal_to_the_launcher_reaches_each_rank_once_and_the_run_checkpoints(tmp_path, how):
    """SIGTERM to the launcher alone (`kill PID`, a local sweep passing its signal on) and SIGINT to its process group
    (a terminal's Ctrl-C): the ranks checkpoint after the same step and the launch exits 128 + N with the run
    'preempted', long before its 200 steps. Before, the launcher alone stopped ("before training started; nothing
    was written") while its ranks trained to the end, and a Ctrl-C reached each rank twice (stop now, no
    checkpoint)."""
    proc, run, ranks = _launched(tmp_path, how)
    sig = signal.SIGTERM if how == "kill_launcher" else signal.SIGINT
    if how == "kill_launcher":
        os.kill(proc.pid, sig)
    else:
        os.killpg(proc.pid, sig)
    _, err = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 128 + sig, err[-3000:]
    assert "before training started" not in err and f"stopped by {sig.name} after" in err and ", checkpointed;" in err
    info, ckpt = run.info(), run.load_checkpoint()
    assert info["status"] == "preempted" and info["reason"].startswith(f"signal {sig.name} after ") and "steps" in info["reason"]
    assert 2 <= ckpt["step"] < 200 and len(run.metrics()) == ckpt["step"]
    wait_until("the ranks end", lambda: _gone(ranks), None, every=0.2)


def test_kill_9_of_the_launcher_ends_its_ranks_with_a_checkpoint(tmp_path):
    """The launcher killed (kill -9): each rank gets the kernel's SIGTERM (PR_SET_PDEATHSIG), checkpoints with the
    other and ends; none is left training, or waiting for a launcher that is gone. Before, the ranks got torch's
    SIGINT twice (no checkpoint) and then waited in a collective until its 10-minute timeout."""
    proc, run, ranks = _launched(tmp_path, "orphans")
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=HANG_S)  # the ranks hold the pipes: they must have ended too
    wait_until("the ranks end", lambda: _gone(ranks), None, every=0.2)
    info, ckpt = run.info(), run.load_checkpoint()
    assert info["status"] == "preempted" and info["reason"].startswith("signal SIGTERM after ") and "steps" in info["reason"], info
    assert 2 <= ckpt["step"] < 200 and len(run.metrics()) == ckpt["step"]
