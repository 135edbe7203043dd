"""W&B source: reading a hand-written cache offline, filling it through a fake API, clear offline errors."""

from __future__ import annotations

import io
import json
import sys
import types
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from analysis.cli import main
from analysis.wandb_source import WandbUnavailable, fetch, load_wandb, split_history, unflatten

# A cached run exactly as the cache layout documents it, written by hand (not by the code under test).
CACHED = {
    "config.json": json.dumps({
        "method": {"name": "tis", "precision": "fp8_e4m3"}, "rollout": {"precision": "fp8_e4m3"},
        "task": {"name": "arithmetic"}, "model": {"name": "tiny"}, "seed": 4, "train": {"steps": 3}, "sweep": "wb",
    }),
    "run.json": json.dumps({"status": "completed", "reason": None, "step": 2, "run_name": "tis-arithmetic-tiny-s4",
                            "git_sha": "feedbeef", "git_dirty": False, "versions": {"torch": "2.13.0"},
                            "host": "node1", "wandb_id": "abc123", "source": "wandb", "wandb_state": "finished",
                            "arm": {"color": "#0072B2", "order": 30, "diagnostics": {}},
                            "precision": {"name": "fp8_e4m3", "label": "FP8", "weight_bits": 8, "act_bits": 8}}),
    "metrics.jsonl": "".join(
        json.dumps({"step": s, "reward/mean": 0.1 * s, "time/rollout_tokens_per_s": 500.0, "mismatch/kl_k3": 1e-3}) + "\n"
        for s in range(3)),
    "eval.jsonl": '{"step": 0, "eval/accuracy": 0.25}\n{"step": 3, "eval/accuracy": 0.75}\n',
}


def _write_cache(cache: Path) -> Path:
    run_dir = cache / "ent" / "proj" / "grp" / "abc123"
    run_dir.mkdir(parents=True)
    for name, text in CACHED.items():
        (run_dir / name).write_text(text)
    return run_dir


def test_offline_reads_a_hand_written_cache(tmp_path: Path):
    _write_cache(tmp_path / "cache")
    sweep = load_wandb("ent/proj", "grp", tmp_path / "cache", offline=True)
    assert sweep.skipped == []
    (run,) = sweep.runs
    assert (run.method, run.precision, run.task, run.model, run.seed) == ("tis", "fp8_e4m3", "arithmetic", "tiny", 4)
    assert run.metrics["reward/mean"].tolist() == [0.0, 0.1, 0.2]
    assert run.evals["eval/accuracy"].tolist() == [0.25, 0.75]
    assert sweep.sources == [f"wandb:ent/proj group=grp (cache {tmp_path / 'cache' / 'ent' / 'proj' / 'grp'})"]


def test_cli_offline_from_cache(tmp_path: Path):
    _write_cache(tmp_path / "cache")
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(["--wandb", "ent/proj", "--group", "grp", "--cache", str(tmp_path / "cache"), "--offline",
                   "--out", str(tmp_path / "rep"), "--formats", "png"])
    assert rc == 0, err.getvalue()
    report = (tmp_path / "rep" / "report.md").read_text()
    assert "wandb:ent/proj group=grp" in report and "feedbeef" in report
    assert "| tis | FP8 W8A8 | 75.0 |\n" in report  # one seed: the mean, no std; one task: no Avg.


def test_offline_without_cache_is_a_clear_error(tmp_path: Path):
    with pytest.raises(WandbUnavailable, match="--offline: no cache"):
        load_wandb("ent/proj", "grp", tmp_path / "cache", offline=True)
    err = io.StringIO()
    with redirect_stderr(err):
        rc = main(["--wandb", "ent/proj", "--group", "grp", "--cache", str(tmp_path / "cache"), "--offline"])
    assert rc == 2 and "no cache" in err.getvalue()


def test_split_history_separates_eval_rows_and_drops_wandb_keys():
    rows = [
        {"_step": 0, "_runtime": 1.0, "step": 0, "reward/mean": 0.1, "eval/accuracy": 0.2, "media": {"x": 1}},
        {"_step": 1, "step": 1, "reward/mean": 0.3, "eval/accuracy": None},
        {"_step": 2, "eval/accuracy": 0.5},
    ]
    metrics, evals = split_history(rows)
    assert metrics == [{"step": 0, "reward/mean": 0.1}, {"step": 1, "reward/mean": 0.3}]
    assert evals == [{"step": 0, "eval/accuracy": 0.2}, {"step": 2, "eval/accuracy": 0.5}]


def test_unflatten_accepts_flat_and_nested_configs():
    assert unflatten({"method.name": "ess", "train": {"steps": 5}, "_wandb": {}, "seed": {"value": 2}}) == {
        "method": {"name": "ess"}, "train": {"steps": 5}, "seed": 2}


class _FakeRun:
    def __init__(self, rid: str, state: str, summary: dict[str, Any], seed: int):
        self.id, self.name, self.state, self.summary = rid, f"run-{rid}", state, summary
        self.path = ["ent", "proj", rid]
        self.config = {"method.name": "naive", "method.precision": "fp8_e4m3", "task.name": "countdown",
                       "model.name": "tiny", "seed": seed, "train.steps": 2,
                       # what the trainer attaches for the analysis (bench/train.py -> tracking run_info)
                       "run_info": {"arm": {"color": "#D55E00", "order": 10, "diagnostics": {}},
                                    "precision": {"name": "fp8_e4m3", "label": "FP8", "weight_bits": 8, "act_bits": 8},
                                    "runtime": {"engine": "vllm", "device": "cuda", "device_name": "NVIDIA H100"}}}
        self.metadata = {"git": {"commit": "cafe"}, "python": "3.11.9", "host": "gpu7"}
        self.created_at = "2025-02-01T00:00:00"
        self.scans = 0

    def scan_history(self, page_size: int = 1000):
        self.scans += 1
        return iter([{"_step": 0, "step": 0, "reward/mean": 0.5, "eval/accuracy": 0.1},
                     {"_step": 1, "step": 1, "reward/mean": 0.6},
                     {"_step": 2, "step": 2, "eval/accuracy": 0.4}])


@pytest.fixture
def fake_wandb(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    state: dict[str, Any] = {"runs": [_FakeRun("r1", "finished", {}, 0),
                                      _FakeRun("r2", "finished", {"status": "diverged", "reason": "nan"}, 1),
                                      _FakeRun("r3", "running", {}, 2)],
                             "calls": [], "fail": False}

    class Api:
        def __init__(self, timeout: int = 0):
            if state["fail"]:
                raise ConnectionError("no route to host")

        def runs(self, path: str, filters: dict[str, Any]):
            state["calls"].append((path, filters))
            return state["runs"]

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(Api=Api))
    return state


def test_fetch_fills_the_cache_and_reuses_final_runs(tmp_path: Path, fake_wandb: dict[str, Any]):
    sweep = load_wandb("ent/proj", "g1", tmp_path / "cache")
    assert fake_wandb["calls"] == [("ent/proj", {"group": "g1"})]
    by_seed = {r.seed: r for r in sweep.runs}
    assert sorted(by_seed) == [0, 1]  # r3 is running: cached, listed, left out
    assert by_seed[1].status == "diverged" and by_seed[1].reason == "nan"
    assert by_seed[0].info["git_sha"] == "cafe"
    assert by_seed[0].info["arm"]["color"] == "#D55E00" and by_seed[0].info["precision"]["label"] == "FP8"
    assert (by_seed[0].engine, by_seed[0].device) == ("vllm", "cuda")  # throughput rows: not an emulated CPU row
    assert "run_info" not in by_seed[0].config  # moved into run.json, as the trainer's own run dirs have it
    assert by_seed[0].evals["eval/accuracy"].tolist() == [0.1, 0.4]
    assert [s.reason for s in sweep.skipped] == ["status=running at step 1"]
    load_wandb("ent/proj", "g1", tmp_path / "cache")
    assert [r.scans for r in fake_wandb["runs"]] == [1, 1, 2]  # only the running one is fetched again


def test_api_failure_falls_back_to_the_cache_or_says_what_to_do(tmp_path: Path, fake_wandb: dict[str, Any]):
    fake_wandb["fail"] = True
    with pytest.raises(WandbUnavailable, match="ConnectionError.*no cache at"):
        load_wandb("ent/proj", "g1", tmp_path / "cache")
    fake_wandb["fail"] = False
    fetch("ent/proj", "g1", tmp_path / "cache")
    fake_wandb["fail"] = True
    messages: list[str] = []
    sweep = load_wandb("ent/proj", "g1", tmp_path / "cache", log=messages.append)
    assert len(sweep.runs) == 2
    assert any("using the cached copy" in m for m in messages)


def test_bad_project_path_is_rejected(tmp_path: Path):
    with pytest.raises(ValueError, match="ENTITY/PROJECT"):
        load_wandb("just-a-project", None, tmp_path, offline=True)
