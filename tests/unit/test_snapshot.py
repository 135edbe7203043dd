"""Which files the SLURM launcher's code snapshot takes (bench/launch/launchers.py), on throwaway git repos."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bench.launch.launchers import SNAPSHOT_PATHS, snapshot_code


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=root, check=True,
                          capture_output=True, text=True).stdout


def test_git_checkout_snapshot_is_the_working_tree_minus_ignored(tmp_path):
    repo = tmp_path / "repo"
    write(repo, {"bench/__init__.py": "X = 1\n", "bench/tracked.py": "v1\n", "conf/config.yaml": "a: 1\n",
                 "pyproject.toml": "[project]\n", ".gitignore": "*.log\n", "README.md": "not code\n"})
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "init")
    write(repo, {"bench/tracked.py": "v2 (edited, uncommitted)\n", "bench/new_module.py": "untracked\n",
                 "bench/debug.log": "ignored\n"})
    snap = snapshot_code(tmp_path / "snap", root=repo)
    files = sorted(str(p.relative_to(snap)) for p in snap.rglob("*") if p.is_file())
    assert files == ["SNAPSHOT.json", "bench/__init__.py", "bench/new_module.py", "bench/tracked.py",
                     "conf/config.yaml", "pyproject.toml"]
    assert (snap / "bench" / "tracked.py").read_text() == "v2 (edited, uncommitted)\n"  # as on disk
    meta = json.loads((snap / "SNAPSHOT.json").read_text())
    assert meta["git_sha"] == git(repo, "rev-parse", "HEAD").strip() and meta["git_dirty"] is True
    assert meta["source"] == str(repo)


def test_plain_directory_snapshot_skips_bytecode(tmp_path):
    src = tmp_path / "src"
    write(src, {"bench/__init__.py": "", "bench/__pycache__/a.pyc": "", "bench/m.pyc": "", "conf/experiment/s.yaml": "x\n"})
    snap = snapshot_code(tmp_path / "snap", root=src)
    files = sorted(str(p.relative_to(snap)) for p in snap.rglob("*") if p.is_file())
    assert files == ["SNAPSHOT.json", "bench/__init__.py", "conf/experiment/s.yaml"]
    assert json.loads((snap / "SNAPSHOT.json").read_text())["git_sha"] is None


def test_refuses_to_snapshot_without_the_package(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(RuntimeError, match="no bench/"):
        snapshot_code(tmp_path / "snap", root=tmp_path / "empty")
    assert not (tmp_path / "snap").exists()


def test_the_real_project_snapshot_has_what_jobs_import(tmp_path):
    snap = snapshot_code(tmp_path / "snap")
    top = {p.name for p in snap.iterdir()}
    assert top <= {*SNAPSHOT_PATHS, "SNAPSHOT.json"} and {"bench", "hydra_plugins", "conf"} <= top
    for rel in ("bench/launch/launchers.py", "bench/run/preempt.py", "hydra_plugins/qrl_bench/launchers.py",
                "conf/config.yaml", "conf/hydra/launcher/slurm.yaml"):
        assert (snap / rel).is_file(), rel
    assert not list(snap.rglob("*.pyc"))


def test_unchanged_code_reuses_the_earlier_snapshot_and_a_change_makes_a_new_one(tmp_path):
    src = tmp_path / "src"
    write(src, {"bench/__init__.py": "X = 1\n", "conf/config.yaml": "a: 1\n"})
    first = snapshot_code(tmp_path / ".code" / "20261127-120000", root=src)
    again = snapshot_code(tmp_path / ".code" / "20261127-120500", root=src)
    assert again == first and not (tmp_path / ".code" / "20261127-120500").exists()
    write(src, {"conf/config.yaml": "a: 2\n"})
    changed = snapshot_code(tmp_path / ".code" / "20261127-121000", root=src)
    assert changed != first and (changed / "conf" / "config.yaml").read_text() == "a: 2\n"
    assert json.loads((first / "SNAPSHOT.json").read_text())["digest"] != \
        json.loads((changed / "SNAPSHOT.json").read_text())["digest"]


def test_a_rewritten_reference_report_does_not_make_the_code_dirty(tmp_path):
    """The quickstart rewrites its committed report under results/: output, not a change to the code."""
    from bench.run.store import git_info

    repo = tmp_path / "repo"
    write(repo, {"bench/__init__.py": "X = 1\n", "results/s/report/report.md": "reference\n"})
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "init")
    write(repo, {"results/s/report/report.md": "regenerated\n"})
    assert git_info(repo / "bench")[1] is False
    assert json.loads((snapshot_code(tmp_path / "a", root=repo) / "SNAPSHOT.json").read_text())["git_dirty"] is False
    write(repo, {"bench/__init__.py": "X = 2\n"})
    assert git_info(repo / "bench")[1] is True
    assert json.loads((snapshot_code(tmp_path / "b", root=repo) / "SNAPSHOT.json").read_text())["git_dirty"] is True


def test_an_untracked_module_of_the_code_makes_it_dirty_and_other_untracked_files_do_not(tmp_path):
    """A new arm's module not yet committed is imported by the run, and its recorded commit lacks it."""
    from bench.run.store import git_info

    repo = tmp_path / "repo"
    write(repo, {"bench/__init__.py": "X = 1\n", "conf/config.yaml": "a: 1\n", ".gitignore": "*.log\n"})
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "init")
    write(repo, {"notes.md": "scratch\n", "bench/run.log": "ignored\n", "results/s/seed0/metrics.jsonl": "{}\n"})
    assert git_info(repo / "bench")[1] is False
    assert json.loads((snapshot_code(tmp_path / "a", root=repo) / "SNAPSHOT.json").read_text())["git_dirty"] is False
    for new in ("bench/methods/halfw.py", "conf/method/halfw.yaml"):
        write(repo, {new: "new\n"})
        assert git_info(repo / "bench")[1] is True, new
        (repo / new).unlink()
    write(repo, {"bench/methods/halfw.py": "new\n"})
    assert json.loads((snapshot_code(tmp_path / "b", root=repo) / "SNAPSHOT.json").read_text())["git_dirty"] is True
