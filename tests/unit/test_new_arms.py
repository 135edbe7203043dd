"""Hand-computed cases for the arms of issue 12: icepop (I1-I4), geo_rs (S1-S4), opsm (O1-O4), fp16 (F1-F5).

Loss values and autograd gradients w.r.t. ltheta as a leaf tensor, float64, token-mean over the valid tokens,
clip range [0.8, 1.2]. Log-probs are written as log of probabilities chosen so that every ratio is a round
number; each expected value below is worked out in the comment next to it.
"""

import math

import pytest
import torch

from bench.launch.config import validate
from bench.methods.base import make_method
from bench.methods import arm_precision
from bench.methods.icepop import IcePopConfig
from bench.methods.opsm import OPSMConfig, opsm_keep
from bench.methods.geo_rs import GeoRSConfig, geometric_keep
from bench.models.logprobs import token_logprobs
from bench.quant.plain import HalfLinear
from bench.quant.quantizers import Quantizer, quantize
from bench.rollout.base import SamplingParams
from bench.rollout.embedded import EmbeddedEngine
from tests.helpers import make_cfg
from tests.unit.test_methods import D, assert_detached, close, run, tt
from tests.unit.test_methods import batch as _batch
from bench.domains import check_schema

LOG_HALF = math.log(0.5)


def batch(lold, lmu, adv, mask=None):
    """A Batch of float64 tensors, token-mean over the valid tokens."""
    return _batch(torch.as_tensor(lold, dtype=D), lmu, adv, mask)


# ---------------------------------------------------------------- icepop
# rho = pi_old/mu: [[0.5/0.25, 0.2/0.5], [0.3/0.05, 0.4/0.36]] = [[2, 0.4], [6, 10/9]]
I_LOLD = torch.log(tt([[0.5, 0.2], [0.3, 0.4]]))
I_LMU = torch.log(tt([[0.25, 0.5], [0.05, 0.36]]))


def test_i1_icepop_keeps_rho_inside_the_band_and_zero_outside():
    # alpha=0.5, beta=5: w = [[2, 0 (0.4 < 0.5)], [0 (6 > 5), 10/9]]; r = 1, A = [+1, -1] -> psi = -A
    # L = (2*(-1) + 0 + 0 + (10/9)*(+1)) / 4 = -2/9;  dL/dltheta = w * (-A) / 4
    loss, g, stats, _ = run(make_method("icepop"), I_LOLD, batch(I_LOLD, I_LMU, [1.0, -1.0]))
    close(loss, -2.0 / 9.0)
    close(g, [[-0.5, 0.0], [0.0, (10.0 / 9.0) / 4.0]])
    close(stats["is_weights"], [[2.0, 0.0], [0.0, 10.0 / 9.0]])
    assert stats["masked_frac"] == 0.5 and stats["masked_frac_low"] == 0.25 and stats["masked_frac_high"] == 0.25
    assert_detached(stats)


def test_i2_icepop_band_is_configurable():
    # alpha=0.3, beta=7: nothing masked, w = rho; L = (-2 - 0.4 + 6 + 10/9) / 4
    loss, g, stats, _ = run(make_method("icepop", icepop_alpha=0.3, icepop_beta=7.0), I_LOLD, batch(I_LOLD, I_LMU, [1.0, -1.0]))
    close(loss, (-2.0 - 0.4 + 6.0 + 10.0 / 9.0) / 4.0)
    close(g, [[-0.5, -0.1], [1.5, (10.0 / 9.0) / 4.0]])
    assert stats["masked_frac"] == 0.0


def test_i3_icepop_weight_multiplies_the_clipped_surrogate():
    # one token, rho = 2 (kept), A = +1, r = pi_theta/pi_old = 1.5 > 1.2: psi = -min(1.5, 1.2) = -1.2 (clipped)
    # L = 2 * -1.2 = -2.4, gradient 0 (clipped branch); a token at rho = 6 contributes nothing at all
    lold, lmu = torch.log(tt([[0.4]])), torch.log(tt([[0.2]]))
    loss, g, _, met = run(make_method("icepop"), lold + math.log(1.5), batch(lold, lmu, [1.0]))
    close(loss, -2.4)
    close(g, [[0.0]])
    assert met["clipfrac"] == 1.0
    loss, g, _, _ = run(make_method("icepop"), lold + math.log(1.5), batch(lold, torch.log(tt([[0.4 / 6.0]])), [1.0]))
    close(loss, 0.0)
    close(g, [[0.0]])


def test_i4_icepop_equals_tis_mask_mode_with_the_same_band():
    g = torch.Generator().manual_seed(0)
    lold = -torch.rand(4, 6, generator=g, dtype=D) * 3
    lmu = lold + torch.randn(4, 6, generator=g, dtype=D)
    lt = lold + 0.3 * torch.randn(4, 6, generator=g, dtype=D)
    mask = torch.rand(4, 6, generator=g) > 0.2
    b = batch(lold, lmu, [1.0, -0.5, 0.3, -2.0], mask)
    a = run(make_method("icepop"), lt, b)
    t = run(make_method("tis", is_mode="mask", is_cap_low=0.5, is_cap_C=5.0), lt, b)
    close(a[0], t[0])
    close(a[1], t[1])


@pytest.mark.parametrize("schema, knobs, match", [
    (IcePopConfig, {"icepop_alpha": 1.5}, "icepop_alpha=1.5"),
    (IcePopConfig, {"icepop_beta": 0.9}, "icepop_beta=0.9"),
    (GeoRSConfig, {"geo_rs_lo": 1.05}, "geo_rs_lo=1.05"),
    (GeoRSConfig, {"geo_rs_hi": 0.99}, "geo_rs_hi=0.99"),
    (OPSMConfig, {"opsm_delta": -0.1}, "opsm_delta=-0.1"),
    (OPSMConfig, {"opsm_behaviour": "old"}, "opsm_behaviour='old'.*rollout, recompute"),
])
def test_bad_knobs_are_named(schema, knobs, match):
    with pytest.raises(ValueError, match=match):
        check_schema(schema(name="x", **knobs), "method")


# ---------------------------------------------------------------- geo_rs
# per-token log rho = lold - lmu; lold = log 0.5 everywhere
S_D = tt([[math.log(3.0), -math.log(3.0)],  # mean 0      -> g = 1      kept  (tokens rho = 3 and 1/3)
          [0.3, 0.1],                        # mean 0.2    -> g = 1.221  > 1.1 rejected
          [-0.2, 99.0],                      # mean -0.2 (2nd token padded) -> g = 0.819 < 1/1.1 rejected
          [0.05, 0.05]])                     # mean 0.05   -> g = 1.051  kept
S_MASK = [[True, True], [True, True], [True, False], [True, True]]
S_LOLD = torch.full((4, 2), LOG_HALF, dtype=D)
S_ADV = [1.0, -1.0, 1.0, -0.5]


def s_batch():
    lmu = S_LOLD - S_D
    lmu[2, 1] = float("-inf")  # garbage on a padded position must not reach the statistic
    return batch(S_LOLD, lmu, S_ADV, S_MASK)


def test_s1_geo_rs_drops_whole_sequences_outside_the_band():
    # w = keep = rows 0 and 3; r = 1, psi = -A: row 0 -> -1, -1; row 3 -> +0.5, +0.5; 7 valid tokens
    # L = (-2 + 1) / 7 = -1/7; dL/dltheta = keep * (-A) / 7
    loss, g, stats, _ = run(make_method("geo_rs"), S_LOLD, s_batch())
    close(loss, -1.0 / 7.0)
    close(g, [[-1 / 7, -1 / 7], [0.0, 0.0], [0.0, 0.0], [0.5 / 7, 0.5 / 7]])
    assert stats["seq_masked_frac"] == 0.5
    close(stats["geo_min"], math.exp(-0.2))
    close(stats["geo_max"], math.exp(0.2))
    assert_detached(stats)


def test_s2_geo_rs_with_token_tis_on_the_kept_sequences():
    # row 0 weights min(3, 2) = 2 and 1/3; row 3: e^0.05 twice (C = 2)
    # L = (-(2 + 1/3) + 0.5 * 2 e^0.05) / 7
    loss, g, stats, _ = run(make_method("geo_rs", geo_rs_token_tis=True), S_LOLD, s_batch())
    e = math.exp(0.05)
    close(loss, (-(2.0 + 1.0 / 3.0) + e) / 7.0)
    close(g, [[-2 / 7, -(1 / 3) / 7], [0.0, 0.0], [0.0, 0.0], [0.5 * e / 7, 0.5 * e / 7]])
    close(stats["is_weights"], [[2.0, 1.0 / 3.0], [0.0, 0.0], [0.0, 0.0], [e, e]])


def test_s3_geo_rs_band_edges_and_verl_band():
    keep, log_g = geometric_keep(S_D, torch.tensor(S_MASK), 0.8, 1.25)  # wider band: every row kept
    assert keep.tolist() == [True, True, True, True]
    close(log_g, [0.0, 0.2, -0.2, 0.05])
    keep, _ = geometric_keep(S_D, torch.tensor(S_MASK), 0.999, 1.001)  # verl's preset: only the exact-mean-0 row
    assert keep.tolist() == [True, False, False, False]
    keep, log_g = geometric_keep(S_D, torch.zeros(4, 2, dtype=torch.bool), 1 / 1.1, 1.1)  # empty rows: g = 1, kept
    assert keep.all() and (log_g == 0).all()


def test_s4_geo_rs_geometric_mean_is_length_invariant():
    # the same per-token drift 0.06 on a 2-token and a 50-token answer: the same g = e^0.06, both kept, whereas
    # the product ratio (Seq-TIS) is e^0.12 against e^3
    short, long_ = torch.full((1, 50), 0.06, dtype=D), torch.full((1, 50), 0.06, dtype=D)
    mask_short = torch.zeros(1, 50, dtype=torch.bool)
    mask_short[0, :2] = True
    k1, g1 = geometric_keep(short, mask_short, 1 / 1.1, 1.1)
    k2, g2 = geometric_keep(long_, torch.ones(1, 50, dtype=torch.bool), 1 / 1.1, 1.1)
    close(g1, [0.06])
    close(g2, [0.06])
    assert bool(k1) and bool(k2)


# ---------------------------------------------------------------- opsm
# drift = log mu - log pi_theta per token; ltheta = lold = log 0.5 (r = 1)
O_DRIFT = tt([[0.8, 0.4],    # A = -1,   mean 0.6 > 0.5   -> masked
              [0.8, 0.4],    # A = +1,   mean 0.6          -> kept (positive advantage)
              [0.3, 0.5],    # A = -0.5, mean 0.4 <= 0.5   -> kept
              [0.6, -7.0]])  # A = -1,   mean 0.6 (2nd token padded) -> masked
O_MASK = [[True, True], [True, True], [True, True], [True, False]]
O_ADV = [-1.0, 1.0, -0.5, -1.0]
O_LOLD = torch.full((4, 2), LOG_HALF, dtype=D)


def test_o1_opsm_masks_negative_advantage_sequences_that_drifted():
    # kept rows 1 and 2; psi = -A: row 1 -> -1, -1; row 2 -> +0.5, +0.5; 7 valid tokens: L = (-2 + 1) / 7
    b = batch(O_LOLD, O_LOLD + O_DRIFT, O_ADV, O_MASK)
    loss, g, _, met = run(make_method("opsm"), O_LOLD, b)
    close(loss, -1.0 / 7.0)
    close(g, [[0.0, 0.0], [-1 / 7, -1 / 7], [0.5 / 7, 0.5 / 7], [0.0, 0.0]])
    assert met["seq_masked_frac"] == 0.5
    close(met["seq_log_ratio_mean"], (0.6 + 0.6 + 0.4 + 0.6) / 4)
    close(met["seq_log_ratio_max"], 0.6)


def test_o2_opsm_reads_the_current_policy_not_pi_old():
    # row 2: log mu - log pi_old = [0.3, 0.5] (mean 0.4, kept at theta_old), but the policy has moved:
    # ltheta = lold - 0.2 on row 2, so mean(log mu - ltheta) = 0.6 > 0.5 -> masked now.
    # Remaining: row 1 (r = 1, A = +1): L = -2/7
    b = batch(O_LOLD, O_LOLD + O_DRIFT, O_ADV, O_MASK)
    lt = O_LOLD.clone()
    lt[2] -= 0.2
    loss, g, _, met = run(make_method("opsm"), lt, b)
    close(loss, -2.0 / 7.0)
    close(g, [[0.0, 0.0], [-1 / 7, -1 / 7], [0.0, 0.0], [0.0, 0.0]])
    assert met["seq_masked_frac"] == 0.75
    # opsm_behaviour=recompute measures log pi_old - ltheta instead: row 2 drift 0.2 (kept), rows 0/1/3 drift 0
    # (kept): everything trains. row 2: r = e^-0.2 = 0.8187 (inside [0.8, 1.2]), psi = 0.5 r, dpsi/dlt = 0.5 r
    loss, g, _, met = run(make_method("opsm", opsm_behaviour="recompute"), lt, b)
    r = math.exp(-0.2)
    close(loss, (1.0 + 1.0 - 1.0 - 1.0 + 0.5 * r + 0.5 * r + 1.0) / 7.0)
    close(g, [[1 / 7, 1 / 7], [-1 / 7, -1 / 7], [0.5 * r / 7, 0.5 * r / 7], [1 / 7, 0.0]])
    assert met["seq_masked_frac"] == 0.0


def test_o3_opsm_threshold_is_strict_and_configurable():
    keep, d = opsm_keep(O_LOLD, O_LOLD + O_DRIFT, tt(O_ADV), torch.tensor(O_MASK), delta=0.6 + 1e-12)
    assert keep.all()  # D = 0.6 is not > 0.6
    close(d, [0.6, 0.6, 0.4, 0.6])
    keep, _ = opsm_keep(O_LOLD, O_LOLD + O_DRIFT, tt(O_ADV), torch.tensor(O_MASK), delta=0.3)
    assert keep.tolist() == [False, True, False, False]  # row 2 (A < 0, D = 0.4) joins


def test_o4_opsm_mask_carries_no_gradient():
    lt = O_LOLD.clone().requires_grad_(True)
    keep, d = opsm_keep(lt, O_LOLD + O_DRIFT, tt(O_ADV), torch.tensor(O_MASK), delta=0.5)
    assert not keep.requires_grad and not d.requires_grad


# ---------------------------------------------------------------- fp16
def test_f1_fp16_arm_is_the_uncorrected_recompute_loss():
    # the bf16/fp8 loss (N1 of test_methods): rho ignored, r = 1, L = 0, grad = -A / 2
    lold, lmu = torch.log(tt([[0.5], [0.2]])), torch.log(tt([[0.25], [0.4]]))
    loss, g, _, _ = run(make_method("fp16"), lold, batch(lold, lmu, [1.0, -1.0]))
    close(loss, 0.0)
    close(g, [[-0.5], [0.5]])


def test_f2_fp16_arm_sets_both_precisions(tmp_path):
    cfg = make_cfg(tmp_path, "method=fp16")
    validate(cfg)
    assert cfg.rollout.precision == "fp16" and cfg.train.dtype == "fp16"
    assert set(cfg.method) == {"name"}  # the trainer's dtype lives in train.*, not in the arm
    assert make_cfg(tmp_path, "method=fp16", "train.dtype=fp32").train.dtype == "fp32"  # still overridable
    with pytest.raises(ValueError, match="rollout.precision=bf16"):  # the fp16 baseline rolls out in fp16 only
        validate(make_cfg(tmp_path, "method=fp16", "rollout.precision=bf16"))
    assert make_cfg(tmp_path, "method=tis").train.dtype == "bf16"  # the other arms keep the default
    assert arm_precision("fp16") == "fp16"


def test_f3_fp16_format_rounds_to_the_ieee_half_grid():
    # spacing 2^-10 at 1: 1 + 2^-11 is a tie -> even (1); 1 + 3*2^-11 -> 1 + 2^-9; max 65504, 65520 -> inf;
    # 2^-25 (half the smallest subnormal 2^-24) -> 0 (tie to even), 3*2^-25 -> 2^-23
    x = tt([1 + 2**-11, 1 + 3 * 2**-11, 65504.0, 65519.0, 65520.0, 2**-25, 3 * 2**-25, -(1 + 2**-9)])
    codes, scale = quantize(x, "fp16", "per_tensor")
    close(codes * scale, [1.0, 1 + 2**-9, 65504.0, 65504.0, float("inf"), 0.0, 2**-23, -(1 + 2**-9)], atol=0)
    assert Quantizer("fp16").describe()["label"] == "FP16" and not Quantizer("fp16").is_scaled


def test_f4_fp16_linear_is_finer_than_bf16():
    # w = 1 + 2^-9 is exact in fp16 and rounds to 1 in bf16 (spacing 2^-7); x = [1, 0.25], w = [[1 + 2^-9, 2]]
    w, x = tt([[1 + 2**-9, 2.0]]).float(), tt([[1.0, 0.25]]).float()
    close(HalfLinear(w, None, torch.float32, torch.float16)(x).double(), [[1.5 + 2**-9]], atol=0)
    close(HalfLinear(w, None, torch.float32, torch.bfloat16)(x).double(), [[1.5]], atol=0)
    assert HalfLinear(w, None, torch.float16, torch.float16)(x).dtype == torch.float16


def test_f5_fp16_rollout_is_closer_to_the_trainer_than_bf16():
    import transformers as tr
    torch.manual_seed(0)
    model = tr.Qwen2ForCausalLM(tr.Qwen2Config(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                               num_key_value_heads=2, intermediate_size=128)).eval()
    ids = torch.randint(1, 128, (3, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(3, 6, dtype=torch.bool)
    gaps = {}
    for precision in ("bf16", "fp16"):
        engine = EmbeddedEngine(precision)
        engine.load_weights(model)
        r = engine.generate(ids, mask, 2, SamplingParams(8, 1.0), torch.Generator().manual_seed(0))
        with torch.no_grad():
            ref = token_logprobs(model, r, 1.0, "fp32")[0]
        gaps[precision] = float((ref - r.logp_mu).abs()[r.response_mask].mean())
        assert engine.decoder.lm_head.half == {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    assert 0 < gaps["fp16"] < gaps["bf16"] / 2, gaps  # 10 mantissa bits against 7
