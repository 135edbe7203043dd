"""rollout.cpu_attention=varlen: the C kernel over each row's own key columns (bench.rollout.cpu_attention) is the
matmul decode attention over the window up to summation order, and the engine with it samples the same rollout."""

from __future__ import annotations

import pytest
import torch

from bench.rollout import SamplingParams, cpu_attention, embedded
from bench.rollout.embedded import EmbeddedEngine
from tests.unit.test_engine import _build
from tests.vllm.helpers import prompts

needs_kernel = pytest.mark.skipif(cpu_attention.unavailable() is not None,
                                  reason=f"the varlen kernel cannot be built here: {cpu_attention.unavailable()}")


@needs_kernel
@pytest.mark.parametrize("B, H, Hkv, total, D, lo, hi", [(5, 4, 2, 40, 16, 3, 37), (7, 6, 2, 33, 8, 0, 33),
                                                         (3, 3, 3, 20, 64, 5, 6), (9, 8, 2, 70, 32, 10, 50)])
def test_varlen_kernel_is_the_matmul_attention_over_the_window(B, H, Hkv, total, D, lo, hi):
    """Rows start anywhere in [lo, hi) (one at lo: the whole window; one at hi - 1: a single column), with masked
    holes inside their own columns; q is the strided view `_qkv` returns. Against `decode_attention` over [lo, hi)
    with every column before a row's start masked: equal to fp32 rounding. The keys and values before a row's start
    are never read (filled with 1e30 there, the result is bit-identical)."""
    g = torch.Generator().manual_seed(B * total)
    qkv = torch.randn(B, 1, H + 2 * Hkv, D, generator=g)
    q = qkv[:, :, :H].transpose(1, 2)  # [B, H, 1, D], not contiguous
    k, v = (torch.randn(B, Hkv, total, D, generator=g) for _ in range(2))
    starts = torch.randint(lo, hi, (B,), generator=g)
    starts[0], starts[-1] = lo, hi - 1
    mask = torch.zeros(B, 1, 1, total)
    holes = torch.rand(B, 1, 1, total, generator=g) < 0.2
    holes[..., hi - 1] = False  # the column a step writes is always attended
    mask.masked_fill_(holes, float("-inf"))
    for b, s in enumerate(starts.tolist()):
        mask[b, ..., :s] = float("-inf")
    got = cpu_attention.varlen_decode_attention(q, k, v, mask, starts, lo, hi, D**-0.5)
    want = embedded.decode_attention(q, k[:, :, lo:hi], v[:, :, lo:hi], mask[..., lo:hi], D**-0.5)
    assert got.shape == (B, H, 1, D) and torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=0, atol=2e-6)
    before = torch.arange(total)[None, None, :, None] < starts[:, None, None, None]
    k2, v2 = k.masked_fill(before, 1e30), v.masked_fill(before, 1e30)
    assert torch.equal(cpu_attention.varlen_decode_attention(q, k2, v2, mask, starts, lo, hi, D**-0.5), got)


@needs_kernel
@pytest.mark.parametrize("precision, slots, n", [("fp32", 10, 8), ("fp32", 2, 16), ("int8", 4, 8)])
def test_engine_with_varlen_attention_samples_the_same_refilled_rollout(monkeypatch, precision, slots, n):
    """3 x n sequences through a few slots (continuous batching, the window moved to the cache's front by `_shift`):
    the varlen engine gives the matmul engine's tokens and lengths, log-probs to fp32 rounding, and its steps read
    fewer columns than the window (rows start after it). INT8's activations are fp32 on a CPU, so its attention is
    fp32 (where the attention runs in bf16, on a CPU with bf16 matmuls, the key does not apply: SDPA attends)."""
    model = _build("qwen2")
    ids, mask = prompts()
    free = EmbeddedEngine("fp32")
    free.load_weights(model)
    first = free.generate(ids, mask, 8, SamplingParams(20, 0.8), torch.Generator().manual_seed(4))
    eos = [int(t) for t in first.response_ids.flatten().bincount().topk(4).indices]  # frequent ids: rows end early
    reads, shifts = [], []
    real, shift = cpu_attention.varlen_decode_attention, embedded.FastDecoder._shift

    def counted(q, k, v, mask, rows, lo, hi, scale):
        reads.append(((hi - rows).sum().item(), (hi - lo) * rows.numel()))
        return real(q, k, v, mask, rows, lo, hi, scale)

    monkeypatch.setattr(cpu_attention, "varlen_decode_attention", counted)
    monkeypatch.setattr(embedded.FastDecoder, "_shift", lambda self: shifts.append(1) or shift(self))

    def run(attention: str):
        engine = EmbeddedEngine(precision, eos_id=eos, chunk_tokens=slots * (ids.shape[1] + 20), sync_every=4,
                                cpu_attention=attention)
        engine.load_weights(model)
        assert engine.decoder.varlen == (attention == "varlen")
        return engine.generate(ids, mask, n, SamplingParams(20, 0.8), torch.Generator().manual_seed(4))

    want, got = run("matmul"), run("varlen")
    assert shifts and reads and sum(own for own, _ in reads) < sum(window for _, window in reads)
    assert torch.equal(got.response_ids, want.response_ids) and torch.equal(got.response_mask, want.response_mask)
    assert (got.logp_mu - want.logp_mu).abs().max() < 1e-5 and got.response_ids.shape[0] == 3 * n


def test_cpu_attention_choices_are_checked(monkeypatch):
    """A bad value names the valid ones; varlen with cpu_kernels=plain (SDPA, no matmul attention to replace) is
    refused; where the kernel cannot be built the engine says why and names the way out."""
    with pytest.raises(ValueError, match=r"rollout.cpu_attention='paged' is not valid; choose one of: matmul, varlen"):
        EmbeddedEngine("fp32", cpu_attention="paged")
    with pytest.raises(ValueError, match="rollout.cpu_attention=varlen .* rollout.cpu_kernels=plain"):
        EmbeddedEngine("fp32", cpu_attention="varlen", cpu_kernels="plain")
    monkeypatch.setattr(cpu_attention, "unavailable", lambda: "no C compiler (cc or gcc) on PATH, nor $CC")
    engine = EmbeddedEngine("fp32", cpu_attention="varlen")
    with pytest.raises(ValueError, match="cannot run here: no C compiler .* use rollout.cpu_attention=matmul"):
        engine.load_weights(_build("qwen2"))


@needs_kernel
def test_rollout_benchmark_times_the_varlen_variants(capsys):
    """`bench.benchmarks.rollout --variants ... varlen varlen_sync8` (docs/benchmarks.md's command at a tiny shape):
    a throughput row per variant, all sampling the same responses, and each variant's ratio over `before`."""
    from bench.benchmarks import rollout

    rollout.main(["--engines", "embedded", "--precisions", "fp32", "--batch", "12", "--slots", "4", "--new-tokens", "16",
                  "--mean-response", "4", "--variants", "before", "eager", "varlen", "varlen_sync8", "--repeats", "1",
                  "--layers", "1", "--threads", str(torch.get_num_threads())])  # the suite's thread count kept
    out = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| embedded")}
    assert {"embedded (before)", "embedded", "embedded (varlen)", "embedded (varlen_sync8)"} <= set(rows)
    ratios = [line for line in out.splitlines() if line.startswith(("| varlen |", "| varlen_sync8 |"))]
    assert len(ratios) == 2 and all(float(r.split("|")[3].strip().rstrip("x")) > 0 for r in ratios)
