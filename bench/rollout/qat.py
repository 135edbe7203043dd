"""The trainer's forward at the rollout engine's precision, with straight-through gradients (quantization-aware
training): the on-policy quantized control (`method=matched`, docs/arms.md) and the field's "fix at source"
(Jet-RL's unified FP8 training and rollout, verl's `fsdp_config.qat`, miles' INT4 QAT).

`quantize_trainer(model, ...)` changes, in place, how an HF Llama / Qwen2 / Qwen3 model computes, never its
weights: each module whose arithmetic the embedded engine's fast decoder (bench/rollout/embedded.py `FastDecoder`)
changes is replaced by one that computes what the engine computes, from the same fp32 master Parameters (so the
optimizer, the state dict and tied weights are untouched):

  nn.Linear     `QATLinear`: weight and input rounded by the engine's own `Quantizer` (its codes and scales, fresh
                at every forward as the engine's are at every sync), fp32 GEMM, bias and output in the engine's
                activation dtype; q/k/v and gate/up are quantized as the fused tensors the engine builds (one
                per-tensor or global scale over the fused weight). The lm_head uses the engine's plain quantizer
                (the activation dtype) unless `quantize_lm_head`.
  nn.Embedding  `QATEmbedding`: the table in the activation dtype (fake-quantized first with `quantize_embeddings`).
  *RMSNorm      `QATRMSNorm`: the engine's `_rms_norm`, weight in the activation dtype.
  attention     `qat_attention` (an HF attention implementation): the engine's `grouped_attention` in its attention
                dtype (fp32 on a CPU without bf16 hardware), K and V rounded as an FP8 KV cache stores them.

Everything between these modules (residual adds, SiLU, RoPE) then runs in the activation dtype as the engine's
does, because their inputs are in it. Backward: straight-through, d q(x) / dx := 1 for every rounding (weights,
activations, casts, KV cache), the plain form: with amax scales almost nothing is clipped (MXFP4's power-of-two
block scale saturates a few elements at +-6 x 2^e; their gradient passes too). The gradient lands on the fp32
master weights, which the optimizer updates; the engine re-quantizes them at the next sync.

The result: the trainer's log pi at the synced weights equals the engine's log mu up to float summation order
(tests/unit/test_qat.py: KL(mu || pi_old) <= 1e-6 per token at every precision this supports). Activation scales
that span a whole tensor (`per_tensor` activations, NVFP4's global activation scale) are computed per decode step
over the engine's batch of rows; a teacher-forced pass over other rows cannot reproduce them, so they are refused
(`unsupported`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bench.quant.blockscale import fake_quant_kv
from bench.quant.linear import native_bf16_matmul
from bench.quant.plain import native_half
from bench.quant.quantizers import Quantizer

ATTENTION = "qrl_qat"  # the HF attention implementation name registered below
#: projections the fast decoder fuses into one engine linear (bench/rollout/embedded.py `_Layer`)
FUSED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def ste(x: torch.Tensor, rounded: torch.Tensor) -> torch.Tensor:
    """`rounded` in the forward, the identity's gradient into `x` in the backward (straight-through)."""
    return x + (rounded.to(x.dtype) - x).detach()


def round_input(quantizer: Quantizer, x: torch.Tensor) -> torch.Tensor:
    """A linear layer's input as the engine's layer of `quantizer` multiplies it (fp32 values): dynamically quantized
    (W8A8, W4A4), rounded to the 16-bit format (bf16 / fp16 layers), or as it is (weight-only, fp32)."""
    if quantizer.is_scaled:
        return quantizer.fake_quant_act(x)
    codes, scale = quantizer.fmt.quantize(x, "per_tensor")  # unscaled formats: a rounding, scale 1
    return codes * scale


def gemm_dtype(quantizer: Quantizer, device: torch.device) -> torch.dtype:
    """The dtype the engine's layer of `quantizer` multiplies in: a 16-bit format's own where its GEMM is native
    (bench/quant/plain.py `native_half`), fp32 for every other layer (fake quantization, exact int8 emulation)."""
    half = getattr(quantizer.fmt, "half", None)
    return half if half is not None and native_half(half, device) else torch.float32


def attention_dtype(act_dtype: torch.dtype, cuda: bool) -> torch.dtype:
    """The dtype the engine's fast decoder computes attention in (FastDecoder.attn): fp32 on a CPU for 16-bit
    activations it has no fast kernel for, the activation dtype elsewhere."""
    slow = not cuda and (act_dtype == torch.float16 or (act_dtype == torch.bfloat16 and not native_bf16_matmul()))
    return torch.float32 if slow else act_dtype


class QATLinear(nn.Linear):
    """An nn.Linear (same Parameters, same state-dict keys) whose forward is the engine layer's arithmetic with
    straight-through gradients. `fused_with` holds the other projections the engine fuses with this one: the weight
    is quantized as the fused tensor [this; fused_with...] and this layer's rows taken."""

    def __init__(self, linear: nn.Linear, quantizer: Quantizer, act_dtype: torch.dtype) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias  # the masters themselves
        self.quantizer, self.act_dtype = quantizer, act_dtype
        # the sibling modules (not their tensors, which FSDP replaces by shards), in a plain list: not registered
        self.fused_with: list[nn.Module] = []

    def quantized_weight(self) -> torch.Tensor:
        w = self.weight.float()
        fused = torch.cat([w.detach(), *(g.weight.detach().float() for g in self.fused_with)])
        codes, scale = self.quantizer.quantize_weight(fused.detach())
        return ste(w, (codes * scale)[: self.out_features])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xq = ste(xf, round_input(self.quantizer, xf.detach()))
        bias = None if self.bias is None else ste(self.bias.float(), self.bias.detach().to(self.act_dtype).float())
        gemm = gemm_dtype(self.quantizer, self.weight.device)  # the engine's 16-bit layers may multiply natively
        if gemm != torch.float32:
            return F.linear(xq.to(gemm), self.quantized_weight().to(gemm), None if bias is None else bias.to(gemm)
                            ).to(self.act_dtype)
        return F.linear(xq, self.quantized_weight(), bias).to(self.act_dtype)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, quantizer={self.quantizer.format}, act_dtype={self.act_dtype}"


class QATEmbedding(nn.Embedding):
    """The engine's embedding table: in the activation dtype, fake-quantized first when it quantizes embeddings."""

    def __init__(self, emb: nn.Embedding, act_dtype: torch.dtype, quantizer: Quantizer | None) -> None:
        nn.Module.__init__(self)
        for key in ("num_embeddings", "embedding_dim", "padding_idx", "max_norm", "norm_type", "scale_grad_by_freq",
                    "sparse"):
            setattr(self, key, getattr(emb, key))
        self.weight = emb.weight
        self.act_dtype, self.quantizer = act_dtype, quantizer

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        w = self.weight.float()
        if self.quantizer is not None:
            w = ste(w, self.quantizer.fake_quant_weight(w.detach()))
        return F.embedding(ids, w).to(self.act_dtype)


class QATRMSNorm(nn.Module):
    """The engine's RMSNorm (`_rms_norm`: normalize in fp32, cast back, scale by the weight in the input dtype)."""

    def __init__(self, norm: nn.Module, act_dtype: torch.dtype) -> None:
        super().__init__()
        self.weight, self.variance_epsilon, self.act_dtype = norm.weight, norm.variance_epsilon, act_dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from bench.rollout.embedded import _rms_norm

        return _rms_norm(x.to(self.act_dtype), self.weight.to(self.act_dtype), self.variance_epsilon)


@dataclass(frozen=True)
class AttentionSettings:
    """What `qat_attention` needs from the engine: its attention dtype and KV-cache rounding."""

    dtype: torch.dtype
    kv_cache_dtype: str | None = None


def qat_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: torch.Tensor | None, scaling: float, dropout: float = 0.0,
                  prefill_length: int | None = None, **_: Any):
    """HF attention implementation: the engine's `grouped_attention`, over K and V as its cache holds them, in the
    shapes the engine calls it with: the first `prefill_length` queries (the prompt) as one block over the prompt's
    keys, as its prefill does, then every later query alone over the keys up to its own, as a decode step does. A
    kernel's summation order depends on those shapes; one call over the whole sequence differs from the engine by
    float noise that bf16 rounding and FP8 activation codes amplify (measured on the shipped chain warm start: 1e-5
    to 1e-4 nats of KL(mu || pi_old) per token at bf16 / fp8_e4m3, against 0 to 1e-7 this way). Those per-query
    calls give the forward values only (no graph); the gradient is that of one call over the whole sequence, the same
    function, straight through to those values (`ste`): the per-query calls' own backward cost ~20x the rest of the
    step on a CPU.

    query [B, H, S, D], key/value [B, Hkv, L, D], attention_mask bool [B, 1, S, L] (True: attend) or None (causal);
    every query also attends to its own position, as the engine's prefill lets pad rows do (an all-masked row would
    give NaN). Returns [B, S, H, D] in the query's dtype, as HF's implementations do."""
    from bench.rollout.embedded import grouped_attention

    settings: AttentionSettings = module.qat_attention
    S, L = query.shape[2], key.shape[2]
    if settings.kv_cache_dtype is not None:  # K (after RoPE) and V rounded as an FP8 cache stores them (scale 1)
        key = ste(key, fake_quant_kv(key.detach(), settings.kv_cache_dtype))
        value = ste(value, fake_quant_kv(value.detach(), settings.kv_cache_dtype))
    own_pos = torch.arange(S, device=query.device)[:, None] + (L - S)  # the key position of each query
    keys = torch.arange(L, device=query.device)[None, :]
    mask = keys <= own_pos if attention_mask is None else attention_mask.bool()
    mask = (mask | (keys == own_pos)).expand(query.shape[0], 1, S, L)
    q, k, v = (t.to(settings.dtype) for t in (query, key, value))
    block = S if prefill_length is None or S != L else min(max(int(prefill_length), 1), S)
    out = grouped_attention(q, k, v, mask, scaling)  # differentiable: one call, its backward is cheap
    if block < S:  # the engine's shapes give the values; their many small backward calls would cost 20x the rest
        with torch.no_grad():
            parts = [grouped_attention(q[:, :, :block], k[:, :, :block], v[:, :, :block], mask[..., :block, :block],
                                       scaling)]
            parts += [grouped_attention(q[:, :, i:i + 1], k[:, :, :i + 1], v[:, :, :i + 1], mask[..., i:i + 1, :i + 1],
                                        scaling) for i in range(block, S)]
        out = ste(out, torch.cat(parts, dim=2))
    return out.to(query.dtype).transpose(1, 2).contiguous(), None


def engine_kwargs(model: nn.Module, prompt_length: int) -> dict[str, int]:
    """What a teacher-forced forward of `model` passes so that a trainer reproducing the engine (`quantize_trainer`)
    computes the prompt as the engine's prefill (`qat_attention`); nothing for any other model."""
    implementation = getattr(getattr(model, "config", None), "_attn_implementation", None)
    return {"prefill_length": prompt_length} if implementation == ATTENTION else {}


def _register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(ATTENTION, qat_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, sdpa_mask)


def unsupported(quantizer: Quantizer) -> str | None:
    """Why a teacher-forced trainer pass cannot reproduce the engine at `quantizer`, or None when it can."""
    if quantizer.quantizes_activations and not quantizer.fmt.act_scales_per_token(quantizer.act_granularity):
        return (f"{quantizer.format} with act_granularity={quantizer.act_granularity} scales each activation tensor "
                "as a whole, and the engine computes that scale per decode step over its batch of rows, which a "
                "teacher-forced pass over other rows cannot reproduce; use per-token (or per-block) activation "
                "scales, or act_granularity=none")
    return None


def quantize_trainer(model: nn.Module, quantizer: Quantizer, act_dtype: torch.dtype, quantize_lm_head: bool = False,
                     quantize_embeddings: bool = False, kv_cache_dtype: str | None = None) -> int:
    """Swap `model`'s modules so that its forward computes what the embedded engine's fast decoder computes at
    `quantizer` and `act_dtype` (module docstring); returns how many linears now quantize. ValueError when the
    engine's arithmetic cannot be reproduced (`unsupported`, or a model the fast decoder does not serve)."""
    from bench.rollout.embedded import fast_path_problem, plain_quantizer

    problem = unsupported(quantizer) or fast_path_problem(model)
    if problem:
        raise ValueError(f"the trainer cannot compute as the rollout engine does: {problem}")
    _register_attention()
    plain = plain_quantizer(act_dtype)
    settings = AttentionSettings(attention_dtype(act_dtype, model.lm_head.weight.is_cuda), kv_cache_dtype)
    count = 0
    for parent in list(model.modules()):
        if hasattr(parent, "q_proj") and hasattr(parent, "o_proj"):
            parent.qat_attention = settings
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear) and not isinstance(child, QATLinear):
                q = quantizer if child is not model.lm_head or quantize_lm_head else plain
                setattr(parent, name, QATLinear(child, q, act_dtype))
                count += q is quantizer
            elif isinstance(child, nn.Embedding) and not isinstance(child, QATEmbedding):
                setattr(parent, name, QATEmbedding(child, act_dtype, quantizer if quantize_embeddings else None))
            elif type(child).__name__.endswith("RMSNorm") and hasattr(child, "variance_epsilon"):
                setattr(parent, name, QATRMSNorm(child, act_dtype))
    for parent in model.modules():  # the projections the engine fuses: each quantized as the fused tensor
        for names in FUSED:
            group = [getattr(parent, n, None) for n in names]
            if all(isinstance(m, QATLinear) for m in group):
                for m in group:
                    m.fused_with = [g for g in group if g is not m]
    model.config._attn_implementation = ATTENTION
    return count


__all__ = ["ATTENTION", "QATEmbedding", "QATLinear", "QATRMSNorm", "attention_dtype", "engine_kwargs", "qat_attention",
           "quantize_trainer", "round_input", "ste", "unsupported"]
