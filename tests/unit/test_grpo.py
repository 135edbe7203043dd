"""GRPO core (docs/arms.md §2, tests G1-G4) plus the masking / k3 / log-ratio helpers."""

import math

import pytest
import torch

from bench.grpo import (
    agg_loss,
    clip_mask,
    clipped_surrogate,
    group_advantages,
    k3_kl,
    safe_log_ratio,
)

D = torch.float64


def t(x):
    return torch.tensor(x, dtype=D)


def test_g1_std_normalized_advantages():
    adv = group_advantages(t([1.0, 0.0, 0.0, 1.0]), group_size=4, eps=1e-6)
    torch.testing.assert_close(adv, t([0.866024, -0.866024, -0.866024, 0.866024]), atol=1e-5, rtol=0)


def test_g2_all_equal_exactly_zero_and_single_winner():
    assert torch.equal(group_advantages(t([1.0, 1.0, 1.0, 1.0]), 4), torch.zeros(4, dtype=D))
    # non-binary equal rewards: the mean subtraction alone would leave ~1e-11
    assert torch.equal(group_advantages(t([0.1, 0.1, 0.1, 0.7, 0.7, 0.7]), 3), torch.zeros(6, dtype=D))
    torch.testing.assert_close(
        group_advantages(t([1.0, 0.0, 0.0, 0.0]), 4), t([1.499997, -0.499999, -0.499999, -0.499999]), atol=1e-5, rtol=0
    )
    torch.testing.assert_close(
        group_advantages(t([1.0, 0.0, 0.0, 0.0]), 4, norm_by_std=False), t([0.75, -0.25, -0.25, -0.25]), atol=1e-12, rtol=0
    )


def test_advantages_are_per_group_and_keep_dtype():
    r = torch.tensor([1.0, 0.0, 3.0, 3.0], dtype=torch.float32)
    adv = group_advantages(r, 2)
    assert adv.dtype == torch.float32
    assert adv[2:].eq(0).all() and adv[0] > 0 > adv[1]
    assert group_advantages(torch.tensor([1, 0]), 2).dtype == torch.float32


def test_advantages_singleton_group_warns_and_bad_shape_raises():
    with pytest.warns(UserWarning):
        assert torch.equal(group_advantages(t([3.0, 1.0]), 1), torch.zeros(2, dtype=D))
    with pytest.raises(ValueError):
        group_advantages(t([1.0, 0.0, 1.0]), 2)


L = [[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]]
M = [[True, True, True], [True, False, False]]


@pytest.mark.parametrize(
    "mode,expected",
    [("token-mean", 2.5), ("seq-mean-token-mean", 3.0), ("seq-mean-token-sum-norm", 10.0 / 6.0)],
)
def test_g3_aggregation(mode, expected):
    assert agg_loss(t(L), torch.tensor(M), mode).item() == pytest.approx(expected, abs=1e-9)


def test_g3_step_denominator_and_t_max():
    # token-mean over a minibatch of a larger optimizer step divides by the step's token count
    assert agg_loss(t(L), torch.tensor(M), "token-mean", n_tokens=8).item() == pytest.approx(10.0 / 8)
    assert agg_loss(t(L), torch.tensor(M), "seq-mean-token-sum-norm", t_max=5).item() == pytest.approx(1.0)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_g3_all_zero_mask_is_zero_without_nan(mode):
    per_tok = t([[math.inf, math.nan], [-math.inf, 1.0]]).requires_grad_()
    mask = torch.zeros(2, 2, dtype=torch.bool)
    out = agg_loss(per_tok, mask, mode)
    out.backward()
    assert out.item() == 0.0
    assert torch.equal(per_tok.grad, torch.zeros(2, 2, dtype=D))


def test_agg_unknown_mode():
    with pytest.raises(ValueError, match="token-mean"):
        agg_loss(t(L), torch.tensor(M), "sum")


def _psi_and_grad(r, a, el=0.2, eh=0.2, c=None):
    lt = torch.log(t(r)).requires_grad_()
    psi = clipped_surrogate(torch.exp(lt), t(a), el, eh, c)
    psi.sum().backward()
    return psi.detach(), lt.grad


def test_g4_clipped_surrogate_positive_advantage():
    psi, g = _psi_and_grad([0.5, 1.0, 1.1, 1.5], [1.0] * 4)
    torch.testing.assert_close(psi, t([-0.5, -1.0, -1.1, -1.2]), atol=1e-12, rtol=0)
    torch.testing.assert_close(g, t([-0.5, -1.0, -1.1, 0.0]), atol=1e-12, rtol=0)


def test_g4_clipped_surrogate_negative_advantage():
    psi, g = _psi_and_grad([0.5, 1.0, 1.1, 1.5], [-1.0] * 4)
    torch.testing.assert_close(psi, t([0.8, 1.0, 1.1, 1.5]), atol=1e-12, rtol=0)
    torch.testing.assert_close(g, t([0.0, 1.0, 1.1, 1.5]), atol=1e-12, rtol=0)


def test_g4_clip_higher():
    psi, g = _psi_and_grad([1.5], [1.0], el=0.2, eh=0.28)
    assert psi.item() == pytest.approx(-1.28) and g.item() == 0.0


def test_clip_mask_matches_zero_gradient_branch():
    r, a = [0.5, 1.0, 1.1, 1.5, 0.5, 1.5, 4.0], [1.0, 1.0, 1.0, 1.0, -1.0, -1.0, -1.0]
    _, g = _psi_and_grad(r, a, c=3.0)
    clipped = clip_mask(t(r), t(a), 0.8, 1.2, dual_clip_c=3.0)
    assert clipped.tolist() == [False, False, False, True, True, False, True]
    assert torch.equal(g == 0, clipped)


def test_dual_clip_bounds_negative_advantage_loss():
    psi, g = _psi_and_grad([4.0, 2.0], [-1.0, -1.0], c=3.0)
    torch.testing.assert_close(psi, t([3.0, 2.0]), atol=1e-12, rtol=0)
    torch.testing.assert_close(g, t([0.0, 2.0]), atol=1e-12, rtol=0)


def test_k3_kl_values_and_clamps():
    lt, lref = torch.log(t([0.5, 0.5])), torch.log(t([0.25, 0.5]))
    d = math.log(0.5)
    torch.testing.assert_close(k3_kl(lt, lref), t([math.exp(d) - d - 1, 0.0]), atol=1e-12, rtol=0)
    # d = clamp(-99) = -20 gives exp(-20) + 19 > 10, clamped to 10; d = +20 gives e^20 - 21, clamped to 10
    assert k3_kl(t([-1.0]), t([-100.0])).item() == 10.0
    assert k3_kl(t([-100.0]), t([-1.0])).item() == 10.0


def test_safe_log_ratio_masks_and_clamps_without_nan_grads():
    a = t([-1.0, -1.0, -math.inf]).requires_grad_()
    b = t([-50.0, -0.5, -math.inf])
    mask = torch.tensor([True, True, False])
    x = safe_log_ratio(a, b, mask, 20.0)
    torch.testing.assert_close(x.detach(), t([20.0, -0.5, 0.0]), atol=0, rtol=0)
    torch.exp(x).sum().backward()
    torch.testing.assert_close(a.grad, t([0.0, math.exp(-0.5), 0.0]), atol=1e-12, rtol=0)
