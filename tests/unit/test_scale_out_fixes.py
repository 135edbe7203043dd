"""Issue 33's low items on the scale-out path, on the CPU: the process group's timeout after start-up (N6), the
vLLM evaluation engine handed a sharded policy as it is (N14), tensor parallelism refused in one line (N15), the
critic's output a tensor of its own. A one-rank gloo group stands in for a node's: FSDP2 and the timeouts are the
real ones; no vLLM runs here (the engine's refusal comes before it is imported)."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import transformers as tr

from bench.distributed import engines, sharding
from bench.distributed.group import STEP_TIMEOUT, TIMEOUT, settle


@pytest.fixture
def group():
    """A one-rank gloo process group with the start-up timeout, left after the test."""
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore(), timeout=TIMEOUT)
    try:
        yield dist.distributed_c10d._get_default_group()
    finally:
        dist.destroy_process_group()


def timeout_of(group) -> timedelta:
    return group._get_backend(torch.device("cpu")).options._timeout


def test_the_timeout_drops_after_start_up(group):
    """N6: generous while the run starts (30 min: models, engines, the first evaluation), short after its first
    step (QRL_DIST_STEP_TIMEOUT_MIN, 10 min by default, as verl's): a stuck rank ends the job within minutes."""
    assert timeout_of(group) == timedelta(minutes=30) == TIMEOUT
    settle()
    assert timeout_of(group) == STEP_TIMEOUT <= timedelta(minutes=10)


def test_a_vllm_evaluation_gets_the_sharded_policy_as_it_is(group, monkeypatch):
    """N14: the evaluation engine streams a sharded policy (one gathered tensor at a time, as the rollout engine
    does), so the evaluation's BlockEngine must not unshard the whole fp32 policy first."""
    from bench.rollout.vllm_engine import VLLMEvalEngine

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    model = tr.Qwen2ForCausalLM(tr.Qwen2Config(vocab_size=32, hidden_size=16, intermediate_size=32,
                                               num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
    sharding.shard(model)
    seen = []

    class Template:  # the engine VLLMEvalEngine would build (no vLLM here): records what it is handed
        precision, device = "fp32", "cpu"  # the evaluation's precision on a CPU: it evaluates in the rollout engine

        def load_weights(self, m):
            seen.append(type(m.model.embed_tokens.weight).__name__)

        def sibling(self, precision):
            return self

    engine = engines.BlockEngine(VLLMEvalEngine(Template(), owns_template=True), 1, 0)
    engine.load_weights(model)
    assert seen == ["DTensor"]  # still sharded: nothing was gathered for it
    assert sharding.is_sharded(model)


@pytest.mark.parametrize("precision, model_dtype", [
    ("fp32", torch.float32),  # the evaluation's engine
    ("int8", torch.float32),  # a rollout engine
    ("bf16", torch.bfloat16),  # a bf16 engine from a bf16 model, as on a GPU: its conversions return the weights
])
def test_the_embedded_engine_copies_a_sharded_policy_one_unit_at_a_time(group, monkeypatch, precision, model_dtype):
    """The embedded engine (rollout and fp32 evaluation alike) copies a sharded policy one FSDP unit at a time:
    each decoder layer alone, then the root's embedding, norm and lm_head, every unit resharded after, so a rank
    never holds the gathered fp32 model, during the copy or beside it afterwards (an fp32 evaluation engine used to
    keep the whole model gathered while it held its own copy: two fp32 models per rank, ~64 GB at 8B). The copy
    equals the one built from the model in one process: same tokens, same log-probs. A conversion to the dtype a
    weight already has returns the weight (bf16 from a bf16 model on the native bf16 path every GPU takes): the
    engine copies it while its unit is gathered, or its tensors lose their storage when the unit reshards."""
    import copy

    from torch.distributed.tensor import DTensor

    from bench.rollout import embedded
    from bench.rollout.base import SamplingParams

    from bench.quant import plain as plain_formats

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.setattr(plain_formats, "native_half", lambda half, device: True)  # the GPU's path, on the CPU
    torch.manual_seed(0)
    plain = tr.Qwen2ForCausalLM(tr.Qwen2Config(vocab_size=48, hidden_size=32, intermediate_size=64,
                                               num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                               tie_word_embeddings=False)).to(model_dtype)
    model = sharding.shard(copy.deepcopy(plain))
    units = sharding.decoder_layers(model)

    def whole(m: torch.nn.Module) -> bool:
        return not any(isinstance(p, DTensor) for p in m.parameters(recurse=False))

    seen = []  # at each decoder layer's copy: which units are whole (the root; the layers by index)
    copy_root = embedded.FastDecoder.register_buffer

    def spy_root(self, name, tensor, *args):
        if name == "embed":
            seen.append((whole(model.lm_head), [i for i, u in enumerate(units) if whole(u.self_attn.q_proj)]))
        copy_root(self, name, tensor, *args)

    build = embedded._Layer.__init__

    def spy(self, hf_layer, *args):
        seen.append((whole(model.lm_head), [i for i, u in enumerate(units) if whole(u.self_attn.q_proj)]))
        build(self, hf_layer, *args)

    monkeypatch.setattr(embedded._Layer, "__init__", spy)
    monkeypatch.setattr(embedded.FastDecoder, "register_buffer", spy_root)
    engine = engines.BlockEngine(embedded.EmbeddedEngine(precision), 1, 0)
    engine.load_weights(model)
    assert seen == [(False, [0]), (False, [1]), (False, [2]), (True, [])]  # the layers, then the root
    assert all(isinstance(p, DTensor) for p in model.parameters())  # every unit resharded

    alone = engines.BlockEngine(embedded.EmbeddedEngine(precision), 1, 0)  # the same seeds per block
    alone.load_weights(plain)
    ids, mask = torch.randint(0, 48, (3, 5)), torch.ones(3, 5, dtype=torch.bool)
    sampling = SamplingParams(max_new_tokens=6, temperature=1.0)
    got, want = (e.generate(ids, mask, 2, sampling, torch.Generator().manual_seed(1)) for e in (engine, alone))
    assert torch.equal(got.response_ids, want.response_ids)
    assert torch.equal(got.logp_mu, want.logp_mu)


def test_the_generic_hf_decoder_is_refused_for_a_sharded_policy(group, monkeypatch):
    """rollout.backend=hf deep-copies the model, which FSDP2 refuses for a sharded one: one line naming the fix
    instead of torch's "FSDP does not support deepcopy" from inside the engine."""
    from bench.rollout.embedded import EmbeddedEngine

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    model = sharding.shard(tr.Qwen2ForCausalLM(tr.Qwen2Config(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1)))
    with pytest.raises(ValueError, match=r"rollout.backend=hf serves \w*Qwen2ForCausalLM on the generic HF path.*"
                                         r"train.nproc_per_node=1"):
        engines.BlockEngine(EmbeddedEngine("fp32", backend="hf"), 1, 0).load_weights(model)


def test_tensor_parallelism_is_refused_in_one_line():
    """N15: each rank holds its own engine beside its trainer shard (external launcher, tensor parallel 1); a
    tensor_parallel_size from the caller used to collide with the launcher's (a duplicate-keyword TypeError)."""
    from bench.rollout.vllm_engine import VLLMEngine

    with pytest.raises(ValueError, match=r"tensor_parallel_size must be 1: each rank of a run holds its own engine"):
        VLLMEngine("bf16", tensor_parallel_size=2)


def test_the_critic_returns_a_tensor_of_its_own():
    """FSDP2 hooks a sharded module's outputs for its backward; a view of the value head's output would let an
    in-place op bypass that hook (and the pre-backward all-gather)."""
    from bench.critic import ValueModel

    backbone = tr.Qwen2Model(tr.Qwen2Config(vocab_size=32, hidden_size=16, intermediate_size=32,
                                            num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
    ids = torch.randint(0, 32, (2, 5))
    values = ValueModel(backbone, 16)(ids, torch.ones_like(ids), torch.arange(5).expand(2, 5))
    assert values.shape == (2, 5) and values._base is None
