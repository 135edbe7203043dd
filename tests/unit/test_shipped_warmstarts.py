"""The shipped warm starts (bench/warmstart.py, bench/warmstarts/): every committed reference sweep starts from a
committed warm start, whose weights match their recorded hash, and a run uses it without building anything.

If a change alters a warm start's key (its model config, the task, the recipe's CODE_VERSION), the first test
fails naming the sweep: rebuild with scripts/ship_warmstarts.sh on the reference machine and commit the result.
"""

from __future__ import annotations

import json
import shutil

import pytest
from hydra import compose, initialize_config_dir

import bench.warmstart as ws
from bench.launch.config import CONF_DIR
from bench.launch.dryrun import expand
from bench.tasks.base import build_task

#: the committed reference sweeps, and the full separation sweep (run on a cluster, from the same shipped starts)
REFERENCE_SWEEPS = ("smoke_short", "smoke", "severity", "separation_slice", "separation")


def _warm_starts(sweep: str) -> dict[str, tuple]:
    """{warm-start name: (model config, task)} of every job of a named sweep. A warm start depends on the model and
    the task, not on the arm or the seed: one job is composed per distinct model/task overrides (a compose costs ~1 s)."""
    out, jobs = {}, expand([f"+experiment={sweep}"])
    arm_or_seed = ("method", "rollout.", "seed=", "variant=")
    distinct = {tuple(o for o in job if not o.startswith(arm_or_seed)): job for job in jobs}
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for job in distinct.values():
            cfg = compose("config", overrides=job)
            if cfg.model.path is None:
                task = build_task(cfg.task)
                out.setdefault(ws.warm_start_name(cfg.model, task), (cfg.model, task))
    return out


@pytest.mark.parametrize("sweep", REFERENCE_SWEEPS)
def test_every_reference_sweep_starts_from_a_shipped_warm_start(sweep):
    names = _warm_starts(sweep)
    assert names, sweep
    missing = [n for n in names if not (ws.SHIPPED_DIR / n).is_dir()]
    assert not missing, f"+experiment={sweep} has no shipped warm start {missing}: run scripts/ship_warmstarts.sh"
    for name in names:
        info = json.loads((ws.SHIPPED_DIR / name / ws.INFO_FILE).read_text())
        assert ws.weights_sha256(ws.SHIPPED_DIR / name) == info["weights_sha256"]
        assert info["built_on"] and 0.0 < info["test_greedy_accuracy"] < 1.0


def test_a_run_uses_the_shipped_warm_start_without_building(tmp_path, monkeypatch):
    (name, (model_cfg, task)), = list(_warm_starts("smoke_short").items())[:1]
    monkeypatch.setattr(ws, "train_warm_start", lambda *a: pytest.fail("built a warm start that is shipped"))
    cfg = model_cfg.copy()
    cfg.cache_dir = str(tmp_path)  # an empty cache
    assert ws.warm_start_dir(cfg, task) == ws.SHIPPED_DIR / name
    assert not (tmp_path / "warmstart" / name).exists()
    (tmp_path / "warmstart" / name).mkdir(parents=True)  # this machine's own build of the same key
    assert ws.warm_start_dir(cfg, task) == ws.SHIPPED_DIR / name  # the shipped one wins


def test_a_shipped_warm_start_whose_weights_changed_is_refused(tmp_path, monkeypatch):
    name = next(p.name for p in sorted(ws.SHIPPED_DIR.iterdir()) if p.is_dir())
    shutil.copytree(ws.SHIPPED_DIR / name, tmp_path / name)
    weights = tmp_path / name / ws.WEIGHTS_FILE
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    monkeypatch.setattr(ws, "SHIPPED_DIR", tmp_path)
    with pytest.raises(RuntimeError, match=f"{name} does not match its recorded sha256"):
        ws.shipped_dir(name)
    assert ws.shipped_dir("chain-qwen2-0000000000000000") is None  # nothing shipped under that name: build


def test_ship_copies_a_cached_warm_start_with_its_hash_and_cpu(tmp_path, monkeypatch):
    cache = tmp_path / "cache" / "warmstart" / "x-qwen2-0123456789abcdef"
    cache.mkdir(parents=True)
    (cache / ws.WEIGHTS_FILE).write_bytes(b"weights")
    (cache / "config.json").write_text("{}")
    (cache / ws.INFO_FILE).write_text(json.dumps({"task": "x", "steps_run": 5, "test_greedy_accuracy": 0.25}))
    monkeypatch.setattr(ws, "warm_start_dir", lambda *a: cache)
    monkeypatch.setattr(ws, "SHIPPED_DIR", tmp_path / "ship" / "warmstarts")
    (tmp_path / "ship").mkdir()
    shipped = ws.ship(None, None)
    assert shipped == tmp_path / "ship" / "warmstarts" / cache.name
    info = json.loads((shipped / ws.INFO_FILE).read_text())
    assert info["weights_sha256"] == ws.weights_sha256(cache) and "torch" in info["built_on"]
    assert sorted(p.name for p in shipped.iterdir()) == ["config.json", ws.WEIGHTS_FILE, ws.INFO_FILE]


def test_the_ship_command_refuses_bad_input_in_one_line(capsys):
    from bench.launch.ship_warmstart import main

    assert main(["task=chian"]) == 2
    assert "task=chian: unknown task 'chian' (did you mean 'chain'?)" in capsys.readouterr().err
    assert main(["model=hf", "model.path=/nowhere"]) == 2  # a user model is not warm-started
    assert "only the built-in tiny models" in capsys.readouterr().err
