"""UAQ invariant scaling (QuRL section 4.3, Eq. 10-12; docs/arms.md §4.6).

A one-time reparametrization of the trainer's master weights before RL: in every decoder layer the input norm
gain becomes s*gamma (LayerNorm: also s*beta) and the Q/K/V projections W/s (bias unchanged). The layer output is
unchanged in exact arithmetic, (W/s)(s*x_hat) = W x_hat, while dL/dW' = s * dL/dW, so each update moves Q/K/V
further relative to their (scale-equivariant) quantization grid. Qwen3's q_norm/k_norm act on W x and are
unaffected.

Targets must be complete consumer groups of one norm, else the output would change: {q,k,v}_proj scale
input_layernorm (the paper's scope); {gate,up}_proj scale post_attention_layernorm (an optional extension: the
paper does not say whether the MLP was scaled, docs/arms.md §6 question 2).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# norm attribute -> (submodule holding the projections, projections that read that norm's output)
_GROUPS = {
    "input_layernorm": ("self_attn", ("q_proj", "k_proj", "v_proj")),
    "post_attention_layernorm": ("mlp", ("gate_proj", "up_proj")),
}
UAQ_TARGETS = tuple(p for _, projs in _GROUPS.values() for p in projs)


def _decoder_layers(model: torch.nn.Module) -> Sequence[torch.nn.Module]:
    """model.model.layers (a *ForCausalLM) or model.layers (the bare decoder); ValueError naming the class."""
    for owner in (getattr(model, "model", None), model):
        layers = getattr(owner, "layers", None) if owner is not None else None
        if isinstance(layers, (torch.nn.ModuleList, list, tuple)) and len(layers) > 0:
            return layers
    raise ValueError(
        f"apply_uaq: {type(model).__name__} has no decoder layers at model.model.layers or model.layers "
        "(expected a HF Llama/Qwen2/Qwen3-style model)"
    )


def _plan(targets: Sequence[str]) -> list[tuple[str, str, tuple[str, ...]]]:
    """The (norm, submodule, projections) groups covered by `targets`; ValueError for a partial group."""
    wanted, plan = set(targets), []
    for norm, (sub, projs) in _GROUPS.items():
        hit = wanted & set(projs)
        if hit and hit != set(projs):
            raise ValueError(
                f"apply_uaq: targets {sorted(hit)} cover only part of {list(projs)}, which all read {norm}; "
                "scaling a subset would change the model's output"
            )
        if hit:
            plan.append((norm, sub, projs))
        wanted -= set(projs)
    if wanted:
        raise ValueError(f"apply_uaq: unknown targets {sorted(wanted)}; valid: {', '.join(UAQ_TARGETS)}")
    if not plan:
        raise ValueError("apply_uaq: no targets given")
    return plan


def check_targets(targets: Sequence[str]) -> None:
    """ValueError unless `targets` are whole consumer groups of one norm (config-time check)."""
    _plan(targets)


@torch.no_grad()
def apply_uaq(
    model: torch.nn.Module, scale: float = 1.5, targets: Sequence[str] = ("q_proj", "k_proj", "v_proj")
) -> dict[str, float]:
    """Scale every decoder layer in place: norm.weight (and norm.bias) *= s, target projection weights /= s.

    Returns {"uaq_scale": s, "uaq_layers": number of layers, "uaq_tensors": number of tensors changed}.
    """
    if not scale > 0:
        raise ValueError(f"apply_uaq: scale={scale} must be positive")
    plan = _plan(targets)
    layers = _decoder_layers(model)
    changed = 0
    for i, layer in enumerate(layers):
        for norm_name, sub_name, projs in plan:
            norm = getattr(layer, norm_name, None)
            sub = getattr(layer, sub_name, None)
            if norm is None or getattr(norm, "weight", None) is None or sub is None:
                raise ValueError(
                    f"apply_uaq: layer {i} of {type(model).__name__} has no {norm_name}.weight / {sub_name} "
                    "(expected a HF Llama/Qwen2/Qwen3-style decoder layer)"
                )
            linears = [getattr(sub, p, None) for p in projs]
            if any(lin is None or getattr(lin, "weight", None) is None for lin in linears):
                raise ValueError(f"apply_uaq: layer {i} of {type(model).__name__} lacks one of {sub_name}.{projs}")
            norm.weight.mul_(scale)
            changed += 1
            if getattr(norm, "bias", None) is not None:  # LayerNorm: beta scales with gamma
                norm.bias.mul_(scale)
                changed += 1
            for lin in linears:
                lin.weight.div_(scale)
                changed += 1
    return {"uaq_scale": float(scale), "uaq_layers": float(len(layers)), "uaq_tensors": float(changed)}


__all__ = ["apply_uaq"]
