"""QuRL's weight diagnostics (Eq. 13-14), per linear-layer type.

normalized weight update  ||W_{k+1} - W_k||^2 / ||W_k||^2   (how far one optimizer step moves the weights;
                                                             measured by the trainer around its update)
normalized quant error    ||Q(W) - W||^2 / ||W||^2           (how far the rollout copy is from the trainer's;
                                                             measured by the engine as it quantizes)
QuRL's UAQ argument is that the first must dominate the second for quantized rollouts to track training.
Sums are taken over all layers of a type before the ratio, so a type's number is one weighted average.
"""

from __future__ import annotations

from collections import defaultdict

import torch

LAYER_TYPES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def layer_type(name: str) -> str | None:
    """q_proj, ..., down_proj for a module or parameter name of a Llama/Qwen decoder, else None."""
    parts = name.split(".")
    for part in reversed(parts[-2:]):
        if part in LAYER_TYPES:
            return part
    return None


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
    """`quant/weight_update/<type>` between a `snapshot` and the model now."""
    out = {}
    for kind, ws in linear_weights(model).items():
        num = sum(_total((w.detach() - b).pow(2).sum()) for w, b in zip(ws, before[kind]))
        den = sum(_total(b.pow(2).sum()) for b in before[kind])
        out[f"quant/weight_update/{kind}"] = num / max(den, 1e-30)
    return out


def _total(x: torch.Tensor) -> float:
    """A scalar as a float; the sum over every shard for a sharded (DTensor) weight, not this rank's part."""
    return float(x.full_tensor() if hasattr(x, "full_tensor") else x)


class QuantErrors:
    """`quant/quant_error/<type>`, accumulated by an engine while it quantizes the trainer's weights.

    `add` takes the original weight [out, in], the weight the engine actually computes with, and which row
    ranges belong to which layer type (a fused QKV or gate/up layer holds several), so the number is the
    engine's real error, fused per-tensor scales included.
    """

    def __init__(self) -> None:
        self.num: dict[str, float] = defaultdict(float)
        self.den: dict[str, float] = defaultdict(float)

    @torch.no_grad()
    def add(self, original: torch.Tensor, quantized: torch.Tensor, parts: list[tuple[str | None, int]]) -> None:
        w, wq, row = original.detach().float(), quantized.detach().float(), 0
        for kind, rows in parts:
            if kind is not None:
                self.num[kind] += float((wq[row : row + rows] - w[row : row + rows]).pow(2).sum())
                self.den[kind] += float(w[row : row + rows].pow(2).sum())
            row += rows

    def metrics(self) -> dict[str, float]:
        return {f"quant/quant_error/{k}": self.num[k] / max(self.den[k], 1e-30)
                for k in LAYER_TYPES if k in self.num}
