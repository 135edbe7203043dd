"""`qrl-bench sync SWEEP_DIR` (bench/run/wandb_sync.py): it finds every run's offline W&B attempts under a sweep, in
time order, builds `wandb sync` calls that keep each run's recorded name, group and tags (no overriding flags),
prints them under --dry-run, and fails with one line on a bad directory, an empty sweep or an unreachable server.
The upload itself needs the W&B server; tests/integration/test_tracking.py runs the real `wandb sync` as far as
no credentials allow."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest

from bench.run import wandb_sync
from bench.run.wandb_sync import commands, find, main, server_problem


def fake_run(sweep: Path, subdir: str, name: str, wandb_id: str | None, attempts: list[str]) -> Path:
    """A run directory with run.json and empty offline attempt folders, as the tracker lays them out."""
    d = sweep / subdir
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"status": "completed", "run_name": name, "wandb_id": wandb_id}))
    for stamp in attempts:
        a = d / "wandb" / f"offline-run-{stamp}-{wandb_id}"
        a.mkdir(parents=True)
        (a / f"run-{wandb_id}.wandb").write_bytes(b"")
    return d


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    root = tmp_path / "smoke"
    fake_run(root, "tis@int8/arithmetic/tiny/seed1", "tis@int8-arithmetic-tiny-s1", "bbb", ["20261127_120000"])
    # resumed twice: three attempts of one W&B id, written out of order on purpose
    fake_run(root, "bf16@bf16/arithmetic/tiny/seed0", "bf16@bf16-arithmetic-tiny-s0", "aaa",
             ["20261127_130000", "20261127_110000", "20261127_120500"])
    fake_run(root, "naive@int8/arithmetic/tiny/seed0", "naive@int8-arithmetic-tiny-s0", None, [])  # tracking=disabled
    (root / "bf16@bf16/arithmetic/tiny/seed0/wandb/offline-run-20261127_140000-aaa").mkdir()  # no .wandb: not an attempt
    code = root / ".code" / "20261127" / "results" / "x" / "seed0"  # a code snapshot is never entered
    code.mkdir(parents=True)
    (code / "run.json").write_text("{}")
    return root


def test_it_finds_every_run_and_its_attempts_in_time_order(sweep: Path):
    runs = {r.name: r for r in find([sweep])}
    assert set(runs) == {"bf16@bf16-arithmetic-tiny-s0", "tis@int8-arithmetic-tiny-s1", "naive@int8-arithmetic-tiny-s0"}
    bf16 = runs["bf16@bf16-arithmetic-tiny-s0"]
    assert bf16.wandb_id == "aaa" and [a.name for a in bf16.attempts] == [
        "offline-run-20261127_110000-aaa", "offline-run-20261127_120500-aaa", "offline-run-20261127_130000-aaa"]
    assert runs["naive@int8-arithmetic-tiny-s0"].attempts == []


def test_one_wandb_sync_call_with_no_flag_that_renames_or_retags(sweep: Path):
    runs = find([sweep])
    (call,) = commands([r for r in runs if r.attempts])
    assert call[:4] == [sys.executable, "-m", "wandb", "sync"]
    paths = call[4:]
    assert not [p for p in paths if p.startswith("-")]  # no --project/--entity/--id/--job-type/--replace-tags
    assert paths == [str(a) for r in runs for a in r.attempts] and len(paths) == 4


def test_chunks_keep_a_runs_attempts_together(sweep: Path, monkeypatch):
    monkeypatch.setattr(wandb_sync, "CHUNK", 2)
    calls = commands([r for r in find([sweep]) if r.attempts])
    assert [len(c) - 4 for c in calls] == [3, 1]  # the 3 attempts of bf16 stay in one call; tis follows


def test_dry_run_lists_runs_and_the_command_and_uploads_nothing(sweep: Path, capsys, monkeypatch):
    monkeypatch.setattr(wandb_sync.subprocess, "run", lambda *a, **k: pytest.fail("a dry run ran a command"))
    assert main([str(sweep), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "bf16@bf16-arithmetic-tiny-s0  id aaa  3 offline attempt(s)" in out
    assert "2 run(s), 4 offline attempt(s)" in out and "1 run(s) without an offline mirror" in out
    assert f"{sys.executable} -m wandb sync " in out


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys):
    assert main([str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"qrl-bench sync: {tmp_path / 'nope'} is not a directory; give a sweep directory such as results/<sweep>"]
    empty = tmp_path / "empty"
    fake_run(empty, "bf16@bf16/arithmetic/tiny/seed0", "bf16@bf16-arithmetic-tiny-s0", None, [])
    assert main([str(empty)]) == 2
    assert capsys.readouterr().err.strip() == (f"qrl-bench sync: nothing to upload under {empty}: 1 run(s), none with "
                                               "an offline W&B mirror (tracking=disabled or online, or "
                                               "WANDB_MODE=disabled: scripts/quickstart.sh sets it unless "
                                               "WANDB_MODE=offline is given)")


def test_an_unreachable_server_is_one_line_and_exit_1(sweep: Path, capsys, monkeypatch):
    with socket.socket() as s:  # a port nothing listens on: the connection is refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(wandb_sync, "base_url", lambda: f"http://127.0.0.1:{port}")  # WANDB_BASE_URL: test_tracking
    monkeypatch.setattr(wandb_sync.subprocess, "run", lambda *a, **k: pytest.fail("synced without a server"))
    assert server_problem(f"http://127.0.0.1:{port}") is not None
    assert main([str(sweep)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"qrl-bench sync: cannot reach the W&B server http://127.0.0.1:{port} (127.0.0.1:{port}: ")
    assert len(err.strip().splitlines()) == 1


def test_a_usage_error_is_one_line(capsys):
    """It printed argparse's usage ("usage: usage: qrl-bench sync ...", the word twice) above the error."""
    with pytest.raises(SystemExit) as e:
        main(["results/x", "--dryrun"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.splitlines()) == 1 and err.count("usage") == 1, err
    assert "unrecognized arguments: --dryrun" in err
