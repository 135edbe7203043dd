"""The vLLM preflight's step (f), free memory, on a GPU run's numbers (no GPU here: the estimate and the free memory
are given). vLLM runs in the trainer's process, so its weights and KV cache are this process's allocations: what the
training step still needs is the estimated peak less the engine's share and what the trainer held before the engine
started, not less what is allocated once the engine is up (that took the engine's share off twice)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from bench.launch import memory
from bench.launch.vllm_preflight import Preflight, PreflightError


def test_free_memory_takes_the_engine_share_off_once(monkeypatch):
    monkeypatch.setattr(memory, "estimate_memory", lambda cfg: SimpleNamespace(peak=60.0, parts={"vllm engine": 28.0}))
    preflight = SimpleNamespace(cfg=OmegaConf.create({"rollout": {"gpu_memory_utilization": 0.35}}), rollout=object())
    # the trainer held 12 GB before the engine: 60 - 28 - 12 = 20 GB still needed
    assert Preflight.free_memory(preflight, 21.0, 12.0) == ("21.0 GB free after the engine started >= ~20.0 GB the "
                                                            "training step still needs")
    with pytest.raises(PreflightError, match=r"19.0 GB of the GPU are free .* needs ~20.0 GB more .* less the engine's "
                                             r"28.0 and the trainer's 12.0 allocated before it\): lower "
                                             r"rollout.gpu_memory_utilization=0.35"):
        Preflight.free_memory(preflight, 19.0, 12.0)


def test_an_evaluation_engine_beside_an_embedded_rollout_is_not_counted_as_resident(monkeypatch):
    """rollout=embedded, eval.engine=vllm: the vLLM engine the preflight starts is the evaluation's, closed after each
    evaluation, so the training step has its share back; (f) used to ask for the whole peak on top of it."""
    est = SimpleNamespace(resident=30.0, phases={"evaluation": 28.0, "training": 15.0, "generation": 10.0},
                          parts={"trainer states": 20.0, "rollout engine": 10.0})
    est.peak = est.resident + 28.0
    monkeypatch.setattr(memory, "estimate_memory", lambda cfg: est)
    preflight = SimpleNamespace(cfg=OmegaConf.create({"rollout": {}}), rollout=None)
    # the training step: 30 resident + 15 training - 12 held before = 33 GB, of which the evaluation's 28 come back
    assert Preflight.free_memory(preflight, 5.0, 12.0) == ("5.0 GB free after the engine started >= ~5.0 GB the "
                                                           "training step still needs")
    with pytest.raises(PreflightError, match=r"4.0 GB of the GPU are free .* needs ~5.0 GB more .*resident 30.0 \+ "
                                             r"largest other phase 15.0 GB, less the evaluation engine's 28.0 .*: "
                                             r"eval.engine=embedded"):
        Preflight.free_memory(preflight, 4.0, 12.0)
    rollout = SimpleNamespace(cfg=preflight.cfg, rollout=object())  # a vLLM rollout engine stays: the whole peak
    monkeypatch.setattr(memory, "estimate_memory", lambda cfg: SimpleNamespace(peak=58.0, parts={"vllm engine": 28.0}))
    with pytest.raises(PreflightError, match=r"needs ~18.0 GB more"):
        Preflight.free_memory(rollout, 5.0, 12.0)


def test_a_rank_whose_local_rank_names_a_gpu_it_cannot_see_starts_vllm_on_its_own():
    """Under SLURM with one GPU bound per task, rank 3 sees its GPU as device 0 while LOCAL_RANK says 3; vLLM's
    external launcher takes its GPU from LOCAL_RANK (asserting it below the device count), so the engine starts
    with LOCAL_RANK set to the rank's device for the call, and the variable is restored after it."""
    import os

    from bench.launch.vllm_preflight import start_error
    from bench.rollout.vllm_engine import local_rank_as

    saved = os.environ.get("LOCAL_RANK")
    try:
        os.environ["LOCAL_RANK"] = "3"
        with local_rank_as(0):
            assert os.environ["LOCAL_RANK"] == "0"
        assert os.environ["LOCAL_RANK"] == "3"
        with local_rank_as(None):
            assert os.environ["LOCAL_RANK"] == "3"
        del os.environ["LOCAL_RANK"]
        with local_rank_as(1):
            assert os.environ["LOCAL_RANK"] == "1"
        assert "LOCAL_RANK" not in os.environ
    finally:
        os.environ.pop("LOCAL_RANK", None)
        if saved is not None:
            os.environ["LOCAL_RANK"] = saved
    # vLLM 0.32's words when it happens anyway: the preflight names the binding, not rollout=embedded
    err = start_error(AssertionError("DP adjusted local rank 3 is out of bounds for 1 devices."))
    assert "change the job's GPU binding" in str(err)


def test_a_sweeps_preflight_checks_every_memory_footprint_not_one_per_engine_setup(tmp_path):
    """`-m algo.advantage=grpo,gae --preflight` checked only the grpo job (one engine setup), while step (f)'s
    memory check differs between them (GAE's critic: ~7 GB per GPU more at 1.5B); jobs that differ only in the seed
    share one preflight."""
    from bench.launch.vllm_preflight import setup_key
    from tests.helpers import make_cfg

    grpo, gae, seed1 = (make_cfg(tmp_path, "rollout=vllm", "model=qwen2.5-1.5b-instruct", *o)
                        for o in ([], ["algo.advantage=gae"], ["seed=1"]))
    assert setup_key(grpo) != setup_key(gae)
    assert setup_key(grpo) == setup_key(seed1)


def test_an_engine_error_is_one_clipped_line_naming_the_setting():
    """vLLM's long messages were cut mid-word at 300 characters; on a CPU its advice of gpu_memory_utilization
    does nothing (the KV cache is VLLM_CPU_KVCACHE_SPACE); any exception in a step fails it in one line (a vLLM
    RuntimeError at the first forward pass escaped as a 90-line traceback, exit 1, no run.json)."""
    from bench.launch.vllm_preflight import Preflight, PreflightError, start_error

    words = "The model's max seq len is larger than the maximum number of tokens that can be stored in KV cache. " * 5
    err = str(start_error(ValueError(words), "cpu"))
    assert "…" in err and len(err) < 600 and "VLLM_CPU_KVCACHE_SPACE" in err and "\n" not in err
    assert "change model.max_length" in str(start_error(ValueError("max_model_len 40 > 32"), "cpu"))
    said: list[str] = []
    pf = object.__new__(Preflight)  # the step runner alone: no engine is needed to fail a step
    pf.say, pf.steps = said.append, []

    def forward() -> str:
        raise RuntimeError("Unsupported CPU attention configuration: head_dim=16 isa=2 kv_cache_idx=0\nmore")

    with pytest.raises(PreflightError) as e:
        pf.step("c", "sync", forward)
    assert "(c) sync: RuntimeError: Unsupported CPU attention configuration: head_dim=16" in str(e.value)
    assert "rollout=embedded" in str(e.value) and "\n" not in str(e.value) and pf.steps[0].status == "failed"
