"""W&B mirror (bench/run/tracking.py), checked with real offline W&B runs read back by wandb's own CLI.

Read back with `wandb leet inspect --json` (tests/integration/wandb_readback.py).
"""

from __future__ import annotations

import math
import os
import warnings
from typing import Any

import pytest

from bench.run.tracking import Tracker, WandbTracker, start_tracking, tracking_mode
from tests.helpers import make_cfg
from tests.integration.wandb_readback import history, inspect_records, offline_runs


def same(a: dict, b: dict) -> bool:
    """Row equality where NaN == NaN (json and W&B both keep NaN)."""
    return a.keys() == b.keys() and all(
        (isinstance(a[k], float) and isinstance(b[k], float) and math.isnan(a[k]) and math.isnan(b[k])) or a[k] == b[k]
        for k in a)


def rows_like_metrics(n: int) -> list[dict[str, Any]]:
    """Rows shaped like metrics.jsonl: the step, namespaced keys, ints, awkward floats, a NaN."""
    return [{"step": s, "reward/mean": 0.1 * s + 1 / 3, "train/loss": -1.5e-7 * (s + 1), "train/lr": 2e-4,
             "mismatch/kl_k3": 1e-12 * s, "method/tis/is_weight_max": 2.0, "quant/quant_error/q_proj": 1234567.891,
             "reward/accuracy": 0, "mismatch/ratio_max": float("nan") if s == 2 else 1.0 + s,
             "time/step_s": 0.25} for s in range(n)]


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


def test_offline_history_read_back_equals_logged_rows(tmp_path, offline):
    cfg = make_cfg(tmp_path, "method=tis", "seed=2", "tracking=offline", "tracking.project=qrl-test",
                   "tracking.tags=[a,b]")
    cfg.sweep = "trk"
    tracker = start_tracking(cfg, tmp_path, "tis-arithmetic-tiny-s2")
    assert isinstance(tracker, WandbTracker) and tracker.active and tracker.run_id
    rows = rows_like_metrics(5)
    for r in rows:
        tracker.log(r, r["step"])
    tracker.finish(exit_code=0)

    [run] = offline_runs(tmp_path)
    assert run.name.endswith(tracker.run_id)
    got = history(run)
    assert [h.pop("_step") for h in got] == [r["step"] for r in rows]
    assert len(got) == len(rows) and all(same(h, r) for h, r in zip(got, rows)), (got, rows)

    meta = next(r["run"] for r in inspect_records(run) if r.get("type") == "run")
    assert meta["run_id"] == tracker.run_id and meta["project"] == "qrl-test"
    # group = the sweep, job_type = the arm, tags = the identity axes, then the user's (bench/run/identity.py RunId)
    assert meta["run_group"] == "trk" and meta["job_type"] == "tis@fp8_e4m3"
    assert meta["display_name"] == "tis-arithmetic-tiny-s2"
    assert meta["tags"] == ["method:tis", "precision:fp8_e4m3", "task:arithmetic", "model:tiny", "seed:2", "engine:embedded",
                            "a", "b"]
    config = meta["config"]["update"]
    assert config["method"]["name"] == "tis" and config["seed"] == 2 and config["rollout"]["precision"] == "fp8_e4m3"  # resolved
    exit_rec = next(r for r in inspect_records(run) if r.get("type") == "exit")
    assert exit_rec["exit"].get("exit_code", 0) == 0


def test_runlog_writes_the_run_dir_then_mirrors_each_row_at_its_step(tmp_path, offline):
    """RunLog (bench/run/runlog.py), the one writer of metrics: every row lands in metrics.jsonl / eval.jsonl and,
    at its own step, in W&B (its replay on resume: test_faults.py section 7, with real interrupted runs)."""
    from bench.run.runlog import RunLog
    from bench.run.store import RunDir

    cfg = make_cfg(tmp_path, "tracking=offline")
    run = RunDir(tmp_path / "run")
    run.start("seed: 0\n", "x")
    log = RunLog.open(run, cfg, "x", start=0)
    rows, evals = rows_like_metrics(3), [{"step": 0, "eval/accuracy": 0.25}, {"step": 3, "eval/accuracy": 0.5}]
    log.log_eval(evals[0])
    for r in rows:
        log.log(r)
    log.log_eval(evals[1])
    log.close(exit_code=1, preempting=True)
    assert all(same(a, b) for a, b in zip(run.metrics(), rows)) and len(run.metrics()) == 3 and run.evals() == evals
    [first] = offline_runs(run.path)
    got = history(first)
    assert [h.pop("_step") for h in got] == [0, 1, 2, 3]
    assert same(got[0], evals[0] | rows[0]) and same(got[1], rows[1]) and got[3] == evals[1]  # eval and step 0: one row


def test_resume_reuses_the_run_id(tmp_path, offline):
    cfg = make_cfg(tmp_path, "tracking=offline")
    first = start_tracking(cfg, tmp_path, "bf16-arithmetic-tiny-s0")
    first.log({"step": 0, "x": 1.0}, 0)
    first.mark_preempting()
    first.finish(exit_code=1)
    second = start_tracking(cfg, tmp_path, "bf16-arithmetic-tiny-s0", resume_id=first.run_id)
    second.log({"step": 1, "x": 2.0}, 1)
    second.finish(exit_code=0)
    assert second.run_id == first.run_id
    runs = offline_runs(tmp_path)
    assert len(runs) == 2 and all(first.run_id in r.name for r in runs)  # same second: "...-<id>-1"
    metas = [next(x["run"] for x in inspect_records(r) if x.get("type") == "run") for r in runs]
    assert [m["run_id"] for m in metas] == [first.run_id] * 2 and metas[1].get("resume") is True
    assert [h["x"] for r in runs for h in history(r)] == [1.0, 2.0]


def test_sync_uploads_a_sweeps_offline_attempts_with_wandb_sync_as_recorded(tmp_path, offline, monkeypatch):
    """`qrl-bench sync` on real offline mirrors (a run resumed once: two attempts of one W&B id): it finds both, in
    order, and hands them to the real `wandb sync`, which gets as far as offline allows: with the server reachable
    (WANDB_BASE_URL: a local listener) and no credentials, W&B's own one-line error and a non-zero exit."""
    import socket

    from bench.run.identity import RunId
    from bench.run.wandb_sync import find
    from tests.helpers import cli

    cfg = make_cfg(tmp_path, "tracking=offline", "sweep=up")
    run_dir = RunId.of(cfg).path(tmp_path)
    first = start_tracking(cfg, run_dir, RunId.of(cfg).name)
    first.finish(exit_code=1)
    second = start_tracking(cfg, run_dir, RunId.of(cfg).name, resume_id=first.run_id)
    second.finish(exit_code=0)
    (run_dir / "run.json").write_text(f'{{"status": "completed", "run_name": "{RunId.of(cfg).name}", '
                                      f'"wandb_id": "{first.run_id}"}}')
    (found,) = find([tmp_path / "up"])
    assert found.attempts == offline_runs(run_dir) and len(found.attempts) == 2

    home = tmp_path / "home"  # no ~/.netrc, no W&B settings: no credentials
    home.mkdir()
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        env = {"HOME": str(home), "NETRC": str(home / "netrc"), "WANDB_CONFIG_DIR": str(home),
               "WANDB_BASE_URL": f"http://127.0.0.1:{server.getsockname()[1]}"}
        for key in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE"):
            monkeypatch.delenv(key, raising=False)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        proc = cli("sync", str(tmp_path / "up"), timeout=300)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert f"{RunId.of(cfg).name}  id {first.run_id}  2 offline attempt(s)" in proc.stdout
    assert "No API key configured" in proc.stderr and "Syncing 2 run(s)" in proc.stderr, proc.stderr
    assert f"qrl-bench sync: wandb sync exited {proc.returncode}" in proc.stderr


def test_wandb_mode_env_wins_over_config(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert tracking_mode(make_cfg(tmp_path, "tracking=offline")) == "disabled"
    monkeypatch.setenv("WANDB_MODE", "dryrun")  # W&B's old name for offline
    assert tracking_mode(make_cfg(tmp_path, "tracking=disabled")) == "offline"
    monkeypatch.delenv("WANDB_MODE")
    assert tracking_mode(make_cfg(tmp_path, "tracking=online")) == "online"
    monkeypatch.setenv("WANDB_MODE", "bogus")
    with pytest.raises(ValueError, match="bogus"):
        tracking_mode(make_cfg(tmp_path))


def test_disabled_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    tracker = start_tracking(make_cfg(tmp_path, "tracking=disabled"), run_dir, "x", resume_id="abc123")
    assert type(tracker) is Tracker and not tracker.active and tracker.run_id == "abc123"
    tracker.log({"step": 0, "a": 1.0}, 0)
    tracker.finish(0)
    assert list(run_dir.iterdir()) == []


def test_failing_init_warns_and_does_not_crash(tmp_path, monkeypatch):
    # online with no API key anywhere (fresh HOME, no netrc): wandb.init raises UsageError
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "home" / ".config" / "wandb"))
    with pytest.warns(RuntimeWarning, match="W&B init failed"):
        tracker = start_tracking(make_cfg(tmp_path, "tracking=online"), tmp_path, "x", resume_id="keepme")
    assert not tracker.active and tracker.run_id == "keepme"  # the stored id is not forgotten
    tracker.log({"step": 0, "a": 1.0}, 0)
    tracker.finish(1)


def test_failing_log_degrades_to_noop_and_keeps_earlier_rows(tmp_path, offline):
    tracker = start_tracking(make_cfg(tmp_path, "tracking=offline"), tmp_path, "x")
    tracker.log({"step": 0, "a": 1.0}, 0)
    with pytest.warns(RuntimeWarning, match="W&B log failed"):
        tracker.log({"step": 1, "a": object()}, 1)  # not serializable: wandb raises TypeError
    assert not tracker.active
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no further warnings: it is a quiet no-op now
        tracker.log({"step": 2, "a": 3.0}, 2)
        tracker.finish(0)
    [run] = offline_runs(tmp_path)
    assert [h["a"] for h in history(run)] == [1.0]


# ---------------------------------------------------------------- with the real trainer


@pytest.mark.slow
def test_real_run_history_equals_metrics_jsonl(tmp_path, offline):
    from bench.launch.cli import execute
    from bench.run.store import RunDir

    cfg = make_cfg(tmp_path, "method=tis", "tracking=offline")
    assert execute(cfg) == "completed"
    run = RunDir.of(cfg)
    [wb] = offline_runs(run.path)
    assert run.info()["wandb_id"] and wb.name.endswith(run.info()["wandb_id"])  # the id is kept in run.json
    logged = {h.pop("_step"): h for h in history(wb)}
    rows = run.metrics()
    assert rows and [{k: logged[r["step"]].get(k, "<missing>") for k in r} for r in rows] == rows
    evals = run.evals()  # eval rows share the step of the training row they precede
    assert evals and [{k: logged[e["step"]].get(k, "<missing>") for k in e} for e in evals] == evals
    assert set(logged) == {r["step"] for r in rows} | {e["step"] for e in evals}  # nothing else was logged


@pytest.mark.slow
def test_real_run_survives_a_failing_wandb(tmp_path, monkeypatch):
    from bench.launch.cli import execute
    from bench.run.store import RunDir

    # keep the cached tiny-model warm start where it is (its default path is under HOME)
    monkeypatch.setenv("QRL_BENCH_CACHE", os.environ.get("QRL_BENCH_CACHE", os.path.expanduser("~/.cache/qrl-bench")))
    monkeypatch.setenv("WANDB_MODE", "online")  # no API key anywhere: init fails
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "home" / ".config" / "wandb"))
    cfg = make_cfg(tmp_path, "tracking=online")
    with pytest.warns(RuntimeWarning, match="W&B init failed"):
        assert execute(cfg) == "completed"
    run = RunDir.of(cfg)
    assert [r["step"] for r in run.metrics()] == list(range(cfg.train.steps))
    assert run.info()["wandb_id"] is None and not (run.path / "wandb").exists()


def test_a_diverged_runs_mirror_says_diverged_and_analysis_from_wandb_keeps_it(tmp_path, offline):
    """W&B's state of a diverged run is 'failed' (exit code 1), the same as a crash; read from W&B, analysis left
    it out ("status=failed") where the run directory keeps it as a result: survivor bias for the arms that
    collapse. The mirror's summary carries run.json's status, reason and diverged step, and the W&B reader
    (analysis/wandb_source.py) takes them."""
    from types import SimpleNamespace

    from analysis.wandb_source import cache_run
    from bench.run.runlog import RunLog
    from bench.run.store import RunDir

    cfg = make_cfg(tmp_path, "tracking=offline")
    run = RunDir(tmp_path / "run")
    run.start("seed: 0\n", "x")
    log = RunLog.open(run, cfg, "x", start=0)
    log.log_eval({"step": 0, "eval/accuracy": 0.25})
    log.log({"step": 0, "train/loss": 1.0})
    run.finish("diverged", reason="non-finite loss at step 1", diverged_step=1)
    log.close(exit_code=1)
    [mirror] = offline_runs(run.path)
    summary: dict[str, Any] = {}
    for rec in inspect_records(mirror):
        if rec.get("type") == "summary":
            summary |= rec["summary"].get("update", {})
    assert summary.get("run/status") == "diverged" and summary.get("run/diverged_step") == 1, summary
    # what the W&B API gives back for that run (state 'failed'), through the reader that fills analysis' cache
    api_run = SimpleNamespace(state="failed", summary={"run/status": "diverged", "run/reason": "non-finite loss",
                                                       "run/diverged_step": 1}, config={}, name="x", id="abc",
                              metadata={}, scan_history=lambda page_size: iter([{"_step": 0, "eval/accuracy": 0.25}]))
    cache_run(api_run, tmp_path / "cache" / "abc")
    info = (tmp_path / "cache" / "abc" / "run.json").read_text()
    assert '"status": "diverged"' in info and '"diverged_step": 1' in info
