"""Each key of bench.run.identity.ADDED_KEYS at its neutral value computes what the code before the key computed.

A run recorded before a key existed matches a launch that gives the key its neutral value (bench.run.identity
`config_diff`), so a relaunched sweep skips or resumes it instead of refusing it. That is sound only if today's code
at that value is the earlier code: one test per key shows it. Two forms:

- replay against the earlier code: the code path the key replaced, copied here from the commit before the key
  (named in each test), run beside today's on the same inputs, compared bit for bit;
- by construction: the key only gates a code path, and the test shows that at its neutral value the gate is closed
  (nothing of the new path runs, or the path's outputs are independent of the key's value).
"""

from __future__ import annotations

import ast
import json
import math
from types import SimpleNamespace

import pytest
import torch
import transformers as tr
from omegaconf import OmegaConf

from bench.launch.config import CONF_DIR
from bench.grpo import agg_loss, clipped_surrogate_bounds, group_advantages, safe_log_ratio
from bench.methods.base import Batch, make_method, token_advantages
from bench.methods.importance import behaviour_log_ratio, truncated_weights
from bench.rollout import SamplingParams, cpu_attention, embedded
from bench.rollout.embedded import EmbeddedEngine, _sample, inverse_cdf, top_p_logprobs
from bench.run.identity import ADDED_KEYS, flatten
from bench.train import rebaseline
from tests.helpers import REPO, make_cfg

D = torch.float64


def neutral(key: str):
    """The value each test runs at: the declaration's, so a wrong declaration fails its test."""
    return ADDED_KEYS[key].neutral


def test_every_declared_key_exists_today_and_composes_at_its_neutral_value(tmp_path):
    """A typo in ADDED_KEYS would accept a missing key nobody declared: each key is a key of today's config (of an
    arm that has it), and its neutral value composes."""
    arm_of = {"method.denominator": "tis", "method.is_seq_ratio": "tis", "method.geo_rs_weighted": "geo_rs"}
    for method in ("naive", "tis", "geo_rs"):
        keys = [k for k in ADDED_KEYS if arm_of.get(k, "naive") == method]
        cfg = make_cfg(tmp_path, f"method={method}", *(f"{k}={json.dumps(ADDED_KEYS[k].neutral)}" for k in keys))
        flat = flatten(OmegaConf.to_container(cfg, resolve=True))
        for key in keys:
            assert json.dumps(flat.get(key, "missing")) == json.dumps(ADDED_KEYS[key].neutral), key
    assert all(len(added.commit) >= 7 and added.why for added in ADDED_KEYS.values())


# ------------------------------------------------------------------------------------ training (dd028ce)
def _batch(seed: int, B: int = 8, T: int = 6) -> Batch:
    """A rollout batch with padding, behaviour log-ratios wide enough that TIS truncates and Geo-RS rejects."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 4:] = False
    mask[3, 2:] = False
    lmu = -torch.rand(B, T, generator=g, dtype=D) * 3
    lold = lmu + torch.randn(B, T, generator=g, dtype=D) * 0.3
    adv = torch.randn(B, generator=g, dtype=D)
    return Batch(logp_old=lold, logp_mu=lmu, adv=adv, mask=mask, n_tokens=float(mask.sum()))


def _old_ppo_loss(m, logp: torch.Tensor, batch: Batch, w: torch.Tensor) -> torch.Tensor:
    """PPOClipMethod.loss at 6ae5a75 (before dd028ce added method.denominator): the token-mean over the batch's
    mask and n_tokens, whatever the weights."""
    algo, mask = m.algo, batch.mask.bool()
    ratio = torch.exp(safe_log_ratio(logp, batch.logp_old.detach(), mask, algo.log_ratio_clamp))
    psi = clipped_surrogate_bounds(ratio, token_advantages(batch.adv, logp), 1.0 - algo.clip_eps_low,
                                   1.0 + algo.clip_eps_high, algo.dual_clip_c)
    return agg_loss(w.detach() * psi, mask, algo.loss_agg, batch.n_tokens)


def _loss_and_grad(fn, logp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    lt = logp.clone().requires_grad_(True)
    loss = fn(lt)
    loss.backward()
    return loss.detach(), lt.grad


@pytest.mark.parametrize("method", ["tis", "geo_rs"])
def test_denominator_all_is_the_token_mean_before_the_key(method):
    """method.denominator=all (replay against 6ae5a75): a dropped token (weight 0) stays in the denominator, so the
    loss and its gradient are the earlier loss's bit for bit; `kept` differs (the test can fail)."""
    batch = _batch(0)
    logp = batch.logp_old + 0.05
    m = make_method(method, denominator=neutral("method.denominator"), **({"is_cap_C": 1.05} if method == "tis" else {}))
    stats = m.prepare(batch)
    w = stats["is_weights"]
    assert bool((w[batch.mask] == 0).any()) or method == "tis"
    new = _loss_and_grad(lambda lt: m.loss(lt, batch, stats)[0], logp)
    old = _loss_and_grad(lambda lt: _old_ppo_loss(m, lt, batch, w), logp)
    assert torch.equal(new[0], old[0]) and torch.equal(new[1], old[1])
    if bool((w[batch.mask] == 0).any()):
        kept = make_method(method, denominator="kept")
        assert not torch.equal(_loss_and_grad(lambda lt: kept.loss(lt, batch, kept.prepare(batch))[0], logp)[0], old[0])


def test_geo_rs_weighted_false_is_the_keep_mask_before_the_key():
    """method.geo_rs_weighted=false (replay against 6ae5a75's GeoRS.prepare): each token's weight is its sequence's
    keep bit, as before."""
    batch = _batch(1)
    m = make_method("geo_rs", geo_rs_weighted=neutral("method.geo_rs_weighted"))
    mask = batch.mask.bool()
    log_rho = behaviour_log_ratio(batch, m.algo.log_ratio_clamp)
    n = mask.sum(-1)  # geometric_keep at 6ae5a75:
    log_g = torch.where(mask, log_rho, torch.zeros_like(log_rho)).sum(-1) / n.clamp(min=1)
    keep = (log_g >= math.log(m.cfg.geo_rs_lo)) & (log_g <= math.log(m.cfg.geo_rs_hi))
    old = torch.ones_like(log_rho) * keep[:, None] * mask
    assert 0 < int(keep.sum()) < batch.mask.shape[0]  # some sequences rejected, some kept
    assert torch.equal(m.prepare(batch)["is_weights"], old)
    assert not torch.equal(make_method("geo_rs", geo_rs_weighted=True).prepare(batch)["is_weights"], old)


def test_is_seq_ratio_product_is_sequence_tis_before_the_key():
    """method.is_seq_ratio=product (replay against 6ae5a75's TIS.prepare at is_level=sequence): the weight is
    min(exp(clamp(sum_t LR)), C) per sequence, as before."""
    batch = _batch(2)
    m = make_method("tis", is_level="sequence", is_seq_ratio=neutral("method.is_seq_ratio"), is_cap_C=2.0)
    raw = behaviour_log_ratio(batch, float("inf"))
    clamp = m.algo.log_ratio_clamp
    rho = torch.exp(raw.sum(-1).clamp(-clamp, clamp))[:, None].expand_as(raw)
    old = truncated_weights(rho, m.cfg.is_cap_C, m.cfg.is_mode, m.cfg.is_cap_low) * batch.mask
    assert torch.equal(m.prepare(batch)["is_weights"], old)
    geometric = make_method("tis", is_level="sequence", is_seq_ratio="geometric", is_cap_C=2.0)
    assert not torch.equal(geometric.prepare(batch)["is_weights"], old)


def test_baseline_all_is_the_grpo_advantage_before_the_key():
    """algo.baseline=all (replay against 6ae5a75's group_advantages): every response sets its group's mean and std;
    the trainer re-baselines only under `kept` (bench/train.py rebaseline reads the key before asking the arm)."""
    g = torch.Generator().manual_seed(3)
    rewards = torch.randint(0, 2, (32,), generator=g).to(D)
    rewards[:4] = 1.0  # a group whose rewards are all equal
    for norm in (True, False):
        r = rewards.view(-1, 4)  # group_advantages at 6ae5a75:
        centered = r - r.mean(dim=1, keepdim=True)
        adv = centered / (r.std(dim=1, keepdim=True, unbiased=True) + 1e-6) if norm else centered
        adv = torch.where((r == r[:, :1]).all(dim=1, keepdim=True), torch.zeros_like(adv), adv).reshape(-1)
        assert torch.equal(group_advantages(rewards, 4, eps=1e-6, norm_by_std=norm), adv)
    # the trainer's re-baselining at the neutral value leaves the batch as it is, though the arm rejected responses;
    # the namespace stands for the trainer's Parts, of which rebaseline reads the config and the arm
    batch, m = _batch(1), make_method("geo_rs")
    stats = m.prepare(batch)
    assert bool(m.rejected_rows(batch, stats).any())
    parts = SimpleNamespace(cfg=SimpleNamespace(algo=SimpleNamespace(baseline=neutral("algo.baseline"))), method=m)
    assert rebaseline(parts, None, rewards[:8], batch, stats) is batch


# --------------------------------------------------------------------------------- evaluation (3bd2052)
def _old_sample(logits: torch.Tensor, sampling: SamplingParams, uniform: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """embedded._sample at 3bd2052^ (before eval.top_k): temperature, then the top-p nucleus, then the CDF."""
    logp_all = torch.log_softmax(logits.float() / sampling.temperature, dim=-1)
    if sampling.top_p < 1.0:
        logp_all = top_p_logprobs(logp_all, sampling.top_p)
    tok = inverse_cdf(logp_all.exp(), uniform)
    return tok, logp_all.gather(-1, tok[:, None]).squeeze(-1)


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_top_k_0_samples_as_before_the_key(temperature, top_p):
    """eval.top_k=0 (replay against 3bd2052^'s sampler): the same tokens and log-probs bit for bit."""
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(64, 128, generator=g) * 3
    u = torch.rand(64, generator=g, dtype=D)
    new = _sample(logits, SamplingParams(8, temperature, top_p=top_p, top_k=neutral("eval.top_k")), u)
    old = _old_sample(logits, SamplingParams(8, temperature, top_p=top_p), u)
    assert torch.equal(new[0], old[0]) and torch.equal(new[1], old[1])
    assert not torch.equal(_sample(logits, SamplingParams(8, temperature, top_p=top_p, top_k=2), u)[1], old[1])


# ------------------------------------------------------------------------------ configuration (f1d2bb8)
def test_convention_ours_applies_no_preset():
    """convention=ours (by construction): the preset group is `optional convention_preset@method:
    ${method}_${convention}` and no `<arm>_ours.yaml` exists, so the arm's knobs are its own config's; and nothing
    but the config check reads the key (a preset's values would show as method.* differences themselves)."""
    assert "optional convention_preset@method: ${method}_${convention}" in (CONF_DIR / "config.yaml").read_text()
    assert not list((CONF_DIR / "convention_preset").glob(f"*_{neutral('convention')}.yaml"))
    readers = set()
    for path in (REPO / "bench").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr == "convention") or (
                    isinstance(node, ast.Constant) and node.value == "convention"):
                readers.add(path.relative_to(REPO).as_posix())
    # the check, ADDED_KEYS, and CONFIG_GROUPS (the group's name for --help and the error messages)
    assert readers == {"bench/launch/config.py", "bench/run/identity.py", "bench/__init__.py"}, readers


# ----------------------------------------------------------------------------------- rollout (4a105a2)
SMALL = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=128, initializer_range=0.02, max_position_embeddings=128)


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return tr.Qwen2ForCausalLM(tr.Qwen2Config(**SMALL, tie_word_embeddings=True)).eval()


def _generate(model, precision: str, eos: list[int] | None = None, **kw):
    engine = EmbeddedEngine(precision, eos_id=eos, **kw)
    engine.load_weights(model)
    rows, step = [], engine.decoder.step
    engine.decoder.step = lambda tok: rows.append(tok.shape[0]) or step(tok)
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(1, 128, (3, 7), generator=g)
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[1, :3] = False
    r = engine.generate(ids.masked_fill(~mask, 0), mask, 8, SamplingParams(24, 0.8), torch.Generator().manual_seed(1))
    return r, rows


@pytest.mark.parametrize("precision", ["mxfp4", "fp32"])
def test_without_compaction_the_sync_interval_changes_no_token(model, precision):
    """rollout.compact=false, rollout.sync_every=16 (by construction): every decode step sees the whole batch, as
    before the keys, and the rollout is that of a stop check at every token (sync_every=1, the loop before
    4a105a2) bit for bit: tokens after a stop are masked, each token's uniform is drawn before the loop, and the
    steps past the longest row are dropped."""
    free, _ = _generate(model, precision)
    eos = [int(t) for t in free.response_ids.flatten().bincount().topk(12).indices]  # frequent ids: every row ends early
    before, before_rows = _generate(model, precision, eos, sync_every=1, compact=False)
    now, now_rows = _generate(model, precision, eos, sync_every=neutral("rollout.sync_every"),
                              compact=neutral("rollout.compact"))
    lengths = before.response_mask.sum(1)
    assert lengths.min() < lengths.max() < 24  # rows end at different steps, the last before max_new_tokens
    assert set(before_rows) == set(now_rows) == {24}  # no compaction: the full batch at every step
    assert len(now_rows) > len(before_rows)  # the sparse check ran past the longest row; those steps are dropped
    for a, b in [(now.response_ids, before.response_ids), (now.response_mask, before.response_mask),
                 (now.logp_mu, before.logp_mu)]:
        assert torch.equal(a, b)


def test_compile_false_runs_the_eager_decoder(model, monkeypatch):
    """rollout.compile=false (by construction): torch.compile is never called and no quantizer is fused, so the
    decoder is the eager one, the only one before the key."""
    def refuse(fn):
        raise AssertionError("rollout.compile=false compiled a function")
    monkeypatch.setattr(embedded, "compiled", refuse)
    engine = EmbeddedEngine("mxfp4", compile=neutral("rollout.compile"))
    engine.load_weights(model)
    assert not any(isinstance(getattr(m, "quantizer", None), embedded.FusedActQuantizer) for m in engine.decoder.modules())


def test_fp8_kernel_auto_chooses_each_linear_as_before_the_key(model, monkeypatch):
    """rollout.fp8_kernel=auto (by construction): before the key the engine passed no FP8 kernel and the FP8 format's
    make_linear chose with its default, auto; at the neutral value every FP8 linear is chosen with auto."""
    from bench.quant import fp8 as fp8_mod

    seen = []
    choose = fp8_mod.choose_fp8_kernel
    monkeypatch.setattr(fp8_mod, "choose_fp8_kernel", lambda kernel, *a: seen.append(kernel) or choose(kernel, *a))
    EmbeddedEngine("fp8_e4m3", fp8_kernel=neutral("rollout.fp8_kernel")).load_weights(model)
    assert seen and set(seen) == {"auto"}



@pytest.mark.parametrize("backend", ["fast", "hf"])
def test_plain_cpu_kernels_run_torch_linear_and_sdpa(model, monkeypatch, backend):
    """rollout.cpu_kernels=plain (by construction): no layer gets oneDNN's packed weight, so every fp32 GEMM is
    F.linear on the layer's own weight, and no decode step takes the matmul attention, so every attention is the
    SDPA call of before the key. Shown on a model whose weights `auto` would pack (the threshold lowered to 0)."""
    from bench.quant import linear as linear_mod

    monkeypatch.setattr(linear_mod, "ONEDNN_MIN_WEIGHT", 0)
    monkeypatch.setattr(embedded, "decode_attention", lambda *a: pytest.fail("the matmul attention ran"))
    engine = EmbeddedEngine("fp8_e4m3", backend=backend, cpu_kernels=neutral("rollout.cpu_kernels"))
    r, _ = _generate(model, "fp8_e4m3", backend=backend, cpu_kernels=neutral("rollout.cpu_kernels"))
    engine.load_weights(model)
    modules = list(engine.decoder.modules() if backend == "fast" else engine.decoder.model.modules())
    assert any(getattr(m, "fp32_gemm", False) for m in modules)
    assert all(getattr(m, "packed", None) is None for m in modules) and r.response_mask.any()


def test_refill_false_generates_a_chunk_at_a_time(model, monkeypatch):
    """rollout.refill=false (by construction): `generate` hands the decoder one chunk of at most chunk_rows sequences
    at a time, each with a cache of its own, and no sequence is ever admitted into a running cache, as before the
    key."""
    monkeypatch.setattr(embedded.FastDecoder, "admit", lambda *a: pytest.fail("a sequence was admitted"))
    starts = []
    start = embedded.FastDecoder.start
    monkeypatch.setattr(embedded.FastDecoder, "start",
                        lambda self, ids, *a, **kw: starts.append(ids.shape[0]) or start(self, ids, *a, **kw))
    r, _ = _generate(model, "fp32", chunk_tokens=5 * (7 + 24), refill=neutral("rollout.refill"))
    assert starts == [5, 5, 5, 5, 4] and r.response_ids.shape[0] == 24


def test_cpu_attention_matmul_never_calls_the_varlen_kernel(model, monkeypatch):
    """rollout.cpu_attention=matmul (by construction): the decoder's varlen flag is off, so every decode step attends
    by `decode_attention` over the window, and the C kernel (bench.rollout.cpu_attention) is never called."""
    monkeypatch.setattr(cpu_attention, "varlen_decode_attention", lambda *a: pytest.fail("the varlen kernel ran"))
    calls, real = [], embedded.decode_attention
    monkeypatch.setattr(embedded, "decode_attention", lambda *a: calls.append(1) or real(*a))
    engine = EmbeddedEngine("fp32", cpu_attention=neutral("rollout.cpu_attention"))
    engine.load_weights(model)
    assert engine.decoder.varlen is False
    r, rows = _generate(model, "fp32", cpu_attention=neutral("rollout.cpu_attention"))
    assert rows and calls and r.response_mask.any()


def test_cuda_graphs_false_decodes_every_step_eagerly(model, monkeypatch):
    """rollout.cuda_graphs=false (by construction): the decoder gets no graphs, so every step takes `_decode` eagerly
    and the graphed path (its static buffer, capture and replay) never runs."""
    monkeypatch.setattr(embedded.FastDecoder, "_graph_step", lambda *a: pytest.fail("the graphed step ran"))
    engine = EmbeddedEngine("fp32", cuda_graphs=neutral("rollout.cuda_graphs"))
    engine.load_weights(model)
    assert engine.decoder.graphs is None
    r, rows = _generate(model, "fp32", cuda_graphs=neutral("rollout.cuda_graphs"))
    assert rows and r.response_mask.any()


def test_lr_warmup_0_trains_at_lr_from_step_0():
    """train.lr_warmup_steps=0 (by construction): every step's learning rate is train.lr, the constant the optimizer
    was built with before the key."""
    from bench.train import scheduled_lr
    from bench.train_config import TrainConfig

    for lr in (3e-5, 1e-6, 1.0):
        cfg = TrainConfig(lr=lr, lr_warmup_steps=neutral("train.lr_warmup_steps"))
        assert all(scheduled_lr(cfg, step) == lr for step in range(0, 1000, 7))
