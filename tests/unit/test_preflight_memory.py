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
    preflight = SimpleNamespace(cfg=OmegaConf.create({"rollout": {"gpu_memory_utilization": 0.35}}))
    # the trainer held 12 GB before the engine: 60 - 28 - 12 = 20 GB still needed
    assert Preflight.free_memory(preflight, 21.0, 12.0) == ("21.0 GB free after the engine started >= ~20.0 GB the "
                                                            "training step still needs")
    with pytest.raises(PreflightError, match=r"19.0 GB of the GPU are free .* needs ~20.0 GB more .* less the engine's "
                                             r"28.0 and the trainer's 12.0 allocated before it\): lower "
                                             r"rollout.gpu_memory_utilization=0.35"):
        Preflight.free_memory(preflight, 19.0, 12.0)
