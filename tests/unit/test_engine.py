"""The embedded rollout engine against the trainer's teacher-forced log-probs (bench.models.logprobs).

Tiny random models built from configs (vocab 128, hidden 64, 2 layers, init std 0.02): at that scale a
missing padding mask already moves log-probs by ~0.1, so the 1e-4 agreement below is a real check.
"""

import pytest
import torch
import transformers as tr

from bench.quant import plain
from bench.quant.linear import onednn_available
from bench.quant.quantizers import Quantizer, fake_quant
from bench.registry import FORMATS
from bench.rollout import embedded
from bench.models.logprobs import token_logprobs
from bench.models.tokenizer import engine_ids
from bench.rollout import SamplingParams, build_engine
from bench.rollout.embedded import EmbeddedEngine
from bench.rollout.embedded import EmbeddedRolloutConfig, fast_path_problem
from bench.rollout.vllm_engine import VLLMRolloutConfig
from bench.domains import check_schema
from tests.vllm.helpers import prompts  # the same 3 left-padded prompts as the vLLM engine's tests

SMALL = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=128, initializer_range=0.02, max_position_embeddings=128)


def _build(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "qwen2":  # qkv bias, tied embeddings
        model = tr.Qwen2ForCausalLM(tr.Qwen2Config(**SMALL, tie_word_embeddings=True))
    elif kind == "llama":  # untied, non-default rope_theta
        rope = {"rope_type": "default", "rope_theta": 5e5}
        model = tr.LlamaForCausalLM(tr.LlamaConfig(**SMALL, rope_parameters=rope))
    elif kind == "qwen3":  # q_norm / k_norm, explicit head_dim
        model = tr.Qwen3ForCausalLM(tr.Qwen3Config(**SMALL, head_dim=16))
    elif kind == "gpt_neox":  # outside the family: parallel residual, partial rotary, LayerNorm
        model = tr.GPTNeoXForCausalLM(tr.GPTNeoXConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2,
                                                       num_attention_heads=4, intermediate_size=128))
    return model.eval()


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    return {k: _build(k) for k in ("qwen2", "llama", "qwen3", "gpt_neox")}


def _rollout(engine, model, temperature=1.0, n=2, new=10, seed=0, greedy=False):
    engine.load_weights(model)
    ids, mask = prompts()
    sampling = SamplingParams(max_new_tokens=new, temperature=temperature, greedy=greedy)
    return engine.generate(ids, mask, n, sampling, torch.Generator().manual_seed(seed))


def _gap(model, rollout, temperature=1.0) -> torch.Tensor:
    """|log pi_fp32 - log mu| on the response tokens."""
    with torch.no_grad():
        logp, _ = token_logprobs(model, rollout, temperature, dtype="fp32")
    return (logp - rollout.logp_mu)[rollout.response_mask].abs()


@pytest.mark.parametrize("kind", ["qwen2", "llama", "qwen3"])
@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_fp32_fast_path_matches_teacher_forced(models, kind, temperature):
    engine = EmbeddedEngine("fp32")
    r = _rollout(engine, models[kind], temperature)
    assert engine.active_backend == "fast"
    assert r.response_ids.shape == (6, 10) and r.response_mask.all()  # no EOS: full length
    assert torch.equal(r.prompt_ids[0], r.prompt_ids[1]) and torch.equal(r.prompt_mask[4], r.prompt_mask[5])
    assert _gap(models[kind], r, temperature).max() < 1e-4


@pytest.mark.parametrize("backend, kind", [("auto", "gpt_neox"), ("hf", "qwen2"), ("hf", "qwen3")])
def test_fp32_hf_fallback_matches_teacher_forced(models, backend, kind):
    engine = EmbeddedEngine("fp32", backend=backend)
    r = _rollout(engine, models[kind], 0.7)
    assert engine.active_backend == "hf"
    assert _gap(models[kind], r, 0.7).max() < 1e-4


def test_fast_backend_refuses_other_families(models):
    assert "gpt_neox" in fast_path_problem(models["gpt_neox"])
    with pytest.raises(ValueError, match="gpt_neox"):
        EmbeddedEngine("fp32", backend="fast").load_weights(models["gpt_neox"])


@pytest.mark.parametrize("kind", ["qwen2", "llama", "qwen3"])
def test_low_precision_mismatch_is_small_nonzero_and_ordered(models, kind):
    gaps = {}
    for precision in ("bf16", "fp8_e4m3", "int8"):
        gap = _gap(models[kind], _rollout(EmbeddedEngine(precision), models[kind]))
        assert torch.isfinite(gap).all()
        assert gap.max() > 1e-5, precision  # the engine really runs in that precision
        assert gap.max() < 0.2 and gap.mean() < 0.03, precision
        gaps[precision] = gap.mean()
    assert gaps["fp8_e4m3"] > gaps["bf16"]  # 3 mantissa bits against 8


def test_quantized_hf_fallback(models):
    for precision in ("bf16", "fp8_e4m3", "int8"):
        engine = EmbeddedEngine(precision)
        gap = _gap(models["gpt_neox"], _rollout(engine, models["gpt_neox"]))
        assert engine.active_backend == "hf"
        assert torch.isfinite(gap).all() and 1e-5 < gap.max() < 0.2


def _force_native_bf16(monkeypatch, native: bool) -> None:
    """Pin the engine's bf16 branch regardless of this CPU (the detection reads /proc/cpuinfo flags)."""
    monkeypatch.setattr(plain, "native_bf16_matmul", lambda: native)
    monkeypatch.setattr(embedded, "native_bf16_matmul", lambda: native)


@pytest.mark.parametrize("native", [False, True])
def test_bf16_branches(models, monkeypatch, native):
    """On CPUs with bf16 hardware (AVX512-BF16, AMX) the engine runs torch's bf16 GEMM and attention; elsewhere
    it emulates bf16 in fp32 (bf16-rounded operands). Both branches are forced here, whatever this CPU has, and
    each must give a bf16 rollout: a small, nonzero gap to fp32. Whether the two branches' numbers coincide
    depends on the CPU's kernels, so it is not asserted."""
    _force_native_bf16(monkeypatch, native)
    engine = EmbeddedEngine("bf16")
    rollout = _rollout(engine, models["qwen2"])
    want = torch.bfloat16 if native else torch.float32
    assert engine.decoder.attn == want and engine.decoder.layers[0].qkv.weight.dtype == want
    gap = _gap(models["qwen2"], rollout)
    assert torch.isfinite(gap).all() and 1e-5 < gap.max() < 0.05


def test_int8_kernels_give_identical_rollouts(models):
    """Real torch._int_mm and its exact emulation: the same int32 GEMMs, so the same samples and log mu."""
    a = _rollout(EmbeddedEngine("int8", int8_kernel="int_mm"), models["qwen3"])
    b = _rollout(EmbeddedEngine("int8", int8_kernel="emulated"), models["qwen3"])
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.logp_mu, b.logp_mu)


@pytest.mark.parametrize("precision", ["fp8_e4m3", "int8"])
def test_load_weights_requantizes_with_fresh_scales(models, precision):
    model = _build("llama")
    engine = EmbeddedEngine(precision)
    before = _rollout(engine, model)
    qkv = engine.decoder.layers[0].qkv
    scale_before = qkv.weight_scale.clone()
    n_q = model.config.num_attention_heads * 16  # rows of q_proj inside the fused qkv
    with torch.no_grad():
        model.model.layers[0].self_attn.q_proj.weight.mul_(2.0)
    # the engine holds its own copy: nothing changes until the next sync
    same = engine.generate(*prompts(), 2, SamplingParams(max_new_tokens=10), torch.Generator().manual_seed(0))
    assert torch.equal(same.logp_mu, before.logp_mu)
    after = _rollout(engine, model)
    new_scale = engine.decoder.layers[0].qkv.weight_scale
    assert torch.equal(new_scale[:n_q], 2 * scale_before[:n_q])  # doubling is exact in fp32
    assert torch.equal(new_scale[n_q:], scale_before[n_q:])
    assert not torch.equal(after.logp_mu, before.logp_mu)


def test_per_tensor_weights_share_one_scale_over_fused_qkv(models):
    engine = EmbeddedEngine("fp8_e4m3", weight_granularity="per_tensor", act_granularity="per_tensor")
    gap = _gap(models["qwen2"], _rollout(engine, models["qwen2"]))
    assert engine.decoder.layers[0].qkv.weight_scale.numel() == 1
    assert torch.isfinite(gap).all() and gap.max() > 1e-5


def test_same_seed_same_rollout_other_seed_other_rollout(models):
    engine = EmbeddedEngine("fp8_e4m3")
    a, b = _rollout(engine, models["qwen2"], seed=7), _rollout(engine, models["qwen2"], seed=7)
    c = _rollout(engine, models["qwen2"], seed=8)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.logp_mu, b.logp_mu)
    assert not torch.equal(a.response_ids, c.response_ids)


def test_greedy_takes_the_argmax_and_reports_t1_logprobs(models):
    model = models["qwen3"]
    r = _rollout(EmbeddedEngine("fp32"), model, temperature=0.5, greedy=True)
    with torch.no_grad():
        ids = torch.cat([r.prompt_ids, r.response_ids], 1)[:, :-1]
        attn = torch.cat([r.prompt_mask, r.response_mask], 1)[:, :-1].long()
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, r.prompt_ids.shape[1] - 1 :]
    assert torch.equal(r.response_ids, logits.argmax(-1))
    assert _gap(model, r, temperature=1.0).max() < 1e-4
    assert torch.equal(r.response_ids[0], r.response_ids[1])  # no randomness within a group


def test_eos_ends_the_response_mask(models):
    model = models["qwen2"]
    free = _rollout(EmbeddedEngine("fp32"), model, n=4, new=12)
    eos = int(free.response_ids[0, 2])  # a token that occurs: rerun with it as EOS, same seed
    r = _rollout(EmbeddedEngine("fp32", eos_id=eos, pad_id=99), model, n=4, new=12)
    B, T = r.response_ids.shape
    hit_any = False
    for i in range(B):
        hits = (free.response_ids[i] == eos).nonzero()
        stop = int(hits[0]) + 1 if len(hits) else T  # generated length, EOS included
        hit_any |= bool(len(hits))
        assert r.response_mask[i, :stop].all() and not r.response_mask[i, stop:].any()
        assert torch.equal(r.response_ids[i, :stop], free.response_ids[i, :stop])  # same draws up to EOS
        assert (r.response_ids[i, stop:] == 99).all() and (r.logp_mu[i, stop:] == 0).all()
    assert hit_any
    assert _gap(model, r).max() < 1e-4


def test_generation_stops_when_every_row_has_ended(models):
    first = _rollout(EmbeddedEngine("fp32"), models["llama"], greedy=True).response_ids[0, 0]
    ids, mask = prompts()
    engine = EmbeddedEngine("fp32", eos_id=int(first))
    engine.load_weights(models["llama"])
    r = engine.generate(ids[:1], mask[:1], 3, SamplingParams(max_new_tokens=10, greedy=True))
    assert r.response_ids.shape == (3, 1) and r.response_mask.all()


def test_lm_head_and_embedding_quantization_are_switches(models):
    base = _gap(models["llama"], _rollout(EmbeddedEngine("int8"), models["llama"]))
    for flag in ("quantize_lm_head", "quantize_embeddings"):
        gap = _gap(models["llama"], _rollout(EmbeddedEngine("int8", **{flag: True}), models["llama"]))
        assert torch.isfinite(gap).all() and not torch.equal(gap, base), flag


def test_bad_arguments():
    # the engine is built from its schema (EmbeddedRolloutConfig): the schema's checks, named as config keys
    with pytest.raises(ValueError, match="rollout.precision='fp3' is not valid; choose one of: .*bf16, .*fp8_e4m3, .*int8"):
        EmbeddedEngine("fp3")
    with pytest.raises(ValueError, match=r"rollout.sync_every=0 is out of range; allowed: \[1, 4096\]"):
        EmbeddedEngine("fp32", sync_every=0)
    with pytest.raises(TypeError, match="no_such_knob"):
        EmbeddedEngine("fp32", no_such_knob=1)
    with pytest.raises(ValueError, match="'vllm'"):
        EmbeddedEngine("fp32", backend="vllm")
    with pytest.raises(ValueError, match="'per_row'"):
        EmbeddedEngine("int8", weight_granularity="per_row")
    with pytest.raises(RuntimeError, match="load_weights"):
        EmbeddedEngine("fp32").generate(*prompts(), 1, SamplingParams(max_new_tokens=2))


def test_max_len_is_enforced(models):
    engine = EmbeddedEngine("fp32", max_len=12)
    engine.load_weights(models["qwen2"])
    with pytest.raises(ValueError, match="max_len=12"):
        engine.generate(*prompts(), 1, SamplingParams(max_new_tokens=6))


def test_build_engine_from_config():
    cfg = EmbeddedRolloutConfig(precision="fp8_e4m3", weight_granularity="per_tensor", quantize_lm_head=True)
    tok = type("Tok", (), {"eos_token_id": 5, "pad_token_id": None})()
    engine = build_engine(cfg, **engine_ids(tok))
    assert isinstance(engine, EmbeddedEngine) and engine.precision == "fp8_e4m3"
    assert engine.quantizer.weight_granularity == "per_tensor" and engine.cfg.quantize_lm_head
    assert (engine.eos_id, engine.pad_id) == (5, 5)
    assert build_engine(EmbeddedRolloutConfig(precision="int8"), eos_id=3, pad_id=0).pad_id == 0
    assert build_engine(EmbeddedRolloutConfig(precision="bf16"), eos_id=[5, 6], max_len=64).max_len == 64
    with pytest.raises(ValueError, match="'tpu'.*embedded, vllm"):
        build_engine(EmbeddedRolloutConfig(engine="tpu", precision="bf16"))
    with pytest.raises(ValueError, match="rollout.precision='fp3' is not valid; choose one of: .*bf16, .*fp8_e4m3, .*int8"):
        build_engine(EmbeddedRolloutConfig(precision="fp3"))


def test_vllm_engine_explains_how_to_install():
    try:
        import vllm  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match=r"pip install qrl-bench\[vllm\]"):
            build_engine(VLLMRolloutConfig(precision="bf16"))
    else:
        pytest.skip("vllm is installed here; the missing-package message cannot be shown")


@pytest.mark.parametrize("precision", FORMATS.names())
@pytest.mark.parametrize("backend", ["fast", "hf"])
def test_every_registered_precision_rolls_out(models, precision, backend):
    """Each format of bench/quant/ runs in both decoders; quantized ones differ from fp32, and the 4-bit
    formats more than the 8-bit ones (a severity ladder, measured on the mean log-prob gap)."""
    engine = EmbeddedEngine(precision, backend=backend)
    gap = _gap(models["qwen2"], _rollout(engine, models["qwen2"]))
    assert torch.isfinite(gap).all()
    if precision == "fp32":
        assert gap.max() < 1e-4
    else:
        assert gap.max() > 1e-5
    limit = 0.5 if Quantizer(precision).fmt.bits <= 4 else 0.2
    assert gap.max() < limit, (precision, float(gap.max()))
    assert bool(engine.quant_metrics()) is Quantizer(precision).is_scaled


def test_engine_reports_its_own_quantization_error(models):
    """quant/quant_error/<type> = sum ||Q(W)-W||^2 / sum ||W||^2 over that type's layers (QuRL Eq. 14): per
    channel, fusing Q/K/V into one engine layer changes nothing, so it equals the per-weight computation."""
    model = models["qwen2"]
    engine = EmbeddedEngine("int8")
    engine.load_weights(model)
    got = engine.quant_metrics()
    for kind in ("q_proj", "v_proj", "down_proj"):
        ws = [getattr(layer.self_attn if kind != "down_proj" else layer.mlp, kind).weight.detach().double()
              for layer in model.model.layers]
        num = sum(float((fake_quant(w, "int8", "per_channel") - w).pow(2).sum()) for w in ws)
        den = sum(float(w.pow(2).sum()) for w in ws)
        assert got[f"quant/quant_error/{kind}"] == pytest.approx(num / den, rel=1e-4)


def test_fp8_kv_cache_option(models):
    base = _rollout(EmbeddedEngine("bf16"), models["qwen2"])
    for kv in ("fp8_e4m3", "fp8_e5m2"):
        r = _rollout(EmbeddedEngine("bf16", kv_cache_dtype=kv), models["qwen2"])
        assert torch.isfinite(r.logp_mu).all() and not torch.equal(r.logp_mu, base.logp_mu), kv
    with pytest.raises(ValueError, match="fast decoder"):
        EmbeddedEngine("bf16", kv_cache_dtype="fp8", backend="hf").load_weights(models["qwen2"])
    with pytest.raises(ValueError, match="rollout.kv_cache_dtype='int8' is not valid; choose one of: fp8"):
        EmbeddedEngine("bf16", kv_cache_dtype="int8")


@pytest.mark.parametrize("precision, backend, refill", [("fp32", "fast", False), ("int8", "fast", False),
                                                        ("bf16", "fast", False), ("fp32", "hf", True),
                                                        ("fp32", "fast", True), ("int8", "fast", True),
                                                        ("fp8_e4m3", "fast", True), ("fp16", "fast", True)])
def test_chunked_generation_equals_one_batch(models, precision, backend, refill):
    """H3: a batch generated a few sequences at a time gives the same tokens and log-probs as one batch: every
    sequence samples from its own uniforms, so the chunking cannot matter. Without `refill` (and on the generic HF
    path, which has none) each chunk has a KV cache of its own; with it one cache of `rows` slots decodes them all, a
    queued sequence taking an ended one's slot at a sync (continuous batching)."""
    model = models["qwen2"]
    free = _rollout(EmbeddedEngine(precision, chunk_tokens=None, backend=backend), model, n=4, new=12)
    eos = int(free.response_ids[1, 3])  # a token that occurs: rows end at different steps
    whole = _rollout(EmbeddedEngine(precision, eos_id=eos, chunk_tokens=None, backend=backend), model, n=4, new=12,
                     temperature=0.8)
    seq = 7 + 12  # prompt + max new tokens
    for rows in (1, 2, 5):
        engine = EmbeddedEngine(precision, eos_id=eos, chunk_tokens=rows * seq, refill=refill, backend=backend,
                                sync_every=2)
        engine.load_weights(model)
        cache_rows, admitted = [], []
        start = engine.decoder.start
        engine.decoder.start = lambda ids, mask, T, **kw: cache_rows.append(ids.shape[0]) or start(ids, mask, T, **kw)
        if hasattr(engine.decoder, "admit"):
            admit = engine.decoder.admit
            engine.decoder.admit = lambda slots, ids, mask: admitted.append(ids.shape[0]) or admit(slots, ids, mask)
        ids, mask = prompts()
        r = engine.generate(ids, mask, 4, SamplingParams(12, 0.8), torch.Generator().manual_seed(0))
        if refill and backend == "fast":  # one cache of `rows` slots; the other 12 - rows sequences admitted
            assert cache_rows == [rows] and sum(admitted) == 12 - rows and len(admitted) > 1
        else:  # each cache holds a chunk
            assert cache_rows == [rows] * (12 // rows) + ([12 % rows] if 12 % rows else []) and not admitted
        assert torch.equal(r.response_ids, whole.response_ids) and torch.equal(r.response_mask, whole.response_mask)
        # batch-size-dependent GEMM kernels: rounding only, which a bf16 or FP8 rounding of the activations can
        # carry into a neighbouring code (a chunk of 1-2 prompts prefills 7-14 rows, the whole batch 84)
        tol = 1e-5 if precision in ("fp32", "int8") else 1e-2
        assert (r.logp_mu - whole.logp_mu).abs().max() < tol
        assert torch.equal(r.prompt_ids, whole.prompt_ids)
    assert not whole.response_mask.all() and whole.response_mask[:, 0].all()  # some rows stopped early


@pytest.mark.parametrize("precision, backend, kernels", [
    ("fp32", "fast", "auto"), ("bf16", "fast", "auto"), ("fp8_e4m3", "fast", "auto"), ("int8", "fast", "auto"),
    ("fp8_e4m3", "hf", "auto"), ("fp32", "fast", "onednn"), ("fp8_e4m3", "fast", "onednn"), ("fp32", "fast", "plain")])
def test_compaction_and_sparse_syncs_give_the_same_rollout(models, precision, backend, kernels):
    """Item 3 of issue 34: finished rows leave the batch and the KV cache at a host sync every k steps; the
    tokens (and here the log-probs too) are those of the engine that syncs every token and never compacts, with
    each CPU kernel choice (`onednn` packs every weight of this small model; `auto` packs none of them)."""
    if kernels == "onednn" and not onednn_available():
        pytest.skip("this torch has no oneDNN")
    model = models["qwen2"]
    ids, mask = prompts()
    free = _rollout(EmbeddedEngine(precision, backend=backend), model, n=8, new=24)
    eos = [int(t) for t in free.response_ids.flatten().bincount().topk(3).indices]  # frequent ids: rows end early

    def run(**kw):
        engine = EmbeddedEngine(precision, eos_id=eos, backend=backend, cpu_kernels=kernels, **kw)
        engine.load_weights(model)
        rows, step = [], engine.decoder.step
        engine.decoder.step = lambda tok: rows.append(tok.shape[0]) or step(tok)
        r = engine.generate(ids, mask, 8, SamplingParams(24, 0.8), torch.Generator().manual_seed(1))
        return r, rows

    before, before_rows = run(sync_every=1, compact=False)
    after, after_rows = run(sync_every=4)
    lengths = before.response_mask.sum(1)
    assert lengths.min() < 8 and lengths.max() > 12  # rows end at different steps: a compaction has work to do
    assert set(before_rows) == {24}
    assert after_rows[0] == 24 and min(after_rows) < 24 and min(after_rows) >= embedded.COMPACT_MIN_ROWS
    changes = [t + 1 for t in range(1, len(after_rows)) if after_rows[t] != after_rows[t - 1]]
    assert changes and all(t % 4 == 0 for t in changes)  # the batch shrinks at the syncs only
    assert torch.equal(after.response_ids, before.response_ids) and torch.equal(after.response_mask, before.response_mask)
    assert torch.equal(after.logp_mu, before.logp_mu)


def test_bucketed_decode_attention_gives_the_same_rollout(models, precision="fp32"):
    """A CUDA decode step attends over the key positions rounded up to ATTN_BUCKET_CUDA, the unwritten ones masked
    (-inf: exact zeros in the softmax), so the attention backend sees a new key length every 128 steps, not every
    step. Forced here on the CPU with a bucket that leaves most steps with masked positions: in fp32 the same tokens
    and the log-probs equal to rounding (in bf16 a last-bit difference of the longer sum can flip a later token, as
    between two GPU kernels); a CPU engine keeps bucket 1 (exactly the written positions, as before)."""
    model = models["qwen3"]
    ids, mask = prompts()

    def run(bucket: int):
        engine = EmbeddedEngine(precision)
        engine.load_weights(model)
        assert engine.decoder.attn_bucket == 1  # the CPU default
        engine.decoder.attn_bucket = bucket
        keys, decode = [], engine.decoder._decode
        engine.decoder._decode = lambda tok, lo, hi: keys.append(hi) or decode(tok, lo, hi)
        r = engine.generate(ids, mask, 4, SamplingParams(20, 0.8), torch.Generator().manual_seed(3))
        return r, keys  # the decode steps' attended key columns

    exact, exact_keys = run(1)
    bucketed, bucketed_keys = run(16)
    P = ids.shape[1]
    assert exact_keys == list(range(P + 1, P + 20))
    assert all(k % 16 == 0 or k == P + 20 for k in bucketed_keys) and len(set(bucketed_keys)) < len(exact_keys) / 4
    assert all(b >= e for b, e in zip(bucketed_keys, exact_keys)) and bucketed_keys != exact_keys
    assert torch.equal(bucketed.response_ids, exact.response_ids)
    assert (bucketed.logp_mu - exact.logp_mu).abs().max() < 1e-5


def test_sparse_syncs_stop_within_k_steps_of_the_last_row(models):
    """With a sync every k steps the loop decodes at most k - 1 steps past the longest row, and the returned
    width is the longest row's (as with a sync every token)."""
    model = models["qwen2"]
    free = _rollout(EmbeddedEngine("fp32"), model, temperature=0.8, n=4, new=30, seed=2)
    eos = [int(free.response_ids[i, 3 + 2 * i]) for i in range(12)]  # the same draws: row i ends by token 4 + 2i
    engine = EmbeddedEngine("fp32", eos_id=eos, sync_every=8)
    engine.load_weights(model)
    steps, step = [], engine.decoder.step
    engine.decoder.step = lambda tok: steps.append(1) or step(tok)
    ids, mask = prompts()
    r = engine.generate(ids, mask, 4, SamplingParams(30, 0.8), torch.Generator().manual_seed(2))
    longest = int(r.response_mask.sum(1).max())
    assert longest < 30 and r.response_ids.shape[1] == longest
    assert longest - 1 <= len(steps) < longest - 1 + 8


def test_this_torch_knows_every_eager_numerics_option():
    """`compiled` sets each EAGER_NUMERICS option by the first spelling this torch knows and leaves out one it knows
    under none (Inductor refuses unknown options): a torch that renames one again fails here, not silently on a GPU."""
    import torch._inductor.config as config

    options = embedded.inductor_options()
    assert len(options) == len(embedded.EAGER_NUMERICS)
    for name in options:
        obj = config
        for part in name.split("."):
            obj = getattr(obj, part)
        assert obj is False  # an option, off by default: `compiled` turns it on for its graphs only


def test_compiled_engine_traces_and_gives_the_same_rollout(models, monkeypatch, precision="fp8_e4m3", backend="fast"):
    """compile=True: the decode pieces and the fused activation quantizers trace without graph breaks into graphs
    that compute what the eager engine does. Traced with dynamo's eager backend (no C++ build: Inductor's kernels are
    for the benchmark and the GPU check, which compare them with the emulation)."""
    monkeypatch.setattr(embedded, "COMPILE_BACKEND", "eager")
    torch._dynamo.reset()
    eager = _rollout(EmbeddedEngine(precision, backend=backend), models["qwen3"], n=1, new=3)
    engine = EmbeddedEngine(precision, backend=backend, compile=True)
    counters = torch._dynamo.utils.counters
    counters.clear()
    got = _rollout(engine, models["qwen3"], n=1, new=3)
    assert not counters["graph_break"] and counters["stats"]["unique_graphs"] > 0
    assert any(isinstance(getattr(m, "quantizer", None), embedded.FusedActQuantizer) for m in engine.decoder.modules())
    assert torch.equal(got.response_ids, eager.response_ids) and (got.logp_mu - eager.logp_mu).abs().max() < 1e-5


def test_inverse_cdf_draws_each_token_with_its_probability():
    probs = torch.tensor([[0.5, 0.0, 0.25, 0.25]]).expand(40000, 4)
    u = torch.rand(40000, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    counts = torch.bincount(embedded.inverse_cdf(probs, u), minlength=4).float() / 40000
    assert counts[1] == 0 and (counts - probs[0]).abs().max() < 0.02  # 4 sigma ~ 0.01
    edge = embedded.inverse_cdf(torch.tensor([[0.5, 0.5, 0.0]]), torch.tensor([1.0], dtype=torch.float64))
    assert edge.item() != 2  # u * total at the very end never lands on a zero-probability token


def test_chunk_rows():
    assert embedded.chunk_rows(100, None) >= 10**9
    assert embedded.chunk_rows(100, 250) == 2 and embedded.chunk_rows(100, 50) == 1
    with pytest.raises(ValueError, match="chunk_tokens=0"):
        EmbeddedEngine("fp32", chunk_tokens=0)
    with pytest.raises(ValueError, match="rollout.chunk_tokens=0"):
        check_schema(EmbeddedRolloutConfig(precision="fp32", chunk_tokens=0), "rollout")


def test_int8_engine_computes_in_bf16_on_cuda_and_fp32_on_cpu(models):
    """M1: QuRL/FlashRL run INT8 GEMMs inside a bf16 engine on a GPU; on a CPU the engine stays fp32 (the
    device is read from the weights at load time; test_gpu_fixes.py checks the GPU side on a GPU)."""
    fmt, fp8 = Quantizer("int8").fmt, Quantizer("fp8_e4m3").fmt
    assert (fmt.act_dtype_on("cuda"), fmt.act_dtype_on("cpu")) == ("bf16", "fp32")
    assert fp8.act_dtype_on("cuda") == fp8.act_dtype_on("cpu")
    engine = EmbeddedEngine("int8")
    engine.load_weights(next(iter(models.values())))
    assert engine.act_dtype == torch.float32
    assert EmbeddedEngine("int8", act_dtype="bf16").act_dtype == torch.bfloat16  # an explicit choice wins


def test_inverse_cdf_in_row_chunks_draws_the_tokens_of_one_pass():
    """The float64 CDF is built CDF_ROWS rows at a time (memory: [CDF_ROWS, V], not [rows, V]); each row's draw is
    its own, so the chunks draw exactly the tokens of one pass over every row."""
    g = torch.Generator().manual_seed(3)
    rows = 2 * embedded.CDF_ROWS + 5
    probs = torch.softmax(torch.randn(rows, 1000, generator=g) * 3, -1)
    u = torch.rand(rows, dtype=torch.float64, generator=g)
    cdf = probs.double().cumsum(-1)
    whole = torch.searchsorted(cdf, u[:, None] * cdf[:, -1:], right=True).squeeze(-1)
    assert torch.equal(embedded.inverse_cdf(probs, u), whole)


def test_decode_attention_is_sdpa_in_two_matmuls():
    """`decode_attention` (a CPU decode step's attention unless rollout.cpu_kernels=plain) is the GQA attention SDPA
    computes: one query row per sequence, G query heads per KV head, masked key positions (-inf) left out."""
    g = torch.Generator().manual_seed(0)
    for B, H, Hkv, L, D in ((3, 4, 2, 9, 16), (5, 8, 2, 40, 32), (2, 6, 6, 17, 8)):
        q, k, v = (torch.randn(*shape, generator=g) for shape in ((B, H, 1, D), (B, Hkv, L, D), (B, Hkv, L, D)))
        valid = torch.rand(B, 1, 1, L, generator=g) > 0.3
        valid[..., -1] = True  # the position a step writes is always attended
        mask = torch.zeros(B, 1, 1, L).masked_fill_(~valid, float("-inf"))
        got = embedded.decode_attention(q, k, v, mask, D**-0.5)
        want = embedded.grouped_attention(q, k, v, mask, D**-0.5)
        assert got.shape == want.shape == (B, H, 1, D)
        torch.testing.assert_close(got, want, rtol=0, atol=2e-6)
        k2 = k.masked_fill(~valid.view(B, 1, L, 1), 1e3)  # what a masked key holds changes nothing
        torch.testing.assert_close(embedded.decode_attention(q, k2, v, mask, D**-0.5), got, rtol=0, atol=2e-6)


@pytest.mark.parametrize("kernels", ["onednn", "plain"])
def test_cpu_kernel_choices_sample_the_same_rollout(models, kernels):
    """rollout.cpu_kernels changes how a CPU decode step computes, not what: against `auto` the same tokens, and
    log-probs equal to fp32 rounding. `plain` uses neither oneDNN nor the matmul attention; `onednn` packs every
    weight and attends by `decode_attention`."""
    if kernels == "onednn" and not onednn_available():
        pytest.skip("this torch has no oneDNN")
    model = models["qwen3"]
    calls = []
    real = embedded.decode_attention
    embedded.decode_attention = lambda *a: calls.append(1) or real(*a)
    try:
        base = _rollout(EmbeddedEngine("fp32"), model, n=4, new=16)
        auto_calls, calls[:] = len(calls), []
        engine = EmbeddedEngine("fp32", cpu_kernels=kernels)
        other = _rollout(engine, model, n=4, new=16)
    finally:
        embedded.decode_attention = real
    packed = [m.packed is not None for m in engine.decoder.modules() if hasattr(m, "packed")]
    assert auto_calls > 0 and packed and all(packed) == (kernels == "onednn") and any(packed) == all(packed)
    assert (len(calls) > 0) == (kernels != "plain")
    assert torch.equal(other.response_ids, base.response_ids)
    assert (other.logp_mu - base.logp_mu).abs().max() < 1e-5
    with pytest.raises(ValueError, match=r"rollout.cpu_kernels='mkl' is not valid; choose one of: auto, onednn, plain"):
        EmbeddedEngine("fp32", cpu_kernels="mkl")


def test_refill_decodes_a_queue_in_fewer_steps_with_the_same_tokens(models):
    """Continuous batching (rollout.refill): 24 sequences through 10 slots. Sequences ended at a sync hand their
    slots to queued ones, so the batch stays full and the cache decodes fewer steps than chunk after chunk, each to
    its longest row; once the queue is empty the ended rows leave the batch (compaction). The tokens are those of
    the whole batch at once, and each sequence's log-probs equal them to fp32 rounding."""
    model = models["qwen3"]
    ids, mask = prompts()
    free = _rollout(EmbeddedEngine("fp32"), model, n=8, new=20)
    eos = [int(t) for t in free.response_ids.flatten().bincount().topk(4).indices]  # frequent ids: rows end early
    sampling = SamplingParams(20, 0.8)
    whole = EmbeddedEngine("fp32", eos_id=eos, chunk_tokens=None)
    whole.load_weights(model)
    want = whole.generate(ids, mask, 8, sampling, torch.Generator().manual_seed(4))

    def run(refill: bool):
        engine = EmbeddedEngine("fp32", eos_id=eos, chunk_tokens=10 * (ids.shape[1] + 20), refill=refill, sync_every=4)
        engine.load_weights(model)
        rows, step = [], engine.decoder.step
        engine.decoder.step = lambda tok: rows.append(tok.shape[0]) or step(tok)
        return engine.generate(ids, mask, 8, sampling, torch.Generator().manual_seed(4)), rows

    (refilled, refill_rows), (chunked, chunk_rows) = run(True), run(False)
    lengths = want.response_mask.sum(1)
    assert lengths.min() < 8 and lengths.max() > 12 and want.response_ids.shape[0] == 24
    assert refill_rows[0] == 10 and min(refill_rows) < 10  # full slots, then compaction once the queue is empty
    assert len(refill_rows) < len(chunk_rows)  # fewer decode steps than three chunks of 10, 10 and 4
    for got in (refilled, chunked):
        assert torch.equal(got.response_ids, want.response_ids) and torch.equal(got.response_mask, want.response_mask)
        assert (got.logp_mu - want.logp_mu).abs().max() < 1e-5


@pytest.mark.parametrize("greedy, new, sync_every, slots, stop", [
    (False, 1, 16, 2, False), (True, 6, 1, 1, True), (False, 9, 3, 5, False), (False, 9, 2, 7, True),
    (True, 12, 5, 3, True)])
def test_refill_edge_cases_give_the_tokens_of_one_batch(models, greedy, new, sync_every, slots, stop):
    """Continuous batching at its edges: one new token, one slot, a sync every step or every few, no stop id (every
    sequence runs to max_new_tokens and the slots turn over together), greedy and sampled: the tokens and lengths of
    the whole batch at once, log-probs to fp32 rounding."""
    model = models["qwen2"]
    ids, mask = prompts()
    free = _rollout(EmbeddedEngine("fp32"), model, n=4, new=8)
    eos = [int(t) for t in free.response_ids.flatten().bincount().topk(3).indices]
    sampling = SamplingParams(new, 0.9, greedy=greedy)

    def run(**kw):
        engine = EmbeddedEngine("fp32", eos_id=eos if stop else None, sync_every=sync_every, **kw)
        engine.load_weights(model)
        return engine.generate(ids, mask, 4, sampling, torch.Generator().manual_seed(7))

    whole, refilled = run(chunk_tokens=None), run(chunk_tokens=slots * (ids.shape[1] + new))
    assert torch.equal(refilled.response_ids, whole.response_ids)
    assert torch.equal(refilled.response_mask, whole.response_mask)
    assert (refilled.logp_mu - whole.logp_mu).abs().max() < 1e-5
    assert refilled.response_mask.sum(1).max() <= new and whole.response_ids.shape[0] == 12


@pytest.mark.parametrize("greedy, sync_every, slots, compact, narrowed", [
    (False, 1, 2, True, True), (True, 5, 3, False, False), (False, 16, 10, True, False), (False, 3, 2, False, True)])
def test_a_refilled_cache_moves_its_window_with_the_tokens_of_one_batch(models, greedy, sync_every, slots, compact,
                                                                       narrowed):
    """A refilled cache attends over the window from its oldest sequence that may still decode (`_window`), and when the
    shared column reaches the cache's end the window moves to its front (`_shift`): 36 sequences through 2-10 slots
    fill the cache several times over. Each sequence attends what it would in a cache of its own (its columns and
    masked ones), so the tokens and lengths are the whole batch's, log-probs to fp32 rounding. The window is narrower
    than the cache when the oldest slot's sequence ended early and a newer one took its slot: with 2 slots and 5 stop
    ids (`narrowed`) it does; greedy rows of this model rarely stop, so their slots turn over together."""
    model = models["qwen2"]
    ids, mask = prompts()
    free = _rollout(EmbeddedEngine("fp32"), model, n=4, new=8)
    eos = [int(t) for t in free.response_ids.flatten().bincount().topk(5).indices]
    sampling = SamplingParams(10, 0.9, greedy=greedy)

    def run(**kw):
        engine = EmbeddedEngine("fp32", eos_id=eos, sync_every=sync_every, compact=compact, **kw)
        engine.load_weights(model)
        return engine

    whole = run(chunk_tokens=None).generate(ids, mask, 12, sampling, torch.Generator().manual_seed(5))
    engine = run(chunk_tokens=slots * (ids.shape[1] + 10))
    shifts, windows, dec = [], [], engine.decoder
    shift, decode = dec._shift, dec._decode
    dec._shift = lambda: shifts.append(dec._state["base"]) or shift()
    dec._decode = lambda tok, lo, hi: windows.append((lo, hi)) or decode(tok, lo, hi)
    refilled = engine.generate(ids, mask, 12, sampling, torch.Generator().manual_seed(5))
    assert len(shifts) >= 2 and shifts == sorted(set(shifts))  # the window moved on, more than once
    assert any(lo > 0 for lo, _ in windows) or not narrowed  # a step attended fewer columns than the cache has
    assert all(0 <= lo < hi <= ids.shape[1] + 10 for lo, hi in windows)
    assert torch.equal(refilled.response_ids, whole.response_ids)
    assert torch.equal(refilled.response_mask, whole.response_mask)
    assert (refilled.logp_mu - whole.logp_mu).abs().max() < 1e-5 and whole.response_ids.shape[0] == 36


@pytest.mark.parametrize("precision, kw", [("fp32", {}), ("fp8_e4m3", {}), ("fp32", {"cpu_kernels": "plain"}),
                                           ("int8", {"chunk_tokens": 5 * (7 + 16)})])
def test_the_cuda_graph_step_computes_the_eager_step(models, precision, kw):
    """rollout.cuda_graphs' CPU twin: the graphed path (`FastDecoder._graph_step`: the token through a static buffer,
    the step a graph captures, `_decode`, with every per-step value a device tensor and every buffer updated in
    place) run without capture on the CPU gives the eager step's tokens and log-probs bit for bit, through compactions
    (new graphs per batch) and refills (admissions write the buffers in place). On a CPU the engine never captures
    (tests/unit/test_gpu_kernels.py replays the graphs on a GPU)."""
    model = models["qwen3"]
    ids, mask = prompts()
    free = _rollout(EmbeddedEngine(precision), model, n=8, new=16)
    eos = [int(t) for t in free.response_ids.flatten().bincount().topk(3).indices]

    def run(graphed: bool, whole_cache: bool = True):
        engine = EmbeddedEngine(precision, eos_id=eos, sync_every=4, cuda_graphs=True, **kw)
        engine.load_weights(model)
        assert engine.decoder.graphs is None  # a CPU engine ignores rollout.cuda_graphs: no graph to capture
        if whole_cache:  # every step attends from the cache's first column, as a graph does (not from the window's)
            decode = engine.decoder._decode
            engine.decoder._decode = lambda tok, lo, hi: decode(tok, 0, hi)
        static, real = [], engine.decoder._graph_step
        if graphed:
            engine.decoder.use_cuda_graphs()
            engine.decoder._graph_step = lambda tok, keys: static.append(keys) or real(tok, keys)
        r = engine.generate(ids, mask, 8, SamplingParams(16, 0.8), torch.Generator().manual_seed(2))
        return r, static, engine.decoder.graphs

    (eager, _, _), (graphed, static, graphs) = run(False), run(True)
    assert static and graphs == {}  # every step took the static path; nothing was captured on the CPU
    assert torch.equal(graphed.response_ids, eager.response_ids) and torch.equal(graphed.logp_mu, eager.logp_mu)
    assert torch.equal(graphed.response_mask, eager.response_mask) and eager.response_mask.sum(1).min() < 16
    windowed = run(False, whole_cache=False)[0]  # the eager default: a refilled cache's window, fewer zero terms
    assert torch.equal(windowed.response_mask, eager.response_mask)
    assert (windowed.logp_mu - eager.logp_mu).abs().max() < (1e-5 if precision == "fp32" else 1e-3)
