"""How the trainer computes on its device: precision, micro-batches, gradient checkpointing, loss scaling.

The loop (bench/train.py) asks for three things and never branches on the device or the dtype:

    logprobs(model, rollout)        no-grad log-probs (recompute pass, reference model), micro-batch by micro-batch
    backward(model, rollout, loss)  the loss of one optimizer step on its whole minibatch, and its gradient
    step(model, optimizer)          unscale, clip, optimizer step (skipped by the fp16 loss scaler on overflow)

Precision (train.dtype): fp32 master weights and Adam states always; bf16/fp16 compute is autocast on CUDA and
rounded weights on CPU (bench.models.logprobs). fp16 adds a loss-scaling GradScaler: fp16 gradients underflow
below 6e-8, so the loss is scaled up before backward and the gradients scaled back before clipping; a step whose
scaled gradients overflow is skipped and the scale halved (torch.amp.GradScaler). On the CPU emulation the
gradients are fp32 anyway; the scaler still runs (power-of-two scaling is exact in fp32), so the mechanism is
exercised where it is tested.

Micro-batches (train.micro_batch_size): activation memory grows with the sequences in one forward, so a
minibatch is pushed through the model a few sequences at a time. The loss is still computed once, on the whole
minibatch's log-probs, so every method sees exactly what it would see unbatched (token-mean over the valid
tokens of the whole optimizer step, P3O's minibatch ESS, sequence-mean aggregations, their metrics):

    1. logp = concat over micro-batches of log pi_theta, no graph kept        (one extra forward)
    2. loss = method.loss(logp as a leaf); g = d loss / d logp                 (cheap: no model in the graph)
    3. per micro-batch: forward with graph, backward(g[rows])                 (gradients accumulate)

By the chain rule the accumulated gradient is the big-batch gradient; only the summation order differs. The
price is one forward per micro-batch beyond the usual forward + backward (about a third more model FLOPs, a
quarter with gradient checkpointing; more wall time where small GEMMs are inefficient: on the 1M CPU model,
4 micro-batches of 16 took the train part from 0.27 to 0.49 s). With `micro_batch_size` unset or >= the
minibatch, the plain single pass runs instead.

Gradient checkpointing (train.gradient_checkpointing): the HF model keeps only each decoder layer's input and
recomputes the layer inside backward (transformers' activation checkpointing, non-reentrant).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from bench.models.logprobs import emulated_weights, token_logprobs
from bench.rollout.base import Rollout

LossFn = Callable[[torch.Tensor], tuple[torch.Tensor, dict[str, float]]]


class Diverged(RuntimeError):
    """A non-finite loss or gradient: the run stops, keeps its metrics, and is marked diverged."""


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """transformers' activation checkpointing on every decoder layer, non-reentrant.

    HF checkpoints a layer only when that layer is in training mode. The trainer keeps its policy in eval mode
    (no dropout: the log-probs of the loss are those of the recompute pass and of the engine), so only the
    checkpointed layer modules themselves are flagged as training, not their children: dropout modules and
    attention dropout read their own flags and stay off.
    """
    from transformers.modeling_layers import GradientCheckpointingLayer

    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    if not layers:
        raise ValueError(f"{type(model).__name__} has no checkpointable decoder layers (train.gradient_checkpointing)")
    for layer in layers:
        layer.training = True


#: consecutive finite steps before the loss scale doubles again: verl's fp16 actor and Precision-RL use
#: ShardedGradScaler(growth_interval=400); torch's default 2000 regrows the scale 5x more slowly after an overflow
GROWTH_INTERVAL = 400


def make_grad_scaler(device: torch.device, dtype: str) -> torch.amp.GradScaler:
    """Enabled for fp16 only; a disabled scaler passes everything through unchanged. Initial scale 2^16, growth
    x2, backoff x0.5 (torch's defaults), growth_interval GROWTH_INTERVAL."""
    return torch.amp.GradScaler(device.type, enabled=dtype == "fp16", growth_interval=GROWTH_INTERVAL)


def micro_slices(n: int, size: int | None) -> list[slice]:
    """Row ranges of at most `size` rows covering 0..n (one range when size is None or >= n)."""
    size = n if size is None or size >= n else size
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


@dataclass
class TrainerCompute:
    """The trainer's compute settings (train.device / dtype / micro_batch_size), see the module docstring."""

    device: torch.device
    dtype: str
    temperature: float
    micro_batch_size: int | None = None
    scaler: torch.amp.GradScaler | None = None
    micro_batch_tokens: int | None = None  # no-grad passes: also at most this many tokens per forward

    def __post_init__(self) -> None:
        if self.scaler is None:
            self.scaler = make_grad_scaler(self.device, self.dtype)
        self.skipped = 0  # optimizer steps skipped by the loss scaler since the last scaler_metrics()

    @torch.no_grad()
    def logprobs(self, model: torch.nn.Module, rollout: Rollout, with_entropy: bool = False
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """log p of every response token [B, T] (and entropy), without a graph, micro-batch by micro-batch; each
        micro-batch is cut further to `micro_batch_tokens` tokens per forward (bit-identical, bench.models.logprobs),
        so long responses never hold a whole micro-batch's logits at once."""
        parts = [token_logprobs(model, rollout.select(s), self.temperature, self.dtype, with_entropy,
                                micro_batch_tokens=self.micro_batch_tokens)
                 for s in micro_slices(rollout.batch_size, self.micro_batch_size)]
        logp = torch.cat([p[0] for p in parts])
        return logp, (torch.cat([p[1] for p in parts]) if with_entropy else None)

    def backward(self, model: torch.nn.Module, rollout: Rollout, loss_fn: LossFn, step: int
                 ) -> tuple[torch.Tensor, dict[str, float], torch.Tensor, torch.Tensor]:
        """Loss of one optimizer step on `rollout` and its (scaled) gradient accumulated into the parameters.

        Returns (loss, metrics, log pi_theta detached, entropy). Raises Diverged on a non-finite loss, before
        any gradient is written.
        """
        slices = micro_slices(rollout.batch_size, self.micro_batch_size)
        if len(slices) == 1:
            with emulated_weights(model, self.dtype):
                logp, entropy = token_logprobs(model, rollout, self.temperature, self.dtype, with_entropy=True)
                loss, metrics = self._checked(loss_fn, logp, step)
                self.scaler.scale(loss).backward()
            return loss.detach(), metrics, logp.detach(), entropy
        logp, entropy = self.logprobs(model, rollout, with_entropy=True)
        leaf = logp.clone().requires_grad_(True)
        loss, metrics = self._checked(loss_fn, leaf, step)
        (grad,) = torch.autograd.grad(self.scaler.scale(loss), leaf)
        with emulated_weights(model, self.dtype):
            for s in slices:
                part, _ = token_logprobs(model, rollout.select(s), self.temperature, self.dtype)
                part.backward(grad[s])
        return loss.detach(), metrics, logp, entropy

    @staticmethod
    def _checked(loss_fn: LossFn, logp: torch.Tensor, step: int) -> tuple[torch.Tensor, dict[str, float]]:
        loss, metrics = loss_fn(logp)
        if not torch.isfinite(loss):
            raise Diverged(f"step {step}: non-finite loss ({loss.item()})")
        return loss, metrics

    def step(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, grad_clip: float, step: int
             ) -> float | None:
        """Unscale, clip to `grad_clip`, optimizer step; returns the gradient norm before clipping, or None when
        the loss scaler skipped the step.

        Without loss scaling a non-finite gradient norm is divergence. With it (fp16) it is an overflow of
        the scaled gradients: the scaler skips the step and halves its scale; only an overflow at a scale
        <= 1 (the unscaled gradients themselves are not finite) is divergence.
        """
        scaler = self.scaler
        scaler.unscale_(optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        if not torch.isfinite(grad_norm) and (not scaler.is_enabled() or scaler.get_scale() <= 1.0):
            raise Diverged(f"step {step}: non-finite gradient norm ({grad_norm.item()})")
        scaler.step(optimizer)
        scaler.update()
        if not torch.isfinite(grad_norm):
            self.skipped += 1
            return None
        return float(grad_norm)

    def scaler_metrics(self) -> dict[str, float]:
        """fp16 only: the loss scale now and the optimizer steps it skipped since the last call."""
        if not self.scaler.is_enabled():
            return {}
        out = {"grad_scale": float(self.scaler.get_scale()), "skipped_steps": float(self.skipped)}
        self.skipped = 0
        return out

    def state_dict(self) -> dict:
        return self.scaler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        if state:
            self.scaler.load_state_dict(state)


__all__ = ["GROWTH_INTERVAL", "Diverged", "LossFn", "TrainerCompute", "enable_gradient_checkpointing", "make_grad_scaler",
           "micro_slices"]
