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
