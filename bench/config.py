"""Typed schemas of the Hydra config tree (conf/). Registered in Hydra's ConfigStore so that a misspelt key
or a value of the wrong type fails at start-up naming it; `validate` adds the value checks (ranges, choices)
that a type cannot express, before any work starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

PRECISIONS = ("bf16", "fp32", "fp8_e4m3", "int8")
WEIGHT_GRANULARITIES = ("per_channel", "per_tensor")
ACT_GRANULARITIES = ("per_token", "per_tensor", "none")
LOSS_AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
IS_LEVELS = ("token", "sequence")
IS_MODES = ("truncate", "mask")
ENGINES = ("embedded", "vllm")
TRACKING_MODES = ("offline", "online", "disabled")


@dataclass
class MethodConfig:
    """One schema for every arm; keys and defaults from methods.md section 9.1."""

    name: str = "bf16"
    precision: str = "bf16"  # the arm's rollout precision; rollout.precision defaults to it
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    dual_clip_c: Optional[float] = None
    loss_agg: str = "token-mean"
    adv_eps: float = 1e-6
    norm_adv_by_std: bool = True
    kl_ref_beta: float = 0.0
    log_ratio_clamp: float = 20.0
    is_cap_C: float = 2.0  # noqa: N815  (the C of TIS/ACR/AIS)
    is_level: str = "token"
    is_mode: str = "truncate"  # truncate (TIS) | mask (MIS: weight 0 outside [is_cap_low, C])
    is_cap_low: Optional[float] = None
    uaq_scale: float = 1.0  # 1.0 = off; acr_uaq sets 1.5
    uaq_targets: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj"])
    p3o_ess_eps: float = 1e-8
    p3o_kl_exp_clamp: float = 10.0
    p3o_ent_beta: float = 0.0
    ais_adv_eps: float = 1e-8
    ais_n_min: int = 2
    ais_alpha_min: float = 0.0
    ais_alpha_max: float = 1.0


@dataclass
class ModelConfig:
    """`path: null` = the built-in tiny model (built from this config, warm-started, cached);
    otherwise a local directory or hub id loaded through transformers (same code path for any model)."""

    name: str = "tiny"
    path: Optional[str] = None
    arch: str = "qwen2"  # built-in only: qwen2 | llama
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 512
    max_position_embeddings: int = 128
    vocab_size: int = 128  # built-in only: embedding rows (>= the 100-token character tokenizer)
    warmstart_seed: int = 0  # built-in only: init + SFT data order of the warm start
    warmstart_steps: int = 4000  # built-in only: SFT step budget of the cosine schedule (stops at warmstart_target_acc)
    warmstart_lr: float = 1e-3
    warmstart_batch: int = 16  # small batches: at this size progress is per update, not per example
    warmstart_target_acc: Optional[float] = 0.45  # stop SFT once greedy accuracy on train examples reaches it
    cache_dir: str = "${oc.env:QRL_BENCH_CACHE,'~/.cache/qrl-bench'}"


@dataclass
class TaskConfig:
    """Base schema of a task; each task file in conf/task/ extends it with its own keys."""

    name: str = MISSING
    max_new_tokens: int = 16
    n_train: int = 5000
    n_test: int = 200
    data_seed: int = 1234  # fixed across RL seeds: every seed sees the same train/test split


@dataclass
class ArithmeticTaskConfig(TaskConfig):
    name: str = "arithmetic"
    max_new_tokens: int = 6
    min_digits: int = 1
    max_digits: int = 2
    ops: list[str] = field(default_factory=lambda: ["+", "-"])


@dataclass
class CountdownTaskConfig(TaskConfig):
    name: str = "countdown"
    max_new_tokens: int = 12
    n_numbers: int = 3
    max_number: int = 9


@dataclass
class JsonlTaskConfig(TaskConfig):
    """A datasets-backed task: question/answer JSONL files, numeric exact-match reward."""

    name: str = "jsonl"
    max_new_tokens: int = 8
    train_file: str = MISSING
    test_file: str = MISSING
    question_field: str = "question"
    answer_field: str = "answer"
    prompt_template: str = "{question}="  # str.format with the question; the completion is the bare number


@dataclass
class RolloutConfig:
    engine: str = "embedded"
    precision: str = "${method.precision}"
    weight_granularity: str = "per_channel"
    act_granularity: str = "per_token"
    quantize_lm_head: bool = False
    quantize_embeddings: bool = False
    temperature: float = 1.0


@dataclass
class TrainConfig:
    steps: int = 100
    batch_size: int = 64  # sequences per rollout batch = prompts x group_size
    group_size: int = 8
    minibatches: int = 1  # optimizer steps per rollout batch
    epochs: int = 1
    lr: float = 1e-4  # Adam on a ~1M model: 3e-4+ destroys the warm start's accuracy, 2e-5 barely moves
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    dtype: str = "bf16"  # trainer compute: bf16 (fp32 master weights + bf16 autocast) | fp32
    eval_every: int = 10
    checkpoint_every: int = 10
    threads: int = 0  # torch threads; 0 = leave torch's default (sweeps set 1 per job)
    keep_checkpoint: bool = False  # keep ckpt/last.pt after completion (it is always kept while resumable)


@dataclass
class TrackingConfig:
    mode: str = "offline"  # offline | online | disabled; WANDB_MODE overrides
    project: str = "qrl-bench"
    entity: Optional[str] = None
    tags: list[str] = field(default_factory=list)


@dataclass
class Config:
    method: MethodConfig = MISSING
    model: ModelConfig = MISSING
    task: Any = MISSING
    rollout: RolloutConfig = MISSING
    train: TrainConfig = field(default_factory=TrainConfig)
    tracking: TrackingConfig = MISSING
    seed: int = 0
    sweep: str = "default"
    out_root: str = "results"


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=Config)
    cs.store(group="method", name="method_schema", node=MethodConfig)
    cs.store(group="model", name="model_schema", node=ModelConfig)
    cs.store(group="rollout", name="rollout_schema", node=RolloutConfig)
    cs.store(group="tracking", name="tracking_schema", node=TrackingConfig)
    cs.store(group="task", name="arithmetic_schema", node=ArithmeticTaskConfig)
    cs.store(group="task", name="countdown_schema", node=CountdownTaskConfig)
    cs.store(group="task", name="jsonl_schema", node=JsonlTaskConfig)


def _choice(what: str, value: Any, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise ValueError(f"{what}={value!r} is not valid; choose one of: {', '.join(valid)}")


def validate(cfg: Any) -> None:
    """Value checks a type cannot express. Raises ValueError naming the bad value (before any work)."""
    t, m, r = cfg.train, cfg.method, cfg.rollout
    if t.group_size < 2:
        raise ValueError(f"train.group_size={t.group_size} is too small: GRPO needs at least 2 responses per prompt")
    if t.batch_size <= 0 or t.batch_size % t.group_size:
        raise ValueError(
            f"train.batch_size={t.batch_size} is not divisible by train.group_size={t.group_size}"
        )
    if (t.batch_size // t.group_size) % t.minibatches:
        raise ValueError(f"train.minibatches={t.minibatches} must divide the {t.batch_size // t.group_size} prompts per step")
    if not t.lr > 0:
        raise ValueError(f"train.lr={t.lr} must be positive")
    if t.steps < 1:
        raise ValueError(f"train.steps={t.steps} must be at least 1")
    _choice("train.dtype", t.dtype, ("bf16", "fp32"))
    _choice("rollout.precision", r.precision, PRECISIONS)
    _choice("method.precision", m.precision, PRECISIONS)
    _choice("rollout.engine", r.engine, ENGINES)
    _choice("rollout.weight_granularity", r.weight_granularity, WEIGHT_GRANULARITIES)
    _choice("rollout.act_granularity", r.act_granularity, ACT_GRANULARITIES)
    if not r.temperature > 0:
        raise ValueError(f"rollout.temperature={r.temperature} must be positive")
    _choice("method.loss_agg", m.loss_agg, LOSS_AGGS)
    _choice("method.is_level", m.is_level, IS_LEVELS)
    _choice("method.is_mode", m.is_mode, IS_MODES)
    if not m.is_cap_C > 0:
        raise ValueError(f"method.is_cap_C={m.is_cap_C} must be positive")
    if not 0.0 <= m.ais_alpha_min <= m.ais_alpha_max <= 1.0:
        raise ValueError(f"method.ais_alpha_min/max=({m.ais_alpha_min}, {m.ais_alpha_max}) must satisfy 0 <= min <= max <= 1")
    _choice("tracking.mode", cfg.tracking.mode, TRACKING_MODES)
