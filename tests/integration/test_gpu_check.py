"""`scripts/gpu_check.sh --dry-run` on a CPU machine: it runs its own CPU self-test (every step's driver at tiny
shapes, in the issue-34 order, the report stamped) and exits 0 with a report; a bad argument exits 2. The GPU run itself
needs a GPU (bench/launch/gpu_check.py)."""

from __future__ import annotations

import os
import sys
import subprocess

import pytest

from tests.hang import HANG_S

from tests.helpers import REPO

pytestmark = pytest.mark.slow


def test_gpu_check_dry_run_is_a_cpu_self_test(tmp_path):
    report = tmp_path / "report.md"
    env = {**os.environ, "GPU_CHECK_REPORT": str(report), "HF_HUB_OFFLINE": "1", "WANDB_SILENT": "true"}
    proc = subprocess.run(["bash", "scripts/gpu_check.sh", "--dry-run"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=HANG_S)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "CPU self-test passed" in proc.stderr
    text = report.read_text()
    assert text.startswith("# qrl-bench CPU self-test")
    assert "commit `" in text and "card **no GPU (cpu)**" in text  # the stamp
    assert "accumulator: 1 + 2^-k exact for k <= 18" in text  # step 1 on the CPU fallback: an fp32 sum
    sections = [line for line in text.splitlines() if line.startswith("## ") and line[3].isdigit()]
    assert [s.split(".")[0] for s in sections] == ["## 1", "## 2", "## 3", "## 4", "## 5", "## 6"]  # the order
    assert "| SDPA default | exact |" in text and "| SDPA default | buckets of 128 |" in text  # step 2: attention
    assert "| embedded | int8 |" in text  # step 2: the rollout row (eager only here: compiled needs Triton or a C++ build)
    for row in ("bf16@bf16", "naive@int8", "naive@fp8_e4m3"):
        assert f"| {row} | 0 |" in text and "completed" in text  # step 3: one training step per precision row
        assert f'{row}: [{{"rows": ' in text  # and its engine's generate chunks (rows, steps, ms per step)
    assert "skipped: the cuda-marked tests need a CUDA GPU" in text and "step failed" not in text
    memory = text.split("## 4.")[1].split("\n## ")[0]  # one training step on one 320-token sequence
    assert "| 320 |" in memory and "exit " not in memory, memory


def test_gpu_check_refuses_unknown_arguments():
    proc = subprocess.run(["bash", "scripts/gpu_check.sh", "--fast"], cwd=REPO, capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 2 and "--dry-run" in proc.stderr


def test_trainer_memory_estimate_composes_a_real_preset_in_a_fresh_process():
    """The GPU check's step 4 at 1.5B died composing its estimate (the group yamls extend schemas nobody had
    registered in that process; the CPU self-test's smoke shape has no estimate, so it never got there)."""
    code = "from bench.benchmarks.trainer_memory import estimate_gb; print(estimate_gb('qwen2.5-1.5b', 8448))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=HANG_S,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    gb = float(proc.stdout.split()[-1])
    assert 20 < gb < 50, gb  # the H100 measured a 30.97 GB peak for this step; the estimate said 32.0
