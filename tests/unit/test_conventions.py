"""The conventions of docs/arms.md §4.9-4.12 and §7: GR1-GR3 (geo_rs, seq_is_rs), OP1-OP3 (opsm), IP1-IP3
(icepop), AIS's fp64 alpha, FH2-FH3 (fp16/bf16 rounding, loss-scaler schedule), MET2-MET3 (mismatch metrics).

Loss values and autograd gradients w.r.t. ltheta as a leaf tensor, float64, token-mean over the valid tokens,
clip range [0.8, 1.2], atol 1e-6 (the spec's six decimals) unless stated.
"""

from __future__ import annotations

import math

import pytest
import torch

from bench.compute import GROWTH_INTERVAL, TrainerCompute
from bench.methods.ais import ais_alpha
from bench.methods.base import Batch, make_method
from bench.methods.geo_rs import geometric_keep
from bench.methods.opsm import opsm_keep
from bench.methods.tis import SeqISRSConfig
from bench.mismatch import mismatch_metrics
from bench.quant.quantizers import quantize
from tests.helpers import make_cfg
from tests.unit.test_methods import D, assert_detached, batch, close, lg, method, run, tt

LOG_04 = math.log(0.4)


def full_mask(b: int, t: int) -> torch.Tensor:
    return torch.ones(b, t, dtype=torch.bool)


# ---------------------------------------------------------------- GR1-GR3: geo_rs and seq_is_rs (M6.3)
# lmu = log 0.4 everywhere, lold = lmu + delta, theta = theta_old (r = 1, psi = -A)
GR1_DELTA = [[math.log(3.0), -math.log(3.0)], [0.2, 0.0], [-0.05, 0.0]]
GR1_MASK = [[True, True], [True, True], [True, False]]
GR1_ADV = [1.0, -1.0, -1.0]


def gr1_batch(n_tokens=None):
    lmu = torch.full((3, 2), LOG_04, dtype=D)
    lold = lmu + tt(GR1_DELTA)
    lmu[2, 1] = -math.inf  # the padded position: garbage there never reaches a statistic
    return lold, batch(lold, lmu, GR1_ADV, GR1_MASK, n_tokens=n_tokens)


def test_gr1_geo_rs_default_band_rejects_on_the_geometric_mean():
    assert make_method("geo_rs").cfg.geo_rs_lo == 1 / 1.1 and make_method("geo_rs").cfg.geo_rs_hi == 1.1
    lold, b = gr1_batch()
    # log g = [0, 0.1, -0.05]: row 1 rejected (0.1 > log 1.1 = 0.0953102); row 0 kept although its tokens have
    # rho = 3 and 1/3. L = (-1 - 1 + 1) / 5
    loss, g, stats, _ = run(method("geo_rs"), lold, b)
    close(stats["is_weights"], [[1, 1], [0, 0], [1, 0]])
    close(loss, -0.2)
    close(g, [[-0.2, -0.2], [0, 0], [0.2, 0]])
    close(stats["seq_masked_frac"], 1 / 3)
    close(stats["geo_mean"], 1.018800)
    close(stats["geo_min"], 0.951229)
    close(stats["geo_max"], 1.105171)
    assert_detached(stats)
    # verl's denominator (rejected tokens leave the mask, N_kept = 3) would give -1/3
    close(run(method("geo_rs"), lold, gr1_batch(n_tokens=3.0)[1])[0], -0.333333)
    # token TIS on the kept rows (C = 2): w = [[min(3, 2), 1/3], [0, 0], [e^-0.05, 0]]
    loss, g, stats, _ = run(method("geo_rs", geo_rs_token_tis=True), lold, b)
    close(stats["is_weights"], [[2, 1 / 3], [0, 0], [0.951229, 0]])
    close(loss, -0.276421)
    close(g, [[-0.4, -0.066667], [0, 0], [0.190246, 0]])


def test_gr1_geo_rs_clamps_each_token_before_the_mean():
    # 250 tokens, one log-ratio 30, the rest 0: clamped first, log g = 20/250 = 0.08 (kept); unclamped it would
    # be 0.12 (rejected)
    delta = torch.zeros(1, 250, dtype=D)
    delta[0, 0] = 30.0
    lmu = torch.full((1, 250), -35.0, dtype=D)
    _, _, stats, _ = run(method("geo_rs"), lmu + delta, batch(lmu + delta, lmu, [1.0]))
    close(stats["geo_mean"], math.exp(0.08))
    assert stats["seq_masked_frac"] == 0.0


@pytest.mark.parametrize("delta, band, kept_on_g, kept_by_verl", [
    (-0.1, (0.9, 1.1), True, False),        # g = 0.904837 in [0.9, 1.1]; verl tests 1/g = 1.105171 > 1.1
    (0.1, (0.9, 1.1), False, True),         # g = 1.105171 > 1.1; 1/g = 0.904837 >= 0.9
    (-0.1, (1 / 1.1, 1.1), False, False),   # log-symmetric band: both readings agree
    (0.1, (1 / 1.1, 1.1), False, False),
    (-0.095, (1 / 1.1, 1.1), True, True),
    (0.095, (1 / 1.1, 1.1), True, True),
])
def test_gr2_band_orientation(delta, band, kept_on_g, kept_by_verl):
    one = torch.ones(1, 1, dtype=torch.bool)
    keep, _ = geometric_keep(tt([[delta]]), one, *band)
    verl, _ = geometric_keep(tt([[-delta]]), one, *band)  # verl's code: mean_t(-log rho) in [log lo, log hi]
    assert (bool(keep), bool(verl)) == (kept_on_g, kept_by_verl)
    lold, lmu = tt([[LOG_04 + delta]]), tt([[LOG_04]])
    _, _, stats, _ = run(method("geo_rs", geo_rs_lo=band[0], geo_rs_hi=band[1]), lold, batch(lold, lmu, [1.0]))
    assert stats["seq_masked_frac"] == (0.0 if kept_on_g else 1.0)


def gr3_batch():
    lmu = torch.full((2, 2), LOG_04, dtype=D)
    lold = lmu + lg([[1.8, 1.0], [2.5, 1.0]])
    return lold, lmu


def test_gr3_seq_is_rs_is_verls_seq_mis():
    cfg = SeqISRSConfig(name="seq_is_rs")
    assert (cfg.is_level, cfg.is_mode, cfg.is_cap_low, cfg.is_cap_C) == ("sequence", "mask", 0.5, 2.0)
    lold, lmu = gr3_batch()
    # rho_seq = [1.8, 2.5]: row 0 kept with weight 1.8, row 1 rejected (2.5 > 2). L = (-1.8 - 1.8) / 4
    loss, g, stats, _ = run(method("seq_is_rs"), lold, batch(lold, lmu, [1.0, -1.0]))
    close(stats["is_weights"], [[1.8, 1.8], [0, 0]])
    close(loss, -0.9)
    close(g, [[-0.45, -0.45], [0, 0]])
    assert stats["is_frac_high"] == 0.5 and stats["is_frac_low"] == 0.0  # sequences, by rho_seq
    assert_detached(stats)
    close(run(method("seq_is_rs"), lold, batch(lold, lmu, [1.0, -1.0], n_tokens=2.0))[0], -1.8)  # verl's N_kept
    # Geo-RS on the same rows: log g = [log(1.8)/2, log(2.5)/2] = [0.293893, 0.458145], both rejected: L = 0
    loss, g, stats, _ = run(method("geo_rs"), lold, batch(lold, lmu, [1.0, -1.0]))
    assert loss == 0.0 and torch.equal(g, torch.zeros_like(g)) and stats["seq_masked_frac"] == 1.0
    close(math.log(stats["geo_min"]), 0.293893)
    close(math.log(stats["geo_max"]), 0.458145)


def test_gr3_length_geo_rs_keeps_what_seq_mis_rejects():
    # 50 tokens with delta = 0.02: log g = 0.02 (kept); rho_seq = e^1 = 2.718282 > 2 (rejected)
    lmu = torch.full((1, 50), LOG_04, dtype=D)
    lold = lmu + 0.02
    _, _, geo, _ = run(method("geo_rs"), lold, batch(lold, lmu, [1.0]))
    _, _, mis, _ = run(method("seq_is_rs"), lold, batch(lold, lmu, [1.0]))
    assert geo["seq_masked_frac"] == 0.0 and mis["is_weights"].abs().sum() == 0.0
    close(mis["seq_max"], 0.0)
    assert mis["is_frac_high"] == 1.0


def test_gr3_seq_is_rs_equals_the_tis_arm_configured_as_seq_mis():
    g = torch.Generator().manual_seed(0)
    lmu = -torch.rand(5, 4, generator=g, dtype=D) * 3
    lold = lmu + 0.4 * torch.randn(5, 4, generator=g, dtype=D)
    lt = lold + 0.2 * torch.randn(5, 4, generator=g, dtype=D)
    b = batch(lold, lmu, [1.0, -0.5, 0.3, -2.0, 1.0], torch.rand(5, 4, generator=g) > 0.2)
    a = run(method("seq_is_rs"), lt, b)
    t = run(method("tis", is_level="sequence", is_mode="mask", is_cap_low=0.5, is_cap_C=2.0), lt, b)
    close(a[0], t[0], atol=0)
    close(a[1], t[1], atol=0)
    assert 0 < float((a[2]["is_weights"] == 0).double().mean()) < 1  # the band bites on some rows, not all


def test_new_arm_yamls_compose(tmp_path):
    geo = make_cfg(tmp_path, "method=geo_rs").method
    assert (geo.name, geo.geo_rs_lo, geo.geo_rs_hi, geo.geo_rs_token_tis) == ("geo_rs", 1 / 1.1, 1.1, False)
    mis = make_cfg(tmp_path, "method=seq_is_rs").method
    assert (mis.name, mis.is_level, mis.is_mode, mis.is_cap_low, mis.is_cap_C) == ("seq_is_rs", "sequence", "mask",
                                                                                   0.5, 2.0)
    assert make_cfg(tmp_path, "method=seq_is_rs", "method.is_cap_low=null").method.is_cap_low is None  # the blog's


# ---------------------------------------------------------------- OP1-OP3: opsm (M7)
OP1_LT = lg([[0.25, 0.4], [0.25, 0.4], [0.25, 0.5]])
OP1_LMU = lg([[0.5, 0.6], [0.5, 0.6], [0.5, 0.5]])


def test_op1_opsm_masks_negative_advantage_rows_that_drifted():
    b = batch(OP1_LT, OP1_LMU, [-1.0, 1.0, -0.5])
    keep, d = opsm_keep(OP1_LT, OP1_LMU, tt([-1.0, 1.0, -0.5]), full_mask(3, 2), 0.5)
    close(d, [0.549306, 0.549306, 0.346574])
    assert keep.tolist() == [False, True, True]
    loss, g, _, met = run(method("opsm"), OP1_LT, b)
    close(loss, -0.166667)
    close(g, [[0, 0], [-0.166667, -0.166667], [0.083333, 0.083333]])
    close(met["seq_masked_frac"], 1 / 3)
    close(run(method("opsm", opsm_delta=0.55), OP1_LT, b)[0], 0.166667)  # nothing masked
    # per-token advantages, row 0 = [-1, +0.5]: only token (0, 0) is masked
    adv = tt([[-1.0, 0.5], [1.0, 1.0], [-0.5, -0.5]])
    bt = Batch(logp_old=OP1_LT, logp_mu=OP1_LMU, adv=adv, mask=full_mask(3, 2), n_tokens=6.0)
    loss, g, _, _ = run(method("opsm"), OP1_LT, bt)
    close(loss, -0.25)
    close(g[0], [0, -0.083333])


def test_op2_opsm_mask_follows_theta():
    lold = lg([[0.5, 0.5]])
    b = batch(lold, lold + 0.3, [-1.0])
    loss, g, _, met = run(method("opsm", opsm_delta=0.4), lold, b)  # D = 0.3: kept
    close(loss, 1.0)
    close(g, [[0.5, 0.5]])
    lt = lold - 0.15  # D = 0.45 > 0.4: masked
    loss, g, _, met = run(method("opsm", opsm_delta=0.4), lt, b)
    assert loss == 0.0 and torch.equal(g, torch.zeros_like(g)) and met["seq_masked_frac"] == 1.0
    # recompute (l_b = lold): D = 0.15, kept; r = e^-0.15 inside [0.8, 1.2]
    loss, g, _, _ = run(method("opsm", opsm_delta=0.4, opsm_behaviour="recompute"), lt, b)
    close(loss, 0.860708)
    close(g, [[0.430354, 0.430354]])


def test_op3_opsm_decides_on_the_unclamped_log_ratio():
    # 20 tokens, l_b - ltheta = [+25, then -0.75 x 19], A = -1 (ltheta = lold = -26 so that every log-prob is a
    # valid one; only the differences matter). D = (25 - 14.25) / 20 = 0.5375 > 0.5: masked. A +-20 clamp per
    # token would give D = (20 - 14.25) / 20 = 0.2875: kept, loss 1.0, 0.05 per token of gradient.
    lold = torch.full((1, 20), -26.0, dtype=D)
    lmu = lold - 0.75
    lmu[0, 0] = lold[0, 0] + 25.0
    loss, g, _, met = run(method("opsm"), lold, batch(lold, lmu, [-1.0]))
    close(met["seq_log_ratio_mean"], 0.5375)
    assert loss == 0.0 and torch.equal(g, torch.zeros_like(g)) and met["seq_masked_frac"] == 1.0


# ---------------------------------------------------------------- IP1-IP3: icepop (M5)
def test_ip1_icepop_fractions_are_the_band_edges():
    lold, lmu = lg([[0.5, 0.2, 0.3, 0.9]]), lg([[0.25, 0.5, 0.05, 0.9]])  # rho = [2, 0.4, 6, 1]
    loss, g, stats, _ = run(method("icepop"), lold, batch(lold, lmu, [1.0]))
    close(stats["is_weights"], [[2, 0, 0, 1]])
    close(loss, -0.75)
    close(g, [[-0.5, 0, 0, -0.25]])
    assert (stats["masked_frac"], stats["masked_frac_low"], stats["masked_frac_high"]) == (0.5, 0.25, 0.25)
    assert stats["is_frac_low"] == 0.25  # rho < alpha = 0.5 (not rho < 1/beta = 0.2, which would be 0)
    assert stats["is_frac_high"] == 0.25  # rho > beta = 5
    close(stats["is_ess"], 0.45)
    close(mismatch_metrics(lold, lmu, full_mask(1, 4))["mismatch/is_ess"], 0.817568)
    close(run(method("tis"), lold, batch(lold, lmu, [1.0]))[0], -1.35)  # TIS truncates instead: w = [2, .4, 2, 1]


def test_ip2_icepop_all_masked_beyond_the_clamp():
    lold, lmu = tt([[-1.0, -5.0]]), tt([[-31.0, -1.0]])  # log-ratios [30 -> 20, -4]: rho = [e^20, 0.018316]
    loss, g, stats, _ = run(method("icepop"), lold, batch(lold, lmu, [1.0]))
    assert loss == 0.0 and torch.equal(g, torch.zeros_like(g))
    assert (stats["masked_frac"], stats["masked_frac_low"], stats["masked_frac_high"]) == (1.0, 0.5, 0.5)
    assert (stats["is_frac_low"], stats["is_frac_high"], stats["is_ess"]) == (0.5, 0.5, 0.0)
    assert all(math.isfinite(v) for v in stats.values() if isinstance(v, float))
    close(run(method("tis"), lold, batch(lold, lmu, [1.0]))[0], -1.009158)


def test_ip3_icepop_weight_multiplies_the_clipped_surrogate():
    lold, lmu = lg([[0.4, 0.4]]), lg([[0.1, 0.1]])  # rho = 4 (kept); A = -1, r = [0.7, 1.5]
    loss, g, stats, met = run(method("icepop"), lold + lg([[0.7, 1.5]]), batch(lold, lmu, [-1.0]))
    close(stats["is_weights"], [[4, 4]])
    close(loss, 4.6)  # psi = [0.8 (clipped), 1.5]: (4 * 0.8 + 4 * 1.5) / 2
    close(g, [[0.0, 3.0]])
    assert met["clipfrac"] == 0.5


# ---------------------------------------------------------------- AIS: alpha in float64 (11.1 item 10)
def ais_alpha_reference(lold: list[list[float]], lmu: list[list[float]], adv: list[float], cap: float = 2.0) -> float:
    """M4.2's alpha in plain Python floats (fp64), every row in S, every token valid."""
    rho_bar = [[min(math.exp(max(-20.0, min(20.0, a - b))), cap) for a, b in zip(ro, rm)] for ro, rm in zip(lold, lmu)]
    c = [a * sum(r - 1.0 for r in row) / len(row) for a, row in zip(adv, rho_bar)]
    n = len(c)
    c_mean = sum(c) / n
    c_var = sum((x - c_mean) ** 2 for x in c) / (n - 1)
    flat = [r for row in rho_bar for r in row]
    reliability = sum(flat) ** 2 / (len(flat) * sum(r * r for r in flat))
    bias2 = max(0.0, c_mean**2 - c_var / n)
    var = c_var / (reliability * n)
    return bias2 / (bias2 + var)


def test_ais_alpha_is_formed_in_fp64_from_fp32_log_probs():
    # A nearly matched batch (rho - 1 ~ 1e-2), one token per response: rho = [1.03, 1, 0.98, 1.01], A = [1, 1, -1, -1]
    # -> c = [0.03, 0, 0.02, -0.01], c_mean = 0.01, s^2 = 3.33e-4: B = c_mean^2 - s^2/4 = 1.67e-5 is a sixth of
    # c_mean^2, V = 8.3e-5, alpha ~ 0.167. The fp32 log-probs are exact fp64 values; rho = exp(lold - lmu) rounded
    # to fp32 is off by up to 6e-8 (4e-8 at 1.01), i.e. ~4e-6 relative in c, which B / (B + V) amplifies.
    lmu = torch.full((4, 1), math.log(0.3), dtype=torch.float32)
    lold = (lmu.double() + torch.log(tt([[1.03], [1.0], [0.98], [1.01]]))).float()
    adv = [1.0, 1.0, -1.0, -1.0]
    ref = ais_alpha_reference(lold.double().tolist(), lmu.double().tolist(), adv)
    assert 0.16 < ref < 0.17
    b = Batch(logp_old=lold, logp_mu=lmu, adv=torch.tensor(adv), mask=full_mask(4, 1), n_tokens=4.0)
    stats = make_method("ais").prepare(b)
    assert stats["alpha"] == pytest.approx(ref, rel=1e-12, abs=0)
    assert stats["is_weights"].dtype == torch.float32  # the weights applied to the loss stay in the working dtype
    close(stats["is_weights"].double(), (1 - ref) + ref * torch.exp(lold.double() - lmu.double()), atol=1e-7)
    # what forming rho in fp32 first gives (before the change): visibly off (~2e-5 relative here)
    rho32 = torch.exp(lold - lmu)
    assert (rho32.double() - torch.exp(lold.double() - lmu.double())).abs().max() > 1e-8
    alpha32 = ais_alpha(rho32.clamp(max=2.0), torch.tensor(adv, dtype=D), full_mask(4, 1))["alpha"]
    assert abs(alpha32 - ref) / ref > 1e-7


# ---------------------------------------------------------------- FH2-FH3: fp16 arm (M8)
FH2_IN = [1 + 2**-11, 1 + 3 * 2**-11, 65504.0, 65519.99, 65520.0, 2**-25, 3 * 2**-26, 2049 + 2**-30,
          1 + 2**-11 + 2**-40]
FH2_OUT = [1.0, 1 + 2**-9, 65504.0, 65504.0, math.inf, 0.0, 2**-24, 2050.0, 1 + 2**-10]


def test_fh2_fp64_inputs_are_rounded_once_to_nearest_even():
    codes, scale = quantize(tt(FH2_IN), "fp16", "per_tensor")
    assert (codes * scale).dtype == D
    assert (codes * scale).tolist() == FH2_OUT
    assert tt([2049 + 2**-30]).to(torch.float16).item() == 2048.0  # torch's cast (through fp32) is what is avoided
    neg, _ = quantize(-tt(FH2_IN), "fp16", "per_tensor")
    assert neg.tolist() == [-v for v in FH2_OUT]
    codes, scale = quantize(tt([1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-40]), "bf16", "per_tensor")
    assert (codes * scale).tolist() == [1.0, 1 + 2**-6, 1 + 2**-7]
    nan, _ = quantize(tt([math.nan, -1e-30]), "fp16", "per_tensor")
    assert math.isnan(nan[0]) and nan[1] == 0.0 and torch.signbit(nan[1])


@pytest.mark.parametrize("fmt, half", [("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_fh2_fp32_inputs_keep_torch_cast_and_fp64_agrees_on_fp32_values(fmt, half):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, generator=g) * torch.exp2(torch.randint(-30, 20, (4096,), generator=g).float())
    codes, scale = quantize(x, fmt, "per_tensor")
    assert codes.dtype == torch.float32 and torch.equal(codes * scale, x.to(half).float())
    codes64, _ = quantize(x.double(), fmt, "per_tensor")  # one rounding of an fp32 value: the same result
    assert torch.equal(codes64, x.to(half).double())


def test_fh3_loss_scale_underflow_arithmetic():
    g = tt(1e-8)
    assert g.to(torch.float16).item() == 0.0  # below half the smallest subnormal 2^-25 = 2.98e-8
    scaled = (g * 2.0**16).to(torch.float16)
    close(scaled.double(), 6.551743e-4, atol=1e-10)
    close(scaled.double() / 2.0**16, 9.997166e-9, atol=1e-15)


def test_fh3_loss_scale_regrows_after_400_finite_steps():
    assert GROWTH_INTERVAL == 400
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    compute = TrainerCompute(torch.device("cpu"), "fp16", 1.0)
    x = torch.ones(1, 2)

    def one_step(step: int, overflow: bool = False) -> float | None:
        opt.zero_grad()
        compute.scaler.scale(model(x).sum()).backward()
        if overflow:
            model.weight.grad[0, 0] = math.inf
        return compute.step(model, opt, 1.0, step)

    assert compute.scaler.get_scale() == 65536.0
    assert one_step(1, overflow=True) is None
    assert compute.metrics() == {"grad_scale": 32768.0, "skipped_steps": 1.0}
    for k in range(399):
        assert one_step(2 + k) is not None
    assert compute.scaler.get_scale() == 32768.0  # 399 finite steps: not yet
    one_step(401)
    assert compute.metrics() == {"grad_scale": 65536.0, "skipped_steps": 0.0}  # torch's default: 2000


# ---------------------------------------------------------------- MET2-MET3: mismatch metrics (section 11)
def test_met2_plain_chi2_may_be_negative():
    out = mismatch_metrics(lg([[0.2, 0.4]]), lg([[0.4, 0.4]]), full_mask(1, 2))  # rho = [0.5, 1]
    close(out["mismatch/kl_k1"], 0.346574)
    close(out["mismatch/kl_k3"], 0.096574)
    close(out["mismatch/chi2_token"], -0.375)  # mean rho^2 - 1, logged as is (self-normalised: 0.111111)
    close(out["mismatch/chi2_seq"], -0.75)  # rho_seq = 0.5
    close(out["mismatch/is_ess"], 0.9)


def test_met3_two_sided_ess_and_strict_fractions():
    out = mismatch_metrics(lg([[0.5, 0.1]]), lg([[0.25, 0.4]]), full_mask(1, 2))  # rho = [2, 0.25]
    close(out["mismatch/is_ess"], 0.735294)  # w = clamp(rho, 1/2, 2) = [2, 0.5]: 6.25 / 8.5 (verl >= 0.8: 0.623077)
    assert out["mismatch/ratio_frac_high"] == 0.0 and out["mismatch/ratio_frac_low"] == 0.5  # 2 is not > 2
    close(out["mismatch/chi2_token"], 1.03125)
    close(out["mismatch/kl_k3"], 0.471574)
