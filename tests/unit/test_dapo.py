"""DAPO knobs (bench/dapo.py): dynamic sampling, overlong filtering, soft overlong punishment.
Expected values are worked out by hand in the comments."""

import pytest
import torch

from bench.dapo import (
    GroupAccumulator,
    apply_soft_overlong_penalty,
    dynamic_sample,
    keep_groups,
    overlong_filter_mask,
    soft_overlong_penalty,
    truncated_responses,
)


def t(x):
    return torch.tensor(x, dtype=torch.float64)


# ---------------------------------------------------------------- keep_groups


def test_keep_groups_drops_all_equal_groups():
    # all correct, all wrong, mixed, mixed non-binary, all equal non-binary
    metric = t([[1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 0], [0.5, 0.5, 0.2, 0.5], [0.3, 0.3, 0.3, 0.3]])
    assert keep_groups(metric).tolist() == [False, False, True, True, False]


def test_keep_groups_singletons_are_kept():
    # G = 1: no spread can be measured, verl keeps the group
    assert keep_groups(t([[1.0], [0.0]])).tolist() == [True, True]


def test_filter_on_correctness_not_on_shaped_reward():
    # 4 correct responses of lengths 10, 17, 10, 10 with L_max=20, L_cache=4: the penalty of length 17 is
    # (16 - 17)/4 = -0.25, so shaped rewards are [1, 0.75, 1, 1] (not all equal) but correctness is all 1:
    # filtering on correctness drops the group, as DAPO Eq. 11 (0 < #correct < G) requires.
    correct = t([[1, 1, 1, 1]])
    shaped = apply_soft_overlong_penalty(correct[0], torch.tensor([10, 17, 10, 10]), 20, 4)
    torch.testing.assert_close(shaped, t([1.0, 0.75, 1.0, 1.0]))
    assert keep_groups(shaped.unsqueeze(0)).tolist() == [True]
    assert keep_groups(correct).tolist() == [False]


def test_keep_groups_bad_shape():
    with pytest.raises(ValueError):
        keep_groups(t([1.0, 0.0]))


# ---------------------------------------------------------------- accumulator

KEEP = [1, 0, 0, 1]  # a mixed group (kept)
SAME = [1, 1, 1, 1]  # an all-equal group (dropped)


def test_accumulator_refills_until_full_and_trims_surplus():
    # target 3 groups.
    # round 1: groups a,b,c = [KEEP, SAME, KEEP]  -> kept a,c (2/3), dropped b
    # round 2: groups d,e,f = [KEEP, KEEP, SAME]  -> kept d,e (total 4 >= 3), dropped f
    # batch = first 3 kept = a, c, d; surplus = 4 - 3 = 1 (e)
    acc = GroupAccumulator(target_groups=3, max_rounds=5)
    assert acc.needs_more()
    acc.add_round(["a", "b", "c"], t([KEEP, SAME, KEEP]))
    assert acc.needs_more()
    keep = acc.add_round(["d", "e", "f"], t([KEEP, KEEP, SAME]))
    assert keep.tolist() == [True, True, False]
    assert not acc.needs_more()
    assert acc.batch() == ["a", "c", "d"]
    c = acc.counts
    assert (c.generated, c.kept, c.dropped, c.used, c.surplus, c.rounds, c.cap_reached) == (6, 4, 2, 3, 1, 2, False)


def test_accumulator_exactly_full_in_one_round():
    # target 2, one round with exactly 2 kept: no refill, no surplus
    acc = GroupAccumulator(target_groups=2, max_rounds=1)
    acc.add_round([0, 1, 2], t([KEEP, SAME, KEEP]))
    assert acc.full and not acc.needs_more() and not acc.counts.cap_reached
    assert acc.batch() == [0, 2] and acc.counts.surplus == 0


def test_accumulator_cap_reached_with_partial_batch():
    # target 4, cap 2 rounds, each round keeps 1 of 2 -> after 2 rounds kept 2 < 4, the cap stops refilling:
    # generated 4, kept 2, dropped 2, used 2, surplus 0, rounds 2, cap_reached
    acc = GroupAccumulator(target_groups=4, max_rounds=2)
    acc.add_round(["a", "b"], t([KEEP, SAME]))
    assert acc.needs_more() and not acc.counts.cap_reached
    acc.add_round(["c", "d"], t([SAME, KEEP]))
    assert not acc.needs_more()
    assert acc.batch() == ["a", "d"]
    c = acc.counts
    assert (c.generated, c.kept, c.dropped, c.used, c.surplus, c.rounds, c.cap_reached) == (4, 2, 2, 2, 0, 2, True)


def test_accumulator_all_groups_dropped():
    # every group of every round is all-equal: the batch stays empty, cap reached after max_rounds=3
    acc = GroupAccumulator(target_groups=2, max_rounds=3)
    while acc.needs_more():
        acc.add_round(["x", "y"], t([SAME, [0, 0, 0, 0]]))
    assert acc.batch() == []
    c = acc.counts
    assert (c.generated, c.kept, c.dropped, c.used, c.rounds, c.cap_reached) == (6, 0, 6, 0, 3, True)


def test_dynamic_sample_driver_and_unlimited_rounds():
    # rounds 0 and 1 produce only dropped groups, round 2 produces 3 kept groups; target 2, no cap:
    # generated 2 + 2 + 3 = 7, kept 3, dropped 4, used 2, surplus 1, rounds 3
    def gen(round_index):
        if round_index < 2:
            return [f"r{round_index}a", f"r{round_index}b"], t([SAME, SAME])
        return ["r2a", "r2b", "r2c"], t([KEEP, KEEP, KEEP])

    batch, c = dynamic_sample(gen, target_groups=2, max_rounds=None)
    assert batch == ["r2a", "r2b"]
    assert (c.generated, c.kept, c.dropped, c.used, c.surplus, c.rounds, c.cap_reached) == (7, 3, 4, 2, 1, 3, False)
    assert c.as_metrics()["dapo/dropped"] == 4.0


def test_accumulator_validation():
    with pytest.raises(ValueError):
        GroupAccumulator(target_groups=0)
    with pytest.raises(ValueError):
        GroupAccumulator(target_groups=1, max_rounds=0)
    with pytest.raises(ValueError):
        GroupAccumulator(target_groups=1).add_round(["a"], t([KEEP, KEEP]))


# ---------------------------------------------------------------- overlong filtering


def test_truncated_responses_from_finish_flags_and_lengths():
    lengths = torch.tensor([3, 5, 5])
    # with finish flags: the second response ended on EOS exactly at the limit -> not truncated
    assert truncated_responses(lengths, 5, finished=torch.tensor([True, True, False])).tolist() == [False, False, True]
    # lengths only: both length-5 responses count as truncated
    assert truncated_responses(lengths, 5).tolist() == [False, True, True]


def test_overlong_filter_masks_whole_truncated_rows():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    out = overlong_filter_mask(mask, torch.tensor([False, True, False]))
    assert out.tolist() == [[True, True, False], [False, False, False], [True, False, False]]
    # token-mean denominator: 6 valid tokens before, 3 after
    assert int(mask.sum()) == 6 and int(out.sum()) == 3


def test_overlong_filter_shape_check():
    with pytest.raises(ValueError):
        overlong_filter_mask(torch.ones(2, 3, dtype=torch.bool), torch.tensor([True]))


# ---------------------------------------------------------------- soft overlong punishment


def test_soft_overlong_penalty_eq13():
    # L_max = 20, L_cache = 4 -> expected length L_max - L_cache = 16
    #   |y| = 10: <= 16                 -> 0
    #   |y| = 16: boundary, <= 16       -> 0
    #   |y| = 17: (16 - 17) / 4         -> -0.25
    #   |y| = 18: (16 - 18) / 4         -> -0.5
    #   |y| = 20: boundary, <= L_max    -> (16 - 20) / 4 = -1.0
    #   |y| = 21: > L_max               -> -1
    lengths = torch.tensor([10, 16, 17, 18, 20, 21])
    pen = soft_overlong_penalty(lengths, max_len=20, cache_len=4)
    torch.testing.assert_close(pen, torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0, -1.0]))


def test_soft_overlong_penalty_factor_and_paper_setting():
    # factor 0.5: |y| = 18 -> 0.5 * -0.5 = -0.25; |y| = 25 -> 0.5 * -1 = -0.5
    pen = soft_overlong_penalty(torch.tensor([18, 25]), 20, 4, penalty_factor=0.5)
    torch.testing.assert_close(pen, torch.tensor([-0.25, -0.5]))
    # DAPO section 4.1: L_max = 20480, L_cache = 4096. |y| = 16384 -> 0; |y| = 18432 -> (16384 - 18432)/4096 = -0.5
    pen = soft_overlong_penalty(torch.tensor([16384, 18432, 20480]), 20480, 4096)
    torch.testing.assert_close(pen, torch.tensor([0.0, -0.5, -1.0]))


def test_soft_overlong_penalty_zero_cache_and_validation():
    # L_cache = 0: no ramp, 0 up to and including L_max, -1 beyond
    torch.testing.assert_close(soft_overlong_penalty(torch.tensor([20, 21]), 20, 0), torch.tensor([0.0, -1.0]))
    with pytest.raises(ValueError):
        soft_overlong_penalty(torch.tensor([1]), 20, 21)
    with pytest.raises(ValueError):
        soft_overlong_penalty(torch.tensor([1]), 20, -1)


def test_apply_soft_overlong_penalty_to_correctness_reward():
    # DAPO's reward is +1 correct / -1 wrong, plus R_length. Correct at 18 tokens: 1 - 0.5 = 0.5;
    # wrong at 21 tokens: -1 - 1 = -2; integer scores are promoted to float
    out = apply_soft_overlong_penalty(torch.tensor([1, -1]), torch.tensor([18, 21]), 20, 4)
    torch.testing.assert_close(out, torch.tensor([0.5, -2.0]))
