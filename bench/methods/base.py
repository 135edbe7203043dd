"""The method interface: every treatment of the rollout/trainer mismatch is `prepare` + `loss`.

`prepare(batch)` runs once per rollout batch (pi_old fixed) and returns detached per-batch constants:
tensors whose first dimension is the batch size (sliced per minibatch by the trainer) and Python floats
(logged as metrics `method/<name>/<key>`). `loss(logp, batch, stats)` runs per minibatch with the trainer's
differentiable log pi_theta and returns the scalar loss and float metrics. The trainer never branches on
the method: everything method-specific lives behind this interface (methods.md, ../shared/DESIGN.md).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar

import torch


@dataclass
class Batch:
    """What a method sees of a rollout batch. All tensors are detached.

    logp_old  [B, T] log pi_old from the recompute pass, or None for methods that skip it
    logp_mu   [B, T] log mu returned by the rollout engine
    adv       [B]    sequence advantages (GRPO group-normalized), broadcast over tokens by the method
    mask      [B, T] bool, trained-on response tokens (non-finite log-probs already removed)
    n_tokens  token-mean denominator: valid tokens of the whole optimizer step (>= 1)
    logp_ref  [B, T] reference-model log-probs, only when kl_ref_beta > 0
    """

    logp_old: torch.Tensor | None
    logp_mu: torch.Tensor
    adv: torch.Tensor
    mask: torch.Tensor
    n_tokens: float
    logp_ref: torch.Tensor | None = None

    @property
    def size(self) -> int:
        return self.logp_mu.shape[0]

    def select(self, idx: torch.Tensor | slice) -> "Batch":
        """Rows `idx`; n_tokens becomes the selected rows' token count (one minibatch = one optimizer step)."""
        sub = {
            f.name: (getattr(self, f.name)[idx] if isinstance(getattr(self, f.name), torch.Tensor) else getattr(self, f.name))
            for f in fields(self)
        }
        sub["n_tokens"] = max(1.0, float(sub["mask"].sum()))
        return Batch(**sub)


def select_stats(stats: dict[str, Any], idx: torch.Tensor | slice, batch_size: int) -> dict[str, Any]:
    """Slice the per-row tensors of `prepare`'s output for a minibatch; keep scalars as they are."""
    return {
        k: (v[idx] if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == batch_size else v)
        for k, v in stats.items()
    }


class Method(ABC):
    """Base class: a treatment. Subclasses set `needs_recompute` and implement `loss` (and `prepare`)."""

    needs_recompute: ClassVar[bool] = True

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg
        self.name: str = cfg.name

    def setup_model(self, model: torch.nn.Module) -> dict[str, float]:
        """One-time change of the trainer's weights before training (UAQ); returns metrics. Default: none."""
        return {}

    def prepare(self, batch: Batch) -> dict[str, Any]:
        """Per-rollout-batch constants (detached). Default: none."""
        return {}

    @abstractmethod
    def loss(self, logp: torch.Tensor, batch: Batch, stats: dict[str, Any]) -> tuple[torch.Tensor, dict[str, float]]:
        """The scalar loss on one minibatch (differentiable in `logp`) and float metrics."""


REGISTRY: dict[str, type[Method]] = {}


def register(*names: str):
    """Class decorator: make a Method selectable as `method=<name>`."""

    def deco(cls: type[Method]) -> type[Method]:
        for n in names:
            REGISTRY[n] = cls
        return cls

    return deco


def build_method(cfg: Any) -> Method:
    """The Method named by cfg.name; an unknown name lists the valid ones."""
    import bench.methods  # noqa: F401  (imports every method module, filling REGISTRY)

    if cfg.name not in REGISTRY:
        raise ValueError(f"unknown method {cfg.name!r}; valid: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[cfg.name](cfg)


__all__ = ["Batch", "Method", "REGISTRY", "build_method", "register", "select_stats", "replace"]
