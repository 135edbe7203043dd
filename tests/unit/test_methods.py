"""Numeric cases of docs/arms.md for every arm: N1-N3 (B1), T1-T5 (TIS), ACR1-ACR4, P1-P5 (P3O), AIS1-AIS4.

Loss values and autograd gradients w.r.t. ltheta as a leaf tensor, float64, atol 1e-6. Each response is one row;
"single token" cases are [1, 1] batches, token-mean with n_tokens = number of valid tokens.
"""

import math

import pytest
import torch

from bench.methods.base import Batch, make_method, select_stats

D = torch.float64
ATOL = 1e-6


def method(name: str, **kw):
    return make_method(name, **kw)


def tt(x):
    return torch.tensor(x, dtype=D)


def lg(x):
    return torch.log(tt(x))


def batch(lold, lmu, adv, mask=None, n_tokens=None, lref=None):
    lmu = torch.as_tensor(lmu, dtype=D)
    mask = torch.ones_like(lmu, dtype=torch.bool) if mask is None else torch.as_tensor(mask, dtype=torch.bool)
    n = float(mask.sum()) if n_tokens is None else n_tokens
    return Batch(logp_old=lold, logp_mu=lmu, adv=tt(adv), mask=mask, n_tokens=max(1.0, n), logp_ref=lref)


def run(m, logp, b):
    """prepare + loss + backward; returns (loss, grad, stats, metrics)."""
    lt = logp.clone().detach().requires_grad_(True)
    stats = m.prepare(b)
    loss, metrics = m.loss(lt, b, stats)
    loss.backward()
    return loss.item(), lt.grad, stats, metrics


def close(a, b, atol=ATOL):
    torch.testing.assert_close(torch.as_tensor(a, dtype=D), torch.as_tensor(b, dtype=D), atol=atol, rtol=0)


def assert_detached(stats):
    for v in stats.values():
        assert not (isinstance(v, torch.Tensor) and v.requires_grad)


# ---------------------------------------------------------------- B1 (N1-N3)
N_LOLD = lg([[0.5], [0.2]])
N_LMU = lg([[0.25], [0.4]])


@pytest.mark.parametrize("name", ["bf16", "naive"])
def test_n1_recompute_form_ignores_mu(name):
    loss, g, _, met = run(method(name), N_LOLD, batch(N_LOLD, N_LMU, [1.0, -1.0]))
    close(loss, 0.0)
    close(g, [[-0.5], [0.5]])
    assert met["clipfrac"] == 0.0 and met["ppo_kl"] == 0.0


def test_n2_bypass_form_clips_before_any_update():
    m = method("naive_ppo_is")
    assert m.needs_recompute is False
    loss, g, _, met = run(m, N_LOLD, batch(None, N_LMU, [1.0, -1.0]))
    close(loss, -0.2)
    close(g, [[0.0], [0.0]])
    assert met["clipfrac"] == 1.0
    close(met["ppo_kl"], ((math.log(0.25) - math.log(0.5)) + (math.log(0.4) - math.log(0.2))) / 2)


def test_n3_bypass_negative_advantage_is_unbounded():
    loss, g, _, met = run(method("naive_ppo_is"), lg([[0.4]]), batch(None, lg([[0.1]]), [-1.0]))
    close(loss, 4.0)
    close(g, [[4.0]])
    assert met["clipfrac"] == 0.0


# ---------------------------------------------------------------- M1 TIS (T1-T5)
T_LOLD = lg([[0.5, 0.2, 0.9]])
T_LMU = lg([[0.25, 0.4, 0.9]])
TIS_KEYS = {"is_mean", "is_max", "is_min", "is_std", "is_frac_high", "is_frac_low", "is_ess"}


def test_t1_token_tis():
    loss, g, stats, met = run(method("tis"), T_LOLD, batch(T_LOLD, T_LMU, [1.0]))
    close(stats["is_weights"], [[2.0, 0.5, 1.0]])
    close(loss, -1.166667)
    close(g, [[-0.666667, -0.166667, -0.333333]])
    assert TIS_KEYS <= set(stats) and {"clipfrac", "ppo_kl"} <= set(met)
    close(stats["is_mean"], 3.5 / 3)
    close(stats["is_ess"], 3.5**2 / (3 * 5.25))
    assert stats["is_frac_high"] == 0.0 and stats["is_frac_low"] == 0.0
    assert_detached(stats)


def test_t2_smaller_cap():
    loss, g, stats, _ = run(method("tis", is_cap_C=1.5), T_LOLD, batch(T_LOLD, T_LMU, [1.0]))
    close(stats["is_weights"], [[1.5, 0.5, 1.0]])
    close(loss, -1.0)
    close(g, [[-0.5, -0.166667, -0.333333]])
    close(stats["is_frac_high"], 1 / 3)


def test_t3_weight_does_not_unclip():
    lold, lmu = lg([[0.5]]), lg([[0.1]])
    loss, g, _, met = run(method("tis"), lold + math.log(1.3), batch(lold, lmu, [1.0]))
    close(loss, -2.4)
    close(g, [[0.0]])
    assert met["clipfrac"] == 1.0


def test_t4_clamped_log_ratio_and_padding():
    lold = tt([[-1.0, -math.inf]])
    lmu = tt([[-50.0, -math.inf]])
    b = batch(lold, lmu, [1.0], mask=[[True, False]])
    loss, g, stats, _ = run(method("tis"), tt([[-1.0, -math.inf]]), b)
    assert stats["is_weights"].tolist() == [[2.0, 0.0]]
    close(loss, -2.0)
    assert torch.isfinite(g).all()
    close(g, [[-2.0, 0.0]])


def test_t5_sequence_tis():
    loss, g, stats, _ = run(method("tis", is_level="sequence"), T_LOLD, batch(T_LOLD, T_LMU, [1.0]))
    close(stats["is_weights"], [[1.0, 1.0, 1.0]])
    close(loss, -1.0)
    close(g, [[-1 / 3] * 3])
    assert stats["seq_mean"] == pytest.approx(1.0) and {"seq_max", "seq_min", "seq_std"} <= set(stats)


def test_sequence_tis_truncates_the_sequence_ratio():
    lold, lmu = lg([[0.5, 0.5], [0.5, 0.5]]), lg([[0.25, 0.25], [0.5, 0.25]])  # seq rho = 4, 2
    _, _, stats, _ = run(method("tis", is_level="sequence", is_cap_C=3.0), lold, batch(lold, lmu, [1.0, 1.0]))
    close(stats["is_weights"], [[3.0, 3.0], [2.0, 2.0]])
    close(stats["seq_max"], 3.0)


def test_masked_is():
    _, _, stats, _ = run(method("tis", is_mode="mask", is_cap_C=1.5), T_LOLD, batch(T_LOLD, T_LMU, [1.0]))
    close(stats["is_weights"], [[0.0, 0.5, 1.0]])
    loss, _, stats, _ = run(
        method("tis", is_mode="mask", is_cap_C=1.5, is_cap_low=0.6), T_LOLD, batch(T_LOLD, T_LMU, [1.0])
    )
    close(stats["is_weights"], [[0.0, 0.0, 1.0]])
    close(loss, -1 / 3)


def test_tis_weights_are_detached_even_from_graph_inputs():
    lold = T_LOLD.clone().requires_grad_(True) * 1.0  # a non-leaf that carries grad
    stats = method("tis").prepare(batch(lold, T_LMU, [1.0]))
    assert_detached(stats)


def test_weights_computed_once_and_sliced_per_minibatch():
    lold = lg([[0.5, 0.2], [0.9, 0.3], [0.4, 0.4], [0.1, 0.6]])
    lmu = lg([[0.25, 0.4], [0.9, 0.1], [0.3, 0.5], [0.2, 0.6]])
    b = batch(lold, lmu, [1.0, -1.0, 0.5, -0.5])
    m = method("tis")
    stats = m.prepare(b)
    idx = torch.tensor([1, 3])
    sub = b.select(idx)
    lt = lold[idx].clone().requires_grad_(True)
    loss, _ = m.loss(lt, sub, select_stats(stats, idx, b.size))
    w = stats["is_weights"][idx]
    close(loss.item(), float(-(w * sub.adv[:, None]).sum() / 4))


# ---------------------------------------------------------------- M2 ACR (ACR1-ACR4)
def acr_case(rho, r, a, name="acr"):
    lold = lg([[0.4]])
    lmu = lold - math.log(rho)
    return run(method(name), lold + math.log(r), batch(lold, lmu, [a]))


def test_acr1_enlarged_upper_bound_keeps_gradient():
    loss, g, stats, met = acr_case(4.0, 2.0, 1.0)
    close(loss, -4.0)
    close(g, [[-4.0]])
    close(stats["acr_upper_mean"], 2.4)
    assert stats["frac_acr_active"] == 1.0 and stats["rho_max"] == pytest.approx(4.0)
    close(stats["kl_k1"], -math.log(4.0))
    assert met["clipfrac"] == 0.0
    tis_loss, tis_g, _, _ = run(method("tis"), lg([[0.4]]) + math.log(2.0), batch(lg([[0.4]]), lg([[0.1]]), [1.0]))
    close(tis_loss, -2.4)
    close(tis_g, [[0.0]])


def test_acr2_clipped_at_enlarged_bound():
    loss, g, _, met = acr_case(4.0, 3.0, 1.0)
    close(loss, -4.8)
    close(g, [[0.0]])
    assert met["clipfrac"] == met["clipfrac_pos"] == 1.0 and met["clipfrac_neg"] == 0.0


def test_acr3_below_cap_equals_tis():
    loss, g, stats, _ = acr_case(1.5, 1.3, 1.0)
    close(loss, -1.8)
    close(g, [[0.0]])
    assert stats["frac_acr_active"] == 0.0 and stats["acr_upper_mean"] == pytest.approx(1.2)


def test_acr4_negative_advantage_unchanged():
    loss, g, _, met = acr_case(4.0, 0.5, -1.0)
    close(loss, 1.6)
    close(g, [[0.0]])
    assert met["clipfrac_neg"] == 1.0
    loss, g, _, _ = acr_case(4.0, 1.0, 1.0)
    close(loss, -2.0)
    close(g, [[-2.0]])


def test_acr_metric_keys_and_detached():
    _, _, stats, met = acr_case(4.0, 2.0, 1.0, name="acr_uaq")
    assert {"frac_acr_active", "acr_upper_mean", "kl_k1", "rho_max"} | TIS_KEYS <= set(stats)
    assert {"clipfrac", "clipfrac_pos", "clipfrac_neg", "ppo_kl"} <= set(met)
    assert_detached(stats)


def test_acr_has_no_sequence_level_knob():
    # ACR is token-level truncated IS by definition (QuRL Eq. 9): its schema has no is_level to set
    with pytest.raises(ValueError, match="'acr' has no knob.*is_level"):
        method("acr", is_level="sequence")


# ---------------------------------------------------------------- M3 P3O (P1-P5)
ESS_KEYS = {"ess_factor", "kl_behavioral", "approx_kl", "pi_loss", "loss_total", "ent_mc", "kl_ref", "clipfrac", "ppo_kl"}


def test_p1_matched_data_is_reinforce():
    lt = lg([[0.5], [0.5], [0.25], [0.25]])
    m = method("ess")
    assert m.needs_recompute is False
    loss, g, _, met = run(m, lt, batch(None, lt, [1.0, 1.0, -1.0, -1.0]))
    assert set(met) == ESS_KEYS
    assert isinstance(met["ess_factor"], float)
    close(met["ess_factor"], 1.0)
    close(loss, -0.346574)
    close(g, [[-0.25], [-0.25], [0.25], [0.25]])
    close(met["kl_behavioral"], 0.0)


def test_p2_concentrated_ratios():
    lt, lmu = lg([[0.5], [0.25]]), lg([[0.25], [0.5]])
    loss, g, _, met = run(method("ess"), lt, batch(None, lmu, [1.0, 1.0]))
    close(met["ess_factor"], 0.735294)
    close(loss, 0.667584)
    close(g, [[-0.301471], [-0.382353]])
    close(met["kl_behavioral"], 0.25)
    close(met["pi_loss"], 1.202814 / 2)
    close(met["loss_total"], 0.667584)
    assert met["clipfrac"] == 1.0
    close(met["approx_kl"], ((2 - 1 - math.log(2)) + (0.5 - 1 + math.log(2))) / 2)


def test_p3_padding_changes_nothing():
    lt = tt([[math.log(0.5)], [math.log(0.25)], [-1e9]])
    lmu = tt([[math.log(0.25)], [math.log(0.5)], [0.0]])
    b = batch(None, lmu, [1.0, 1.0, 5.0], mask=[[True], [True], [False]])
    loss, g, _, met = run(method("ess"), lt, b)
    close(met["ess_factor"], 0.735294)
    close(loss, 0.667584)
    close(g, [[-0.301471], [-0.382353], [0.0]])


def test_p4_uniform_shift():
    loss, g, _, met = run(method("ess"), lg([[0.5], [0.5]]), batch(None, lg([[0.25], [0.25]]), [1.0, -1.0]))
    close(met["ess_factor"], 1.0)
    close(loss, 0.0)
    close(g, [[-0.5], [0.5]])


def test_p5_all_masked():
    lt = tt([[-1.0, -2.0], [-3.0, -math.inf]])
    lmu = tt([[-math.inf, -2.0], [-1.0, -math.inf]])
    loss, g, _, met = run(method("ess"), lt, batch(None, lmu, [1.0, -1.0], mask=[[False, False], [False, False]]))
    assert met["ess_factor"] == 1.0 and loss == 0.0
    assert torch.equal(g, torch.zeros_like(g))
    assert all(math.isfinite(v) for v in met.values())


def test_p3o_kl_exp_clamp_follows_autograd():
    # |lmu - ltheta| = 12 > 10: the clamp is active and the KL term's gradient is (1 - ESS) * 1
    lt, lmu = tt([[-1.0], [-1.0]]), tt([[-13.0], [-1.0]])
    loss, g, _, met = run(method("ess"), lt, batch(None, lmu, [0.0, 0.0]))
    ess = met["ess_factor"]
    w = math.exp(12.0)
    close(ess, (w + 1) ** 2 / (w * w + 1 + 1e-8) / 2)
    close(g, [[(1 - ess) * 1.0 / 2], [0.0]])


# ---------------------------------------------------------------- M4 AIS (AIS1-AIS4)
AIS_KEYS = {"alpha", "R", "B", "V", "c_mean", "c_var", "n"}


def ais_batch(rho_rows, adv, mask=None):
    lmu = torch.full((len(rho_rows), 2), math.log(0.3), dtype=D)
    lold = lmu + torch.log(tt(rho_rows))
    return lold, batch(lold, lmu, adv, mask=mask)


def test_ais1_no_mismatch():
    lold, b = ais_batch([[1.0, 1.0]] * 4, [1.0, 1.0, -1.0, -1.0])
    loss, g, stats, _ = run(method("ais"), lold, b)
    assert AIS_KEYS | TIS_KEYS <= set(stats)
    assert stats["alpha"] == 0.0 and stats["B"] == 0.0 and stats["V"] == 0.0 and stats["c_mean"] == 0.0
    close(stats["is_weights"], torch.ones(4, 2))
    close(loss, 0.0)
    close(g, tt([[-1.0, -1.0], [-1.0, -1.0], [1.0, 1.0], [1.0, 1.0]]) / 8)


def test_ais2_systematic_mismatch_gives_alpha_near_one():
    rows = [[1.2, 1.2], [1.1, 1.1], [0.8, 0.8], [0.9, 0.9]]
    lold, b = ais_batch(rows, [1.0, 1.0, -1.0, -1.0])
    loss, g, stats, _ = run(method("ais"), lold, b)
    close(stats["c_mean"], 0.15)
    close(stats["c_var"], 0.0033333)
    close(stats["R"], 0.975610)
    close(stats["B"], 0.0216667)
    close(stats["V"], 0.000854167)
    close(stats["alpha"], 0.962072)
    assert stats["n"] == 4.0
    w = tt([[1.192414], [1.096207], [0.807586], [0.903793]]).expand(4, 2)
    close(stats["is_weights"], w)
    a = tt([1.0, 1.0, -1.0, -1.0])[:, None]
    close(loss, float(-(w * a).sum() / 8))
    close(g, -w * a / 8)
    assert isinstance(stats["alpha"], float)
    assert_detached(stats)


def test_ais3_advantage_uncorrelated_noise_gives_alpha_zero():
    rows = [[1.1, 1.1], [0.9, 0.9], [1.1, 1.1], [0.9, 0.9]]
    lold, b = ais_batch(rows, [1.0, 1.0, -1.0, -1.0])
    _, _, stats, _ = run(method("ais"), lold, b)
    assert stats["c_mean"] == pytest.approx(0.0, abs=1e-12)
    assert stats["B"] == 0.0 and stats["alpha"] == 0.0
    close(stats["R"], 0.990099)
    close(stats["V"], 0.0033667)
    close(stats["is_weights"], torch.ones(4, 2))


def test_ais4_padding_exclusion_and_truncation():
    rows = [[3.0, 1.0], [1.0, 1.0], [0.5, 1.0], [1.0, 1.0], [2.0, 2.0]]
    mask = [[True, True], [True, False], [True, True], [True, True], [True, True]]
    lold, b = ais_batch(rows, [1.0, -1.0, -1.0, 1.0, 0.0], mask=mask)
    loss, g, stats, _ = run(method("ais"), lold, b)
    assert stats["n"] == 4.0
    close(stats["c_mean"], 0.1875)
    close(stats["c_var"], 0.0572917)
    close(stats["R"], 56.25 / (7 * 9.25))
    close(stats["B"], 0.0208333)
    close(stats["V"], 0.0164873)
    close(stats["alpha"], 0.558226)
    w = stats["is_weights"]
    close(w[0], [1.558226, 1.0])
    close(w[2], [0.720887, 1.0])
    close(w[4], [1.558226, 1.558226])
    assert w[1, 1] == 0.0
    assert float(w.max()) <= 2.0
    assert torch.isfinite(g).all() and g[1, 1] == 0.0


def test_ais_alpha_zero_with_fewer_than_two_responses():
    lold, b = ais_batch([[2.0, 2.0], [2.0, 2.0]], [1.0, 0.0])
    _, _, stats, _ = run(method("ais"), lold, b)
    assert stats["n"] == 1.0 and stats["alpha"] == 0.0


# ---------------------------------------------------------------- shared conventions
@pytest.mark.parametrize("name", ["bf16", "naive", "tis", "acr", "acr_uaq", "ais"])
def test_kl_ref_is_added_unweighted(name):
    lref = lg([[0.25, 0.2, 0.9]])
    base, g0, _, _ = run(method(name), T_LOLD, batch(T_LOLD, T_LMU, [1.0]))
    loss, g, _, met = run(method(name, kl_ref_beta=0.5), T_LOLD, batch(T_LOLD, T_LMU, [1.0], lref=lref))
    d = math.log(0.5)
    k3 = math.exp(d) - d - 1
    close(met["kl_ref"], k3 / 3)
    close(loss, base + 0.5 * k3 / 3)
    # d k3 / d ltheta = 1 - exp(lref - ltheta), unweighted by the IS weight of token 0
    close(g - g0, [[0.5 * (1 - 0.5) / 3, 0.0, 0.0]])
    with pytest.raises(ValueError, match="logp_ref"):
        run(method(name, kl_ref_beta=0.5), T_LOLD, batch(T_LOLD, T_LMU, [1.0]))


def test_recompute_methods_need_logp_old():
    with pytest.raises(ValueError, match="recompute"):
        run(method("tis"), T_LOLD, batch(None, T_LMU, [1.0]))


def test_seq_mean_token_mean_aggregation_is_used():
    lold = lg([[0.5, 0.5], [0.5, 0.5]])
    b = batch(lold, lold, [1.0, 1.0], mask=[[True, True], [True, False]])
    loss, g, _, _ = run(method("naive", loss_agg="seq-mean-token-mean"), lold, b)
    close(loss, -1.0)
    close(g, [[-0.25, -0.25], [-0.5, 0.0]])
