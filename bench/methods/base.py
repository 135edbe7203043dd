"""The method interface: every treatment of the rollout/trainer mismatch is `prepare` + `loss`.

`prepare(batch)` runs once per rollout batch (pi_old fixed) and returns detached per-batch constants:
tensors whose first dimension is the batch size (sliced per minibatch by the trainer) and Python floats
(logged as metrics `method/<name>/<key>`). `loss(logp, batch, stats)` runs per minibatch with the trainer's
differentiable log pi_theta and returns the scalar loss and float metrics. The trainer never branches on
the method: everything method-specific lives behind this interface (docs/arms.md).

An arm is one module in this package plus one yaml in conf/method/:

    @dataclass
    class TISConfig(MethodConfig):            # the arm's own knobs (and nothing else)
        is_cap_C: float = 2.0

    @METHODS.register("tis", schema=TISConfig, color="#0072B2", order=30)
    class TIS(Method): ...

The registry key is the arm's only name (its yaml, conf/method/tis.yaml, states knob values, never the name).
An arm runs at any rollout precision (`rollout.precision`, bench.methods.DEFAULT_LOW_PRECISION unless set), except a
matched-precision baseline, which declares its precision (`precision="bf16"`) and runs at that one only.
`color` and `order` place the arm in plots and tables (omitted: a colour derived from the name, after the
known arms); the class attribute `diagnostics` names the `method/<arm>/*` metrics worth a panel in the
report. Both are written into every run's run.json, so the analysis never imports this package.
The GRPO knobs every arm shares (clip range, aggregation, reference KL, ...) are not here: `algo.*`
(bench.algo_config.AlgoConfig) reaches every method as `self.algo`.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import torch
from omegaconf import MISSING, OmegaConf

from bench.domains import num
from bench.algo_config import AlgoConfig
from bench.registry import METHODS


@dataclass
class MethodConfig:
    """Keys every arm has. An arm's schema extends it with that arm's own knobs only, so a run's config
    carries no other arm's settings and an override of another arm's knob fails at start-up."""

    name: str = MISSING

    def check(self) -> None:
        """Value checks a type cannot express; raise ValueError naming the key and the valid range."""


#: where a dropped token goes in the token-mean: "all" keeps it in the denominator with weight 0 (ours; TRL, SkyRL,
#: AReaL's rejection sampling, miles, prime-rl), "kept" removes it (verl's rollout_rs, ROLL's filters, AReaL's
#: M2PO): the loss is then ours x N / N_kept (docs/arms.md §8)
DENOMINATORS = ("all", "kept")


@dataclass
class MaskingConfig(MethodConfig):
    """Keys of an arm that drops tokens or whole responses (weight 0): where the dropped tokens count."""

    denominator: str = "all"  # all | kept (DENOMINATORS)

    def check(self) -> None:
        if self.denominator not in DENOMINATORS:
            raise ValueError(f"method.denominator={self.denominator!r} is not valid; choose one of: "
                             f"{', '.join(DENOMINATORS)}")


def is_cap_c(default: float = 2.0) -> Any:
    """The field `is_cap_C`: the cap C on pi_old/mu of every arm that truncates or bands it (TIS, Seq-MIS, ACR,
    AIS, Geo-RS's token TIS), its domain declared once here."""
    return num(default, "(0, inf)")


@dataclass
class Batch:
    """What a method sees of a rollout batch. All tensors are detached.

    logp_old  [B, T] log pi_old from the recompute pass, or None for methods that skip it
    logp_mu   [B, T] log mu returned by the rollout engine
    adv       [B]    sequence advantages (GRPO group-normalized), broadcast over tokens by the method, or
              [B, T] per-token advantages (PPO's critic + GAE); methods read it through `token_advantages`
    mask      [B, T] bool, trained-on response tokens (non-finite log-probs already removed)
    n_tokens  token-mean denominator: valid tokens of the whole optimizer step (>= 1)
    logp_ref  [B, T] reference-model log-probs, only when algo.kl_ref_beta > 0
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

    def drop_nonfinite(self, logp: torch.Tensor) -> "Batch":
        """This batch without the tokens whose log pi_theta (`logp`, the trainer's forward) is non-finite
        (docs/arms.md §1: like non-finite log pi_old / log mu, they leave the mask and the token-mean
        denominator). Returns `self` when every valid token is finite."""
        keep = torch.isfinite(logp.detach())
        if bool(keep[self.mask.bool()].all()):
            return self
        mask = self.mask.bool() & keep
        return dataclasses.replace(self, mask=mask, n_tokens=max(1.0, float(mask.sum())))


def token_advantages(adv: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The [B, T] advantage of every token: sequence advantages [B] broadcast over the tokens (GRPO), per-token
    advantages [B, T] as they are (GAE). Detached, in `like`'s dtype. The arms apply their corrections to the
    policy loss the same way whichever estimator made the advantages."""
    a = adv.detach().to(like.dtype)
    if a.dim() == 1:
        return a[:, None].expand_as(like)
    if a.shape != like.shape:
        raise ValueError(f"per-token advantages {tuple(a.shape)} do not match the log-probs {tuple(like.shape)}")
    return a


def select_stats(stats: dict[str, Any], idx: torch.Tensor | slice, batch_size: int) -> dict[str, Any]:
    """Slice the per-row tensors of `prepare`'s output for a minibatch; keep scalars as they are."""
    return {
        k: (v[idx] if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == batch_size else v)
        for k, v in stats.items()
    }


class Method(ABC):
    """Base class: a treatment. Subclasses set `needs_recompute` and implement `loss` (and `prepare`)."""

    needs_recompute: ClassVar[bool] = True
    #: metric key (of `method/<arm>/<key>`) -> panel title in the report's diagnostics figure
    diagnostics: ClassVar[dict[str, str]] = {}
    #: the keys of `method/<arm>/<key>` that every training step writes (train/* holds loss, clipfrac, ppo_kl);
    #: the diagnostics are among them. tests/integration/test_arms.py checks each registered arm's.
    metric_keys: ClassVar[tuple[str, ...]] = ()
    #: True when a term of the loss acts on tokens the arm dropped (dppo_tv's (log r)^2): an all-dropped batch then
    #: still has a loss, the one at zero advantages (tests/conformance/)
    regularizes_dropped: ClassVar[bool] = False

    def __init__(self, cfg: Any, algo: Any) -> None:
        self.cfg = cfg
        self.algo = algo
        self.name: str = cfg.name

    def setup_model(self, model: torch.nn.Module) -> dict[str, float]:
        """One-time change of the trainer's weights before training (UAQ); returns metrics. Default: none."""
        return {}

    @classmethod
    def check_run(cls, cfg: Any) -> None:
        """Checks of the whole run config this arm needs (other sections than method.*), before any work; raise
        ValueError naming the bad value and the valid choices. Default: none."""

    def setup_trainer(self, model: torch.nn.Module, rollout: Any) -> None:
        """At every build (a start and every resume), before training: how the trainer's model computes, never its
        weights (the on-policy control computes at the rollout's precision: bench/methods/matched.py). `rollout` is
        the run's rollout.* config. Default: as it is."""

    def prepare(self, batch: Batch) -> dict[str, Any]:
        """Per-rollout-batch constants (detached). Default: none."""
        return {}

    def kept_tokens(self, batch: Batch, stats: dict[str, Any], logp: torch.Tensor) -> torch.Tensor | None:
        """Bool [B, T]: the valid tokens this arm trains on with a nonzero weight, at log pi_theta = `logp`
        (the trainer passes theta_old's); None when the arm drops none. Feeds mismatch/kl_k3_{masked,unmasked}
        (prime-rl's masked/unmasked mismatch KL)."""
        return None

    def sequence_aggregation(self) -> str:
        """How the arm reduces a response's token log-ratios to the one number it tests or weights by: "token"
        (no per-response statistic), "sum" (the product ratio, which compounds with length), "mean" (the
        geometric mean, length-invariant) or "max" (the worst token). docs/arms.md §5 lists it per arm;
        tests/conformance/ checks it on a response whose tokens are duplicated."""
        return "token"

    def rejected_rows(self, batch: Batch, stats: dict[str, Any]) -> torch.Tensor | None:
        """Bool [B]: the non-empty responses `prepare` dropped entirely, before any update and whatever their
        advantage (so that algo.baseline=kept can take them out of their group's baseline); None: none."""
        return None

    @abstractmethod
    def loss(self, logp: torch.Tensor, batch: Batch, stats: dict[str, Any]) -> tuple[torch.Tensor, dict[str, float]]:
        """The scalar loss on one minibatch (differentiable in `logp`) and float metrics."""


def build_method(cfg: Any, algo: Any) -> Method:
    """The Method named by cfg.name, with its own knobs `cfg` and the shared GRPO knobs `algo`."""
    return METHODS.get(cfg.name)(cfg, algo)


def method_info(name: str) -> dict[str, Any]:
    """What a method declares about itself for reports (run.json's "method"): colour, order, diagnostics."""
    entry = METHODS.entry(name)
    return {**entry.meta, "diagnostics": dict(entry.obj.diagnostics)}


def make_method(name: str, **knobs: Any) -> Method:
    """A method from keyword knobs, each routed to `algo` or to the arm's schema (for tests and scripts).

    A knob that is neither a GRPO knob nor one of the arm's raises, as the CLI does.
    """
    schema = METHODS.schema(name)
    algo_keys = {f.name for f in dataclasses.fields(AlgoConfig)}
    arm_keys = {f.name for f in dataclasses.fields(schema)}
    unknown = set(knobs) - algo_keys - arm_keys
    if unknown:
        raise ValueError(f"method {name!r} has no knob(s) {sorted(unknown)}; its knobs: {sorted(arm_keys - {'name'})}")
    cfg = OmegaConf.structured(schema(name=name, **{k: v for k, v in knobs.items() if k in arm_keys}))
    algo = OmegaConf.structured(AlgoConfig(**{k: v for k, v in knobs.items() if k in algo_keys}))
    return build_method(cfg, algo)


__all__ = ["Batch", "DENOMINATORS", "MaskingConfig", "Method", "MethodConfig", "method_info", "build_method", "make_method",
           "select_stats", "token_advantages"]
