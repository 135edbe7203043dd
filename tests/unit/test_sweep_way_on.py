"""The sweep's closing advice says what relaunching the same command does: it resumes or retries failed and stopped
jobs, and meets a refused one (a changed configuration, a directory it will not touch) again."""

from __future__ import annotations

from types import SimpleNamespace

from bench.launch.sweep_report import _way_on


def _jobs(*outcomes: str) -> list[SimpleNamespace]:
    return [SimpleNamespace(outcome={"outcome": o}) for o in outcomes]


def test_relaunching_is_advised_only_for_what_it_can_resume_or_retry():
    assert _way_on(_jobs("failed", "preempted"), None) == "relaunch the same command to resume or retry them"
    assert "would refuse them again" in _way_on(_jobs("bad_config", "bad_config"), None)
    mixed = _way_on(_jobs("bad_config", "failed", "refused"), None)
    assert "retry the others" in mixed and "the 2 refused need the change their line names" in mixed
    assert "retry the others" in _way_on(_jobs("bad_config"), 15)  # a stopped sweep: its unstarted jobs resume


def test_the_live_line_counts_a_job_a_signal_stopped_as_stopped_not_failed():
    from bench.launch.sweep_report import status_line

    jobs = [SimpleNamespace(state="done", outcome={"outcome": o}) for o in ("completed", "preempted", "failed")]
    jobs.append(SimpleNamespace(state="pending", outcome=None))
    line = status_line("s", jobs, 10.0, eta_text="1m")
    assert "1/4 done · 0 running · 1 failed · 1 stopped · 0 skipped · 1 pending" in line, line
    assert "stopped" not in status_line("s", jobs[:1], 10.0)
    # a signal came: the pending job will not start, so no ETA for it
    jobs.append(SimpleNamespace(state="running", outcome=None))
    stopping = status_line("s", jobs, 10.0, eta_text="1m", stopping=True)
    assert stopping.endswith("1 not started · stopping: waiting for the running jobs"), stopping
    refused = [SimpleNamespace(state="done", outcome={"outcome": o}) for o in ("completed", "bad_config")]
    assert "1/2 done · 0 running · 0 failed · 1 refused · 0 skipped" in status_line("s", refused, 10.0)


def test_a_cancelled_slurm_job_whose_run_checkpointed_is_reported_preempted(tmp_path):
    """`scancel` of a running job: submitit has no result (UncompletedJobError, state CANCELLED), while the run
    caught SLURM's SIGTERM, checkpointed and wrote run.json 'preempted': the summary says preempted, with both
    reasons, and keeps SLURM's state line (it kept only the first line, the result file's path)."""
    import json
    import os
    import time

    from bench.launch.launchers import _as_recorded
    from bench.launch.sweep_report import JobView, outcome_of

    class UncompletedJobError(RuntimeError):
        pass

    err = UncompletedJobError("Job 13_1 (task: 0) with path /x/13_1_0_result.pkl\nhas not produced any output "
                              "(state: CANCELLED by 0)\nError stream produced:\n...")
    outcome = outcome_of(err, "tis")
    assert outcome["reason"] == ("UncompletedJobError: Job 13_1 (task: 0) with path /x/13_1_0_result.pkl has not "
                                 "produced any output (state: CANCELLED by 0)")
    job = JobView(0, "tis", tmp_path, 600)
    since = time.time()
    (tmp_path / "run.json").write_text(json.dumps({"status": "preempted", "reason": "signal SIGTERM after 204 of 500 steps"}))
    recorded = _as_recorded(outcome, job, since - 1)
    assert recorded["outcome"] == "preempted" and recorded["code"] == 143
    assert recorded["reason"].startswith("signal SIGTERM after 204 of 500 steps (SLURM: UncompletedJobError: Job 13_1")
    os.utime(tmp_path / "run.json", (since - 60, since - 60))  # an earlier launch's run.json says nothing of this one
    # cancelled before its run wrote anything (queued, or starting): said in words, not submitit's internals
    recorded = _as_recorded(outcome, job, since)
    assert (recorded["outcome"], recorded["code"]) == ("failed", 1)
    assert recorded["reason"] == ("cancelled on SLURM before the run started (CANCELLED by 0); relaunching the same "
                                  "command runs it")
    other = outcome_of(RuntimeError("node lost"), "tis")
    assert _as_recorded(other, job, since) == other


def test_the_slurm_line_ends_a_job_that_left_the_queue_without_ending_its_run(tmp_path):
    """A job `scancel`led while pending (or one that died before its run wrote run.json) leaves squeue with no
    run record: the live line used to show it pending until the whole launch returned. A job never seen in the
    queue stays as it is (squeue may not list it yet), and one SLURM requeues is back in the queue: not ended."""
    import json
    import time

    from bench.launch.launchers import SlurmMonitor
    from bench.launch.sweep_report import JobView, LiveLine, counts

    views = [JobView(i, f"job{i}", tmp_path / f"run{i}", steps=4) for i in range(3)]
    for v in views:
        v.run_dir.mkdir()
    monitor = SlurmMonitor(views, LiveLine("s", views))
    monitor.started = time.time() - 1
    for v, state in zip(views, ("PENDING", "RUNNING", None)):
        monitor._update(v, state)
    assert [v.state for v in views] == ["pending", "running", "pending"]
    (views[1].run_dir / "run.json").write_text(json.dumps({"status": "completed"}))
    for v in views:  # all three out of the queue now
        monitor._update(v, None)
    assert [v.state for v in views] == ["done", "done", "pending"]
    assert views[0].outcome["outcome"] == "failed" and "left the SLURM queue" in views[0].outcome["reason"]
    assert views[1].outcome == {"outcome": "completed", "reason": None}
    assert counts(views) == {"done": 1, "running": 0, "failed": 1, "stopped": 0, "refused": 0, "skipped": 0, "pending": 1}
    monitor._update(views[0], "PENDING")  # requeued: in the queue again
    assert views[0].state == "pending" and views[0].outcome is None
