"""Issue 13 item 8: a non-finite log pi_theta leaves the mask, and the metric conventions of docs/arms.md §7.

Hand-computed float64 cases (docs/arms.md §1, §7, §4.4, §4.8):
- a token whose log pi_theta is -inf at a valid position is dropped like a non-finite log pi_old / log mu
  (before: kept, and the P3O loss became NaN);
- Seq-TIS is_frac_high/low count sequences whose sequence ratio leaves [1/C, C] (not tokens);
- AIS reports B = V = 0 when n < 2 forces alpha to 0;
- mismatch/kl_k3 clamps rho only: for |delta| > 20 the linear term keeps the raw delta.
"""

from __future__ import annotations

import math

import pytest
import torch

from bench.methods.ais import ais_alpha
from bench.mismatch import mismatch_metrics
from tests.unit.test_methods import D, batch, close, lg, method, run

NEG_INF = float("-inf")


def test_nonfinite_log_pi_theta_is_dropped_from_the_mask_for_p3o():
    # lmu = log[0.25, 0.4, 0.9]; ltheta = log[0.5, -, 0.9] with the middle one -inf (a valid position)
    lmu = lg([[0.25, 0.4, 0.9]])
    lt = torch.tensor([[math.log(0.5), NEG_INF, math.log(0.9)]], dtype=D, requires_grad=True)
    b = batch(None, lmu, [1.0]).drop_nonfinite(lt)
    assert b.mask.tolist() == [[True, False, True]] and b.n_tokens == 2.0
    m = method("ess")
    loss, metrics = m.loss(lt, b, m.prepare(b))
    loss.backward()
    # valid tokens: w = [2, 1], ESS = 9 / 5 / 2 = 0.9, rho = [0.9, 0.9];
    # pg = 0.9 (ln 2 + ln(1/0.9)) / 2 = 0.359329; KLb = [ln 2 + 0.5 - 1, 0] -> mean 0.096574, x (1 - ESS) = 0.009657
    close(loss.item(), 0.368986)
    close(metrics["ess_factor"], 0.9, atol=1e-8)
    assert torch.isfinite(lt.grad).all() and lt.grad[0, 1] == 0.0


@pytest.mark.parametrize("name", ["bf16", "tis", "ais", "naive_ppo_is"])
def test_nonfinite_log_pi_theta_gives_the_loss_of_the_masked_batch(name):
    lold, lmu = lg([[0.5, 0.2, 0.9]]), lg([[0.25, 0.4, 0.9]])
    lt = torch.tensor([[math.log(0.5), NEG_INF, math.log(0.9)]], dtype=D)
    m = method(name)
    lold = None if not m.needs_recompute else lold
    dropped = batch(lold, lmu, [1.0]).drop_nonfinite(lt)
    masked = batch(lold, lmu, [1.0], mask=[[True, False, True]])
    finite_lt = torch.where(torch.isfinite(lt), lt, torch.zeros_like(lt))
    loss_dropped, g, _, _ = run(m, lt, dropped)
    loss_masked, _, _, _ = run(method(name), finite_lt, masked)
    close(loss_dropped, loss_masked)
    assert math.isfinite(loss_dropped) and torch.isfinite(g).all()


def test_drop_nonfinite_keeps_the_batch_when_every_valid_token_is_finite():
    b = batch(lg([[0.5, 0.2]]), lg([[0.25, 0.4]]), [1.0], mask=[[True, False]])
    lt = torch.tensor([[math.log(0.5), NEG_INF]], dtype=D)  # -inf only at a masked position
    assert b.drop_nonfinite(lt) is b


def test_sequence_tis_fractions_count_sequences():
    # token ratios per row; sequence ratios: 4 (>C), 2.25 (>C although each token is 1.5 < C),
    # 0.5 (= 1/C: not low, strict), 0.25 (< 1/C, one valid token), and an empty row (left out)
    rho = [[2.0, 2.0], [1.5, 1.5], [0.5, 1.0], [0.25, 1.0], [1.0, 1.0]]
    mask = [[True, True], [True, True], [True, True], [True, False], [False, False]]
    lmu = torch.full((5, 2), math.log(0.3), dtype=D)
    lold = lmu + torch.log(torch.tensor(rho, dtype=D))
    _, _, stats, _ = run(method("tis", is_level="sequence"), lold, batch(lold, lmu, [1.0] * 5, mask=mask))
    assert stats["is_frac_high"] == pytest.approx(2 / 4)  # tokens would say 4/7
    assert stats["is_frac_low"] == pytest.approx(1 / 4)  # tokens would say 1/7
    close(stats["is_weights"][:4, 0], [2.0, 2.0, 0.5, 0.25])
    # token level on the same batch counts tokens: rho > 2 never (2.0 is not > C), rho < 1/2 once of 7
    _, _, tok, _ = run(method("tis"), lold, batch(lold, lmu, [1.0] * 5, mask=mask))
    assert tok["is_frac_high"] == 0.0 and tok["is_frac_low"] == pytest.approx(1 / 7)


def test_ais_reports_zero_bias_and_variance_when_alpha_is_forced_to_zero():
    # one response in S (the other has A = 0): c = 1 * mean(min(2, C) - 1) = 1; alpha is forced to 0 (n < 2)
    rho_bar = torch.tensor([[2.0, 2.0], [2.0, 2.0]], dtype=D)
    stats = ais_alpha(rho_bar, torch.tensor([1.0, 0.0], dtype=D), torch.ones(2, 2, dtype=torch.bool))
    assert stats["n"] == 1.0 and stats["c_mean"] == 1.0
    assert (stats["alpha"], stats["B"], stats["V"]) == (0.0, 0.0, 0.0)
    # with ais_n_min above n the same holds
    two = ais_alpha(rho_bar, torch.tensor([1.0, -1.0], dtype=D), torch.ones(2, 2, dtype=torch.bool), n_min=3)
    assert two["n"] == 2.0 and (two["alpha"], two["B"], two["V"]) == (0.0, 0.0, 0.0)


@pytest.mark.parametrize("delta, k3", [(-30.0, math.exp(-20.0) + 30.0 - 1.0), (30.0, math.exp(20.0) - 31.0),
                                        (-5.0, math.exp(-5.0) + 5.0 - 1.0)])
def test_kl_k3_clamps_rho_only(delta, k3):
    lmu = torch.tensor([[-40.0]], dtype=D)
    out = mismatch_metrics(lmu + delta, lmu, torch.ones(1, 1, dtype=torch.bool))
    assert out["mismatch/kl_k3"] == pytest.approx(k3, rel=1e-12)
    assert out["mismatch/kl_k3"] >= 0.0


@pytest.mark.parametrize("mode", ["mask", "reject"])
def test_is_frac_low_counts_below_the_band_in_mask_and_reject_modes(mode):
    """docs/arms.md §8 example: rho = [0.6, 1] with the band [0.8, 2] gives
    is_frac_low = 0.5 (0.6 < 0.8); 1/C = 0.5 would count none. Truncation keeps counting rho < 1/C."""
    lmu = lg([[0.5, 0.5]])
    lold = lmu + torch.log(torch.tensor([[0.6, 1.0]], dtype=D))
    b = batch(lold, lmu, [1.0])
    _, _, stats, _ = run(method("tis", is_mode=mode, is_cap_low=0.8, is_cap_C=2.0), lold, b)
    assert stats["is_frac_low"] == pytest.approx(0.5) and stats["is_frac_high"] == 0.0
    _, _, trunc, _ = run(method("tis", is_cap_C=2.0), lold, b)
    assert trunc["is_frac_low"] == 0.0  # 0.6 >= 1/C = 0.5
    # sequence level (seq_is_rs): rho_seq = 0.6 against its band [0.8, 2] is low; one non-empty row
    _, _, seq, _ = run(method("seq_is_rs", is_cap_low=0.8), lold, b)
    assert seq["is_frac_low"] == 1.0 and (seq["is_weights"] == 0).all()
