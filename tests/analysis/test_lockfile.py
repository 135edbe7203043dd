"""requirements.lock: parsed as pip reads it, and runs whose recorded versions differ from it are named."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from analysis.lockfile import LOCK_FILE, drift, lock_sha256, off_lock, read_lock


def test_the_committed_lock_pins_the_stack_but_not_torch_or_cuda():
    pins = read_lock()
    assert {"transformers", "datasets", "hydra-core", "omegaconf", "scipy", "pytest"} <= set(pins)
    # torch is installed by scripts/install.sh (TORCH_SPEC: the CPU wheel); a CUDA stack must never come in by the lock
    assert "torch" not in pins and not any(p.startswith(("nvidia-", "triton")) for p in pins)
    assert len(lock_sha256()) == 16 and LOCK_FILE.name == "requirements.lock"


def test_parse_and_compare(tmp_path: Path):
    lock = tmp_path / "requirements.lock"
    lock.write_text("# header\nHydra_Core==1.3.8\n    # via foo\ntransformers==5.24.0 ; python_version >= '3.10'\n")
    pins = read_lock(lock)
    assert pins == {"hydra-core": "1.3.8", "transformers": "5.24.0"}
    assert read_lock(tmp_path / "missing") == {} and lock_sha256(tmp_path / "missing") is None
    recorded = {"hydra-core": "1.3.8", "transformers": "5.23.0", "torch": "2.13.0+cpu", "python": "3.11.7"}
    assert off_lock(recorded, pins) == {"transformers": ("5.23.0", "5.24.0")}  # torch, python: not pinned, not compared
    runs = [SimpleNamespace(run_id="a", info={"versions": recorded}),
            SimpleNamespace(run_id="b", info={"versions": {"transformers": "5.24.0"}}), SimpleNamespace(run_id="c", info={})]
    assert drift(runs, pins) == {"a": {"transformers": ("5.23.0", "5.24.0")}}
