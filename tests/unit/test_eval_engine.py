"""`eval.engine` (bench/eval_config.py, bench/evaluation.py) and the vLLM evaluation engine's turn-taking with the rollout engine
(bench/rollout/vllm_engine.py VLLMEvalEngine), without vLLM: the real engines are tested in
tests/vllm/test_eval_vllm.py. VLLMEvalEngine only calls `precision`, `device`, `max_len`, `sibling`,
`load_weights`, `generate` and `close` of its template, so a recording stand-in shows every decision."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch

from bench.launch.config import validate
from bench.eval_config import EVAL_ENGINES, EvalConfig, eval_engine_kind
from bench.evaluation import build_eval_engine
from bench.rollout.embedded import EmbeddedEngine
from bench.eval_config import VLLM_EVAL_PRECISION
from bench.rollout.vllm_engine import VLLMEvalEngine
from tests.helpers import make_cfg

HAVE_VLLM = importlib.util.find_spec("vllm") is not None


def test_auto_is_the_rollout_engines_kind_and_an_explicit_choice_wins():
    assert eval_engine_kind("auto", "vllm") == "vllm"
    assert eval_engine_kind("auto", "embedded") == "embedded"
    assert eval_engine_kind("embedded", "vllm") == "embedded"
    assert eval_engine_kind("vllm", "embedded") == "vllm"
    assert EVAL_ENGINES == ("auto", "embedded", "vllm")


def test_a_bad_eval_engine_is_refused_naming_the_choices(tmp_path):
    with pytest.raises(ValueError, match=r"eval.engine='gpu' is not valid; choose one of: auto, embedded, vllm"):
        EvalConfig(engine="gpu").check()
    with pytest.raises(ValueError, match=r"eval.engine='fast' is not valid; choose one of: auto, embedded, vllm"):
        validate(make_cfg(tmp_path, "eval.engine=fast"))  # the root config's check: exit 2 at the command line
    with pytest.raises(ValueError, match=r"rollout.engine='other' has no evaluation engine"):
        eval_engine_kind("auto", "other")


def test_the_eval_engine_rule_is_read_without_torch():
    # one rule for eval.engine=auto, read by the trainer, the memory estimate and the vLLM preflight; its module
    # (with the budget that the dry run reads) imports no torch, so a login node's config checks stay light
    code = "import sys, bench.eval_config, bench.launch.budget; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.skipif(HAVE_VLLM, reason="this environment has vLLM")
def test_eval_engine_vllm_without_vllm_is_a_config_error():
    with pytest.raises(ValueError, match=r"eval.engine=vllm needs vLLM.*eval.engine=embedded"):
        EvalConfig(engine="vllm").check()


def test_embedded_rollouts_evaluate_in_an_fp32_embedded_engine_by_default(tmp_path):
    from bench.train import build

    parts = build(make_cfg(tmp_path))
    assert parts.cfg.eval.engine == "auto"
    assert isinstance(parts.eval_engine, EmbeddedEngine) and parts.eval_engine.precision == "fp32"
    assert parts.eval_engine is not parts.engine


class StubVLLM:
    """Records what VLLMEvalEngine does to a vLLM engine (built, closed, weights loaded, generated)."""

    def __init__(self, precision: str, device: str = "gpu", log: list | None = None):
        self.precision, self.device, self.max_len = precision, device, 64
        self.log = [] if log is None else log
        self.built = False

    def sibling(self, precision: str) -> "StubVLLM":
        self.log.append(("sibling", precision))
        return StubVLLM(precision, self.device, self.log)

    def load_weights(self, model) -> None:
        self.built = True
        self.log.append(("load", self.precision))

    def generate(self, ids, mask, n, sampling, generator=None):
        self.log.append(("generate", self.precision))
        return self.precision

    def release(self) -> None:
        self.log.append(("release", self.precision))

    def close(self) -> None:
        self.built = False
        self.log.append(("close", self.precision))


@pytest.mark.parametrize("device", ["gpu", "cpu"])
def test_quantized_rollouts_hand_the_gpu_to_an_unquantized_engine_and_back(device):
    """fp8 rollouts: the rollout engine is closed before the evaluation's engine (bf16 on a GPU, fp32 on a CPU)
    is built, that engine is closed after the evaluation, and the rollout engine is left to rebuild itself
    (at fp8) at its next sync. At most one engine is built at any time."""
    rollout = StubVLLM("fp8_e4m3", device)
    rollout.load_weights(None)
    ev = VLLMEvalEngine(rollout, owns_template=True)
    assert ev.precision == VLLM_EVAL_PRECISION[device] == {"gpu": "bf16", "cpu": "fp32"}[device]
    assert not ev.shares_rollout_engine and ev.max_len == 64
    rollout.log.clear()
    ev.load_weights(None)
    assert not rollout.built  # closed before the evaluation's engine loads: never two on the GPU
    assert ev.generate(None, None, 1, None) == ev.precision and ev.quant_metrics() == {}
    ev.load_weights(None)  # a second set of the same evaluation: the same engine, synced again
    ev.release()
    p = ev.precision
    assert rollout.log == [("close", "fp8_e4m3"), ("sibling", p), ("load", p), ("generate", p), ("load", p),
                           ("close", p)]
    assert ev.active is None and rollout.precision == "fp8_e4m3"  # the rollout engine itself is never re-precisioned


def test_an_unquantized_rollout_engine_evaluates_itself():
    """rollout.precision already the evaluation's (bf16 on a GPU): nothing is built or closed; the rollout engine is
    released after the evaluation as after a step's rollouts (it sleeps with rollout.sleep_level > 0)."""
    rollout = StubVLLM("bf16", "gpu")
    ev = VLLMEvalEngine(rollout, owns_template=True)
    assert ev.shares_rollout_engine
    ev.load_weights(None)
    ev.generate(None, None, 1, None)
    ev.release()
    assert rollout.log == [("load", "bf16"), ("generate", "bf16"), ("release", "bf16")] and ev.active is None


def test_embedded_rollouts_with_a_vllm_evaluation_never_touch_the_rollout_engine():
    template = StubVLLM("bf16", "gpu")  # an unbuilt engine: the stop ids, context and GPU share
    ev = VLLMEvalEngine(template, owns_template=False)
    assert not ev.shares_rollout_engine  # even at the same precision: it is not a rollout engine
    ev.load_weights(None)
    ev.release()
    assert template.log == [("sibling", "bf16"), ("load", "bf16"), ("close", "bf16")]


def test_build_eval_engine_refuses_a_bad_choice_before_building_anything():
    class RolloutCfg:
        engine = "vllm"

    rollout = StubVLLM("fp8_e4m3")
    with pytest.raises(ValueError, match="eval.engine='x' is not valid"):
        build_eval_engine(EvalConfig(engine="x"), RolloutCfg, rollout, {"eos_id": 2, "pad_id": 0}, 64)
    assert rollout.log == []
