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

Micro-batches (train.micro_batch_size, train.micro_batch_tokens): activation memory grows with the tokens in one
forward, so a minibatch is pushed through the model a few sequences at a time. Its rows are sorted by length
(prompt + response, longest first) and cut into micro-batches of at most `micro_batch_size` rows and
`micro_batch_tokens` tokens (`micro_batches`); each micro-batch is cut to its own rows' extent (`cut`: the longest
real prompt, the longest response) instead of the rollout's padded width, so a short response no longer runs at
the longest one's length (a long tail of lengths, mean 1/5 of the longest, ran ~5x the tokens it needed). A row's
log-probs do not depend on which rows share its forward, nor on padding it does not attend to, so this changes
nothing but the summation order inside kernels (every metric equal to the uncut run to 1e-6,
tests/integration/test_minibatches.py). `train/pad_fraction` logs the padded share of the tokens the trainer's
forwards processed. The no-grad passes (recompute, reference, the exact backward's first pass) and the training
pass use the same micro-batches, cut the same way, so log pi_old and log pi_theta at theta_old are the same
computation: the on-policy ratio is exactly 1 in bf16 too.

The loss is still computed once, on the whole minibatch's log-probs, so every method sees exactly what it would
see unbatched (token-mean over the valid tokens of the whole optimizer step, P3O's minibatch ESS, sequence-mean
aggregations, their metrics):

    1. logp = the micro-batches' log pi_theta, no graph kept                  (one extra forward)
    2. loss = method.loss(logp as a leaf); g = d loss / d logp                 (cheap: no model in the graph)
    3. per micro-batch: forward with graph, backward(g[rows])                 (gradients accumulate)

By the chain rule the accumulated gradient is the big-batch gradient; only the summation order differs. The
price is one forward per micro-batch beyond the usual forward + backward (about a third more model FLOPs, a
quarter with gradient checkpointing; more wall time where small GEMMs are inefficient: on the 1M CPU model,
4 micro-batches of 16 took the train part from 0.27 to 0.49 s). When the minibatch is one micro-batch, the plain
single pass runs instead.

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


def row_extents(rollout: Rollout) -> tuple[torch.Tensor, torch.Tensor]:
    """(real prompt tokens, response tokens up to the last generated one) of every row, [B] long on the CPU.
    Prompts are left-padded and responses right-padded (bench.rollout.base.Rollout); a row without any token
    counts the whole width (it is never cut short)."""
    P, T = rollout.prompt_ids.shape[1], rollout.response_ids.shape[1]
    prompt = P - rollout.prompt_mask.int().argmax(1)  # from the first real token
    response = T - rollout.response_mask.int().flip(1).argmax(1)  # through the last generated one
    prompt = torch.where(rollout.prompt_mask.any(1), prompt, P)
    response = torch.where(rollout.response_mask.any(1), response, T)
    return prompt.cpu(), response.cpu()


def cut(rollout: Rollout) -> Rollout:
    """The rows of `rollout` cut to their own extent: the longest real prompt (left padding dropped) and the
    longest response (right padding dropped); every row keeps its tokens and their positions."""
    prompt, response = row_extents(rollout)
    p, t = int(prompt.max()), int(response.max())
    P = rollout.prompt_ids.shape[1]
    return Rollout(rollout.prompt_ids[:, P - p:], rollout.prompt_mask[:, P - p:], rollout.response_ids[:, :t],
                   rollout.response_mask[:, :t], rollout.logp_mu[:, :t])


def inverse(rows: torch.Tensor) -> torch.Tensor:
    """The permutation that puts the outputs of `rows` (a permutation of 0..n-1) back in row order:
    `x[rows][inverse(rows)] == x`."""
    out = torch.empty_like(rows)
    out[rows] = torch.arange(len(rows))
    return out


def widened(x: torch.Tensor, width: int) -> torch.Tensor:
    """[rows, t] -> [rows, width]: right-padded with zeros (the positions a cut pass did not compute)."""
    return x if x.shape[1] == width else torch.nn.functional.pad(x, (0, width - x.shape[1]))


def micro_batches(prompt: torch.Tensor, response: torch.Tensor, minibatches: int, rows_cap: int | None,
                  tokens_cap: int | None, world: int = 1) -> list[list[torch.Tensor]]:
    """The forwards of a batch: [micro-batch][rank] -> row indices, for rows of `prompt` + `response` tokens.

    Rows are taken minibatch by minibatch (`torch.arange(B).chunk(minibatches)`, the update's minibatches) and
    sorted by length (longest first; ties keep their order). Each micro-batch takes the next `world` x n rows, n
    as large as `rows_cap` rows per rank and `tokens_cap` tokens per rank allow (n x the micro-batch's longest
    prompt + longest response - 1; at least one row), and deals them to the ranks in contiguous parts of n, the
    longest to rank 0. Contiguous rather than round-robin: the step waits for the widest part either way, and the
    parts are then the micro-batches one process runs (with `rows_cap` dividing the minibatch), so a run computes
    the same forwards at every world size. Every rank runs the same number of forwards (FSDP2's collectives need
    it; an empty part is padded: bench/distributed/compute.py). A minibatch's plan is the same whether it is made for the
    whole batch or for the minibatch alone, so the recompute pass and the training pass cut identically."""
    out = []
    for rows in torch.arange(len(prompt)).chunk(minibatches):
        order = rows[torch.sort(prompt[rows] + response[rows], descending=True, stable=True).indices]
        i = 0
        while i < len(order):
            n, p, t = 0, 0, 0  # rows per rank so far, longest prompt and response so far
            while i + n * world < len(order):
                new = order[i + n * world: i + (n + 1) * world]
                p2, t2 = max(p, int(prompt[new].max())), max(t, int(response[new].max()))
                full = (rows_cap is not None and n + 1 > rows_cap) or (
                    tokens_cap is not None and (n + 1) * (p2 + t2 - 1) > tokens_cap)
                if n and full:
                    break
                n, p, t = n + 1, p2, t2
            parts = list(order[i: i + n * world].split(n))
            out.append(parts + [order[:0]] * (world - len(parts)))
            i += n * world
    return out


@dataclass
class TrainerCompute:
    """The trainer's compute settings (train.device / dtype / micro_batch_size / micro_batch_tokens), see the
    module docstring. `cut=False` runs every micro-batch at the rollout's padded width (the behaviour before
    micro-batches were cut; tests compare the two)."""

    device: torch.device
    dtype: str
    temperature: float
    micro_batch_size: int | None = None
    scaler: torch.amp.GradScaler | None = None
    micro_batch_tokens: int | None = None
    cut: bool = True

    def __post_init__(self) -> None:
        if self.scaler is None:
            self.scaler = make_grad_scaler(self.device, self.dtype)
        self.skipped = 0  # optimizer steps skipped by the loss scaler since the last metrics()
        self.tokens = [0, 0]  # tokens the forwards processed, and how many of them were padding, since metrics()

    def plan(self, rollout: Rollout, minibatches: int = 1, world: int = 1) -> list[list[torch.Tensor]]:
        """The micro-batches of `rollout` (`micro_batches`); uncut, every row counts the padded width."""
        prompt, response = row_extents(rollout)
        if not self.cut:
            prompt = torch.full_like(prompt, rollout.prompt_ids.shape[1])
            response = torch.full_like(response, rollout.response_ids.shape[1])
        return micro_batches(prompt, response, minibatches, self.micro_batch_size, self.micro_batch_tokens, world)

    def rows(self, rollout: Rollout, rows: torch.Tensor) -> Rollout:
        """The rows of one forward, cut to their extent (unless `cut` is off), counted for `train/pad_fraction`."""
        part = rollout.select(rows.to(rollout.response_ids.device))
        part = cut(part) if self.cut else part
        prompt, response = row_extents(part)
        width = part.prompt_ids.shape[1] + part.response_ids.shape[1] - 1
        self.tokens[0] += len(rows) * width
        self.tokens[1] += len(rows) * width - int((prompt + response - 1).sum())
        return part

    def _pass(self, model: torch.nn.Module, rollout: Rollout, rows: torch.Tensor, with_entropy: bool
              ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """log-probs (and entropy) of `rows`, [rows, T] at the rollout's full width (zeros past a cut)."""
        logp, entropy = token_logprobs(model, self.rows(rollout, rows), self.temperature, self.dtype, with_entropy)
        T = rollout.response_ids.shape[1]
        return widened(logp, T), (widened(entropy, T) if entropy is not None else None)

    @torch.no_grad()
    def logprobs(self, model: torch.nn.Module, rollout: Rollout, with_entropy: bool = False, minibatches: int = 1
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """log p of every response token [B, T] (and entropy), without a graph, micro-batch by micro-batch
        (`minibatches`: the update's, so that these passes cut exactly as the training pass will)."""
        B, T = rollout.response_ids.shape
        logp = torch.zeros(B, T, device=rollout.response_ids.device)
        entropy = torch.zeros_like(logp) if with_entropy else None
        for (rows,) in self.plan(rollout, minibatches):
            lp, ent = self._pass(model, rollout, rows, with_entropy)
            logp[rows.to(logp.device)] = lp
            if entropy is not None:
                entropy[rows.to(logp.device)] = ent
        return logp, entropy

    def backward(self, model: torch.nn.Module, rollout: Rollout, loss_fn: LossFn, step: int
                 ) -> tuple[torch.Tensor, dict[str, float], torch.Tensor, torch.Tensor]:
        """Loss of one optimizer step on `rollout` (one minibatch) and its (scaled) gradient accumulated into the
        parameters.

        Returns (loss, metrics, log pi_theta detached, entropy). Raises Diverged on a non-finite loss, before
        any gradient is written.
        """
        plan = self.plan(rollout)
        if len(plan) == 1:
            ((rows,),) = plan
            with emulated_weights(model, self.dtype):
                part, ent = self._pass(model, rollout, rows, with_entropy=True)
                order = inverse(rows).to(part.device)  # the plan sorted the rows by length
                logp, entropy = part[order], ent[order]
                loss, metrics = self._checked(loss_fn, logp, step)
                self.scaler.scale(loss).backward()
            return loss.detach(), metrics, logp.detach(), entropy
        logp, entropy = self.logprobs(model, rollout, with_entropy=True)
        leaf = logp.clone().requires_grad_(True)
        loss, metrics = self._checked(loss_fn, leaf, step)
        (grad,) = torch.autograd.grad(self.scaler.scale(loss), leaf)
        with emulated_weights(model, self.dtype):
            for (rows,) in plan:
                part, _ = self._pass(model, rollout, rows, with_entropy=False)
                part.backward(grad[rows.to(grad.device)])
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

    def metrics(self) -> dict[str, float]:
        """Since the last call: the padded share of the tokens the forwards processed (`pad_fraction`); fp16 only,
        the loss scale now and the optimizer steps it skipped."""
        processed, padded = self.tokens
        out = {"pad_fraction": padded / processed} if processed else {}
        self.tokens = [0, 0]
        if self.scaler.is_enabled():
            out |= {"grad_scale": float(self.scaler.get_scale()), "skipped_steps": float(self.skipped)}
            self.skipped = 0
        return out

    def state_dict(self) -> dict:
        return self.scaler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        if state:
            self.scaler.load_state_dict(state)


__all__ = ["GROWTH_INTERVAL", "Diverged", "LossFn", "TrainerCompute", "cut", "enable_gradient_checkpointing", "inverse",
           "make_grad_scaler", "micro_batches", "row_extents", "widened"]
