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
hidden state at the position before response token t is V(s_t), the state before t is generated; the
trainer's dtype applies as it does to the policy (bf16 weights over fp32 masters, or autocast on CUDA).
"""

from __future__ import annotations

import copy
from collections import defaultdict
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from bench.gae import clipped_value_loss
from bench.grpo import masked_mean
from bench.models.logprobs import forward, sequence_inputs
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
        return self.head(hidden.to(self.head.weight.dtype)).squeeze(-1)


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

        source, _ = load_pretrained(critic_path)
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

    @torch.no_grad()
    def values(self, rollout: Rollout) -> torch.Tensor:
        """The old values V(s_t) of a rollout batch, [B, T], no gradient."""
        return token_values(self.model, rollout, self.train.dtype)

    def update(self, rollout: Rollout, returns: torch.Tensor, old_values: torch.Tensor, mask: torch.Tensor,
               step: int) -> dict[str, float]:
        """Optimizer steps on the value loss; returns the mean metrics (critic/*)."""
        from bench.train import Diverged  # the trainer's divergence error (imported here: train imports us)

        cfg, logs = self.train, defaultdict(list)
        for _ in range(cfg.epochs):
            for idx in torch.arange(rollout.batch_size).chunk(cfg.minibatches):
                m = mask[idx]
                vpred = token_values(self.model, rollout.select(idx), cfg.dtype)
                loss, clipfrac = clipped_value_loss(vpred, returns[idx], old_values[idx], m, self.algo.value_clip,
                                                    self.algo.loss_agg, max(1.0, float(m.sum())))
                if not torch.isfinite(loss):
                    raise Diverged(f"step {step}: non-finite critic loss ({loss.item()})")
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
                if not torch.isfinite(grad_norm):
                    raise Diverged(f"step {step}: non-finite critic gradient norm ({grad_norm.item()})")
                self.optimizer.step()
                logs["critic/vf_loss"].append(loss.item())
                logs["critic/vf_clipfrac"].append(clipfrac)
                logs["critic/grad_norm"].append(grad_norm.item())
                logs["critic/vpred_mean"].append(float(masked_mean(vpred.detach(), m.bool())))
        return {k: sum(v) / len(v) for k, v in logs.items()}

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])


__all__ = ["Critic", "ValueModel", "backbone_of", "build_value_model", "token_values"]
