"""Several optimizer steps per rollout batch (train.minibatches, as the named sweeps set it): the PPO clip acts, and
ACR's widened upper bound makes `acr` train differently from `tis` (with one step per batch r = 1 at the only
update: clipfrac is 0 and acr equals tis step for step, issue 21)."""

from __future__ import annotations

import copy

import pytest

from bench.registry import ESTIMATORS, METHODS
from bench.launch.cli import execute
from bench.run.store import RunDir
from tests.helpers import make_cfg

pytestmark = pytest.mark.slow

# mxfp4 rollouts and C = 1.1: many tokens have rho > C, where ACR's upper bound (1 + eps) * rho / C exceeds TIS's;
# the smoke sweep's batch (8 prompts x 8), 4 minibatches x 2 epochs at lr 3e-4: r passes 1 + eps on such tokens
SETTING = ["train.batch_size=64", "train.group_size=8", "train.minibatches=4", "train.epochs=2", "train.lr=3e-4",
           "rollout.precision=mxfp4", "method.is_cap_C=1.1", "train.steps=3"]


def run(tmp_path, method: str, *extra: str) -> list[dict]:
    cfg = make_cfg(tmp_path / method, f"method={method}", *SETTING, *extra)
    assert execute(cfg) == "completed"
    return RunDir.of(cfg).metrics()


def test_clip_acts_and_acr_differs_from_tis(tmp_path):
    tis, acr = run(tmp_path, "tis"), run(tmp_path, "acr")
    assert any(r["train/clipfrac"] > 0 for r in tis) and any(r["train/clipfrac"] > 0 for r in acr)
    assert any(r["method/acr/frac_acr_active"] > 0 for r in acr)
    # the same seed, prompts and first rollout: identical until ACR's range first keeps a gradient TIS clips
    assert tis[0]["reward/mean"] == acr[0]["reward/mean"]
    assert any(a["train/loss"] != t["train/loss"] or a["train/clipfrac"] != t["train/clipfrac"] for a, t in zip(acr, tis))


def test_one_minibatch_never_clips(tmp_path):
    """The contrast (the named sweeps before issue 21): one optimizer step per batch, so r = 1 at the update and
    nothing is clipped."""
    rows = run(tmp_path, "tis", "train.minibatches=1", "train.epochs=1")
    assert all(r["train/clipfrac"] == 0 for r in rows)


# ---------------------------------------------------------------- micro-batches cut to their rows (issue 33 N4)
CUT = ["train.batch_size=8", "train.group_size=4", "train.micro_batch_size=2", "train.grad_clip=1e6",
       "algo.critic_lr=1e-4", "task.n_test=8"]


def close(a: float, b: float, tol: float = 1e-6) -> bool:
    """Equal to 1e-6 of the larger magnitude, or 1e-6 absolute below 1 (the cut forwards sum in another order:
    a log-prob moves by an ulp, ~1e-7, and a mismatch metric near 0 by as much in absolute terms)."""
    return a == b or abs(a - b) <= tol * max(1.0, abs(a), abs(b))


def tolerance(method: str) -> float:
    """1e-6; 1e-4 for an arm whose trainer computes at the rollout's precision (it overrides setup_trainer: the
    control, bench/methods/matched.py): its activations round to bf16 after each GEMM, so a summation order the cut
    changes moves a rounded value by a bf16 ulp now and then (measured: grad_norm 1.4e-5 relative at matched-grpo)."""
    cls = METHODS.entry(method).obj
    return 1e-4 if cls.setup_trainer is not METHODS.entry("naive").obj.setup_trainer else 1e-6


@pytest.mark.parametrize("adv", ESTIMATORS.names())
@pytest.mark.parametrize("method", METHODS.names())
def test_cut_micro_batches_train_what_uncut_ones_do(tmp_path, method, adv):
    """Micro-batches cut to their rows' extent (bench/compute.py) against the same step at the rollout's padded
    width, from the same state (the run's checkpoint, restored): every metric to 1e-6 (time/* and the padding
    share itself aside), fewer tokens processed, and the on-policy ratio of the first minibatch exactly 1 (the
    recompute and training passes cut alike).

    One step: the next one would start from weights that differ in the last bits, and the low-precision
    roundings of the trainer and of the engine (a bf16 ulp is 4e-3) turn some of those into larger differences,
    as any change of summation order would."""
    from bench.checkpoint import restore
    from bench.train import build, train_step

    parts = build(make_cfg(tmp_path, *CUT, f"method={method}", f"algo.advantage={adv}"))
    start = copy.deepcopy({"step": 0, **parts.state_dict()})
    rows = {}
    for cut in (True, False):
        restore(parts, copy.deepcopy(start))
        for compute in (parts.compute, getattr(getattr(parts.advantage, "critic", None), "compute", None)):
            if compute is not None:
                compute.cut = cut
        rows[cut] = train_step(parts, 0)
    fast, slow = rows[True], rows[False]
    assert fast.keys() == slow.keys()
    bad = {k: (fast[k], slow[k]) for k in fast
           if not k.startswith("time/") and k != "train/pad_fraction" and not close(fast[k], slow[k], tolerance(method))}
    assert not bad, bad
    assert fast["train/pad_fraction"] < slow["train/pad_fraction"]
    if METHODS.entry(method).obj.needs_recompute:
        assert fast["train/ppo_kl"] == 0.0  # one minibatch, one epoch: log pi_theta == log pi_old, bit for bit
