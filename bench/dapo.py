"""DAPO's data-side knobs (Yu et al. 2025, arXiv 2503.14476; issue 11, QuRL Table 2): dynamic sampling, overlong
filtering and the soft overlong punishment. Pure functions plus one small accumulator, no trainer state.

The other two DAPO techniques already exist in bench/grpo.py and need nothing new: clip-higher is
`clipped_surrogate(..., eps_low=0.2, eps_high=0.28)` (DAPO Eq. 10) and the token-level policy-gradient loss is
`agg_loss(..., mode="token-mean")` (DAPO Eq. 12). DAPO also drops the KL term (kl_ref_beta = 0).

Sources read (formulas re-derived, no code copied): the DAPO paper section 3 (Eq. 11 dynamic sampling, section 3.4
overlong filtering, Eq. 13 soft overlong punishment) and verl's DAPO recipe as documented in
volcengine/verl@b178a3c docs/algo/dapo.md and verl/workers/reward_manager/dapo.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Generic, Sequence, TypeVar

import torch

T = TypeVar("T")


# ---------------------------------------------------------------------------------------------- dynamic sampling


def keep_groups(group_metric: torch.Tensor) -> torch.Tensor:
    """Bool [n_groups]: True for the groups dynamic sampling keeps, given a [n_groups, G] per-response metric.

    DAPO Eq. 11 trains only on prompts with 0 < #correct < G: a group whose responses all score the same has
    all-zero GRPO advantages and gives no gradient. A group is dropped iff all its values are exactly equal, which
    is verl's rule (`std == 0` of the group's metric); groups of size 1 are kept, as in verl (no spread can be
    measured). Pass the *correctness* per response (verl's recipe filters on `metric: acc`), not the reward after
    the soft overlong penalty: the penalty makes lengths differ, so an all-correct group would otherwise survive.
    """
    if group_metric.dim() != 2:
        raise ValueError(f"group_metric must be [n_groups, G], got shape {tuple(group_metric.shape)}")
    if group_metric.shape[1] <= 1:
        return torch.ones(group_metric.shape[0], dtype=torch.bool, device=group_metric.device)
    return ~(group_metric == group_metric[:, :1]).all(dim=1)


@dataclass
class DynamicSamplingCounts:
    """What dynamic sampling did for one training batch (log these every step).

    generated: groups (prompts x G responses) generated over all rounds;
    kept:      of those, groups that passed `keep_groups`;
    dropped:   generated - kept (all-equal groups);
    used:      kept groups that went into the batch (min(kept, target));
    surplus:   kept - used (filled past the target in the last round and discarded, as verl does);
    rounds:    generation rounds run;
    cap_reached: the round cap stopped refilling before the batch was full.
    """

    generated: int = 0
    kept: int = 0
    dropped: int = 0
    used: int = 0
    surplus: int = 0
    rounds: int = 0
    cap_reached: bool = False

    def as_metrics(self, prefix: str = "dapo/") -> dict[str, float]:
        return {f"{prefix}{k}": float(v) for k, v in self.__dict__.items()}


@dataclass
class GroupAccumulator(Generic[T]):
    """Collects kept groups over generation rounds until `target_groups` are kept or `max_rounds` rounds ran.

    This is DAPO's "dynamic sampling buffer" (Algorithm 1, lines 6-8): generate a round, filter it, add the
    survivors, and generate again while the buffer is short. `max_rounds` caps the rounds per training batch
    (verl: `filter_groups.max_num_gen_batches`, non-positive = no limit; None here = no limit). When the cap is hit
    with a short batch, verl raises an error; this accumulator instead stops and reports `cap_reached`, leaving the
    choice to the trainer [ours; the recommended choice is to train on the partial batch, skip the update if it is
    empty, and log the counts]. Over-filling in the last round is trimmed to exactly `target_groups`, keeping the
    earliest groups (verl: `batch[:train_batch_size * n]`).

    `groups` passed to `add_round` are opaque per-group payloads (indices, rollout records, ...).
    """

    target_groups: int
    max_rounds: int | None = None
    _kept: list[T] = field(default_factory=list, repr=False)
    counts: DynamicSamplingCounts = field(default_factory=DynamicSamplingCounts)

    def __post_init__(self) -> None:
        if self.target_groups < 1:
            raise ValueError(f"target_groups must be >= 1, got {self.target_groups}")
        if self.max_rounds is not None and self.max_rounds < 1:
            raise ValueError(f"max_rounds must be >= 1 or None (no limit), got {self.max_rounds}")

    @property
    def full(self) -> bool:
        return self.counts.kept >= self.target_groups

    def needs_more(self) -> bool:
        """True while the batch is short and the round cap allows another round."""
        if self.full:
            return False
        return self.max_rounds is None or self.counts.rounds < self.max_rounds

    def add_round(self, groups: Sequence[T], group_metric: torch.Tensor) -> torch.Tensor:
        """Filter one generation round, keep its informative groups; returns the round's keep mask."""
        if len(groups) != group_metric.shape[0]:
            raise ValueError(f"{len(groups)} groups but metric for {group_metric.shape[0]}")
        keep = keep_groups(group_metric)
        c = self.counts
        c.rounds += 1
        c.generated += len(groups)
        n_keep = int(keep.sum())
        c.kept += n_keep
        c.dropped += len(groups) - n_keep
        self._kept.extend(g for g, k in zip(groups, keep.tolist()) if k)
        c.used = min(c.kept, self.target_groups)
        c.surplus = c.kept - c.used
        c.cap_reached = not self.full and self.max_rounds is not None and c.rounds >= self.max_rounds
        return keep

    def batch(self) -> list[T]:
        """The kept groups that form the training batch (at most `target_groups`, earliest first)."""
        return self._kept[: self.target_groups]


def dynamic_sample(
    generate_round: Callable[[int], tuple[Sequence[T], torch.Tensor]],
    target_groups: int,
    max_rounds: int | None = None,
) -> tuple[list[T], DynamicSamplingCounts]:
    """Run rounds of `generate_round(round_index) -> (groups, group_metric [n, G])` until the batch is full or the
    cap is reached; returns (batch of kept groups, counts). See `GroupAccumulator` for the rules."""
    acc: GroupAccumulator[T] = GroupAccumulator(target_groups, max_rounds)
    while acc.needs_more():
        groups, metric = generate_round(acc.counts.rounds)
        acc.add_round(groups, metric)
    return acc.batch(), acc.counts


# ---------------------------------------------------------------------------------------------- overlong handling


def truncated_responses(
    lengths: torch.Tensor, max_response_len: int, finished: torch.Tensor | None = None
) -> torch.Tensor:
    """Bool [B]: responses cut off by the generation limit (vLLM finish_reason == "length").

    With `finished` (True = the response ended on EOS/stop) a response is truncated iff it did not finish; this is
    exact. Without it the rule is length >= max_response_len, which also flags a response that happened to end on
    EOS at exactly the last allowed token; pass `finished` when the engine reports it.
    """
    if finished is not None:
        return ~finished.bool()
    return lengths >= max_response_len


def overlong_filter_mask(mask: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """DAPO's Overlong Filtering (section 3.4): "masks the loss of truncated samples".

    Returns the [B, T] loss mask with every token of a truncated response turned off, so those responses add
    neither loss nor tokens to the token-mean denominator. Only the loss is masked: the truncated responses still
    count in their group's advantage statistics (they were sampled and scored). The DAPO paper's best run used the
    soft overlong punishment instead, and verl's DAPO recipe does not implement filtering (docs/algo/dapo.md FAQ).
    """
    if mask.dim() != 2 or truncated.shape != mask.shape[:1]:
        raise ValueError(f"mask [B, T] and truncated [B] expected, got {tuple(mask.shape)}, {tuple(truncated.shape)}")
    return mask.bool() & ~truncated.bool().unsqueeze(1)


def soft_overlong_penalty(
    lengths: torch.Tensor, max_len: int, cache_len: int, penalty_factor: float = 1.0
) -> torch.Tensor:
    """DAPO Eq. 13, the Soft Overlong Punishment, added to the rule-based correctness reward:

        R_length(y) = 0                                   if |y| <= L_max - L_cache
                    = ((L_max - L_cache) - |y|) / L_cache   if L_max - L_cache < |y| <= L_max
                    = -1                                   if L_max < |y|

    L_max is the hard generation limit and L_cache the "soft punish cache" below it (DAPO section 4.1: expected
    maximum 16,384 + cache 4,096 = L_max 20,480). The penalty falls linearly from 0 to -1 across the cache and is
    continuous at both boundaries (at |y| = L_max it is exactly -1). `penalty_factor` scales it (verl's
    `overlong_buffer.penalty_factor`; the paper's formula is factor 1). verl computes
    min(-(|y| - (L_max - L_cache)) / L_cache * factor, 0), which is the same on |y| <= L_max; responses are never
    longer than L_max there because generation stops at L_max. L_cache = 0 gives 0 up to L_max and -1 beyond.
    """
    if not 0 <= cache_len <= max_len:
        raise ValueError(f"need 0 <= cache_len <= max_len, got cache_len={cache_len}, max_len={max_len}")
    y = lengths.to(torch.float64)
    expected = max_len - cache_len
    ramp = (expected - y) / cache_len if cache_len > 0 else torch.zeros_like(y)
    out = torch.where(y <= expected, torch.zeros_like(y), torch.where(y <= max_len, ramp, torch.full_like(y, -1.0)))
    return (out * penalty_factor).to(torch.float32)


def apply_soft_overlong_penalty(
    scores: torch.Tensor, lengths: torch.Tensor, max_len: int, cache_len: int, penalty_factor: float = 1.0
) -> torch.Tensor:
    """scores + R_length(lengths): the shaped reward DAPO trains on (keep the unshaped correctness for filtering)."""
    dtype = scores.dtype if scores.is_floating_point() else torch.float32
    return scores.to(dtype) + soft_overlong_penalty(lengths, max_len, cache_len, penalty_factor).to(dtype)


__all__ = [
    "DynamicSamplingCounts",
    "GroupAccumulator",
    "apply_soft_overlong_penalty",
    "dynamic_sample",
    "keep_groups",
    "overlong_filter_mask",
    "soft_overlong_penalty",
    "truncated_responses",
]
