"""On a CUDA GPU: the device fixes of the GPU review hold on the device itself (their CPU twins are named per test).

Every test here is marked `cuda` and skips, saying why, where torch sees no GPU (tests/conftest.py);
`scripts/gpu_check.sh` runs them.
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers as tr

from bench.rollout import SamplingParams
from bench.rollout.embedded import EmbeddedEngine

pytestmark = pytest.mark.cuda
GPU = torch.device("cuda")


def _model(layers: int = 2, hidden: int = 256) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = tr.Qwen2Config(vocab_size=512, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=2 * hidden, max_position_embeddings=1024,
                         tie_word_embeddings=True)
    return tr.Qwen2ForCausalLM(cfg).eval().to(GPU)


def test_sampled_eval_runs_on_cuda(tmp_path):
    """H1: avg@k evaluation with the trainer on the GPU (a CPU generator stopped it at step 0's evaluation).
    CPU twin: test_evaluation.py::test_sampled_eval_makes_its_generator_on_the_engines_device."""
    from bench.launch.cli import execute
    from tests.helpers import make_cfg

    cfg = make_cfg(tmp_path, "method=tis", "train.device=cuda", "train.steps=1", "train.eval_every=1",
                   "eval.mode=avg@k", "eval.k=2", "eval.sets=[arithmetic]")
    execute(cfg)
    rows = [json.loads(line) for f in tmp_path.rglob("eval.jsonl") for line in f.read_text().splitlines()]
    assert rows and all(0 <= r["eval/arithmetic/avg@2"] <= 1 for r in rows), rows


def test_chunked_generation_bounds_the_kv_cache_on_cuda():
    """H3: the embedded engine's peak memory grows with the chunk, not with the batch: 256 sequences x 320
    positions in chunks of 8192 positions (25 sequences) peak far below one unchunked cache.
    CPU twin: test_engine.py chunking tests (identical tokens whatever the chunk)."""
    model = _model(layers=4)
    prompts = torch.randint(1, 500, (64, 64), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(prompts, dtype=torch.bool)
    sampling = SamplingParams(256, temperature=1.0)
    peaks = {}
    for chunk in (None, 8192):
        engine = EmbeddedEngine("bf16", eos_id=None, chunk_tokens=chunk)
        engine.load_weights(model)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = engine.generate(prompts, mask, 4, sampling, torch.Generator(GPU).manual_seed(0))
        assert out.response_ids.shape == (256, 256)
        peaks[chunk] = torch.cuda.max_memory_allocated() - base
        del engine, out
        torch.cuda.empty_cache()
    # one [L, 2, B, kv, P+T, D] cache for 256 sequences vs 25: the chunked peak must be well under half
    assert peaks[8192] < 0.5 * peaks[None], peaks


def test_int8_engine_runs_in_bf16_on_cuda():
    """M1: the INT8 engine keeps its int8 GEMMs inside a bf16 engine on the GPU (as QuRL/FlashRL's), fp32 on CPU.
    CPU twin: the act_dtype_on checks in test_engine.py."""
    engine = EmbeddedEngine("int8", eos_id=None)
    engine.load_weights(_model())
    assert engine.act_dtype == torch.bfloat16
    out = engine.generate(torch.randint(1, 500, (4, 8)), torch.ones(4, 8, dtype=torch.bool), 2,
                          SamplingParams(8, temperature=1.0), torch.Generator(GPU).manual_seed(0))
    assert torch.isfinite(out.logp_mu).all() and (out.logp_mu <= 0).all()


def test_timer_charges_a_phase_for_its_gpu_kernels():
    """M3: a phase that only launches a kernel is charged the kernel's run time (asynchronous launches returned
    at once, so time/sync_s and time/recompute_s read ~0). CPU twin: test_timing.py's sync tests."""
    from bench.timing import Timer

    t = Timer(device=GPU)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with t("sleep"):
        start.record()
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU clock cycles
        end.record()
    kernel_s = start.elapsed_time(end) / 1e3
    assert kernel_s > 0.02
    assert t["sleep"] >= 0.9 * kernel_s, (t["sleep"], kernel_s)
