"""Advantage estimators, `algo.advantage`: where the advantage of every token comes from.

    grpo   group-normalized outcome rewards, one advantage per response [B] (bench/grpo.py group_advantages)
    gae    PPO with a learned critic: outcome reward on the last token, GAE(gamma, lambda) over the critic's
           values, whitened over the batch: one advantage per token [B, T] (bench/gae.py, bench/critic.py)

The trainer calls `estimate` once per rollout batch (before the policy update) and `update` once after it (the
critic's own optimizer steps; nothing for GRPO), and checkpoints `state_dict`. The arms never see which
estimator ran: they receive `Batch.adv` ([B] or [B, T]) and apply their corrections to the policy loss exactly
as with GRPO (bench/methods/base.py `token_advantages`).

Each estimator registers itself in `ESTIMATORS` (bench/registry.py) under the name `algo.advantage` takes, and is
built as `cls(algo, train, policy)`.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from bench.critic import Critic
from bench.gae import gae_from_outcome
from bench.grpo import group_advantages
from bench.registry import ESTIMATORS
from bench.rollout.base import Rollout



class AdvantageEstimator(Protocol):
    def estimate(
        self, rollout: Rollout, rewards: torch.Tensor, keep: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Advantages ([B] or [B, T], detached) of a rollout batch and metrics; remembers what `update` needs.
        `keep` [B] (algo.baseline=kept, GRPO only): the responses that make each group's baseline."""

    def update(self, rollout: Rollout, mask: torch.Tensor, step: int) -> dict[str, float]:
        """After the policy update: train whatever the estimator learns (the critic); returns metrics."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@ESTIMATORS.register("grpo")
class GRPOAdvantage:
    """(R_i - mean_g R) / (std_g R + eps) per group of `train.group_size` responses; stateless."""

    def __init__(self, algo: Any, train: Any, policy: torch.nn.Module | None = None):
        self.algo, self.group_size = algo, train.group_size

    def estimate(
        self, rollout: Rollout, rewards: torch.Tensor, keep: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        adv = group_advantages(rewards, self.group_size, eps=self.algo.adv_eps, norm_by_std=self.algo.norm_adv_by_std,
                               keep=keep)
        return adv, {}

    def update(self, rollout: Rollout, mask: torch.Tensor, step: int) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


@ESTIMATORS.register("gae")
class GAEAdvantage:
    """PPO: the critic's values V(s_t) on the rollout, GAE advantages and returns, then a value update."""

    def __init__(self, algo: Any, train: Any, policy: torch.nn.Module):
        self.algo = algo
        self.critic = Critic(policy, algo, train)
        self._targets: tuple[torch.Tensor, torch.Tensor] | None = None  # (old values, returns) of the last batch

    def estimate(
        self, rollout: Rollout, rewards: torch.Tensor, keep: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        if keep is not None:
            raise ValueError("GAE advantages have no group baseline to re-centre (algo.baseline=kept is GRPO's)")
        mask = rollout.response_mask.bool()
        values = torch.where(mask, self.critic.values(rollout), torch.zeros(()))
        adv, returns = gae_from_outcome(rewards, values, mask, self.algo.gamma, self.algo.lam,
                                        whiten=self.algo.whiten_advantages)
        self._targets = (values, returns)
        n = max(1, int(mask.sum()))
        return adv, {"critic/values_mean": float(values.sum()) / n, "critic/returns_mean": float(returns.sum()) / n}

    def update(self, rollout: Rollout, mask: torch.Tensor, step: int) -> dict[str, float]:
        if self._targets is None:
            raise RuntimeError("GAEAdvantage.update before estimate: no old values/returns for this batch")
        values, returns = self._targets
        self._targets = None
        return self.critic.update(rollout, returns, values, mask, step)

    def state_dict(self) -> dict[str, Any]:
        return {"critic": self.critic.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.critic.load_state_dict(state["critic"])


def build_estimator(cfg: Any, policy: torch.nn.Module) -> AdvantageEstimator:
    """The estimator `cfg.algo.advantage` names (checked by bench.launch.config.check_across)."""
    return ESTIMATORS.get(cfg.algo.advantage)(cfg.algo, cfg.train, policy)


__all__ = ["AdvantageEstimator", "GAEAdvantage", "GRPOAdvantage", "build_estimator"]
