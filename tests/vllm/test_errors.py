"""Unsupported combinations fail when the engine is constructed (start-up), naming the precision, the engine
and what works; the version check names the installed and the supported versions."""

from __future__ import annotations

import pytest

from bench.rollout.vllm_engine import VLLMRolloutConfig
from bench.rollout import build_engine
from bench.rollout.vllm_engine import SUPPORTED_VLLM, VLLMEngine, check_vllm_version, vllm_settings

pytestmark = pytest.mark.vllm


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        # refused by the config check, which does not know the platform: what works on each
        (dict(precision="int8"), r"vllm engine: precision 'int8' is not supported.*What works: on gpu: .*; on cpu: "
                                 r"fp32, bf16, fp8_e4m3 with weight_granularity per_channel.*rollout.engine=embedded"),
        (dict(precision="fp8_e4m3", weight_granularity="per_tensor"),
         r"'fp8_e4m3' with weight_granularity 'per_tensor' is not supported on cpu.*What works on cpu"),
        (dict(precision="fp8_e4m3", weight_granularity="per_block"),
         r"rollout.precision=fp8_e4m3: unknown weight granularity for fp8_e4m3 'per_block'; valid choices: "
         r"per_channel, per_tensor"),  # no block scheme in bench/quant to describe or match a run with
        (dict(precision="fp8_e4m3", act_granularity="none"), r"act_granularity='none' is not offered"),
        (dict(precision="nvfp4"), r"precision 'nvfp4' is not supported; it serves fp32, bf16, fp8_e4m3"),
        (dict(sleep_level=3), r"rollout.sleep_level=3 is out of range; allowed: \[1, 2\] integer; 0 = off"),
        (dict(gpu_memory_utilization=1.5), r"rollout.gpu_memory_utilization=1.5 is out of range; allowed: \(0, 1\]"),
    ],
)
def test_unsupported_combinations_fail_at_construction(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        VLLMEngine(**kwargs)


def test_build_engine_refuses_int8_from_a_config():
    cfg = VLLMRolloutConfig(precision="int8")
    with pytest.raises(ValueError, match="precision 'int8' is not supported"):
        build_engine(cfg, eos_id=1, pad_id=0, max_len=128)


def test_gpu_scheme_mapping():
    """What a GPU gets (vLLM's online FP8 schemes); checked as data since this machine has no GPU."""
    assert vllm_settings("fp8_e4m3", "per_tensor", "per_token", "gpu") == {"dtype": "bfloat16", "quantization": "fp8_per_tensor"}
    with pytest.raises(ValueError, match="'per_block' is not supported on gpu"):
        vllm_settings("fp8_e4m3", "per_block", "per_token", "gpu")
    assert vllm_settings("fp8_e4m3", "per_channel", "per_token", "gpu")["quantization"] == "fp8_per_channel"
    assert vllm_settings("bf16", "per_tensor", "none", "gpu") == {"dtype": "bfloat16"}  # granularities unused
    assert vllm_settings("fp32", "per_channel", "per_token", "cpu") == {"dtype": "float32"}
    with pytest.raises(ValueError, match="int8"):
        vllm_settings("int8", "per_channel", "per_token", "gpu")


def test_version_check_names_installed_and_supported(monkeypatch):
    import vllm

    check_vllm_version(vllm.__version__)  # the installed one is supported
    check_vllm_version("0.32.5+cpu")
    monkeypatch.delenv("QRL_VLLM_ANY_VERSION", raising=False)
    for bad in ("0.31.2", "0.33.0", "1.0.0"):
        with pytest.raises(RuntimeError, match=f"installed vLLM {bad} is outside the supported range {SUPPORTED_VLLM}"):
            check_vllm_version(bad)
    monkeypatch.setenv("QRL_VLLM_ANY_VERSION", "1")
    check_vllm_version("0.33.0")  # allowed, with a printed warning
