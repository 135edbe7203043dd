"""Warm start of the built-in model: the accuracy window RL needs, and the on-disk cache behaviour."""

from __future__ import annotations

import dataclasses
import json
import threading
import time

import pytest
import torch

import bench.warmstart as ws
from bench.models.config import ModelConfig
from bench.tasks.arithmetic import ArithmeticTaskConfig
from bench.tasks.countdown import CountdownTaskConfig
from bench.models.load import load_policy
from bench.warmstart import INFO_FILE, greedy_accuracy, policy_path, warm_start_dir
from bench.models.tokenizer import build_char_tokenizer
from bench.tasks.base import build_task
from bench.domains import check_schema
from tests.hang import wait_until


def load_built_in(cfg, task):
    """The built-in model as build() loads it: the warm-start directory, then the ordinary loader."""
    return load_policy(cfg, policy_path(cfg, task))


def quick_cfg(tmp_path, **kw) -> ModelConfig:
    """A warm start that takes about a second: the cache tests need a build, not a good model."""
    return ModelConfig(cache_dir=str(tmp_path), num_layers=1, warmstart_steps=5, warmstart_target_acc=None, **kw)


@pytest.fixture(scope="module")
def small_task():
    return build_task(ArithmeticTaskConfig(n_train=200, n_test=20))


def weights(model) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def same_weights(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
@pytest.mark.parametrize("task_cfg", [ArithmeticTaskConfig(), CountdownTaskConfig()], ids=["arithmetic", "countdown"])
def test_default_warm_start_is_in_the_rl_window(tmp_path, task_cfg):
    """Defaults give 10-60 % greedy test accuracy: RL groups then have both successes and failures."""
    task = build_task(task_cfg)
    t0 = time.perf_counter()
    model, tok = load_built_in(ModelConfig(cache_dir=str(tmp_path)), task)
    built_s = time.perf_counter() - t0
    acc = greedy_accuracy(model, tok, task)
    info = json.loads((warm_start_dir(ModelConfig(cache_dir=str(tmp_path)), task) / INFO_FILE).read_text())
    print(f"\n{task.name}: test greedy accuracy {acc:.3f}, {info['steps_run']} SFT steps, "
          f"SFT {info['sft_seconds']} s, build+load {built_s:.1f} s")
    assert 0.10 <= acc <= 0.60
    assert info["test_greedy_accuracy"] == acc  # the reloaded model is the one that was measured


def test_second_call_hits_the_cache_with_identical_weights(tmp_path, small_task, monkeypatch):
    cfg = quick_cfg(tmp_path)
    first, tok = load_built_in(cfg, small_task)
    assert not first.training and first.dtype == torch.float32
    [built] = [p for p in (tmp_path / "warmstart").iterdir() if p.is_dir()]  # no temporary dir left over
    assert (built / INFO_FILE).is_file() and (built / "model.safetensors").is_file()

    def no_training(*a, **k):
        raise AssertionError("cache miss: the warm start was trained again")

    monkeypatch.setattr(ws, "train_warm_start", no_training)
    second, _ = load_built_in(cfg, small_task)  # no_training above is the cache-hit check (no wall-time bound)
    assert same_weights(weights(first), weights(second))
    # labels and locations are not part of the key; hyper-parameters are
    assert warm_start_dir(dataclasses.replace(cfg, name="renamed"), small_task) == built
    with pytest.raises(AssertionError, match="cache miss"):
        warm_start_dir(dataclasses.replace(cfg, warmstart_lr=cfg.warmstart_lr * 2), small_task)
    with pytest.raises(AssertionError, match="cache miss"):
        warm_start_dir(cfg, build_task(ArithmeticTaskConfig(n_train=200, n_test=20, data_seed=7)))


def test_warm_start_is_deterministic_across_cache_dirs(tmp_path, small_task):
    a, _ = load_built_in(quick_cfg(tmp_path / "a"), small_task)
    b, _ = load_built_in(quick_cfg(tmp_path / "b"), small_task)
    c, _ = load_built_in(quick_cfg(tmp_path / "c", warmstart_seed=1), small_task)
    assert same_weights(weights(a), weights(b))
    assert not same_weights(weights(a), weights(c))


def test_concurrent_builders_train_once(tmp_path, small_task, monkeypatch):
    """Sweep jobs starting together: one builds under the lock, the others wait and reuse it."""
    calls, waiting = [], []
    real, say = ws.train_warm_start, ws._say

    def said(message: str) -> None:
        waiting.extend([message] if message.startswith("waiting for another job") else [])
        say(message)

    def build_once_the_others_wait(*a, **k):
        calls.append(1)
        wait_until("the other two builders to wait for the lock", lambda: len(waiting) == 2, every=0.01)
        return real(*a, **k)

    monkeypatch.setattr(ws, "_say", said)
    monkeypatch.setattr(ws, "train_warm_start", build_once_the_others_wait)
    cfg = quick_cfg(tmp_path)
    results, errors = [], []

    def job():
        try:
            results.append(warm_start_dir(cfg, small_task))
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=job) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(calls) == 1 and len(set(results)) == 1 and len(waiting) == 2


def test_failed_build_leaves_nothing_behind(tmp_path, small_task, monkeypatch):
    def crash(*a, **k):
        raise RuntimeError("killed mid-build")

    monkeypatch.setattr(ws, "train_warm_start", crash)
    with pytest.raises(RuntimeError, match="mid-build"):
        warm_start_dir(quick_cfg(tmp_path), small_task)
    assert [p for p in (tmp_path / "warmstart").iterdir() if p.is_dir()] == []


def test_a_save_that_wrote_no_model_is_never_installed_and_an_old_one_is_rebuilt(tmp_path, small_task, monkeypatch):
    """transformers' save_pretrained writes nothing on a rank other than 0 of an initialized process group: such a
    build must fail, not leave a cache entry that every later run dies on; one left by an older build is rebuilt."""
    cfg = quick_cfg(tmp_path)
    built = warm_start_dir(cfg, small_task)
    (built / "model.safetensors").unlink()  # what an older build on rank 1 left behind
    (built / "config.json").unlink()
    model, _ = load_built_in(cfg, small_task)  # rebuilt in place, and loadable
    assert (built / "model.safetensors").is_file() and (built / "config.json").is_file()
    monkeypatch.setattr(type(model), "should_save_on_this_rank", lambda self, is_main: False)  # as on rank 1
    with pytest.raises(RuntimeError, match="lacks config.json, model.safetensors"):
        warm_start_dir(quick_cfg(tmp_path / "other"), small_task)
    assert [p for p in (tmp_path / "other" / "warmstart").iterdir() if p.is_dir()] == []


def test_cache_dir_interpolation_and_user_expand(monkeypatch, tmp_path):
    monkeypatch.setenv("QRL_BENCH_CACHE", str(tmp_path))
    assert ws.resolve_cache_dir(ModelConfig().cache_dir) == tmp_path
    monkeypatch.delenv("QRL_BENCH_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert ws.resolve_cache_dir(ModelConfig().cache_dir) == tmp_path / ".cache" / "qrl-bench"


def test_stopping_rule_stops_at_the_target(small_task):
    """A target of 0 is met at the first check: SFT runs exactly EVAL_EVERY steps."""
    from bench.models.tiny import build_tiny_model
    from bench.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    model = build_tiny_model(ModelConfig(num_layers=1), tok)
    run = ws.sft(model, tok, small_task, steps=10 * ws.EVAL_EVERY, lr=1e-3, batch_size=4, seed=0, target_acc=0.0)
    assert run["steps_run"] == ws.EVAL_EVERY and len(run["train_checks"]) == 1


def test_thread_count_comes_from_the_config_not_the_caller(tmp_path, small_task, monkeypatch):
    """The SFT runs on model.warmstart_threads threads whatever the calling job uses, and restores the caller's
    count; 1 (the recipe before the knob existed) keeps the old cache key, any other count gets its own."""
    seen = []
    real = ws._train_warm_start

    def spy(*a, **k):
        seen.append(torch.get_num_threads())
        return real(*a, **k)

    monkeypatch.setattr(ws, "_train_warm_start", spy)
    caller = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        a, _ = load_built_in(quick_cfg(tmp_path / "a"), small_task)
        torch.set_num_threads(1)
        b, _ = load_built_in(quick_cfg(tmp_path / "b", warmstart_threads=2), small_task)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(caller)
    assert seen == [1, 2]
    cfg = quick_cfg(tmp_path)
    tok = build_char_tokenizer(cfg.max_position_embeddings)
    without_knob = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "warmstart_threads"}
    assert ws.cache_key(cfg, small_task, tok) == ws.cache_key(without_knob, small_task, tok)
    assert ws.cache_key(dataclasses.replace(cfg, warmstart_threads=2), small_task, tok) != ws.cache_key(cfg, small_task, tok)
    with pytest.raises(ValueError, match="model.warmstart_threads=0"):
        check_schema(dataclasses.replace(cfg, warmstart_threads=0), "model")


def test_progress_lines_and_a_warning_when_the_target_is_not_reached(tmp_path, small_task, capsys):
    """A first build says so and reports each accuracy check on stderr (a sweep job's run.log); one that spends its
    whole step budget below model.warmstart_target_acc says that RL from it may learn nothing."""
    cfg = dataclasses.replace(quick_cfg(tmp_path), warmstart_steps=ws.EVAL_EVERY, warmstart_target_acc=0.99)
    warm_start_dir(cfg, small_task)
    err = capsys.readouterr().err
    assert "building the arithmetic warm start once" in err
    assert f"step {ws.EVAL_EVERY}/{ws.EVAL_EVERY}, loss " in err
    assert "WARNING: the SFT used its whole budget (model.warmstart_steps=50)" in err
    warm_start_dir(cfg, small_task)  # from the cache: silent
    assert capsys.readouterr().err == ""
