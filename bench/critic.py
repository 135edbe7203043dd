"""PPO's learned critic: a value model V(s_t) over the rollout's response tokens, and its own optimizer step.

The value model is a transformer backbone with a scalar head, as verl builds it (a token-classification model
with one label, `critic.model.path` = the actor's model in the verl quickstart and FlashRL's GSM8K recipe).
By default the backbone is a copy of the policy's (the policy's weights at the start of RL, so both start from
the same model) with its LM head dropped; `algo.critic_path` loads a separate model instead (a local directory
or hub id, e.g. a bigger critic; it must use the policy's tokenizer, since it reads the rollout's token ids).

The head starts at zero, so V = 0 everywhere before the first update: GAE with gamma = lambda = 1 then gives
A_t = R (then whitened), a plain REINFORCE start, and no random numbers are drawn (the head is built under a
forked RNG), so adding a critic changes nothing else in the run's random streams.

Values are read exactly where the policy's log-probs are (bench/models/logprobs.py `sequence_inputs`): the
hidden state at the position before response token t is V(s_t), the state before t is generated. The critic
computes as the policy does (bench/compute.py): the trainer's device and dtype (rounded weights on CPU, autocast
on CUDA, loss scaling for fp16), the same micro-batches cut to their rows' extent (`train.micro_batch_size`,
`train.micro_batch_tokens`), the same gradient clip.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from bench.compute import Diverged, TrainerCompute, inverse, widened
from bench.gae import clipped_value_loss
from bench.grpo import masked_mean
from bench.models.logprobs import emulated_weights, forward, sequence_inputs
from bench.rollout.base import Rollout


class ValueModel(nn.Module):
    """backbone (a transformers base model: embeddings + decoder layers + final norm) + Linear(hidden, 1)."""

    def __init__(self, backbone: nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        with torch.random.fork_rng(devices=[]):  # built on the CPU under a forked RNG: no random stream moves
            head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(head.weight)
        nn.init.zeros_(head.bias)
        self.head = head.to(next(backbone.parameters()).device)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                use_cache: bool = False) -> torch.Tensor:
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                               use_cache=use_cache).last_hidden_state
        # a tensor of its own, not a view of the head's output: FSDP2 hooks this (root) output for its backward,
        # and an in-place op on a view of it would bypass the hook (and the pre-backward all-gather)
        return self.head(hidden.to(self.head.weight.dtype))[..., 0].clone()


def backbone_of(model: PreTrainedModel) -> nn.Module:
    """The base model under a causal-LM head (`model.model` for Llama/Qwen2/Qwen3)."""
    base = getattr(model, "base_model", None)
    if base is None or base is model:
        raise ValueError(f"{type(model).__name__} has no base model under its LM head to build a critic from")
    return base


def build_value_model(policy: PreTrainedModel, critic_path: str | None = None) -> ValueModel:
    """The critic: a copy of the policy's backbone (critic_path null) or the backbone of another model."""
    if critic_path is None:
        source = copy.deepcopy(policy)
    else:
        from bench.models.load import load_pretrained

        source, _ = load_pretrained(critic_path)  # on the host: onto the policy's device, where the trainer runs it
        source = source.to(next(policy.parameters()).device)
    source = source.float()  # the same mode as the policy (eval: no dropout)
    return ValueModel(backbone_of(source), source.config.hidden_size)


def token_values(model: ValueModel, rollout: Rollout, dtype: str = "fp32") -> torch.Tensor:
    """V(s_t) for every response position t, [B, T] float32 (masked positions hold finite garbage)."""
    ids, attn, pos = sequence_inputs(rollout)
    P = rollout.prompt_ids.shape[1]
    values = forward(model, dtype, input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False)
    return values[:, P - 1 :].float()


class Critic:
    """The value model, its AdamW, and one PPO value update per rollout batch (verl `update_critic`).

    `values(rollout)` runs before the policy update (the "old values" GAE needs); `update(...)` then regresses
    V on the GAE returns with the clipped value loss (bench/gae.py), over the same minibatches and epochs as
    the policy, with the policy's gradient clip and weight decay and its own learning rate.
    """

    def __init__(self, policy: PreTrainedModel, algo: Any, train: Any):
        self.model = build_value_model(policy, algo.critic_path)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=algo.critic_lr, weight_decay=train.weight_decay)
        self.algo, self.train = algo, train
        # the policy's compute settings, with a loss scaler of the critic's own (fp16)
        device = next(self.model.parameters()).device
        self.compute = TrainerCompute(device, train.dtype, 1.0, train.micro_batch_size,
                                      micro_batch_tokens=train.micro_batch_tokens)

    @torch.no_grad()
    def values(self, rollout: Rollout, minibatches: int | None = None) -> torch.Tensor:
        """The old values V(s_t) of a rollout batch, [B, T], no gradient, micro-batch by micro-batch (the update's
        minibatches by default, so that the update's first pass cuts its micro-batches the same way)."""
        minibatches = self.train.minibatches if minibatches is None else minibatches
        out = torch.zeros(rollout.response_ids.shape, device=rollout.response_ids.device)
        for (rows,) in self.compute.plan(rollout, minibatches):
            out[rows.to(out.device)] = self._values(rollout, rows)
        return out

    def _values(self, rollout: Rollout, rows: torch.Tensor) -> torch.Tensor:
        """V of `rows`, cut to their extent, [rows, T] at the rollout's width (zeros past the cut)."""
        part = self.compute.rows(rollout, rows)
        return widened(token_values(self.model, part, self.train.dtype), rollout.response_ids.shape[1])

    def update(self, rollout: Rollout, returns: torch.Tensor, old_values: torch.Tensor, mask: torch.Tensor,
               step: int) -> dict[str, float]:
        """Optimizer steps on the value loss; returns the mean metrics (critic/*)."""
        cfg, logs = self.train, defaultdict(list)
        for _ in range(cfg.epochs):
            for idx in torch.arange(rollout.batch_size).chunk(cfg.minibatches):
                idx = idx.to(mask.device)
                m = mask[idx]

                def loss_fn(v: torch.Tensor, idx: torch.Tensor = idx, m: torch.Tensor = m):
                    return clipped_value_loss(v, returns[idx], old_values[idx], m, self.algo.value_clip,
                                              self.algo.loss_agg, max(1.0, float(m.sum())))

                self.optimizer.zero_grad(set_to_none=True)
                loss, clipfrac, vpred = self._backward(rollout.select(idx), loss_fn, step)
                grad_norm = self.compute.step(self.model, self.optimizer, cfg.grad_clip, step)
                logs["critic/vf_loss"].append(loss.item())
                logs["critic/vf_clipfrac"].append(clipfrac)
                logs["critic/grad_norm"] += [] if grad_norm is None else [grad_norm]
                logs["critic/vpred_mean"].append(float(masked_mean(vpred, m.bool())))
        return {k: sum(v) / len(v) for k, v in logs.items() if v}

    def _backward(self, rollout: Rollout, loss_fn: Any, step: int) -> tuple[torch.Tensor, float, torch.Tensor]:
        """The value loss of one minibatch and its (scaled) gradient, as TrainerCompute.backward does for the
        policy: one pass, or with micro-batches the loss on detached values and d loss / d V pushed back per
        micro-batch. Raises Diverged on a non-finite loss before any gradient is written."""
        scaler, dtype = self.compute.scaler, self.train.dtype
        plan = self.compute.plan(rollout)
        with emulated_weights(self.model, dtype):
            if len(plan) == 1:
                ((rows,),) = plan
                vpred = self._values(rollout, rows)[inverse(rows).to(rollout.response_ids.device)]  # in row order
                loss, clipfrac = self._checked(loss_fn, vpred, step)
                scaler.scale(loss).backward()
                return loss.detach(), clipfrac, vpred.detach()
            leaf = self.values(rollout, minibatches=1).requires_grad_(True)
            loss, clipfrac = self._checked(loss_fn, leaf, step)
            (grad,) = torch.autograd.grad(scaler.scale(loss), leaf)
            for (rows,) in plan:
                self._values(rollout, rows).backward(grad[rows.to(grad.device)])
        return loss.detach(), clipfrac, leaf.detach()

    @staticmethod
    def _checked(loss_fn: Any, values: torch.Tensor, step: int) -> tuple[torch.Tensor, float]:
        loss, clipfrac = loss_fn(values)
        if not torch.isfinite(loss):
            raise Diverged(f"step {step}: non-finite critic loss ({loss.item()})")
        return loss, clipfrac

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "grad_scaler": self.compute.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.compute.load_state_dict(state.get("grad_scaler") or {})


__all__ = ["Critic", "ValueModel", "backbone_of", "build_value_model", "token_values"]
