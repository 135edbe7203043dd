"""HSDP across nodes: the device mesh of a run spanning nodes is (nodes, ranks per node), replicate x shard, and
the gradient summed over it (micro-batches reduce-scattered within a node, all-reduced across nodes once) is the
one-process gradient. Four gloo ranks on this machine stand in for 2 nodes x 2
(LOCAL_WORLD_SIZE=2 is what torchrun and submitit export on each of two nodes of 2). The same ranks check the
stream of whole weights a vLLM engine per rank is fed (bench/rollout/vllm_engine.py `whole_weights`)."""

from __future__ import annotations

import os

import pytest
import torch

from bench.distributed import compute, group, sharding


@pytest.mark.parametrize("world, per_node, shape", [(1, 1, (1,)), (8, 8, (8,)), (16, 8, (2, 8)), (4, 2, (2, 2)),
                                                     (64, 8, (8, 8))])
def test_mesh_shape_is_one_node_fsdp_or_nodes_by_ranks(world, per_node, shape):
    assert sharding.mesh_shape(world, per_node) == shape


@pytest.mark.parametrize("world, per_node", [(6, 4), (8, 0), (0, 1)])
def test_mesh_shape_refuses_ranks_that_do_not_fill_nodes(world, per_node):
    with pytest.raises(ValueError, match=f"WORLD_SIZE={world}"):
        sharding.mesh_shape(world, per_node)


def tiny_model() -> torch.nn.Module:
    import transformers as tr

    torch.manual_seed(0)
    config = tr.Qwen2Config(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                            num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False)
    return tr.Qwen2ForCausalLM(config)


def loss_of(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """A per-row sum: each rank's rows' loss adds up to the whole batch's."""
    return model(ids).logits.float().log_softmax(-1).amax(-1).sum()


def two_nodes_of_two() -> dict:
    """One rank of 4 as if on node RANK // 2 (runs inside launch_local)."""
    os.environ["LOCAL_WORLD_SIZE"] = "2"
    os.environ["LOCAL_RANK"] = str(int(os.environ["RANK"]) % 2)
    torch.set_num_threads(1)
    group.init("cpu")
    model = tiny_model()
    ids = torch.randint(0, 32, (8, 6), generator=torch.Generator().manual_seed(1))
    reference = {n: g for n, g in zip([n for n, _ in model.named_parameters()],
                                      torch.autograd.grad(loss_of(model, ids), list(model.parameters())))}
    state = {n: t.clone() for n, t in model.state_dict().items()}
    sharding.shard(model)
    mesh = next(model.parameters()).device_mesh
    from bench.rollout.vllm_engine import whole_weights  # what a vLLM engine per rank is streamed

    streamed = list(whole_weights(model))
    assert [n for n, _ in streamed] == list(state) and all(torch.equal(t, state[n]) for n, t in streamed)
    rows = ids.tensor_split(4)[group.rank()]
    for s in compute.accumulating(model, [slice(0, 1), slice(1, 2)]):  # two micro-batches, one all-reduce
        loss_of(model, rows[s]).backward()
    worst = max(float((p.grad.full_tensor() - reference[n]).abs().max()) for n, p in model.named_parameters())
    return {"shape": tuple(mesh.shape), "dims": mesh.mesh_dim_names, "worst": worst,
            "placements": [type(pl).__name__ for pl in next(model.parameters()).placements]}


@pytest.mark.slow
def test_four_ranks_as_two_nodes_build_hsdp_and_sum_the_whole_gradient():
    out = group.launch_local(4, two_nodes_of_two)
    assert out["shape"] == (2, 2) and out["dims"] == ("replicate", "shard")
    assert out["placements"] == ["Replicate", "Shard"]  # a whole copy per node, sharded within it
    assert out["worst"] < 1e-5
