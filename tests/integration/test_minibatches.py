"""Several optimizer steps per rollout batch (train.minibatches, as the named sweeps set it): the PPO clip acts, and
ACR's widened upper bound makes `acr` train differently from `tis` (with one step per batch r = 1 at the only
update: clipfrac is 0 and acr equals tis step for step, issue 21)."""

from __future__ import annotations

import pytest

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
