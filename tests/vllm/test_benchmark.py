"""bench.benchmarks.rollout: preset shapes match the published models, and the vLLM rows run end to end."""

from __future__ import annotations

import pytest

from bench.benchmarks import rollout
from bench.quant.linear import native_bf16_matmul

pytestmark = pytest.mark.vllm


@pytest.mark.parametrize("preset, n_params", [
    ("qwen2.5-0.5b", 494_032_768),   # the parameter counts of the published checkpoints
    ("qwen2.5-1.5b", 1_543_714_304),
    ("qwen3-8b", 8_190_735_360),
])
def test_preset_shapes_have_the_published_parameter_counts(preset, n_params):
    model = rollout.build_model(preset, device="meta")
    assert sum(p.numel() for p in model.parameters()) == n_params
    cut = rollout.build_model(preset, layers=2, device="meta")
    assert cut.config.num_hidden_layers == 2 and cut.config.hidden_size == model.config.hidden_size


def test_bad_preset_and_depth_fail_clearly():
    with pytest.raises(ValueError, match="unknown preset 'qwen9'; choose one of: 1m, 10m, qwen2.5-0.5b"):
        rollout.build_model("qwen9")
    with pytest.raises(ValueError, match="--layers 40 must be in 1..28 for qwen2.5-1.5b"):
        rollout.build_model("qwen2.5-1.5b", layers=40, device="meta")


def test_vllm_fp8_row_reports_throughput_and_sync(capsys):
    rollout.main(["--engines", "vllm", "--precisions", "fp8_e4m3", "--batch", "4", "--new-tokens", "8",
                  "--prompt-len", "8", "--repeats", "1", "--threads", "1"])
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| vllm | fp8_e4m3 per_channel |"))
    tok_s, vs_bf16, sync_ms = [c.strip() for c in row.strip("|").split("|")[2:5]]
    assert float(tok_s) > 0 and vs_bf16 == "-" and float(sync_ms) > 0
    assert "engine start" in out
    # the emulation note depends on this CPU (AVX512-BF16 / AMX or not): assert the rule, not one CPU's label
    assert f"native bf16 matmul: {native_bf16_matmul()}" in out
    assert ("EMULATED" in out) == (not native_bf16_matmul())
