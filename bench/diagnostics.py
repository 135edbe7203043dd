"""QuRL's weight diagnostics (Eq. 13-14), per linear-layer type, for every run that can log them.

normalized weight update  ||W_{k+1} - W_k||^2 / ||W_k||^2   (how far one optimizer step moves the weights)
normalized quant error    ||Q(W) - W||^2 / ||W||^2           (how far the rollout copy is from the trainer's)
QuRL's UAQ argument is that the first must dominate the second for quantized rollouts to track training.
Sums are taken over all layers of a type before the ratio, so a type's number is one weighted average.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from bench.quant.quantizers import fake_quant

LAYER_TYPES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def linear_weights(model: torch.nn.Module) -> dict[str, list[torch.Tensor]]:
    """Decoder linear weights grouped by layer type (the name's last component)."""
    groups: dict[str, list[torch.Tensor]] = defaultdict(list)
    for name, p in model.named_parameters():
        parts = name.split(".")
        if len(parts) >= 2 and parts[-1] == "weight" and parts[-2] in LAYER_TYPES:
            groups[parts[-2]].append(p)
    return groups


def snapshot(model: torch.nn.Module) -> dict[str, list[torch.Tensor]]:
    return {k: [w.detach().clone() for w in ws] for k, ws in linear_weights(model).items()}


def weight_update(before: dict[str, list[torch.Tensor]], model: torch.nn.Module) -> dict[str, float]:
    out = {}
    for kind, ws in linear_weights(model).items():
        num = sum(float((w.detach() - b).pow(2).sum()) for w, b in zip(ws, before[kind]))
        den = sum(float(b.pow(2).sum()) for b in before[kind])
        out[f"quant/weight_update/{kind}"] = num / max(den, 1e-30)
    return out


def quant_error(model: torch.nn.Module, fmt: str, granularity: str) -> dict[str, float]:
    out = {}
    with torch.no_grad():
        for kind, ws in linear_weights(model).items():
            num = sum(float((fake_quant(w.float(), fmt, granularity) - w.float()).pow(2).sum()) for w in ws)
            den = sum(float(w.float().pow(2).sum()) for w in ws)
            out[f"quant/quant_error/{kind}"] = num / max(den, 1e-30)
    return out
