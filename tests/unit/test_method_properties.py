"""Property tests (hypothesis) of the method interface: finiteness, bounds, reductions, registry."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import dataclasses

from bench.algo_config import AlgoConfig
from bench.methods.base import make_method
from bench.registry import METHODS
from bench.methods.ais import ais_alpha
from bench.methods.base import Batch
from bench.methods.ess import p3o_weights
from bench.mismatch import mismatch_metrics

D = torch.float64
NAMES = METHODS.names()  # every registered arm: a new one is tested without editing a list
SETTINGS = settings(max_examples=60, deadline=None)

logp_value = st.one_of(st.floats(-60.0, 0.0), st.floats(-1e4, 0.0), st.just(0.0))


@st.composite
def scenarios(draw, cap=st.floats(0.5, 10.0)):
    b, t = draw(st.integers(1, 4)), draw(st.integers(1, 5))

    def mat(elem):
        return [[draw(elem) for _ in range(t)] for _ in range(b)]

    mask = torch.tensor(mat(st.booleans()))
    lt, lold, lmu = (torch.tensor(mat(logp_value), dtype=D) for _ in range(3))
    neg_inf = torch.tensor(-math.inf, dtype=D)
    lt, lold, lmu = (torch.where(mask, x, neg_inf) for x in (lt, lold, lmu))  # -inf at masked positions
    adv = torch.tensor([draw(st.one_of(st.floats(-3.0, 3.0), st.just(0.0))) for _ in range(b)], dtype=D)
    return {"lt": lt, "lold": lold, "lmu": lmu, "adv": adv, "mask": mask, "C": draw(cap)}


def make(name, **kw):
    """The arm with those of `kw` it has: properties quantified over every arm pass a cap C to all of them,
    and only the arms with a cap take it (shared GRPO knobs always apply)."""
    if name not in METHODS:
        return make_method(name)  # raises, listing the valid names
    own = {f.name for f in dataclasses.fields(METHODS.schema(name))} | {f.name for f in dataclasses.fields(AlgoConfig)}
    return make_method(name, **{k: v for k, v in kw.items() if k in own})


def run(m, s, logp_old=None, lref=None):
    lold = s["lold"] if logp_old is None else logp_old
    b = Batch(lold if m.needs_recompute else None, s["lmu"], s["adv"], s["mask"], max(1.0, float(s["mask"].sum())), lref)
    lt = s["lt"].clone().requires_grad_(True)
    stats = m.prepare(b)
    loss, metrics = m.loss(lt, b, stats)
    loss.backward()
    return loss, lt.grad, stats, metrics


@SETTINGS
@given(
    s=scenarios(),
    name=st.sampled_from(NAMES),
    agg=st.sampled_from(["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]),
    dual=st.sampled_from([None, 3.0]),
    beta=st.sampled_from([0.0, 0.1]),
)
def test_finite_for_any_finite_inputs(s, name, agg, dual, beta):
    m = make(name, is_cap_C=s["C"], loss_agg=agg, dual_clip_c=dual, kl_ref_beta=beta)
    lref = torch.where(s["mask"], s["lold"].flip(-1).nan_to_num(neginf=-5.0), torch.tensor(-math.inf, dtype=D))
    loss, grad, stats, metrics = run(m, s, lref=lref)
    assert torch.isfinite(loss)
    assert torch.isfinite(grad).all()
    assert (grad[~s["mask"]] == 0).all()
    assert {"clipfrac", "ppo_kl"} <= set(metrics)
    assert 0.0 <= metrics["clipfrac"] <= 1.0
    assert all(math.isfinite(v) for v in metrics.values())
    for v in stats.values():
        if isinstance(v, float):
            assert math.isfinite(v)
        else:
            assert torch.isfinite(v).all() and not v.requires_grad


@SETTINGS
@given(s=scenarios())
def test_mismatch_metrics_finite(s):
    out = mismatch_metrics(s["lold"], s["lmu"], s["mask"], s["C"])
    assert all(math.isfinite(v) for v in out.values())
    assert out["mismatch/kl_k3"] >= 0.0 and out["mismatch/kl_k2"] >= 0.0
    assert 0.0 < out["mismatch/is_ess"] <= 1.0 + 1e-12


@SETTINGS
@given(s=scenarios(), name=st.sampled_from(["tis", "acr", "ais"]), level=st.sampled_from(["token", "sequence"]),
       mode=st.sampled_from(["truncate", "mask"]))
def test_weights_bounded_by_max_1_C(s, name, level, mode):
    kw = {"is_level": level, "is_mode": mode} if name == "tis" else {}
    stats = make(name, is_cap_C=s["C"], **kw).prepare(
        Batch(s["lold"], s["lmu"], s["adv"], s["mask"], 1.0)
    )
    w = stats["is_weights"]
    assert (w >= 0).all() and (w <= max(1.0, s["C"]) + 1e-12).all()
    assert (w[~s["mask"]] == 0).all()


@SETTINGS
@given(s=scenarios())
def test_p3o_weights_capped_by_ess(s):
    _, rho, ess = p3o_weights(s["lt"], s["lmu"], s["mask"])
    assert 0.0 < ess <= 1.0 + 1e-12
    assert (rho >= 0).all() and (rho <= ess).all() and not rho.requires_grad


@SETTINGS
@given(s=scenarios(), cap=st.floats(0.1, 10.0))
def test_ais_alpha_in_unit_interval(s, cap):
    rho_bar = torch.exp((s["lold"] - s["lmu"]).nan_to_num(0.0).clamp(-20, 20)).clamp(max=cap)
    out = ais_alpha(rho_bar, s["adv"], s["mask"])
    assert 0.0 <= out["alpha"] <= 1.0
    assert out["B"] >= 0.0 and out["V"] >= 0.0 and 0.0 < out["R"] <= 1.0 + 1e-12


@SETTINGS
@given(
    s=scenarios(cap=st.floats(1.0, 10.0)),
    name=st.sampled_from(["tis", "tis-seq", "tis-mask", "acr", "acr_uaq", "ais"]),
    dual=st.sampled_from([None, 3.0]),
)
def test_reduces_to_naive_when_mu_equals_pi_old(s, name, dual):
    s = dict(s, lmu=s["lold"])
    kw = {"tis-seq": {"is_level": "sequence"}, "tis-mask": {"is_mode": "mask"}}.get(name, {})
    loss, grad, stats, _ = run(make(name.split("-")[0], is_cap_C=s["C"], dual_clip_c=dual, **kw), s)
    ref_loss, ref_grad, _, _ = run(make("naive", dual_clip_c=dual), s)
    torch.testing.assert_close(loss, ref_loss, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(grad, ref_grad, atol=1e-12, rtol=1e-12)
    if name == "ais":
        assert stats["alpha"] == 0.0


@pytest.mark.parametrize("name", NAMES)
def test_registry_builds_every_arm(name):
    m = make(name)
    assert m.name == name and name in METHODS


@SETTINGS
@given(s=scenarios(), name=st.sampled_from([n for n in NAMES if not METHODS.get(n).needs_recompute]))
def test_bypass_arms_never_read_pi_old(s, name):
    """An arm without the recompute pass gets no log pi_old (Batch.logp_old None) and still trains."""
    loss, grad, _, _ = run(make(name, is_cap_C=s["C"]), s)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()


def test_unknown_method_lists_valid_names():
    with pytest.raises(ValueError) as e:
        make("nope")
    for name in NAMES:
        assert name in str(e.value)
