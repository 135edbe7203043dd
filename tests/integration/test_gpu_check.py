"""`scripts/gpu_check.sh --dry-run` on a CPU machine: it runs its own CPU self-test (every step's driver at tiny
shapes) and exits 0 with a report; a bad argument exits 2. The GPU run itself needs a GPU (bench/launch/gpu_check.py)."""

from __future__ import annotations

import os
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
    assert "accumulator: 1 + 2^-k exact for k <= 18" in text  # step 2 on the CPU fallback: an fp32 sum
    for section in ("## Environment", "## FP8 GEMM precision", "## Engine x precision", "## qurl_table1 at its real shape", "## INT8 weight layouts"):
        assert section in text
    for precision in ("bf16", "fp8_e4m3", "int8"):
        assert f"| embedded | {precision} | 0 |" in text  # each engine row trained without an error
    assert "run status completed" in text and "step failed" not in text
    long = text.split("## Long sequences")[1].split("\n## ")[0]  # one training step on one 320-token sequence
    assert "exit 0" in long and "| 320 |" in long, long


def test_gpu_check_refuses_unknown_arguments():
    proc = subprocess.run(["bash", "scripts/gpu_check.sh", "--fast"], cwd=REPO, capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 2 and "--dry-run" in proc.stderr
