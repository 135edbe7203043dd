"""PPO / GAE math (bench/gae.py). Every expected number is worked out by hand in the comments."""

import math

import pytest
import torch

from bench.gae import (
    clipped_value_loss,
    discounted_returns,
    gae_advantages_returns,
    gae_from_outcome,
    masked_whiten,
    outcome_token_rewards,
)

D = torch.float64


def t(x):
    return torch.tensor(x, dtype=D)


def m(x):
    return torch.tensor(x, dtype=torch.bool)


def close(a, b, atol=1e-9):
    torch.testing.assert_close(a, t(b) if not isinstance(b, torch.Tensor) else b, atol=atol, rtol=0)


# ---------------------------------------------------------------- outcome rewards


def test_outcome_reward_goes_on_last_valid_token():
    # row 0: 3 valid tokens -> score on t=2; row 1: 2 valid + pad -> t=1; row 2: no valid token -> dropped
    r = outcome_token_rewards(t([1.0, -1.0, 5.0]), m([[1, 1, 1], [1, 1, 0], [0, 0, 0]]))
    close(r, [[0.0, 0.0, 1.0], [0.0, -1.0, 0.0], [0.0, 0.0, 0.0]])


def test_outcome_reward_with_a_hole_uses_last_valid_token():
    # mask [1, 0, 1, 0]: the last valid token is t=2
    close(outcome_token_rewards(t([2.0]), m([[1, 0, 1, 0]])), [[0.0, 0.0, 2.0, 0.0]])


# ---------------------------------------------------------------- returns

REW = [[0.0, 0.0, 1.0]]
VAL = [[0.5, 0.6, 0.7]]
FULL = [[1, 1, 1]]


def test_discounted_returns_gamma_one_and_point_nine():
    # gamma=1: G = [1, 1, 1]
    close(discounted_returns(t(REW), m(FULL), 1.0), [[1.0, 1.0, 1.0]])
    # gamma=0.9: G_2 = 1, G_1 = 0.9*1 = 0.9, G_0 = 0.9*0.9 = 0.81
    close(discounted_returns(t(REW), m(FULL), 0.9), [[0.81, 0.9, 1.0]])


def test_discounted_returns_skip_padding_and_holes():
    # mask [1, 0, 1]: the masked reward 5 is ignored and no discount is applied at t=1:
    # G_2 = 1, G_0 = 0 + 0.9 * G_2 = 0.9, G_1 = 0 (masked)
    close(discounted_returns(t([[0.0, 5.0, 1.0]]), m([[1, 0, 1]]), 0.9), [[0.9, 0.0, 1.0]])
    # right padding with garbage reward: [0, 1, pad=inf] -> G = [0.9, 1, 0]
    close(discounted_returns(t([[0.0, 1.0, math.inf]]), m([[1, 1, 0]]), 0.9), [[0.9, 1.0, 0.0]])


# ---------------------------------------------------------------- GAE


def test_gae_gamma1_lambda1():
    # delta_2 = 1 + 1*0 - 0.7 = 0.3          (V after the last token = 0)
    # delta_1 = 0 + 1*0.7 - 0.6 = 0.1
    # delta_0 = 0 + 1*0.6 - 0.5 = 0.1
    # A_2 = 0.3; A_1 = 0.1 + 0.3 = 0.4; A_0 = 0.1 + 0.4 = 0.5
    # R = A + V = [1.0, 1.0, 1.0]  (= the Monte-Carlo return with gamma=1)
    adv, ret = gae_advantages_returns(t(REW), t(VAL), m(FULL), 1.0, 1.0)
    close(adv, [[0.5, 0.4, 0.3]])
    close(ret, [[1.0, 1.0, 1.0]])


def test_gae_gamma_0_9_lambda_0_95():
    # gamma*lambda = 0.855
    # delta_2 = 1 + 0.9*0   - 0.7 = 0.3
    # delta_1 = 0 + 0.9*0.7 - 0.6 = 0.63 - 0.6 = 0.03
    # delta_0 = 0 + 0.9*0.6 - 0.5 = 0.54 - 0.5 = 0.04
    # A_2 = 0.3
    # A_1 = 0.03 + 0.855*0.3    = 0.03 + 0.2565    = 0.2865
    # A_0 = 0.04 + 0.855*0.2865 = 0.04 + 0.2449575 = 0.2849575
    # R = A + V = [0.7849575, 0.8865, 1.0]
    adv, ret = gae_advantages_returns(t(REW), t(VAL), m(FULL), 0.9, 0.95)
    close(adv, [[0.2849575, 0.2865, 0.3]])
    close(ret, [[0.7849575, 0.8865, 1.0]])


def test_gae_lambda_zero_is_td_error():
    # lambda=0: A_t = delta_t = [0.04, 0.03, 0.3] for gamma=0.9 (deltas above)
    adv, _ = gae_advantages_returns(t(REW), t(VAL), m(FULL), 0.9, 0.0)
    close(adv, [[0.04, 0.03, 0.3]])


def test_gae_lambda_one_returns_equal_discounted_returns():
    # lambda=1 telescopes: A_t = G_t - V_t, so R = G = [0.81, 0.9, 1.0] for gamma=0.9
    _, ret = gae_advantages_returns(t(REW), t(VAL), m(FULL), 0.9, 1.0)
    close(ret, [[0.81, 0.9, 1.0]])


def test_gae_ignores_padding_even_with_garbage():
    # row 0 is the 3-token example (gamma=lambda=1). Row 1: 2 valid tokens, reward 1 on t=1, V=[0.5, 0.6],
    # padding holds garbage V=NaN and r=inf. delta_1 = 1 - 0.6 = 0.4, delta_0 = 0.6 - 0.5 = 0.1,
    # A = [0.5, 0.4, 0], R = [1.0, 1.0, 0]
    rew = t([[0.0, 0.0, 1.0], [0.0, 1.0, math.inf]])
    val = t([[0.5, 0.6, 0.7], [0.5, 0.6, math.nan]])
    adv, ret = gae_advantages_returns(rew, val, m([[1, 1, 1], [1, 1, 0]]), 1.0, 1.0)
    close(adv, [[0.5, 0.4, 0.3], [0.5, 0.4, 0.0]])
    close(ret, [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def test_gae_skips_a_hole_in_the_mask():
    # mask [1, 0, 1] (e.g. a tool observation at t=1): the valid sequence is t=0 then t=2.
    # gamma=0.9, lambda=1, V_0=0.5, V_2=0.7 (V_1=42 and r_1=5 are ignored):
    # delta_2 = 1 - 0.7 = 0.3; delta_0 = 0 + 0.9*0.7 - 0.5 = 0.13
    # A_2 = 0.3; A_0 = 0.13 + 0.9*0.3 = 0.4; A_1 = 0
    adv, ret = gae_advantages_returns(t([[0.0, 5.0, 1.0]]), t([[0.5, 42.0, 0.7]]), m([[1, 0, 1]]), 0.9, 1.0)
    close(adv, [[0.4, 0.0, 0.3]])
    close(ret, [[0.9, 0.0, 1.0]])


def test_gae_outputs_are_constants():
    vals = t(VAL).requires_grad_()
    adv, ret = gae_advantages_returns(t(REW), vals, m(FULL), 1.0, 1.0)
    assert not adv.requires_grad and not ret.requires_grad


# ---------------------------------------------------------------- whitening


def test_masked_whiten_known_vector_and_padding():
    # x = [1, 2, 3, 4] (+ masked pad 100): mean 2.5, deviations [-1.5, -0.5, 0.5, 1.5],
    # sum of squares 2.25 + 0.25 + 0.25 + 2.25 = 5, Bessel variance 5/3, std sqrt(5/3) = 1.2909944
    # whitened = [-1.5, -0.5, 0.5, 1.5] / 1.2909944 = [-1.1618950, -0.3872983, 0.3872983, 1.1618950]
    x = t([[1.0, 2.0, 3.0], [4.0, 100.0, math.nan]])
    mask = m([[1, 1, 1], [1, 0, 0]])
    out = masked_whiten(x, mask)
    close(out, [[-1.1618950, -0.3872983, 0.3872983], [1.1618950, 0.0, 0.0]], atol=1e-6)
    # shift_mean=False adds the mean back: + 2.5
    out = masked_whiten(x, mask, shift_mean=False)
    close(out, [[1.3381050, 2.1127017, 2.8872983], [3.6618950, 0.0, 0.0]], atol=1e-6)


def test_masked_whiten_degenerate():
    # all masked -> zeros; a single valid entry -> x - mean = 0 (with a warning)
    close(masked_whiten(t([[3.0, 4.0]]), m([[0, 0]])), [[0.0, 0.0]])
    with pytest.warns(UserWarning):
        close(masked_whiten(t([[3.0, 4.0]]), m([[1, 0]])), [[0.0, 0.0]])
    # constant advantages: variance 0 -> (x - mean) * rsqrt(1e-8) = 0
    close(masked_whiten(t([[2.0, 2.0]]), m([[1, 1]])), [[0.0, 0.0]])


def test_gae_from_outcome_whitens_advantages_not_returns():
    # one response, scores [1], values [0.5, 0.6, 0.7], gamma=lambda=1:
    # raw A = [0.5, 0.4, 0.3] (above), mean 0.4, deviations [0.1, 0, -0.1], Bessel var (0.01+0+0.01)/2 = 0.01,
    # std 0.1 -> whitened A = [1, 0, -1] (the 1e-8 changes it by < 1e-6); returns stay [1, 1, 1]
    adv, ret = gae_from_outcome(t([1.0]), t(VAL), m(FULL))
    close(adv, [[1.0, 0.0, -1.0]], atol=1e-6)
    close(ret, [[1.0, 1.0, 1.0]])


# ---------------------------------------------------------------- clipped value loss


def _vloss(vpred, ret, old, mask, c, **kw):
    v = t(vpred).requires_grad_()
    loss, frac = clipped_value_loss(v, t(ret), t(old), m(mask), c, **kw)
    loss.backward()
    return loss.item(), frac, v.grad


def test_value_loss_clipping_inactive_inside_range():
    # old V = 0.5, R = 1.0, c = 0.2 -> allowed range [0.3, 0.7]; V = 0.6 is inside:
    # clipped V = 0.6, both errors (0.6 - 1.0)^2 = 0.16, loss = 0.5 * 0.16 = 0.08
    # d loss / dV = 0.5 * 2 * (0.6 - 1.0) = -0.4
    loss, frac, g = _vloss([[0.6]], [[1.0]], [[0.5]], [[1]], 0.2)
    assert loss == pytest.approx(0.08) and frac == 0.0
    close(g, [[-0.4]])


def test_value_loss_clipping_active_toward_the_target():
    # V = 0.9 moved past old+c = 0.7 toward R = 1.0: unclipped (0.9-1)^2 = 0.01, clipped (0.7-1)^2 = 0.09,
    # max = 0.09 -> loss 0.045, and the clipped branch is constant in V -> gradient 0
    loss, frac, g = _vloss([[0.9]], [[1.0]], [[0.5]], [[1]], 0.2)
    assert loss == pytest.approx(0.045) and frac == 1.0
    close(g, [[0.0]])


def test_value_loss_moving_away_from_target_is_not_clipped():
    # V = 0.1 is below old-c = 0.3, away from R = 1.0: unclipped (0.1-1)^2 = 0.81 > clipped (0.3-1)^2 = 0.49,
    # max = 0.81 -> loss 0.405, gradient 0.5 * 2 * (0.1 - 1.0) = -0.9
    loss, frac, g = _vloss([[0.1]], [[1.0]], [[0.5]], [[1]], 0.2)
    assert loss == pytest.approx(0.405) and frac == 0.0
    close(g, [[-0.9]])


def test_value_loss_token_mean_over_batch_with_padding():
    # tokens: (V=0.6 | 0.08, grad -0.4), (V=0.9 | 0.045 clipped, grad 0), (V=0.1 | 0.405, grad -0.9),
    # plus one padded token with garbage. 0.5*max(...) per token = [0.08, 0.045, 0.405], token-mean
    # = (0.08 + 0.045 + 0.405) / 3 = 0.53 / 3 = 0.1766667; gradients are the per-token ones / 3;
    # clipfrac = 1/3.
    v = t([[0.6, 0.9], [0.1, math.nan]]).requires_grad_()
    loss, frac = clipped_value_loss(
        v, t([[1.0, 1.0], [1.0, math.inf]]), t([[0.5, 0.5], [0.5, math.nan]]), m([[1, 1], [1, 0]]), 0.2
    )
    loss.backward()
    assert loss.item() == pytest.approx(0.53 / 3) and frac == pytest.approx(1 / 3)
    close(v.grad, [[-0.4 / 3, 0.0], [-0.9 / 3, 0.0]])


def test_value_loss_without_clipping():
    # clip_range=None: plain 0.5 * (V - R)^2; V = 0.9: 0.5 * 0.01 = 0.005, grad 0.5 * 2 * (-0.1) = -0.1
    loss, frac, g = _vloss([[0.9]], [[1.0]], [[0.5]], [[1]], None)
    assert loss == pytest.approx(0.005) and frac == 0.0
    close(g, [[-0.1]])


def test_value_loss_all_masked_is_zero():
    loss, frac, g = _vloss([[0.9]], [[1.0]], [[0.5]], [[0]], 0.2)
    assert loss == 0.0 and frac == 0.0
    close(g, [[0.0]])


def test_shape_mismatch_raises():
    with pytest.raises(ValueError):
        gae_advantages_returns(t(REW), t([[0.5, 0.6]]), m(FULL), 1.0, 1.0)
