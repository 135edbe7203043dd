"""Evaluation: the training task's greedy accuracy, and the benchmarks the papers report (avg@k, pass@k).

* `eval/accuracy` (with `eval/reward_mean`, `eval/response_length`): greedy accuracy of the trainer's policy on
  the training task's test split. One definition for the trainer's periodic evaluation and the warm start's
  stopping rule; the reference reports and the analysis read it.
* `eval/<set>/<metric>` for every task named in `eval.sets` (a registered task; its test split), in
  `eval.mode`:
    greedy  `accuracy`, `reward_mean`, `response_length` (one greedy completion per problem; what QuRL
            calls Avg@1);
    avg@k   `avg@<k>`: mean correctness of k samples per problem, averaged over problems (DAPO, DeepScaleR and
            QuRL report avg@32), plus `reward_mean` and `response_length`;
    pass@k  `pass@<j>` for j = 1, 2, 4, ... up to k (and k itself): the unbiased estimator of Chen et al. 2021
            from n >= k samples per problem (bench/passk.py; `eval.n`, default k), plus `reward_mean` and
            `response_length`.
  Sampling uses `eval.temperature`, `eval.top_k` and `eval.top_p`, applied by the engine's sampler (truncated and
  renormalized); it is offered for evaluation only, since the trainer's log-probs are never truncated
  (docs/arms.md §1).

The evaluation engine (`eval.engine`, `build_eval_engine`) holds the trainer's policy itself, never its quantized
rollout copy:
    embedded  an fp32 copy in the embedded engine, built for each evaluation and released after it (an eager
              decoder: fine at the CPU presets' lengths, hours at avg@32 x 8k-32k tokens on a GPU);
    vllm      a vLLM engine, bf16 on a GPU / fp32 on a CPU (bench.rollout.vllm_engine.VLLMEvalEngine: with fp8
              rollouts the rollout engine is closed for the evaluation and rebuilt, re-quantized, at the next sync;
              docs/gpu.md "Evaluation through vLLM" says why);
    auto      (default) the rollout engine's kind.
Correct = reward >= 1 (a correct answer: format credit is always below 1, bench/rewards.py). Prompts are built
by bench.models.tokenizer.encode_prompts (the chat template when the model uses one) and each generate call
holds at most `eval.batch_size` sequences, so a long benchmark does not need one KV cache for all of it.
Sampled evaluations draw from their own generator, seeded by (run seed, step, set) and made on the device the
engine samples on (bench.rollout.base.sampling_device): evaluating never moves the training run's random stream.
"""

from __future__ import annotations

from typing import Any

import torch

from bench.device import make_generator
from bench.eval_config import EMBEDDED_EVAL_PRECISION, EvalConfig, as_eval_config, eval_engine_kind, set_config
from bench.models.tokenizer import PromptFormat, decode_responses, encode_prompts
from bench.passk import mean_pass_at_k
from bench.rewards import scorer_metrics
from bench.rollout import build_engine
from bench.rollout.base import RolloutEngine, SamplingParams, response_budget, sampling_device
from bench.rollout.embedded import EmbeddedRolloutConfig
from bench.tasks.base import Example, Task, stable_seed
from bench.registry import TASKS


def build_eval_engine(eval_cfg: Any, rollout_cfg: Any, rollout_engine: RolloutEngine, ids: dict[str, Any],
                      max_len: int | None) -> RolloutEngine:
    """The evaluation's engine (module docstring). With eval.engine=vllm it is built around the rollout engine
    when that is vLLM (they take turns on the GPU), else around an unbuilt vLLM engine of the same context.
    `ids`: the stop and pad ids every engine is built with (bench.models.tokenizer.engine_ids)."""
    kind = eval_engine_kind(as_eval_config(eval_cfg).engine, rollout_cfg.engine)
    if kind == "embedded":
        return build_engine(EmbeddedRolloutConfig(precision=EMBEDDED_EVAL_PRECISION), **ids, max_len=max_len)
    from bench.rollout.vllm_engine import VLLMEngine, VLLMEvalEngine, VLLMRolloutConfig

    if isinstance(rollout_engine, VLLMEngine):
        return VLLMEvalEngine(rollout_engine, owns_template=True)
    # an unbuilt engine for its stop ids, context and GPU share; the evaluation builds its sibling at
    # VLLM_EVAL_PRECISION
    template = build_engine(VLLMRolloutConfig(precision="bf16"), **ids, max_len=max_len)
    return VLLMEvalEngine(template, owns_template=False)


def build_eval_sets(eval_cfg: Any, train_task: Task) -> dict[str, Task]:
    """The eval sets' tasks. A set named like the training task is the training task itself (its source and
    settings), so that `task=gsm8k task.source=/data/gsm8k eval.sets=[gsm8k]` evaluates the same copy."""
    eval_cfg = as_eval_config(eval_cfg)
    overrides = eval_cfg.overrides
    out = {}
    for name in eval_cfg.sets:
        if name == train_task.name and name not in overrides:
            out[name] = train_task
        else:
            out[name] = TASKS.get(name)(set_config(name, overrides.get(name)))
    return out


def _chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


@torch.no_grad()
def sample_rewards(
    engine: RolloutEngine, tokenizer: Any, task: Task, examples: list[Example], n: int, sampling: SamplingParams,
    fmt: PromptFormat = PromptFormat(), batch_size: int | None = None, generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rewards [E, n], response lengths [E, n]) of n completions per example from the loaded `engine`.

    `sampling.max_new_tokens` is cut to fit the engine's context (bench.rollout.base.response_budget);
    generate calls hold at most `batch_size` sequences (whole groups of n).
    """
    per_call = len(examples) if batch_size is None else max(1, batch_size // n)
    rewards, lengths = [], []
    for chunk in _chunks(examples, per_call):
        ids, mask = encode_prompts(tokenizer, task, chunk, fmt)
        budget = response_budget(sampling.max_new_tokens, ids.shape[1], engine)
        rollout = engine.generate(ids, mask, n, SamplingParams(budget, sampling.temperature, sampling.greedy,
                                                               sampling.top_p, sampling.top_k), generator)
        completions = decode_responses(tokenizer, rollout.response_ids, rollout.response_mask)
        rewards += [task.reward(ex, c) for ex, c in zip((e for e in chunk for _ in range(n)), completions)]
        lengths.append(rollout.response_mask.sum(1).float())
    return torch.tensor(rewards, dtype=torch.float32).view(len(examples), n), torch.cat(lengths).view(len(examples), n)


@torch.no_grad()
def greedy_eval(
    engine: RolloutEngine, model: torch.nn.Module, tokenizer: Any, task: Task, examples: list[Example],
    max_new_tokens: int | None = None, fmt: PromptFormat = PromptFormat(), batch_size: int | None = None,
) -> dict[str, float]:
    """{eval/accuracy, eval/reward_mean, eval/response_length} of greedy completions on `examples`."""
    if not examples:
        raise ValueError(f"task {task.name!r}: no examples to evaluate on")
    engine.load_weights(model)
    sampling = SamplingParams(max_new_tokens or task.max_new_tokens, greedy=True)
    rewards, lengths = sample_rewards(engine, tokenizer, task, examples, 1, sampling, fmt, batch_size)
    return {"eval/accuracy": (rewards >= 1.0).float().mean().item(),
            "eval/reward_mean": rewards.mean().item(),
            "eval/response_length": lengths.mean().item()}


def pass_ks(k: int) -> list[int]:
    """The pass@j reported for a largest k: 1, 2, 4, ... below k, and k (P3O reports k in {1, 4, 16})."""
    out, j = [], 1
    while j < k:
        out.append(j)
        j *= 2
    return out + [k]


def set_metrics(rewards: torch.Tensor, lengths: torch.Tensor, cfg: EvalConfig) -> dict[str, float]:
    """The `eval.mode` metrics of one set from its rewards [problems, samples] (unprefixed names)."""
    correct = rewards >= 1.0
    out: dict[str, float] = {}
    if cfg.mode == "greedy":
        out["accuracy"] = correct.float().mean().item()
    elif cfg.mode == "avg@k":
        out[f"avg@{cfg.k}"] = correct.float().mean(1).mean().item()  # problems weigh equally
    else:
        counts = [(correct.shape[1], int(c)) for c in correct.sum(1).tolist()]
        out |= {f"pass@{j}": mean_pass_at_k(counts, j) for j in pass_ks(cfg.k)}
    return out | {"reward_mean": rewards.mean().item(), "response_length": lengths.mean().item()}


@torch.no_grad()
def evaluate_set(
    engine: RolloutEngine, tokenizer: Any, name: str, task: Task, cfg: EvalConfig, fmt: PromptFormat,
    seed: int, step: int,
) -> dict[str, float]:
    """`eval/<name>/<metric>` of one eval set's test split; the engine already holds the policy."""
    examples = task.examples("test")
    if not examples:
        raise ValueError(f"eval set {name!r}: its test split is empty")
    prefix = f"eval/{name}"
    scorer_metrics(task, prefix)  # drop counts that are not this evaluation's (e.g. the warm start's)
    greedy = cfg.mode == "greedy"
    sampling = SamplingParams(cfg.max_new_tokens or task.max_new_tokens, cfg.temperature, greedy, cfg.top_p,
                              cfg.top_k)
    # on the engine's device: a CPU generator for an engine on a GPU is refused (or costs a copy per call)
    generator = None if greedy else make_generator(sampling_device(engine), stable_seed("eval", seed, step, name) % 2**63)
    rewards, lengths = sample_rewards(engine, tokenizer, task, examples, cfg.samples, sampling, fmt,
                                      cfg.batch_size, generator)
    metrics = {f"{prefix}/{k}": v for k, v in set_metrics(rewards, lengths, cfg).items()}
    return metrics | scorer_metrics(task, prefix)


@torch.no_grad()
def evaluate_policy(
    engine: RolloutEngine, model: torch.nn.Module, tokenizer: Any, task: Task, sets: dict[str, Task],
    cfg: EvalConfig | Any, fmt: PromptFormat, seed: int, step: int,
) -> dict[str, float]:
    """The trainer's evaluation: the training task's greedy eval/* and every eval set's eval/<set>/*."""
    cfg = as_eval_config(cfg)
    scorer_metrics(task, "eval")
    out = greedy_eval(engine, model, tokenizer, task, task.examples("test"), task.max_new_tokens, fmt, cfg.batch_size)
    out |= scorer_metrics(task, "eval")
    for name, set_task in sets.items():  # the engine still holds `model`
        out |= evaluate_set(engine, tokenizer, name, set_task, cfg, fmt, seed, step)
    release = getattr(engine, "release", None)
    if release is not None:  # its fp32 copy of the policy is rebuilt at the next evaluation anyway: free the GPU
        release()
    return out
