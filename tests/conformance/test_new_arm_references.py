"""The 2026 corrections at their own defaults (convention=ours) against independent float64 references.

Each reference below is written from the arm's formula in docs/arms.md §4.13-4.19 with numpy only (no bench/ code),
and compared with the arm's loss and its gradient w.r.t. log pi_theta on random batches: padding holding -inf,
advantages of both signs, pi_theta moved off pi_old so that PPO's clip is active on some tokens, and behaviour
log-ratios drawn so that every rule both keeps and drops (a few tokens that mu sampled 10^4 times more readily
than pi_old, for the veto). A case whose decision lies within 1e-9 of a band's edge is redrawn, so that rounding
cannot decide it. The non-vacuity check at the end asserts each arm dropped something and kept something.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from bench.methods.base import Batch, make_method

CASES = 60
EPS = 0.2  # algo.clip_eps_low / clip_eps_high defaults
EDGE = 1e-9


def ppo_psi_grad(r: np.ndarray, a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """psi(r, A) = max(-rA, -clip(r, 0.8, 1.2)A) and d psi / d log r (0 where the clip is active)."""
    psi = np.maximum(-r * a, -np.clip(r, 1 - EPS, 1 + EPS) * a)
    clipped = ((a > 0) & (r > 1 + EPS)) | ((a < 0) & (r < 1 - EPS))
    return psi, np.where(clipped, 0.0, -r * a)


def diff(a: np.ndarray, b: np.ndarray, m: np.ndarray) -> np.ndarray:
    """a - b on valid tokens, 0 on padding (where both hold -inf)."""
    return np.where(m, np.where(m, a, 0.0) - np.where(m, b, 0.0), 0.0)


def near(x: np.ndarray, edge: float) -> bool:
    return bool(np.any(np.abs(x - edge) < EDGE * max(1.0, abs(edge))))


def weighted_ppo(w, lt, lold, adv, m):
    """(loss, grad) of token-mean(w * psi(exp(lt - lold), A)) over every valid token (denominator=all)."""
    n = max(1.0, m.sum())
    r = np.exp(diff(lt, lold, m))
    psi, dpsi = ppo_psi_grad(r, adv)
    return float((w * psi * m).sum() / n), w * dpsi * m / n


def row_keep(stat, m, keep):
    """Broadcast a per-response decision to its valid tokens (an empty response has no tokens)."""
    return (keep(stat)[:, None] & m).astype(float)


def rows(x, m, how):
    xs = [x[i][m[i]] for i in range(len(x))]
    return np.array([how(v) if v.size else 0.0 for v in xs])


def ref_sequence_rule(stat_of, keep):
    def ref(lt, lold, lmu, adv, m):
        d = np.clip(diff(lold, lmu, m), -20, 20)
        stat = stat_of(d, m, lold, lmu)
        return row_keep(stat, m, keep), stat
    return ref


k2 = lambda d: d * d / 2
k3 = lambda d: np.exp(d) - 1 - d
p_diff = lambda m, lold, lmu: np.where(m, np.exp(np.where(m, lold, 0)) - np.exp(np.where(m, lmu, 0)), 0.0)

#: arm -> (weights(lt, lold, lmu, adv, m) -> (w, decision statistic), the statistic's band edges)
MASKS = {
    "trm_k2": (ref_sequence_rule(lambda d, m, *_: rows(k2(d), m, np.max), lambda s: s <= 2.5), (2.5,)),
    "trm_k3": (ref_sequence_rule(lambda d, m, *_: rows(k3(d), m, np.max), lambda s: s <= 2.5), (2.5,)),
    "k3_rs": (ref_sequence_rule(lambda d, m, *_: rows(k3(d), m, np.mean), lambda s: s <= 0.01), (0.01,)),
    "veto": (ref_sequence_rule(lambda d, m, *_: rows(d, m, np.min), lambda s: s >= math.log(1e-4)), (math.log(1e-4),)),
    "prob_diff_seq": (ref_sequence_rule(lambda d, m, lold, lmu: rows(p_diff(m, lold, lmu), m, np.mean),
                                        lambda s: (s >= -0.2) & (s <= 0.2)), (-0.2, 0.2)),
}


def ref_prob_diff(lt, lold, lmu, adv, m):
    d = p_diff(m, lold, lmu)
    return ((d >= -0.2) & (d <= 0.2) & m).astype(float), d[m]


def ref_m2po(lt, lold, lmu, adv, m):
    """Drop the largest m2 = (lold - lmu)^2 until the mean of the rest is < 0.04 (always keep the smallest)."""
    m2 = diff(lold, lmu, m) ** 2
    values = m2[m]
    order = np.argsort(-values, kind="stable")
    n_drop = len(values) - 1
    for k in range(len(values)):
        if values[order[k:]].mean() < 0.04:
            n_drop = k
            break
    kept = np.zeros(len(values), dtype=bool)
    kept[order[n_drop:]] = True
    w = np.zeros_like(m2)
    w[m] = kept
    means = np.array([values[order[k:]].mean() for k in range(len(values))])
    return w, means


def case(rng: np.random.Generator):
    """One random batch: (lt, lold, lmu, adv, mask) in float64, -inf at padding."""
    b, t = int(rng.integers(1, 5)), int(rng.integers(1, 7))
    m = rng.random((b, t)) < 0.85
    lmu = np.log(rng.uniform(0.01, 1.0, (b, t)))
    kind = rng.random((b, t))
    delta = np.where(kind < 0.6, rng.normal(0, 0.1, (b, t)), rng.normal(0, 1.2, (b, t)))
    lold = np.minimum(lmu + delta, 0.0)
    veto = kind > 0.97  # mu sampled it >= 10^4 times more readily than pi_old would have
    lold = np.where(veto, -11.0, lold)
    moved = np.where(rng.random((b, t)) < 0.25, rng.normal(0.5, 2.5, (b, t)), rng.normal(0, 0.15, (b, t)))
    lt = np.minimum(lold + moved, 0.0)  # pi_theta off pi_old: PPO's clip and CISPO's cap act on some tokens
    adv = rng.normal(0, 1, b)
    pad = lambda x: np.where(m, x, -np.inf)
    return pad(lt), pad(lold), pad(lmu), adv, m


def method_grad(method: str, lt, lold, lmu, adv, m):
    meth = make_method(method)
    mask = torch.as_tensor(m)
    b = Batch(torch.as_tensor(lold) if meth.needs_recompute else None, torch.as_tensor(lmu), torch.as_tensor(adv),
              mask, max(1.0, float(mask.sum())))
    x = torch.as_tensor(lt).clone().requires_grad_(True)
    stats = meth.prepare(b)
    loss, _ = meth.loss(x, b, stats)
    loss.backward()
    return loss.item(), x.grad.numpy()


def reference(method: str, lt, lold, lmu, adv, m):
    """(loss, grad, kept-token weights, ambiguous?) by the arm's formula."""
    a = np.broadcast_to(adv[:, None], m.shape)
    n = max(1.0, m.sum())
    if method in MASKS or method in ("prob_diff", "m2po"):
        fn, edges = MASKS.get(method, (ref_prob_diff if method == "prob_diff" else ref_m2po, (0.2, -0.2)))
        if method == "m2po":
            edges = (0.04,)
        w, stat = fn(lt, lold, lmu, adv, m)
        ambiguous = any(near(np.asarray(stat), e) for e in edges)
        if method == "m2po":  # the paper's unclipped ratio: psi = -rA
            r = np.exp(diff(lt, lold, m))
            return float((-w * r * a * m).sum() / n), -w * r * a * m / n, w, ambiguous
        loss, grad = weighted_ppo(w, lt, lold, a, m)
        return loss, grad, w, ambiguous
    if method == "cispo":  # -sg(clip(pi_theta/pi_old, 0, 5)) * A * ltheta
        r = np.exp(diff(lt, lold, m))
        w = np.clip(r, 0.0, 5.0) * m
        return float((-w * a * np.where(m, lt, 0)).sum() / n), -w * a / n, (r <= 5.0) * m, near(r[m], 5.0)
    if method == "dppo_tv":  # vs mu, advantage-signed probability trust region +-0.2, tau = 1e-3 (log r)^2
        lr = np.clip(diff(lt, lmu, m), -20, 20)
        r = np.exp(lr)
        d = np.where(m, np.exp(np.where(m, lt, 0)) - np.exp(np.where(m, lmu, 0)), 0.0)
        drop = np.where(a > 0, d > 0.2, d < -0.2) & m
        keep = (m & ~drop).astype(float)
        loss = (-a * r * keep).sum() / n + 1e-3 * (lr * lr * m).sum() / n
        grad = (-a * r * keep + 2e-3 * lr * m) / n
        return float(loss), grad, keep, near(d[m], 0.2) or near(d[m], -0.2)
    raise KeyError(method)


NEW_METHODS = ("trm_k2", "trm_k3", "k3_rs", "veto", "prob_diff", "prob_diff_seq", "m2po", "cispo", "dppo_tv")


@pytest.mark.parametrize("method", NEW_METHODS)
def test_new_arm_matches_its_float64_reference(method):
    rng = np.random.default_rng(sum(map(ord, method)))
    dropped = kept = done = 0
    while done < CASES:
        lt, lold, lmu, adv, m = case(rng)
        if not m.any():
            continue
        loss_ref, grad_ref, w, ambiguous = reference(method, lt, lold, lmu, adv, m)
        if ambiguous:
            continue
        loss, grad = method_grad(method, lt, lold, lmu, adv, m)
        assert loss == pytest.approx(loss_ref, rel=1e-9, abs=1e-12), (method, done)
        np.testing.assert_allclose(grad, grad_ref, rtol=1e-9, atol=1e-12, err_msg=f"{method} case {done}")
        assert np.isfinite(grad).all() and (grad[~m] == 0).all()
        dropped += int(((w == 0) & m).sum())
        kept += int(((w != 0) & m).sum())
        done += 1
    # non-vacuity: the random cases put tokens on both sides of the arm's rule (CISPO: clipped at 5 or not)
    assert dropped >= 3 and kept >= 0.1 * (dropped + kept), (method, dropped, kept)
