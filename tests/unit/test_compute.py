"""The trainer's compute (bench/compute.py, bench/device.py, bench.models.logprobs): device selection, micro-batches,
gradient checkpointing, fp16 emulation and loss scaling, all on the CPU with a tiny random Qwen2.

The equivalence tests compare gradients parameter by parameter; their tolerance (1e-6 relative to the largest
gradient entry, fp32) leaves room only for a different summation order, not for a different computation.
"""

from __future__ import annotations

import copy

import pytest
import torch
import transformers as tr

from bench import device as dev
from bench.compute import Diverged, TrainerCompute, enable_gradient_checkpointing
from bench.methods.base import Batch, make_method
from bench.models.logprobs import emulated_weights, token_logprobs
from bench.rollout import SamplingParams
from bench.rollout.embedded import EmbeddedEngine
from bench.train_config import TrainConfig
from bench.domains import check_schema

CPU = torch.device("cpu")
EMB = "model.embed_tokens.weight"  # tied with the lm_head: one parameter
SMALL = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=128, initializer_range=0.02, max_position_embeddings=128, tie_word_embeddings=True)


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return tr.Qwen2ForCausalLM(tr.Qwen2Config(**SMALL)).eval()


@pytest.fixture(scope="module")
def rollout(model):
    """12 responses (3 prompts of lengths 7/4/2, left-padded, x 4) from an FP8 engine: log mu != log pi."""
    g = torch.Generator().manual_seed(123)
    ids = torch.randint(1, 128, (3, 7), generator=g)
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[1, :3] = False
    mask[2, :5] = False
    engine = EmbeddedEngine("fp8_e4m3", eos_id=5)
    engine.load_weights(model)
    return engine.generate(ids.masked_fill(~mask, 0), mask, 4, SamplingParams(max_new_tokens=9), g)


def _batch(model, rollout) -> Batch:
    """Seeded advantages and a mask with ~20 % of the response tokens dropped, on the rollout's device."""
    device = rollout.response_mask.device
    logp_old, _ = TrainerCompute(device, "fp32", 1.0).logprobs(model, rollout)
    g = torch.Generator().manual_seed(1)
    adv = torch.randn(rollout.batch_size, generator=g).to(device)
    mask = rollout.response_mask & (torch.rand(rollout.response_mask.shape, generator=g) > 0.2).to(device)
    return Batch(logp_old, rollout.logp_mu, adv, mask, float(mask.sum()))


def _backward(model, rollout, method, batch, micro=None, dtype="fp32", scaler=None):
    """(loss, metrics, logp, entropy, grads) of one optimizer step's backward on a fresh copy of `model`."""
    m = copy.deepcopy(model)
    compute = TrainerCompute(CPU, dtype, 1.0, micro, scaler)
    stats = method.prepare(batch)
    loss, metrics, logp, entropy = compute.backward(m, rollout, lambda lp: method.loss(lp, batch, stats), step=0)
    return loss, metrics, logp, entropy, {n: p.grad.clone() for n, p in m.named_parameters()}


def _assert_grads_close(a: dict, b: dict, rel: float = 1e-6) -> None:
    scale = max(g.abs().max().item() for g in a.values())
    assert scale > 0
    for name in a:
        diff = (a[name] - b[name]).abs().max().item()
        assert diff <= rel * scale, f"{name}: |diff| {diff:.3g} > {rel} x max|grad| {scale:.3g}"


# ------------------------------------------------------------------------------------------------ device
def test_device_choice_and_errors(monkeypatch):
    assert dev.resolve_device("cpu") == CPU
    with pytest.raises(ValueError, match=r"train.device='tpu' is not valid; choose one of: auto, cpu, cuda"):
        dev.resolve_device("tpu")
    # this machine: a CPU-only torch wheel -> auto is the CPU, cuda is an error that says why
    monkeypatch.setattr(torch.version, "cuda", None)
    assert dev.resolve_device("auto") == CPU
    with pytest.raises(ValueError, match=r"train.device=cuda but CUDA is not usable: this torch .* CPU-only build"):
        dev.resolve_device("cuda")
    with pytest.raises(ValueError, match="CPU-only build"):
        TrainConfig(device="cuda").check()  # validated before any work (bench.launch.config.validate)
    # a CUDA build on a node without a visible GPU
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert dev.resolve_device("auto") == CPU
    with pytest.raises(ValueError, match=r"sees no GPU \(CUDA_VISIBLE_DEVICES=''\).*gpus_per_node=1"):
        dev.resolve_device("cuda")
    # a GPU: auto takes it
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert dev.resolve_device("auto").type == dev.resolve_device("cuda").type == "cuda"


def test_train_config_checks_the_new_knobs():
    check_schema(TrainConfig(device="cpu", dtype="fp16", micro_batch_size=2, gradient_checkpointing=True), "train")
    with pytest.raises(ValueError, match=r"train.micro_batch_size=0 is out of range; allowed: \[1, inf\) integer"):
        check_schema(TrainConfig(micro_batch_size=0), "train")
    with pytest.raises(ValueError, match=r"train.dtype='fp8' is not valid; choose one of: fp32, bf16, fp16"):
        TrainConfig(dtype="fp8").check()


def test_rng_state_round_trip_and_cross_device_reseed():
    g = dev.make_generator(CPU, 7)
    state = dev.rng_state(g)
    assert state["generator_device"] == "cpu"
    first = torch.rand(3, generator=g)
    dev.restore_rng(g, state, seed=7, step=2)
    assert torch.equal(torch.rand(3, generator=g), first)  # same device: exact continuation
    # a checkpoint written on a GPU resumed on a CPU: reseeded from (seed, step), deterministically, with a warning
    cuda_state = state | {"generator": torch.zeros(16, dtype=torch.uint8), "generator_device": "cuda"}
    with pytest.warns(UserWarning, match="checkpoint written on cuda, resumed on cpu"):
        dev.restore_rng(g, cuda_state, seed=7, step=2)
    reseeded = torch.rand(3, generator=g)
    assert torch.equal(reseeded, torch.rand(3, generator=torch.Generator().manual_seed(7 * 1_000_003 + 2)))


# ------------------------------------------------------------------------------------------------ micro-batches
@pytest.mark.parametrize("name, knobs", [("tis", {}), ("ess", {}), ("tis", {"loss_agg": "seq-mean-token-mean"}),
                                        ("bf16", {"kl_ref_beta": 0.0})])
@pytest.mark.parametrize("micro", [1, 5])
def test_micro_batches_give_the_big_batch_loss_and_gradient(model, rollout, name, knobs, micro):
    """Same loss, metrics, log-probs and gradient (fp32, to 1e-6) whether 12 sequences go through the model at
    once or `micro` at a time: token-mean over the whole step, P3O's minibatch ESS and sequence-mean
    aggregation included (the loss is computed once, on the whole minibatch)."""
    method = make_method(name, **knobs)
    batch = _batch(model, rollout)
    loss, metrics, logp, ent, grads = _backward(model, rollout, method, batch)
    loss_m, metrics_m, logp_m, ent_m, grads_m = _backward(model, rollout, method, batch, micro=micro)
    assert abs(loss_m.item() - loss.item()) <= 1e-6 * max(1.0, abs(loss.item()))
    assert metrics_m.keys() == metrics.keys()
    for k in metrics:
        assert abs(metrics_m[k] - metrics[k]) <= 1e-6 * max(1.0, abs(metrics[k])), k
    valid = rollout.response_mask  # past a micro-batch's cut the outputs are 0, not the padded pass's garbage
    # to 1e-6 relative beyond magnitude 1, as the loss: an entropy near log 128 = 4.85 differs by 2-4 fp32 ulps
    # (1.9e-6) between the two batchings on a 2-core AVX2 AMD EPYC, whose kernels split the sums differently
    torch.testing.assert_close(logp_m[valid], logp[valid], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ent_m[valid], ent[valid], rtol=1e-6, atol=1e-6)
    _assert_grads_close(grads, grads_m)


def test_micro_batched_recompute_equals_one_pass(model, rollout):
    one, _ = TrainerCompute(CPU, "bf16", 0.7).logprobs(model, rollout)
    many, _ = TrainerCompute(CPU, "bf16", 0.7, micro_batch_size=5).logprobs(model, rollout)
    valid = rollout.response_mask
    torch.testing.assert_close(many[valid], one[valid], rtol=0, atol=1e-6)


# ------------------------------------------------------------------------------------------------ checkpointing
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_gradient_checkpointing_gives_the_same_gradients(model, rollout, dtype):
    """Same gradients with and without checkpointing; the checkpointed model really recomputes (each layer's first
    projection runs twice per forward + backward: torch stops a recompute once every saved tensor is back, so a
    later module's hook need not fire again) and its dropout-carrying submodules stay in eval mode. bf16 (CPU: rounded
    weights) checks that the recomputation inside backward sees the same rounded weights as the forward."""
    method = make_method("tis")
    batch = _batch(model, rollout)
    ckpt = copy.deepcopy(model)
    enable_gradient_checkpointing(ckpt)
    layer = ckpt.model.layers[0]
    assert layer.training and not layer.self_attn.training and not ckpt.training
    calls = []
    layer.self_attn.q_proj.register_forward_hook(lambda *_: calls.append(1))
    *_, grads = _backward(model, rollout, method, batch, dtype=dtype)
    stats = method.prepare(batch)
    compute = TrainerCompute(CPU, dtype, 1.0)
    compute.backward(ckpt, rollout, lambda lp: method.loss(lp, batch, stats), step=0)
    assert len(calls) == 2  # forward + recompute in backward
    _assert_grads_close(grads, {n: p.grad for n, p in ckpt.named_parameters()})


def test_gradient_checkpointing_with_micro_batches(model, rollout):
    method = make_method("ess")
    batch = _batch(model, rollout)
    *_, grads = _backward(model, rollout, method, batch)
    ckpt = copy.deepcopy(model)
    enable_gradient_checkpointing(ckpt)
    *_, grads_ckpt = _backward(ckpt, rollout, method, batch, micro=4)
    _assert_grads_close(grads, grads_ckpt)


# ------------------------------------------------------------------------------------------------ fp16 / loss scaling
def test_fp16_emulation_rounds_weights_straight_through(model, rollout):
    """On the CPU the fp16 trainer computes with fp16-rounded weights in fp32 arithmetic: its gradient is the fp32
    gradient at the rounded weights, landing on the fp32 masters, which are restored bit for bit."""
    m = copy.deepcopy(model)
    masters = {n: p.detach().clone() for n, p in m.named_parameters()}
    with emulated_weights(m, "fp16"):
        for n, p in m.named_parameters():
            assert torch.equal(p, masters[n].half().float()), n
        with emulated_weights(m, "fp16"):  # re-entrant: nothing rounded twice, nothing restored early
            assert torch.equal(m.model.embed_tokens.weight, masters[EMB].half().float())
        assert torch.equal(m.model.embed_tokens.weight, masters[EMB].half().float())
    for n, p in m.named_parameters():
        assert torch.equal(p, masters[n]), n
    assert not torch.equal(masters[EMB].half().float(), masters[EMB])  # a real rounding

    method, batch = make_method("tis"), _batch(model, rollout)
    unscaled = torch.amp.GradScaler("cpu", enabled=False)
    *_, grads16 = _backward(model, rollout, method, batch, dtype="fp16", scaler=unscaled)
    rounded = copy.deepcopy(model)
    with torch.no_grad():
        for p in rounded.parameters():
            p.copy_(p.half().float())
    *_, grads_at_rounded = _backward(rounded, rollout, method, batch, dtype="fp32")
    for n in grads16:
        assert torch.equal(grads16[n], grads_at_rounded[n]), n


def test_fp16_loss_scaling_scales_unscales_and_skips_overflow(model, rollout):
    method, batch = make_method("tis"), _batch(model, rollout)
    stats = method.prepare(batch)
    loss_fn = lambda lp: method.loss(lp, batch, stats)  # noqa: E731
    ref, scaled = copy.deepcopy(model), copy.deepcopy(model)
    c_ref = TrainerCompute(CPU, "fp16", 1.0, scaler=torch.amp.GradScaler("cpu", enabled=False))
    c_16 = TrainerCompute(CPU, "fp16", 1.0)
    assert c_16.scaler.is_enabled() and c_16.scaler.get_scale() == 2.0**16
    assert not TrainerCompute(CPU, "bf16", 1.0).scaler.is_enabled()
    c_ref.backward(ref, rollout, loss_fn, 0)
    c_16.backward(scaled, rollout, loss_fn, 0)
    for (n, p), q in zip(ref.named_parameters(), scaled.parameters()):
        assert torch.equal(q.grad, p.grad * 2.0**16), n  # power-of-two scaling is exact in fp32
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    opt_16 = torch.optim.AdamW(scaled.parameters(), lr=1e-3)
    norm_ref = c_ref.step(ref, opt_ref, 1.0, 0)
    norm_16 = c_16.step(scaled, opt_16, 1.0, 0)
    assert norm_16 == pytest.approx(norm_ref, rel=1e-6)  # the norm of the unscaled gradient
    for (n, p), q in zip(ref.named_parameters(), scaled.parameters()):
        torch.testing.assert_close(q, p, rtol=0, atol=1e-7, msg=n)
    assert c_16.metrics().items() >= {"grad_scale": 2.0**16, "skipped_steps": 0.0}.items()

    # overflow of the scaled gradients: the step is skipped, the scale halved; not a divergence
    before = [p.detach().clone() for p in scaled.parameters()]
    opt_16.zero_grad()
    c_16.backward(scaled, rollout, loss_fn, 1)
    scaled.lm_head.weight.grad[0, 0] = float("inf")
    assert c_16.step(scaled, opt_16, 1.0, 1) is None
    assert all(torch.equal(p, b) for p, b in zip(scaled.parameters(), before))
    assert c_16.metrics().items() >= {"grad_scale": 2.0**15, "skipped_steps": 1.0}.items()
    # ... unless the scale is already <= 1 (the unscaled gradient itself is not finite)
    c_1 = TrainerCompute(CPU, "fp16", 1.0, scaler=torch.amp.GradScaler("cpu", init_scale=1.0))
    opt_16.zero_grad()
    c_1.backward(scaled, rollout, loss_fn, 2)
    scaled.lm_head.weight.grad[0, 0] = float("nan")
    with pytest.raises(Diverged, match="step 2: non-finite gradient norm"):
        c_1.step(scaled, opt_16, 1.0, 2)


def test_non_finite_loss_is_divergence_before_any_gradient(model, rollout):
    m = copy.deepcopy(model)
    for micro in (None, 4):
        with pytest.raises(Diverged, match="step 3: non-finite loss"):
            TrainerCompute(CPU, "fp32", 1.0, micro).backward(m, rollout, lambda lp: (lp.sum() * float("nan"), {}), 3)
        assert all(p.grad is None for p in m.parameters())


def test_trainer_logprobs_match_the_plain_function(model, rollout):
    """TrainerCompute.logprobs is token_logprobs (the one definition of the trainer's log-prob): bit for bit at the
    padded width, to 1e-6 with its micro-batches cut to their rows."""
    expected, _ = token_logprobs(model, rollout, 0.7, "bf16")
    assert torch.equal(TrainerCompute(CPU, "bf16", 0.7, cut=False).logprobs(model, rollout)[0], expected)
    got, _ = TrainerCompute(CPU, "bf16", 0.7).logprobs(model, rollout)
    valid = rollout.response_mask
    torch.testing.assert_close(got[valid], expected[valid], rtol=0, atol=1e-6)
