"""Mismatch metrics (docs/arms.md §7, test MET1) and their edge cases; sanitize (section 0)."""

import math

import pytest
import torch

from bench.mismatch import MISMATCH_KEYS, mismatch_metrics, sanitize

D = torch.float64

EXPECTED_KEYS = {
    "mismatch/kl_k1", "mismatch/kl_k3", "mismatch/kl_k2", "mismatch/ppl_train", "mismatch/ppl_rollout",
    "mismatch/log_ppl_diff", "mismatch/log_ppl_abs_diff", "mismatch/log_ppl_diff_max", "mismatch/log_ppl_diff_min",
    "mismatch/ppl_ratio", "mismatch/chi2_token", "mismatch/chi2_seq", "mismatch/is_ess", "mismatch/ratio_mean",
    "mismatch/ratio_max", "mismatch/ratio_min", "mismatch/ratio_std", "mismatch/ratio_frac_high",
    "mismatch/ratio_frac_low", "mismatch/logp_diff_mean", "mismatch/logp_diff_max", "mismatch/max_prob_diff",
    "mismatch/prob_diff_mean", "mismatch/token_mult_prob_error", "mismatch/kl_k3_clamped", "mismatch/kl_k3_masked",
    "mismatch/kl_k3_unmasked",
}


def met1():
    lold = torch.log(torch.tensor([[0.5, 0.2, 0.9]], dtype=D))
    lmu = torch.log(torch.tensor([[0.25, 0.4, 0.9]], dtype=D))
    return lold, lmu, torch.ones(1, 3, dtype=torch.bool)


def test_keys_exact():
    out = mismatch_metrics(*met1())
    assert set(out) == EXPECTED_KEYS == set(MISMATCH_KEYS)
    assert all(isinstance(v, float) for v in out.values())


def test_met1_the_fields_metrics():
    """MET1 (rho = [2, 0.5, 1]) with the field's metrics, each as its framework defines it (bench/mismatch.py)."""
    lold, lmu, m = met1()
    out = mismatch_metrics(lold, lmu, m, kept=torch.tensor([[True, False, True]]))
    assert out["mismatch/token_mult_prob_error"] == pytest.approx(5 / 3)  # NeMo-RL: mean exp|delta| = (2 + 2 + 1)/3
    assert out["mismatch/kl_k3_clamped"] == pytest.approx(0.166667, abs=1e-6)  # miles: = k3 when no term hits 10
    assert out["mismatch/prob_diff_mean"] == pytest.approx(0.05 / 3)  # ROLL: mean(0.25, -0.2, 0)
    # prime-rl's masked/unmasked mismatch KL: k3 terms [0.306853, 0.193147, 0] over the dropped token / the kept two
    assert out["mismatch/kl_k3_masked"] == pytest.approx(0.193147, abs=1e-6)
    assert out["mismatch/kl_k3_unmasked"] == pytest.approx(0.153426, abs=1e-6)
    whole = mismatch_metrics(lold, lmu, m)  # an arm that drops nothing
    assert whole["mismatch/kl_k3_masked"] == 0.0 and whole["mismatch/kl_k3_unmasked"] == whole["mismatch/kl_k3"]
    # miles clamps delta at +-20 in both terms and each term at 10: delta = +-30 gives 10 twice (ours: k3 unbounded)
    out = mismatch_metrics(torch.tensor([[-1.0, -31.0]], dtype=D), torch.tensor([[-31.0, -1.0]], dtype=D),
                           torch.ones(1, 2, dtype=torch.bool))
    assert out["mismatch/kl_k3_clamped"] == pytest.approx(10.0)
    assert out["mismatch/kl_k3"] > 1e8
    assert out["mismatch/token_mult_prob_error"] == pytest.approx(math.exp(20))  # |delta| clamped at 20 before exp


def test_met1():
    out = mismatch_metrics(*met1(), cap_C=2.0)
    expected = {
        "kl_k1": 0.0, "kl_k3": 0.166667, "kl_k2": 0.160151, "chi2_token": 0.75, "chi2_seq": 0.0,
        "ppl_train": 2.231443, "ppl_rollout": 2.231443, "log_ppl_diff": 0.0, "log_ppl_abs_diff": 0.0,
        "ppl_ratio": 1.0, "logp_diff_mean": 0.462098, "logp_diff_max": 0.693147, "max_prob_diff": 0.25,
        "is_ess": 0.777778,
        # rho = [2, 0.5, 1]: neither > C nor < 1/C (strict)
        "ratio_mean": 3.5 / 3, "ratio_max": 2.0, "ratio_min": 0.5, "ratio_frac_high": 0.0, "ratio_frac_low": 0.0,
        "ratio_std": math.sqrt(5.25 / 3 - (3.5 / 3) ** 2),
    }
    for k, v in expected.items():
        assert out[f"mismatch/{k}"] == pytest.approx(v, abs=1e-6), k


def test_ratio_fractions_and_clamp():
    lold = torch.tensor([[-1.0, -1.0, -5.0, -1.0]], dtype=D)
    lmu = torch.tensor([[-50.0, -3.0, -1.0, -1.0]], dtype=D)  # delta = [49, 2, -4, 0]
    out = mismatch_metrics(lold, lmu, torch.ones(1, 4, dtype=torch.bool), cap_C=2.0)
    assert out["mismatch/ratio_max"] == pytest.approx(math.exp(20.0))  # +-20 log-ratio clamp
    assert out["mismatch/ratio_frac_high"] == pytest.approx(0.5)
    assert out["mismatch/ratio_frac_low"] == pytest.approx(0.25)
    assert out["mismatch/logp_diff_max"] == pytest.approx(49.0)  # raw gap, unclamped
    assert out["mismatch/kl_k3"] >= 0.0
    assert out["mismatch/chi2_seq"] == pytest.approx(math.exp(40.0) - 1.0)  # seq log-ratio clamped at 20


def test_chi2_is_the_plain_estimator_and_may_be_negative():
    """rho = [0.5, 1] on one token each of two sequences: mean rho^2 - 1 = -0.375 at both levels, not clamped
    at 0 (the unbiased estimator of E_mu[rho^2] - 1; a clamp would bias step averages upward)."""
    lold = torch.log(torch.tensor([[0.25], [0.5]], dtype=D))
    lmu = torch.log(torch.tensor([[0.5], [0.5]], dtype=D))
    out = mismatch_metrics(lold, lmu, torch.ones(2, 1, dtype=torch.bool))
    assert out["mismatch/chi2_token"] == pytest.approx(-0.375)
    assert out["mismatch/chi2_seq"] == pytest.approx(-0.375)


def test_sequence_level_means_skip_empty_rows():
    lold = torch.log(torch.tensor([[0.5, 0.5], [0.2, 0.9]], dtype=D))
    lmu = torch.log(torch.tensor([[0.25, 0.5], [0.4, 0.1]], dtype=D))
    mask = torch.tensor([[True, False], [False, False]])
    out = mismatch_metrics(lold, lmu, mask)
    assert out["mismatch/log_ppl_diff"] == pytest.approx(math.log(0.25) - math.log(0.5))
    assert out["mismatch/log_ppl_diff_max"] == out["mismatch/log_ppl_diff_min"] == out["mismatch/log_ppl_diff"]
    assert out["mismatch/ppl_train"] == pytest.approx(2.0)
    assert out["mismatch/ppl_ratio"] == pytest.approx(0.5)
    assert out["mismatch/chi2_seq"] == pytest.approx(3.0)


def test_empty_mask_is_finite_and_neutral():
    lold, lmu, _ = met1()
    out = mismatch_metrics(lold, lmu, torch.zeros(1, 3, dtype=torch.bool))
    assert all(math.isfinite(v) for v in out.values())
    assert out["mismatch/is_ess"] == 1.0 and out["mismatch/ratio_mean"] == 1.0
    assert out["mismatch/kl_k3"] == 0.0 and out["mismatch/ppl_train"] == 1.0


def test_nonfinite_logprobs_are_masked_out():
    lold, lmu, mask = met1()
    lold2 = torch.cat([lold, torch.tensor([[math.nan]], dtype=D)], 1)
    lmu2 = torch.cat([lmu, torch.tensor([[-math.inf]], dtype=D)], 1)
    out = mismatch_metrics(lold2, lmu2, torch.ones(1, 4, dtype=torch.bool))
    ref = mismatch_metrics(lold, lmu, mask)
    assert out == pytest.approx(ref)


def test_sanitize():
    lt = torch.tensor([[-1.0, math.nan, -1.0, -1.0]], dtype=D)
    lmu = torch.tensor([[-1.0, -1.0, -math.inf, math.inf]], dtype=D)
    mask = torch.tensor([[True, True, True, False]])
    clean, frac = sanitize(lt, lmu, mask)
    assert clean.tolist() == [[True, False, False, False]]
    assert frac == pytest.approx(2 / 3)
    clean, frac = sanitize(None, lmu, mask, torch.tensor([[math.inf, 0.0, 0.0, 0.0]]))
    assert clean.tolist() == [[False, True, False, False]] and frac == pytest.approx(2 / 3)
    assert sanitize(lt, lmu, torch.zeros_like(mask)) [1] == 0.0
