"""The edge cases behind the field's silent bugs, for every registered arm (the registry is the list: a new arm is
covered with no edit here). docs/arms.md §8 states each rule; tiny float64 tensors, autograd gradients w.r.t.
log pi_theta as a leaf tensor, theta = theta_old unless stated.

* all tokens / all responses dropped: a finite loss equal to the loss at zero advantages (0, except for an arm whose
  loss has a term on dropped tokens, `regularizes_dropped`), its gradient likewise, every metric finite
  (verl 0.9.1 returns NaN, verl PR #7559 a ZeroDivisionError);
* a response dropped by the arm leaves its group's GRPO baseline under algo.baseline=kept (verl PR #6452, NeMo-RL
  PR #3467: rewards [1, 1, 0, 0] with the 2nd dropped give [0.667, 0, -0.333, -0.333]) and stays in it under the
  default algo.baseline=all;
* padding holding -inf / NaN, a valid token whose log-prob is -inf, and an empty response change nothing;
* each arm's documented per-response aggregation (`Method.sequence_aggregation`: token, sum, mean, max) is what
  it computes: duplicating every token of every response changes only the "sum" arms (TRL #5814).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from bench.advantages import GRPOAdvantage
from bench.grpo import group_advantages
from bench.algo_config import AlgoConfig
from bench.methods.base import Batch, make_method
from bench.registry import METHODS
from bench.mismatch import mismatch_metrics, sanitize
from bench.train import rebaseline

D = torch.float64
METHOD_NAMES = METHODS.names()
NAN, NEG_INF = float("nan"), -math.inf


def tt(x) -> torch.Tensor:
    return torch.as_tensor(x, dtype=D)


def make_batch(m, lold, lmu, adv, mask) -> Batch:
    mask = torch.as_tensor(mask, dtype=torch.bool)
    return Batch(lold if m.needs_recompute else None, lmu, tt(adv), mask, max(1.0, float(mask.sum())))


def run(m, lt: torch.Tensor, b: Batch):
    """prepare + loss + backward: (loss, grad, stats, metrics)."""
    lt = lt.clone().detach().requires_grad_(True)
    stats = m.prepare(b)
    loss, metrics = m.loss(lt, b, stats)
    loss.backward()
    return loss.detach(), lt.grad, stats, metrics


def assert_finite(loss, grad, stats, metrics) -> None:
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    for k, v in stats.items():
        assert (math.isfinite(v) if isinstance(v, float) else torch.isfinite(v).all()), k


# ------------------------------------------------------------------------------------ everything dropped
@pytest.mark.parametrize("method", METHOD_NAMES)
def test_all_tokens_masked_gives_zero_loss_and_gradient(method):
    m = make_method(method)
    lt = tt([[-0.5, -1.0], [-2.0, -0.1]])
    b = make_batch(m, lt - 0.3, lt + 0.2, [1.0, -1.0], torch.zeros(2, 2, dtype=torch.bool))
    loss, grad, stats, metrics = run(m, lt, b)
    assert_finite(loss, grad, stats, metrics)
    assert loss.item() == 0.0 and (grad == 0).all()
    kept = m.kept_tokens(b, stats, lt)
    out = mismatch_metrics(lt - 0.3, lt + 0.2, b.mask, kept=kept)
    assert all(math.isfinite(v) for v in out.values())


def extreme(direction: float, b_rows: int = 4, t: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """(lold, lmu) with lold - lmu = 12 * direction on every token, both valid log-probs (p = 0.61 against ~0)."""
    near, far = torch.full((b_rows, t), -0.5, dtype=D), torch.full((b_rows, t), -12.5, dtype=D)
    return (near, far) if direction > 0 else (far, near)


#: advantages of the every-token-dropped cases (negative ones let the arms that only drop A < 0 tokens, opsm and
#: dppo_tv, drop them all)
ADVANTAGES = {"mixed": [1.0, -1.0, 0.5, -0.5], "negative": [-1.0, -1.0, -0.5, -0.5]}


def dropped_case(method: str, direction: float, adv: list[float]):
    """The method on the extreme batch: (method, lold, lmu, batch, the tokens it keeps)."""
    m = make_method(method)
    lold, lmu = extreme(direction)
    b = make_batch(m, lold, lmu, adv, torch.ones_like(lold, dtype=torch.bool))
    return m, lold, lmu, b, m.kept_tokens(b, m.prepare(b), lold)


@pytest.mark.parametrize("adv", list(ADVANTAGES.values()), ids=list(ADVANTAGES))
@pytest.mark.parametrize("direction", [1.0, -1.0])
@pytest.mark.parametrize("method", METHOD_NAMES)
def test_every_token_dropped_leaves_the_zero_advantage_loss(method, direction, adv):
    m, lold, lmu, b, _ = dropped_case(method, direction, adv)
    mask = b.mask
    loss, grad, stats, metrics = run(m, lold, b)
    assert_finite(loss, grad, stats, metrics)
    kept = m.kept_tokens(b, stats, lold)
    out = mismatch_metrics(lold, lmu, mask, kept=kept)
    assert all(math.isfinite(v) for v in out.values())
    if kept is not None and not kept.any():
        zero_loss, zero_grad, _, _ = run(m, lold, make_batch(m, lold, lmu, [0.0] * 4, mask))
        torch.testing.assert_close(loss, zero_loss, atol=1e-12, rtol=0)
        torch.testing.assert_close(grad, zero_grad, atol=1e-12, rtol=0)
        if not type(m).regularizes_dropped:
            assert loss.item() == 0.0 and (grad == 0).all()
        assert out["mismatch/kl_k3_unmasked"] == 0.0 and out["mismatch/kl_k3_masked"] == pytest.approx(
            out["mismatch/kl_k3"])


def test_the_dropped_everything_case_is_not_vacuous():
    """Most registered arms drop every token of the extreme batch in one direction, so the test above checks the
    dropped-everything branch for them (computed here, not collected from that test's runs: under pytest-xdist its
    cases may run in another process)."""
    dropped = set()
    for method in METHOD_NAMES:
        for direction in (1.0, -1.0):
            for adv in ADVANTAGES.values():
                kept = dropped_case(method, direction, adv)[-1]
                if kept is not None and not kept.any():
                    dropped.add(method)
    assert len(dropped) >= 11, dropped
    assert any(METHODS.get(a).regularizes_dropped for a in dropped)  # dppo_tv's (log r)^2 branch ran too


# ------------------------------------------------------------------------------------ the group baseline
def rebaseline_with(m, b: Batch, stats: dict, baseline: str) -> torch.Tensor:
    algo = AlgoConfig(baseline=baseline, norm_adv_by_std=False)
    parts = SimpleNamespace(method=m, cfg=SimpleNamespace(algo=algo), advantage=GRPOAdvantage(algo, SimpleNamespace(group_size=4)))
    return rebaseline(parts, None, tt([1.0, 1.0, 0.0, 0.0]), b, stats).adv


def row_1_case(method: str):
    """The method on a batch whose row 1 only has pi_old/mu = e^-12 on each token (mu sampled what pi_old almost
    never would): (method, batch, stats, the rows it rejects)."""
    m = make_method(method)
    lold = torch.full((4, 3), -0.5, dtype=D)
    lmu = lold.clone()
    lold[1] = -12.5
    mask = torch.ones_like(lold, dtype=torch.bool)
    b = make_batch(m, lold, lmu, group_advantages(tt([1.0, 1.0, 0.0, 0.0]), 4, norm_by_std=False), mask)
    stats = m.prepare(b)
    return m, b, stats, m.rejected_rows(b, stats)


@pytest.mark.parametrize("method", METHOD_NAMES)
def test_a_dropped_response_leaves_the_group_baseline_under_baseline_kept(method):
    m, b, stats, rejected = row_1_case(method)
    assert rejected is None or rejected.tolist() in ([False] * 4, [False, True, False, False])
    torch.testing.assert_close(rebaseline_with(m, b, stats, "all"), tt([0.5, 0.5, -0.5, -0.5]))  # the default
    kept = rebaseline_with(m, b, stats, "kept")
    if rejected is not None and bool(rejected[1]):
        torch.testing.assert_close(kept, tt([2 / 3, 0.0, -1 / 3, -1 / 3]))
    else:
        torch.testing.assert_close(kept, tt([0.5, 0.5, -0.5, -0.5]))


def test_the_dropped_response_case_is_not_vacuous():
    """Most rejection arms drop row 1 in the test above, so its re-baselined branch is checked."""
    rejected = {method: row_1_case(method)[-1] for method in METHOD_NAMES}
    rebased = [method for method, rows in rejected.items() if rows is not None and bool(rows[1])]
    assert len(rebased) >= 6, rebased


def test_baseline_kept_by_hand():
    r, keep = tt([1.0, 1.0, 0.0, 0.0]), torch.tensor([True, False, True, True])
    torch.testing.assert_close(group_advantages(r, 4, norm_by_std=False, keep=keep), tt([2 / 3, 0.0, -1 / 3, -1 / 3]))
    # with std: the kept rewards [1, 0, 0] have mean 1/3 and Bessel std sqrt(1/3)
    torch.testing.assert_close(group_advantages(r, 4, keep=keep), tt([1.154699, 0.0, -0.577350, -0.577350]), atol=1e-5,
                               rtol=0)
    # fewer than 2 kept responses, or kept ones all equal: no baseline, advantage 0 (as for group_size 1)
    assert (group_advantages(r, 4, keep=torch.tensor([True, False, False, False])) == 0).all()
    assert (group_advantages(r, 4, keep=torch.tensor([True, True, False, False])) == 0).all()
    assert (group_advantages(r, 4, keep=torch.ones(4, dtype=torch.bool)) == group_advantages(r, 4)).all()


# ------------------------------------------------------------------------------------ padding, -inf, empty rows
def base_case(m):
    """2 responses x 3 valid tokens with mixed ratios (rho in 0.5 .. 1.6) and a drifted theta."""
    lold = tt([[-0.7, -1.2, -0.2], [-2.0, -0.4, -0.9]])
    lmu = lold + tt([[0.3, -0.2, 0.05], [-0.4, 0.1, 0.7]])
    lt = lold + tt([[0.1, -0.05, 0.2], [0.0, 0.15, -0.1]])
    return lt, lold, lmu, [1.0, -0.7]


def padded(x: torch.Tensor, fill: float, extra_rows: int = 1, extra_cols: int = 2) -> torch.Tensor:
    out = torch.full((x.shape[0] + extra_rows, x.shape[1] + extra_cols), fill, dtype=x.dtype)
    out[: x.shape[0], : x.shape[1]] = x
    return out


@pytest.mark.parametrize("fill", [NEG_INF, NAN, 0.0])
@pytest.mark.parametrize("method", METHOD_NAMES)
def test_padding_and_an_empty_response_change_nothing(method, fill):
    m = make_method(method)
    lt, lold, lmu, adv = base_case(m)
    ref_loss, ref_grad, _, _ = run(m, lt, make_batch(m, lold, lmu, adv, torch.ones(2, 3, dtype=torch.bool)))
    mask = padded(torch.ones(2, 3, dtype=D), 0.0).bool()  # 2 more positions per row and a 3rd, empty response
    b = make_batch(m, padded(lold, fill), padded(lmu, fill), adv + [3.0], mask)
    loss, grad, stats, metrics = run(m, padded(lt, fill), b)
    assert_finite(loss, grad, stats, metrics)
    torch.testing.assert_close(loss, ref_loss, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(grad[:2, :3], ref_grad, atol=1e-12, rtol=1e-12)
    assert (grad[~mask] == 0).all()
    out = mismatch_metrics(padded(lold, fill), padded(lmu, fill), mask, kept=m.kept_tokens(b, stats, padded(lt, fill)))
    assert all(math.isfinite(v) for v in out.values())


@pytest.mark.parametrize("method", METHOD_NAMES)
def test_a_valid_token_with_a_minus_inf_logprob_leaves_the_mask(method):
    """The trainer's sanitize drops it (counted in mismatch/frac_nonfinite_logprob): the loss is that of the batch
    without the token."""
    m = make_method(method)
    lt, lold, lmu, adv = base_case(m)
    lmu_bad = lmu.clone()
    lmu_bad[1, 1] = NEG_INF  # the engine returned -inf for a token it sampled
    mask, frac = sanitize(lold if m.needs_recompute else None, lmu_bad, torch.ones(2, 3, dtype=torch.bool))
    assert frac == pytest.approx(1 / 6) and not mask[1, 1]
    loss, grad, stats, metrics = run(m, lt, make_batch(m, lold, lmu_bad, adv, mask))
    assert_finite(loss, grad, stats, metrics)
    lmu_ok = lmu.clone()
    lmu_ok[1, 1] = 123.0  # any finite value under a False mask: the same batch without the token
    ref_loss, ref_grad, _, _ = run(m, lt, make_batch(m, lold, lmu_ok, adv, mask))
    torch.testing.assert_close(loss, ref_loss, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(grad, ref_grad, atol=1e-12, rtol=1e-12)
    assert grad[1, 1] == 0


# ------------------------------------------------------------------------------------ sum vs mean
@pytest.mark.parametrize("method", METHOD_NAMES)
def test_the_documented_sequence_aggregation(method):
    """Duplicating every token of every response (same per-token log-ratios, twice the length) leaves the loss of a
    token-, mean- or max-aggregating arm unchanged and changes a sum (product-ratio) arm's: with 0.05 nats per
    token the product ratio goes from e^0.15 = 1.16 to e^0.3 = 1.35 (both inside Seq-MIS's [0.5, 2])."""
    m = make_method(method)
    agg = m.sequence_aggregation()
    assert agg in ("token", "sum", "mean", "max")
    lold = tt([[-0.7, -1.2, -0.2], [-0.3, -0.9, -1.5]])
    lmu = lold - tt([[0.05] * 3, [-0.05] * 3])
    adv = [1.0, -1.0]

    def loss_of(k: int) -> torch.Tensor:
        lo, lm = lold.repeat_interleave(k, dim=1), lmu.repeat_interleave(k, dim=1)
        return run(m, lo, make_batch(m, lo, lm, adv, torch.ones_like(lo, dtype=torch.bool)))[0]

    once, twice = loss_of(1), loss_of(2)
    if agg == "sum":
        assert abs((twice - once).item()) > 1e-3
    else:
        torch.testing.assert_close(twice, once, atol=1e-8, rtol=0)  # ess: its ESS has a 1e-8 in a denominator
