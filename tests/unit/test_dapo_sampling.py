"""DAPO's data-side knobs in the trainer (bench/sampling.py), on the real tiny model, engine and arithmetic task.

* dynamic sampling: every group of the batch has unequal rewards; the counts add up; the batch is a pure function
  of (seed, step, round) and the generator state; the round cap stops refilling and leaves a partial batch;
  with no group kept the step makes no update;
* without any DAPO knob a step samples exactly as before (round 0 = `task.sample(step, n, seed)`);
* the soft overlong penalty is added to the task reward; overlong filtering removes truncated responses from the
  loss mask; truncation is "no EOS", not a length rule.
"""

from __future__ import annotations

import pytest
import torch

from bench.dapo import soft_overlong_penalty
from bench.models.tokenizer import encode_prompts
from bench.rollout.base import Rollout, SamplingParams
from bench.sampling import concat_rollouts, truncated
from bench.train import Timer, build, train_step
from tests.helpers import make_cfg

G = 4


def parts(tmp_path, *overrides):
    p = build(make_cfg(tmp_path, f"train.group_size={G}", "train.batch_size=32", *overrides))
    p.engine.load_weights(p.policy)  # what train_step does first
    return p


def groups(scores: torch.Tensor) -> torch.Tensor:
    return scores.view(-1, G)


def test_concat_rollouts_pads_prompts_left_and_responses_right():
    a = Rollout(torch.tensor([[5, 6]]), torch.tensor([[True, True]]), torch.tensor([[7]]), torch.tensor([[True]]),
                torch.tensor([[-0.5]]))
    b = Rollout(torch.tensor([[8]]), torch.tensor([[True]]), torch.tensor([[9, 2]]), torch.tensor([[True, True]]),
                torch.tensor([[-1.0, -2.0]]))
    c = concat_rollouts([a, b], pad=0)
    assert c.prompt_ids.tolist() == [[5, 6], [0, 8]] and c.prompt_mask.tolist() == [[True, True], [False, True]]
    assert c.response_ids.tolist() == [[7, 0], [9, 2]] and c.response_mask.tolist() == [[True, False], [True, True]]
    assert c.logp_mu.tolist() == [[-0.5, 0.0], [-1.0, -2.0]]


def test_truncated_means_no_eos_not_a_length():
    r = Rollout(torch.zeros(3, 1, dtype=torch.long), torch.ones(3, 1, dtype=torch.bool),
                torch.tensor([[4, 5, 2], [4, 5, 6], [4, 2, 0]]),
                torch.tensor([[True, True, True], [True, True, True], [True, True, False]]), torch.zeros(3, 3))
    assert truncated(r, 2, max_new_tokens=3).tolist() == [False, True, False]  # row 0 ends on EOS at the limit
    assert truncated(r, (6, 2), max_new_tokens=3).tolist() == [False, False, False]  # several stop ids
    assert truncated(r, None, max_new_tokens=3).tolist() == [True, True, False]  # no stop id: by length


def test_without_dapo_knobs_a_step_samples_as_before(tmp_path):
    p = parts(tmp_path)
    state = p.generator.get_state()
    sample = p.sampler.collect(5, Timer())
    p.generator.set_state(state)
    examples = p.task.sample(5, 32 // G, p.cfg.seed)
    ids, mask = encode_prompts(p.tokenizer, p.task, examples, p.prompt_format)
    direct = p.engine.generate(ids, mask, G, SamplingParams(p.cfg.task.max_new_tokens, 1.0), p.generator)
    assert torch.equal(sample.rollout.response_ids, direct.response_ids)
    assert torch.equal(sample.rewards, sample.scores) and sample.metrics == {}
    assert torch.equal(sample.loss_mask(direct.response_mask), direct.response_mask)


def test_dynamic_sampling_keeps_mixed_groups_refills_and_counts(tmp_path):
    p = parts(tmp_path, "algo.dynamic_sampling=true")
    state = p.generator.get_state()
    sample = p.sampler.collect(3, Timer())
    g = groups(sample.scores)
    assert (g != g[:, :1]).any(1).all()  # no all-equal group left
    m = sample.metrics
    assert m["sampling/kept"] + m["sampling/dropped"] == m["sampling/generated"] == 8 * m["sampling/rounds"]
    assert m["sampling/used"] == g.shape[0] == min(m["sampling/kept"], 8)
    assert m["sampling/dropped"] > 0  # the warm start is ~35 % accurate: some groups are all wrong
    if not m["sampling/cap_reached"]:
        assert sample.rollout.batch_size == 32
    # the same step with the same generator state gives the same batch (resume exactness)
    p.generator.set_state(state)
    again = p.sampler.collect(3, Timer())
    assert torch.equal(again.rollout.response_ids, sample.rollout.response_ids) and again.metrics == m


def test_round_cap_leaves_a_partial_batch(tmp_path):
    p = parts(tmp_path, "algo.dynamic_sampling=true", "algo.dynamic_sampling_max_rounds=1")
    sample = p.sampler.collect(3, Timer())
    m = sample.metrics
    assert m["sampling/rounds"] == 1 and m["sampling/generated"] == 8
    assert m["sampling/cap_reached"] == 1.0 and sample.rollout.batch_size == G * m["sampling/kept"] < 32


def test_no_kept_group_means_no_update(tmp_path):
    p = parts(tmp_path, "algo.dynamic_sampling=true", "algo.dynamic_sampling_max_rounds=2")
    p.task.reward = lambda ex, completion: 0.0  # every group all-equal
    before = {k: v.clone() for k, v in p.policy.state_dict().items()}
    row = train_step(p, 0)
    assert row["sampling/kept"] == 0 and row["sampling/rounds"] == 2 and row["sampling/cap_reached"] == 1.0
    assert not any(k.startswith(("train/", "reward/", "mismatch/")) for k in row)
    assert row["time/rollout_s"] > 0
    for k, v in p.policy.state_dict().items():
        assert torch.equal(v, before[k])


def test_soft_overlong_penalty_and_overlong_filter(tmp_path):
    """Arithmetic's limit is 6 tokens; sampling at T = 3 makes some responses run into it without an EOS."""
    p = parts(tmp_path, "rollout.temperature=3.0", "algo.overlong_penalty=true", "algo.overlong_buffer_len=3",
              "algo.overlong_penalty_factor=0.5", "algo.overlong_filter=true")
    assert p.cfg.task.max_new_tokens == 6
    sample = p.sampler.collect(0, Timer())
    lengths = sample.rollout.response_mask.sum(1)
    penalty = sample.rewards - sample.scores
    torch.testing.assert_close(penalty, soft_overlong_penalty(lengths, 6, 3, 0.5))
    # up to 3 tokens: 0; 4: (3 - 4) / 3 * 0.5 = -1/6; 5: -1/3; 6: -1/2
    for n, want in ((2, 0.0), (3, 0.0), (4, -1 / 6), (5, -1 / 3), (6, -0.5)):
        assert torch.allclose(penalty[lengths == n], torch.tensor(want))
    assert (lengths == 6).any() and (lengths < 4).any()
    assert sample.truncated.any() and not sample.truncated.all()
    mask = sample.loss_mask(sample.rollout.response_mask)
    assert not mask[sample.truncated].any()
    assert torch.equal(mask[~sample.truncated], sample.rollout.response_mask[~sample.truncated])
    assert sample.metrics["sampling/truncated_frac"] == pytest.approx(sample.truncated.float().mean().item())
