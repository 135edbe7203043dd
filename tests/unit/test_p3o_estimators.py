"""P3O's KL(pi || mu) term on mu's samples (bench/methods/ess.py `p3o_kl_term`), on a tabular distribution where
every expectation is an exact sum: FeynRL's term has mean chi2(mu || pi) - KL(mu || pi), the importance-weighted k3
(p3o_kl_estimator=is_k3) has mean KL(pi || mu), and its gradient is that of KL(pi || mu)."""

import pytest
import torch

from bench.methods.ess import p3o_kl_term

D = torch.float64


def _tables():
    """Two distributions over 6 tokens, mu with the quantized sampler's outliers (mu >> pi on a rare token)."""
    pi = torch.tensor([0.40, 0.25, 0.15, 0.10, 0.07, 0.03], dtype=D)
    mu = torch.tensor([0.30, 0.30, 0.10, 0.12, 0.03, 0.15], dtype=D)
    return pi, mu


def test_feynrl_term_estimates_chi2_minus_kl_not_kl_pi_mu():
    pi, mu = _tables()
    d = pi.log() - mu.log()
    mean = float((mu * p3o_kl_term(d, "feynrl", clamp=50.0)).sum())
    chi2_mu_pi = float((mu * mu / pi).sum() - 1.0)
    kl_mu_pi = float((mu * (mu / pi).log()).sum())
    kl_pi_mu = float((pi * (pi / mu).log()).sum())
    assert mean == pytest.approx(chi2_mu_pi - kl_mu_pi, abs=1e-12)
    assert abs(mean - kl_pi_mu) > 0.1  # 0.393 against 0.123 here: it is not the KL it is named after


def test_importance_weighted_k3_estimates_kl_pi_mu_and_its_gradient():
    pi, mu = _tables()
    logits = pi.log().clone().requires_grad_(True)
    lp = torch.log_softmax(logits, -1)
    mean = (mu * p3o_kl_term(lp - mu.log(), "is_k3", clamp=50.0)).sum()
    kl = (lp.exp() * (lp - mu.log())).sum()
    assert float(mean.detach()) == pytest.approx(float(kl.detach()), abs=1e-12)
    (g_est,) = torch.autograd.grad(mean, logits, retain_graph=True)
    (g_kl,) = torch.autograd.grad(kl, logits)
    torch.testing.assert_close(g_est, g_kl, rtol=1e-10, atol=1e-12)
    assert bool((p3o_kl_term(torch.linspace(-30, 30, 61, dtype=D), "is_k3") >= 0).all())  # every term >= 0


def test_is_k3_clamps_as_the_arm_clamps_its_exp():
    d = torch.tensor([-40.0, 40.0], dtype=D)
    c = torch.tensor([-10.0, 10.0], dtype=D)
    torch.testing.assert_close(p3o_kl_term(d, "is_k3", 10.0), 1 - c.exp() + c * c.exp())
    with pytest.raises(ValueError, match="feynrl, is_k3"):
        p3o_kl_term(d, "k2")
