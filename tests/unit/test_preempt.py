"""PreemptionGuard with real signals sent to this process (no mocks of the signal machinery)."""

from __future__ import annotations

import os
import signal

import pytest

from bench.run.preempt import PreemptionGuard, Stopped, stop_on_signals, submitit_preempt_signal


def test_signal_is_recorded_not_acted_on_and_handlers_are_restored():
    before = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGTERM)}
    with PreemptionGuard() as guard:
        assert not guard.requested and guard.signal_name is None
        os.kill(os.getpid(), signal.SIGTERM)  # would kill the test process without the guard
        assert guard.requested and guard.signal_name == "SIGTERM"
        os.kill(os.getpid(), signal.SIGUSR1)  # a second signal does not change who asked first
        assert guard.signal_name == "SIGTERM"
    assert {s: signal.getsignal(s) for s in before} == before


def test_exit_without_a_previous_handler_is_nonzero():
    with PreemptionGuard() as guard:
        os.kill(os.getpid(), signal.SIGUSR1)
        with pytest.raises(SystemExit) as exc:
            guard.exit_after_checkpoint()
    assert exc.value.code == 128 + signal.SIGUSR1


def test_exit_chains_to_the_previously_installed_handler():
    """Like submitit's requeue handler: called with the signal once the checkpoint is written."""
    calls = []

    class Requeued(Exception):
        pass

    def submitit_like(signum, frame):
        calls.append(signum)
        raise Requeued  # submitit ends with sys.exit(-1) after `scontrol requeue`

    old = signal.signal(signal.SIGUSR1, submitit_like)
    try:
        with PreemptionGuard() as guard:
            os.kill(os.getpid(), signal.SIGUSR1)
            assert calls == []  # nothing happens before the checkpoint
            with pytest.raises(Requeued):
                guard.exit_after_checkpoint()
        assert calls == [signal.SIGUSR1]
        assert signal.getsignal(signal.SIGUSR1) is submitit_like
    finally:
        signal.signal(signal.SIGUSR1, old)


def test_a_handler_that_returns_still_ends_in_exit():
    """submitit only logs SIGTERM ("bypass"); the run must still stop after its checkpoint."""
    seen = []
    old = signal.signal(signal.SIGTERM, lambda s, f: seen.append(s))
    try:
        with PreemptionGuard() as guard:
            os.kill(os.getpid(), signal.SIGTERM)
            with pytest.raises(SystemExit) as exc:
                guard.exit_after_checkpoint()
        assert seen == [signal.SIGTERM] and exc.value.code == 128 + signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, old)


@pytest.mark.parametrize("rank, code", [("0", 128 + signal.SIGUSR1), ("1", 0)])
def test_the_other_ranks_of_a_slurm_job_leave_the_requeue_to_rank_0(monkeypatch, rank, code):
    """On ranks > 0 submitit's handler returns without requeueing; their exit must not be non-zero, or srun
    (--kill-on-bad-exit) kills rank 0 while it closes the run and requeues the job."""
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    monkeypatch.setenv("SUBMITIT_PREEMPT_SIGNAL", "USR1")
    monkeypatch.setenv("RANK", rank)
    seen = []
    old = signal.signal(signal.SIGUSR1, lambda s, f: seen.append(s))  # submitit's handler on a rank > 0: it returns
    try:
        with PreemptionGuard() as guard:
            os.kill(os.getpid(), signal.SIGUSR1)
            with pytest.raises(SystemExit) as exc:
                guard.exit_after_checkpoint()
        assert seen == [signal.SIGUSR1] and exc.value.code == code
    finally:
        signal.signal(signal.SIGUSR1, old)


def test_submitit_preemption_signal_is_also_caught(monkeypatch):
    monkeypatch.delenv("SUBMITIT_EXECUTOR", raising=False)
    assert submitit_preempt_signal() is None
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    monkeypatch.delenv("SUBMITIT_PREEMPT_SIGNAL", raising=False)
    assert submitit_preempt_signal() == signal.SIGUSR2  # submitit's default
    assert signal.SIGUSR2 in PreemptionGuard().signals
    monkeypatch.setenv("SUBMITIT_PREEMPT_SIGNAL", "USR1")  # what our SLURM launcher sets
    assert PreemptionGuard().signals == (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)


def test_ctrl_c_is_a_preemption_and_a_second_one_stops_at_once():
    with PreemptionGuard() as guard:
        os.kill(os.getpid(), signal.SIGINT)  # would raise KeyboardInterrupt without the guard
        assert guard.requested and guard.signal_name == "SIGINT"
        with pytest.raises(Stopped) as exc:
            os.kill(os.getpid(), signal.SIGINT)
    assert exc.value.signum == signal.SIGINT and not exc.value.checkpointed
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_stop_on_signals_unwinds_the_job_and_marks_a_checkpointed_stop():
    """bench.launch.cli's handler around a job: a signal outside the training loop raises Stopped at once; inside
    it, the guard hands over to it after the checkpoint, marked as checkpointed."""
    with stop_on_signals():
        with pytest.raises(Stopped) as outside:
            os.kill(os.getpid(), signal.SIGTERM)
        assert outside.value.signum == signal.SIGTERM and not outside.value.checkpointed
        with PreemptionGuard() as guard:
            os.kill(os.getpid(), signal.SIGUSR1)
            with pytest.raises(Stopped) as inside:
                guard.exit_after_checkpoint()
        assert inside.value.signum == signal.SIGUSR1 and inside.value.checkpointed
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_stop_on_signals_leaves_handlers_someone_installed():
    mine = lambda s, f: None  # noqa: E731  (submitit's requeue handler, say)
    old = signal.signal(signal.SIGUSR1, mine)
    try:
        with stop_on_signals():
            assert signal.getsignal(signal.SIGUSR1) is mine
            assert signal.getsignal(signal.SIGUSR1) is not signal.getsignal(signal.SIGTERM)
        assert signal.getsignal(signal.SIGUSR1) is mine
    finally:
        signal.signal(signal.SIGUSR1, old)


def test_a_signal_during_the_build_or_the_preflight_closes_the_engines_and_leaves_no_directory(tmp_path, monkeypatch):
    """SIGTERM while a vLLM run was in its preflight: 'nothing was written', yet Hydra's empty run directory stayed,
    and the engine was left to vLLM's atexit shutdown (a traceback, "Invalid process group specified")."""
    from types import SimpleNamespace

    import bench.launch.vllm_preflight as vllm_preflight
    import bench.train
    from bench.launch.cli import execute
    from bench.run.store import RunDir
    from tests.helpers import make_cfg

    cfg = make_cfg(tmp_path, "tracking=disabled")
    RunDir.of(cfg).path.mkdir(parents=True)  # as Hydra makes hydra.run.dir before the job starts
    closed: list[str] = []
    engine = SimpleNamespace(close=lambda: closed.append("engine"))
    monkeypatch.setattr(bench.train, "build", lambda cfg: SimpleNamespace(engine=engine, eval_engine=engine))
    monkeypatch.setattr(vllm_preflight, "applies", lambda cfg: True)

    def preflight(parts, say):
        raise Stopped(signal.SIGTERM)

    monkeypatch.setattr(vllm_preflight, "preflight", preflight)
    outcome = execute(cfg)
    assert outcome == "interrupted" and outcome.code == 128 + signal.SIGTERM
    assert closed == ["engine"]  # once: the evaluation engine is the rollout engine here
    assert not (tmp_path / "default").exists()
