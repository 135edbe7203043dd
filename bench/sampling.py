"""One training batch of rollouts: generation round(s), rewards, and DAPO's data-side knobs (`algo.*`).

    round        prompts of the step -> engine.generate -> task rewards ("scores")
    dynamic_sampling        groups whose scores are all equal are dropped and further rounds refill the batch,
                            at most `dynamic_sampling_max_rounds` rounds (DAPO Eq. 11; bench/dapo.py)
    overlong_penalty        the soft overlong punishment (DAPO Eq. 13) is added to the scores: the reward trained on
    overlong_filter         truncated responses (no EOS within task.max_new_tokens) leave the loss mask

Dynamic sampling filters on the task's own reward (correctness for the math tasks), never on the penalized
reward, as verl's recipe filters on `acc`: the penalty makes lengths differ, so an all-correct group would
otherwise survive. Round r of step s draws its prompts from `task.sample(s, n, seed_r)` with seed_0 = the run's
seed (so a run without dynamic sampling samples exactly as before) and seed_r = stable_seed(seed, r) after it,
and samples with the run's generator: the batch is a pure function of (seed, step, round) and the checkpointed
generator state, so a resumed run reproduces it exactly.

When the round cap stops refilling with a short batch, the step trains on the groups it kept (verl raises an
error instead; ours: a partial batch is still informative). When no group was kept at all, the step makes no
update (`Sample.rollout` is None): training on all-equal groups would give zero GRPO advantages but still move
the weights through Adam's momentum and the KL terms.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from transformers import PreTrainedTokenizerBase

from bench.dapo import apply_soft_overlong_penalty, dynamic_sample, overlong_filter_mask, truncated_responses
from bench.algo_config import AlgoConfig
from bench.models.tokenizer import PromptFormat, decode_responses, encode_prompts, pad_id
from bench.rollout.base import Rollout, RolloutEngine, SamplingParams, response_budget, token_ids
from bench.tasks.base import Task, stable_seed
from bench.timing import Timer


@dataclass
class Sample:
    """The step's training batch. rollout None: dynamic sampling kept no group (no update this step)."""

    rollout: Rollout | None
    scores: torch.Tensor  # [B] task rewards (what dynamic sampling filters on; accuracy = scores >= 1)
    rewards: torch.Tensor  # [B] the rewards trained on: scores (+ the soft overlong penalty)
    truncated: torch.Tensor  # [B] bool: the response hit the generation limit without EOS
    generated_tokens: int  # response tokens generated over every round (throughput)
    metrics: dict[str, float] = field(default_factory=dict)  # sampling/*, only when a DAPO knob is on
    filter_truncated: bool = False

    def loss_mask(self, mask: torch.Tensor) -> torch.Tensor:
        """The training mask with truncated responses removed when algo.overlong_filter is on."""
        return overlong_filter_mask(mask, self.truncated) if self.filter_truncated else mask


def truncated(rollout: Rollout, stop_ids: Any, max_new_tokens: int) -> torch.Tensor:
    """Bool [B]: responses that end on no stop token (cut by the limit); by length when there is no stop id."""
    lengths = rollout.response_mask.sum(1)
    stops = torch.tensor(token_ids(stop_ids), dtype=torch.long, device=rollout.response_ids.device)
    if stops.numel() == 0:
        return truncated_responses(lengths, max_new_tokens)
    finished = (torch.isin(rollout.response_ids, stops) & rollout.response_mask.bool()).any(1)
    return truncated_responses(lengths, max_new_tokens, finished)


@dataclass
class Round:
    rollout: Rollout
    scores: torch.Tensor


def concat_rollouts(parts: list[Rollout], pad: int) -> Rollout:
    """Row-wise concatenation; prompts left-padded and responses right-padded to the widest part."""
    if len(parts) == 1:
        return parts[0]
    P = max(r.prompt_ids.shape[1] for r in parts)
    T = max(r.response_ids.shape[1] for r in parts)

    def pad_to(x: torch.Tensor, width: int, value: Any, left: bool) -> torch.Tensor:
        extra = width - x.shape[1]
        return torch.nn.functional.pad(x, (extra, 0) if left else (0, extra), value=value)

    return Rollout(
        prompt_ids=torch.cat([pad_to(r.prompt_ids, P, pad, True) for r in parts]),
        prompt_mask=torch.cat([pad_to(r.prompt_mask, P, False, True) for r in parts]),
        response_ids=torch.cat([pad_to(r.response_ids, T, pad, False) for r in parts]),
        response_mask=torch.cat([pad_to(r.response_mask, T, False, False) for r in parts]),
        logp_mu=torch.cat([pad_to(r.logp_mu, T, 0.0, False) for r in parts]),
    )


def dapo_enabled(algo: Any) -> bool:
    return bool(algo.dynamic_sampling or algo.overlong_filter or algo.overlong_penalty)


@dataclass
class Sampler:
    """Everything a step's sampling reads, named and typed; built once by bench.train.build around the final
    engine (after bench.distributed has wrapped it) and used by `train_step` as `p.sampler.collect(step, timer)`.

    The settings are the run's `seed`, `train.group_size`, `train.batch_size`, `task.max_new_tokens`,
    `rollout.temperature` and the DAPO knobs of `algo` (module docstring).
    """

    task: Task
    tokenizer: PreTrainedTokenizerBase
    engine: RolloutEngine
    generator: torch.Generator  # the run's sampling stream (checkpointed)
    device: torch.device  # the trainer's: rollouts and scores are moved there
    prompt_format: PromptFormat
    seed: int
    group_size: int
    batch_size: int
    max_new_tokens: int
    temperature: float
    algo: AlgoConfig

    @classmethod
    def from_config(cls, cfg: Any, task: Task, tokenizer: PreTrainedTokenizerBase, engine: RolloutEngine,
                    generator: torch.Generator, device: torch.device, prompt_format: PromptFormat) -> "Sampler":
        return cls(task, tokenizer, engine, generator, device, prompt_format, cfg.seed, cfg.train.group_size,
                   cfg.train.batch_size, cfg.task.max_new_tokens, cfg.rollout.temperature, cfg.algo)

    def score(self, examples: list[dict], rollout: Rollout, n: int) -> torch.Tensor:
        """The task's reward of every response (n responses per example, group-contiguous), on the trainer's device."""
        completions = decode_responses(self.tokenizer, rollout.response_ids, rollout.response_mask)
        rewards = [self.task.reward(ex, c) for ex, c in zip((e for e in examples for _ in range(n)), completions)]
        return torch.tensor(rewards, device=self.device)

    def generate_round(self, step: int, round_index: int, n_prompts: int, timer: Timer) -> Round:
        """Round `round_index` of step `step`: prompts (a pure function of seed, step, round), responses, scores."""
        G = self.group_size
        seed = self.seed if round_index == 0 else stable_seed("dynamic_sampling", self.seed, round_index)
        examples = self.task.sample(step, n_prompts, seed)
        prompt_ids, prompt_mask = encode_prompts(self.tokenizer, self.task, examples, self.prompt_format)
        budget = response_budget(self.max_new_tokens, prompt_ids.shape[1], self.engine)
        with timer("rollout"):
            rollout = self.engine.generate(prompt_ids, prompt_mask, G, SamplingParams(budget, self.temperature),
                                           self.generator)
        rollout = rollout.to(self.device)
        return Round(rollout, self.score(examples, rollout, G))

    def collect(self, step: int, timer: Timer) -> Sample:
        """The step's batch: one round, or dynamic sampling's rounds until the batch is full or the cap is hit."""
        algo = self.algo
        G, n_prompts = self.group_size, self.batch_size // self.group_size
        rounds: list[Round] = []

        def next_round(index: int) -> tuple[list[tuple[int, int]], torch.Tensor]:
            rounds.append(self.generate_round(step, index, n_prompts, timer))
            return [(index, g) for g in range(n_prompts)], rounds[-1].scores.view(n_prompts, G)

        metrics: dict[str, float] = {}
        if algo.dynamic_sampling:
            kept, counts = dynamic_sample(next_round, n_prompts, algo.dynamic_sampling_max_rounds)
            metrics |= counts.as_metrics("sampling/")
            all_scores = torch.cat([r.scores for r in rounds])
            metrics["sampling/generated_accuracy"] = (all_scores >= 1.0).float().mean().item()
            rows: list[list[int]] = [[] for _ in rounds]  # the kept groups' rows, round by round, earliest first
            for index, g in kept:
                rows[index].extend(range(g * G, (g + 1) * G))
            picked = [(r, torch.tensor(idx, dtype=torch.long, device=r.scores.device)) for r, idx in zip(rounds, rows) if idx]
            rollout = concat_rollouts([r.rollout.select(idx) for r, idx in picked], pad_id(self.tokenizer)) if picked else None
            scores = torch.cat([r.scores[idx] for r, idx in picked]) if picked else torch.zeros(0)
        else:
            next_round(0)
            rollout, scores = rounds[0].rollout, rounds[0].scores
        generated = sum(r.rollout.num_tokens() for r in rounds)
        if rollout is None:
            empty = torch.zeros(0, dtype=torch.bool)
            return Sample(None, scores, scores, empty, generated, metrics)
        cut = truncated(rollout, self.engine.eos_id, self.max_new_tokens)
        rewards = scores
        if algo.overlong_penalty:
            lengths = rollout.response_mask.sum(1)
            rewards = apply_soft_overlong_penalty(scores, lengths, self.max_new_tokens, algo.overlong_buffer_len,
                                                  algo.overlong_penalty_factor)
            metrics["sampling/overlong_penalty_mean"] = (rewards - scores.to(rewards.dtype)).mean().item()
        if dapo_enabled(algo):
            metrics["sampling/truncated_frac"] = cut.float().mean().item()
        return Sample(rollout, scores, rewards, cut, generated, metrics, filter_truncated=algo.overlong_filter)


__all__ = ["Round", "Sample", "Sampler", "concat_rollouts", "dapo_enabled", "truncated"]
