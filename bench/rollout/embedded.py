"""The embedded rollout engine: a batched sampler in eager PyTorch holding its own low-precision policy copy.

Two decoders read the same Hugging Face weights:
* `FastDecoder`, a hand-written decoder for the Llama / Qwen2 / Qwen3 family (fused QKV and gate/up, a KV cache
  allocated once per generate chunk, SDPA with GQA, RoPE from the HF config, Qwen3 q/k norms, Qwen2 qkv bias, tied
  or untied lm_head). perf-notes 2 and 7: up to 2x faster than driving HF at small batch and tiny size.
* `HFDecoder`, the generic fallback for any other causal LM: a copy of the HF model whose nn.Linear layers are
  swapped for the engine's precision, driven through its own forward with a KV cache.
Both take positions = cumsum(prompt_mask) - 1 (so left padding does not shift them), the convention of
bench.models.logprobs, and at fp32 reproduce its teacher-forced log-probs.

Precision (weights / GEMM / everything else; the lm_head and embeddings stay unquantized unless asked):
  fp32      fp32 / fp32 / fp32
  bf16      bf16 / bf16 operands, fp32 accumulate / bf16 (log-softmax in fp32)
  fp8_e4m3  e4m3 W8A8 fake quant / fp32 GEMM on the quantized values / bf16. FP8 rollouts on a GPU (vLLM)
            run FP8 GEMMs inside an otherwise-bf16 engine; perf-notes 4 measures the benchmark's FP8 format this
            way (`fp8_fake_w8a8_bf16`). `act_dtype="fp32"` gives the FP8 GEMM error alone.
  int8      int8 W8A8, exact int32-accumulating GEMM (torch._int_mm where fast) / fp32 on a CPU, the fastest int8
            layout there (perf-notes 3a: bf16 around it is slower and adds mismatch); bf16 on a CUDA GPU, as
            QuRL/FlashRL run their INT8 GEMMs inside a bf16 engine.
Weights are re-quantized with fresh scales at every `load_weights` (the engine's copy is rebuilt from the
trainer's fp32 master weights): keeping old scales for new weights is the bug docs/arms.md §3 warns about.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from bench.domains import check_schema, num
from bench.device import DTYPES
from bench.quant.blockscale import KV_CACHE_DTYPES, fake_quant_kv
from bench.quant.diagnostics import QuantErrors, layer_type
from bench.quant.fp8 import FP8_KERNELS
from bench.quant.int8 import INT8_KERNELS
from bench.quant.linear import CPU_KERNELS, make_linear, native_bf16_matmul, swap_linears, use_cpu_gemm
from bench.quant.quantizers import Quantizer
from bench.rollout import cpu_attention
from bench.rollout.base import Rollout, RolloutConfig, SamplingParams, detach_aliases, token_ids
from bench.registry import ENGINES

FAST_FAMILIES = ("llama", "qwen2", "qwen3")
BACKENDS = ("auto", "fast", "hf")
#: Default KV-cache budget of one generate chunk, in token positions (sequences x (prompt + max new tokens)):
#: 2^18 positions hold 3 GB of bf16 cache for Qwen2.5-0.5B, 7.5 GB for 1.5B, 38 GB for Qwen3-8B (fp32
#: caches twice that), and every CPU preset's whole batch (64 x 64 positions) in one chunk.
CHUNK_TOKENS = 2**18
#: Decode steps between two host syncs of a generate chunk (`sync_every`): the stop check (`bool(done.all())` waits
#: for the GPU) and the compaction of finished rows. A row that stopped between syncs decodes up to k - 1 more
#: throw-away tokens (masked out); the last sync of a chunk may run k - 1 steps past its longest row. 16: the sync
#: is 1/16 of what it was, the waste at most 15 steps of the rows still in the batch.
SYNC_EVERY = 16
#: A compaction keeps at least this many rows (finished ones decode on, masked, to make up the number). A CPU GEMM
#: of very few rows takes a matrix-vector kernel whose summation order differs from the batched kernel's (measured
#: on this project's CPU with torch 2.13: 1-3 rows differ in the last bit, 4-63 do not); an FP8 rollout rounds
#: such a last-bit difference to bf16 and then to an FP8 code of the next layer, which can flip a token. Keeping 8
#: rows keeps every decode GEMM on the batched kernel, so compacted tokens equal uncompacted ones bit for bit. Not on
#: every CPU: on a 2-core AMD EPYC (2026-12-01) MKL's fp32 sgemm also differs at 5-7 and 9-11 rows (weights of the
#: 1m and 10m presets' shapes); oneDNN's packed GEMM (rollout.cpu_kernels, weights of 2^18+ elements) at 1 row only.
COMPACT_MIN_ROWS = 8
#: Key positions a CUDA decode step attends over are rounded up to a multiple of this (the positions not yet written
#: are masked with -inf, so they add exact zeros): SDPA then sees one key length per 128 steps instead of a new one
#: every step. A new shape costs SDPA a plan (it builds and caches one per shape): on an H200 a decode step's attention
#: took 43.5 ms at a new key length and 0.09 ms at a seen one (results/gpu_check/h200-2026-11-28.md), so a cold
#: unbucketed rollout paid a plan at every step (the H100's 73 ms a step). A CPU step attends over exactly the
#: written positions, as before (its tokens stay bit-identical to the unbucketed engine's).
ATTN_BUCKET_CUDA = 128


#: `gather(module)` makes a module's own parameters (not its children's) whole for the duration: nothing for a model
#: in one process, an FSDP2 unit unsharded and resharded in a sharded run (bench/distributed/engines.py). The fast
#: decoder is built one decoder layer at a time under it, so no rank ever holds the whole gathered model.
Gather = Callable[[nn.Module], AbstractContextManager]


def as_is(module: nn.Module) -> AbstractContextManager:
    """The `Gather` of a model in one process: its parameters are whole already."""
    return nullcontext()


def plain_quantizer(act_dtype: torch.dtype) -> Quantizer:
    """The unquantized layers (lm_head unless quantize_lm_head) in the engine's activation dtype."""
    return Quantizer({torch.bfloat16: "bf16", torch.float16: "fp16"}.get(act_dtype, "fp32"))


@dataclass
class EmbeddedRolloutConfig(RolloutConfig):
    """`rollout=embedded`: the engine's own knobs (EmbeddedEngine documents each)."""

    engine: str = "embedded"
    quantize_lm_head: bool = False
    quantize_embeddings: bool = False
    backend: str = "auto"
    act_dtype: Optional[str] = None  # null: the precision's on the engine's device (bench/quant/<format>.py act_dtype_on)
    int8_kernel: str = "auto"
    fp8_kernel: str = "auto"  # auto: torch._scaled_mm on a GPU with FP8 tensor cores, else the emulation
    cpu_kernels: str = "auto"  # a CPU's decode kernels: auto | onednn | plain (bench.quant.linear.CPU_KERNELS)
    # a CPU decode step's fp32 attention: matmul (over the live window) | varlen (each row's own columns; a C kernel)
    cpu_attention: str = "matmul"
    kv_cache_dtype: Optional[str] = None  # null: the activation dtype; fp8 | fp8_e4m3 | fp8_e5m2 (scale 1, as vLLM)
    chunk_tokens: Optional[int] = num(CHUNK_TOKENS, "[1, inf)", {None: "the whole batch in one chunk"})  # KV-cache positions per generate chunk
    # decode steps between host syncs (the stop check; finished rows leave the batch there): SYNC_EVERY
    sync_every: int = num(SYNC_EVERY, "[1, 4096]")
    compact: bool = True  # finished rows leave the batch and the KV cache at every sync (exact)
    refill: bool = True  # continuous batching: a finished row's slot takes the next queued sequence at the next sync
    cuda_graphs: bool = False  # decode steps replayed from CUDA graphs on a GPU (FastDecoder.use_cuda_graphs)
    compile: bool = False  # torch.compile each layer's decode pieces and the quantized linears' activation quantization

    def check(self) -> None:
        super().check()
        for key, valid in (("backend", BACKENDS), ("int8_kernel", INT8_KERNELS), ("fp8_kernel", FP8_KERNELS),
                           ("cpu_kernels", CPU_KERNELS), ("cpu_attention", cpu_attention.CPU_ATTENTION)):
            if getattr(self, key) not in valid:
                raise ValueError(f"rollout.{key}={getattr(self, key)!r} is not valid; choose one of: {', '.join(valid)}")
        if self.act_dtype is not None and self.act_dtype not in DTYPES:
            raise ValueError(f"rollout.act_dtype={self.act_dtype!r} is not valid; choose one of: {', '.join(DTYPES)}")
        if self.kv_cache_dtype is not None and self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"rollout.kv_cache_dtype={self.kv_cache_dtype!r} is not valid; choose one of: "
                             f"{', '.join(KV_CACHE_DTYPES)} (or null)")
        if self.cpu_attention == "varlen" and self.cpu_kernels == "plain":
            raise ValueError("rollout.cpu_attention=varlen replaces the matmul decode attention, which "
                             "rollout.cpu_kernels=plain turns off (SDPA): use rollout.cpu_kernels=auto or onednn, "
                             "or rollout.cpu_attention=matmul")


def fast_path_problem(model: nn.Module) -> str | None:
    """Why `FastDecoder` cannot serve this model, or None if it can."""
    cfg = getattr(model, "config", None)
    kind = getattr(cfg, "model_type", None)
    if kind not in FAST_FAMILIES:
        return f"model_type {kind!r} is not one of {', '.join(FAST_FAMILIES)}"
    if getattr(cfg, "hidden_act", None) != "silu":
        return f"hidden_act {cfg.hidden_act!r} is not silu"
    if getattr(cfg, "use_sliding_window", False) or "sliding_attention" in (getattr(cfg, "layer_types", None) or ()):
        return "sliding-window attention"
    if getattr(cfg, "partial_rotary_factor", 1.0) != 1.0:
        return "partial rotary embeddings"
    inner = getattr(model, "model", None)
    rotary = getattr(inner, "rotary_emb", None)
    if rotary is None or not hasattr(inner, "layers") or not hasattr(model, "lm_head"):
        return "unexpected module layout (model.model.layers / rotary_emb, model.lm_head)"
    if getattr(rotary, "rope_type", "default") in ("dynamic", "longrope"):
        return f"rope_type {rotary.rope_type!r} changes with sequence length"
    return None


def rope_inv_freq(model: nn.Module) -> tuple[torch.Tensor, float]:
    """(inv_freq, attention_scaling) from the HF init function of the config's rope type.

    Recomputed from the config (rope_theta, llama3/yarn/linear scaling, head_dim) in fp32 rather than read
    from the rotary buffer, which a `.to(bfloat16)` of the model would have rounded.
    """
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rotary = model.model.rotary_emb
    if rotary.rope_type == "default":
        inv_freq, scaling = rotary.compute_default_rope_parameters(model.config)
    else:
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[rotary.rope_type](model.config)
    return inv_freq.float(), float(scaling)


def rope_tables(
    inv_freq: torch.Tensor, scaling: float, length: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [length, head_dim] as the HF rotary embedding computes them: fp32, scaled, then cast."""
    freqs = torch.arange(length, dtype=torch.float32, device=inv_freq.device)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * scaling).to(dtype), (emb.sin() * scaling).to(dtype)


def rope_signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """sin with its first half negated: HF's rotate_half(x) * sin, cat(-x2, x1) * sin, is x.roll(D/2) * this, the same
    products (a sign flip is exact on either factor) in one roll and one multiply instead of a split, neg and cat."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF Llama/Qwen RMSNorm: normalize in fp32, cast back, scale in the input dtype."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def _bias(linear: nn.Linear) -> torch.Tensor | None:
    return None if linear.bias is None else linear.bias.detach()


def _parts(**linears: nn.Linear) -> list[tuple[str | None, int]]:
    """(layer type, rows) of each projection fused into one engine linear, for the quantization error."""
    return [(kind, lin.weight.shape[0]) for kind, lin in linears.items()]


class _Layer(nn.Module):
    def __init__(self, hf_layer: nn.Module, build, act: torch.dtype):
        super().__init__()
        at, mlp = hf_layer.self_attn, hf_layer.mlp
        qkv = [at.q_proj, at.k_proj, at.v_proj]
        qkv_bias = None if at.q_proj.bias is None else torch.cat([_bias(p) for p in qkv])
        self.qkv = build(torch.cat([p.weight.detach() for p in qkv]), qkv_bias, _parts(q_proj=at.q_proj, k_proj=at.k_proj, v_proj=at.v_proj))
        self.o = build(at.o_proj.weight.detach(), _bias(at.o_proj), _parts(o_proj=at.o_proj))
        gu_bias = None if mlp.gate_proj.bias is None else torch.cat([_bias(mlp.gate_proj), _bias(mlp.up_proj)])
        self.gate_up = build(torch.cat([mlp.gate_proj.weight.detach(), mlp.up_proj.weight.detach()]), gu_bias,
                             _parts(gate_proj=mlp.gate_proj, up_proj=mlp.up_proj))
        self.down = build(mlp.down_proj.weight.detach(), _bias(mlp.down_proj), _parts(down_proj=mlp.down_proj))
        self.register_buffer("ln1", hf_layer.input_layernorm.weight.detach().to(act).clone())
        self.register_buffer("ln2", hf_layer.post_attention_layernorm.weight.detach().to(act).clone())
        qk_norm = None
        if hasattr(at, "q_norm"):  # Qwen3: one weight per head dim, for the q heads and the k heads ([H + Hkv, D])
            q_w, k_w = at.q_norm.weight.detach(), at.k_norm.weight.detach()
            heads = at.q_proj.weight.shape[0] // q_w.shape[0], at.k_proj.weight.shape[0] // k_w.shape[0]
            qk_norm = torch.cat([q_w.expand(heads[0], -1), k_w.expand(heads[1], -1)])
        self.register_buffer("qk_norm", None if qk_norm is None else qk_norm.to(act).clone())


class FastDecoder(nn.Module):
    """Llama / Qwen2 / Qwen3 decoder over a KV cache allocated once per generate chunk.

    `start` allocates the cache and runs the prompt; `step` feeds one token per row. Pad query rows of the
    prompt may attend to themselves, so no softmax row is empty (an all-masked row gives NaN in SDPA, which the
    cache would then carry into real rows).
    """

    def __init__(self, model: nn.Module, quantizer: Quantizer, act_dtype: torch.dtype, knobs: EmbeddedRolloutConfig,
                 gather: Gather = as_is):
        super().__init__()
        cfg = model.config
        self.act = act_dtype
        self.kv_cache_dtype = knobs.kv_cache_dtype
        # bf16 attention on a CPU without bf16 hardware is ~6x slower than fp32 (and fp16 has no fast CPU kernel
        # at all): run it in fp32 on the 16-bit values (the cache then holds bf16/fp16-exact numbers in fp32
        # storage). A GPU runs it in bf16/fp16.
        cuda = model.lm_head.weight.is_cuda
        slow = not cuda and (act_dtype == torch.float16 or (act_dtype == torch.bfloat16 and not native_bf16_matmul()))
        self.attn = torch.float32 if slow else act_dtype
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.eps = cfg.rms_norm_eps
        inv_freq, self.rope_scaling = rope_inv_freq(model)
        if 2 * inv_freq.numel() != self.head_dim:
            raise ValueError("partial rotary embeddings are not supported by FastDecoder (use backend='hf')")
        # the engine lives where the trainer's model does (its buffers and KV cache too)
        self.register_buffer("inv_freq", inv_freq.to(model.lm_head.weight.device))
        self.attn_bucket = ATTN_BUCKET_CUDA if cuda else 1  # decode key positions rounded up to this (ATTN_BUCKET_CUDA)
        # a CPU decode step's fp32 attention as two batched matmuls (`decode_attention`), unless cpu_kernels=plain
        self.matmul_decode = not cuda and self.attn == torch.float32 and knobs.cpu_kernels != "plain"
        # rollout.cpu_attention=varlen: that attention over each row's own columns (bench.rollout.cpu_attention)
        self.varlen = self.matmul_decode and knobs.cpu_attention == "varlen"
        if self.varlen and (why := cpu_attention.unavailable()):
            raise ValueError(f"rollout.cpu_attention=varlen cannot run here: {why}; use rollout.cpu_attention=matmul")
        self.graphs: dict | None = None  # keys -> (CUDA graph, its logits) with rollout.cuda_graphs (use_cuda_graphs)
        plain = plain_quantizer(act_dtype)
        self.quant_errors = QuantErrors()

        def build(w: torch.Tensor, b: torch.Tensor | None, parts: list | None = None, q: Quantizer = quantizer) -> nn.Module:
            layer = make_linear(w, b, q, act_dtype, knobs.int8_kernel, knobs.fp8_kernel)
            if parts and q.is_scaled:
                self.quant_errors.add(w, layer.dequantized_weight(), parts)
            return layer

        inner = model.model
        self.layers = nn.ModuleList()
        for layer in inner.layers:
            with gather(layer):
                self.layers.append(_Layer(layer, build, act_dtype))
                detach_aliases(self.layers[-1], layer)  # tensors of its own before the unit reshards
        with gather(model):  # the root's own parameters: the embedding, the final norm, the lm_head
            embed = inner.embed_tokens.weight.detach().float()
            if knobs.quantize_embeddings:
                embed = quantizer.fake_quant_weight(embed)
            self.register_buffer("embed", embed.to(act_dtype, copy=True))  # never the policy's storage
            self.register_buffer("norm", inner.norm.weight.detach().to(act_dtype).clone())
            lm_head = model.lm_head
            self.lm_head = build(lm_head.weight.detach(), _bias(lm_head),
                                 q=quantizer if knobs.quantize_lm_head else plain)
            detach_aliases(self.lm_head, lm_head)  # the only root piece built without a copy (as the layers')
        self._state: dict = {}

    @property
    def device(self) -> torch.device:
        return self.embed.device

    def start(self, ids: torch.Tensor, mask: torch.Tensor, max_new_tokens: int, refills: bool = False) -> torch.Tensor:
        """Allocate the KV cache of `ids`' rows (its slots) and run their prompts; logits [B, V] of each last position.

        The cache has prompt + max_new_tokens columns per slot, written at one shared column per step. With
        `refills`, `admit` later puts a queued sequence into an ended row's slot: its prompt takes the P columns before
        the shared one and it decodes from there. A step attends over the window of columns from the oldest sequence
        in the batch to the shared one (`_window`); when the shared column reaches the cache's end, the window moves to
        its front (`_shift`), so a refilled cache attends over what its sequences wrote, not over every column."""
        B, P = ids.shape
        total = P + max_new_tokens
        cos, sin = rope_tables(self.inv_freq, self.rope_scaling, total, self.act)
        valid = torch.cat([mask, mask.new_zeros(B, max_new_tokens)], dim=1)  # a new position is unmasked when written
        shape = (len(self.layers), B, self.n_kv, total, self.head_dim)
        # a CPU step reads exactly the positions written (attn_bucket 1), so its cache need not be zeroed first (the
        # zeros were 3 % of a 1M-preset rollout); a bucketed CUDA step reads columns not yet written, masked, where
        # garbage could be NaN; an admitted sequence's slot holds columns of the slot's earlier sequences (zeroed too)
        alloc = torch.empty if self.attn_bucket == 1 and not refills else torch.zeros
        self._state = dict(
            k=alloc(shape, dtype=self.attn, device=ids.device),
            v=alloc(shape, dtype=self.attn, device=ids.device),
            cos=cos,
            sin=rope_signed_sin(sin),  # `_qkv`'s rotation
            # the decode steps' attention mask, additive (0 / -inf) as SDPA turns a bool mask into on every call
            valid=torch.zeros(B, 1, 1, total, dtype=self.attn, device=ids.device).masked_fill_(
                ~valid[:, None, None, :], float("-inf")),
            next_pos=mask.sum(1, keepdim=True),
            col=torch.zeros(1, dtype=torch.long, device=ids.device),  # the column a decode step writes (`step`)
            length=P,  # the columns written so far, counted from the first (the next step writes this one)
            base=0,  # the count of the cache's column 0 (`_shift` moves it on)
            starts=[0] * B,  # the count of each slot's sequence's first column (its prompt's)
            prompt=P,
            total=total,
        )
        pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
        return self._prefill(ids, pos, prompt_attention_mask(mask))

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits [B, V] of one decode step (`_decode`), from a CUDA graph's replay with rollout.cuda_graphs."""
        st = self._state
        if st["length"] - st["base"] == st["total"]:  # the cache is full: the window moves to its front
            self._shift()
        length, base, bucket = st["length"], st["base"], self.attn_bucket
        st["length"] = length + 1
        col = length - base
        st["col"].fill_(col)
        hi = min(st["total"], -(-(col + 1) // bucket) * bucket)  # the columns written, rounded up (ATTN_BUCKET_CUDA)
        if self.graphs is not None:  # a graph per (rows, hi): attended from the cache's first column
            return self._graph_step(tokens, hi)
        return self._decode(tokens, (self._window(length) - base) // bucket * bucket, hi)

    def _window(self, length: int) -> int:
        """The count of the first column a step writing column `length` attends: the earliest start of the batch's
        sequences that may still decode. A sequence spans at most `total` columns, so one that started `total` or more
        columns ago has ended (at max_new_tokens) and is left out: an ended row attends garbage, finite (the shared
        column is unmasked for every row), and its output is thrown away. A sequence that ended at a stop id is not
        known to the host before a sync: its start counts until `admit` or `keep` replaces it."""
        st = self._state
        return min((s for s in st["starts"] if length - s < st["total"]), default=length)

    def _shift(self) -> None:
        """Move the attended window to the cache's front: columns from the oldest sequence that may still decode (and
        the P columns an admission writes before the next shared one) keep their contents, masks and order; the
        columns after them are masked until written. A layer at a time (one layer's copy of the window is the
        temporary); the slots are independent, so each sequence attends what it did before, up to summation order.
        Each shift retires the window's oldest sequence, so there are at most as many as sequences; measured at the 1m
        preset, 256 sequences through 32 slots: 1 shift in 607 steps (geometric lengths, mean 52, none at the cap) and
        23 in 1,055 (mean 108 of 256, 12 % at the cap), the copied columns 0.1 % and 2 % of the attended ones."""
        st = self._state
        length, total = st["length"], st["total"]
        new_base = min(self._window(length), length + 1 - st["prompt"])
        d = new_base - st["base"]  # >= 1: every sequence in the window started fewer than `total` columns ago
        for key in ("k", "v"):
            for layer in st[key]:
                layer[:, :, : total - d] = layer[:, :, d:].clone()
        valid = st["valid"]
        valid[..., : total - d] = valid[..., d:].clone()
        valid[..., total - d:] = float("-inf")
        st["base"] = new_base

    def _decode(self, tokens: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        """One token per row: its K/V written at the cache's column `col` (a device tensor), the attention over the
        columns [lo, hi) (`valid` masks the unwritten and foreign ones), the positions advanced. Every per-step
        value lives on the device and every buffer is updated in place, so that a CUDA graph of this step replays the
        next one (`use_cuda_graphs`)."""
        st = self._state
        col, pos, valid = st["col"], st["next_pos"], st["valid"]
        valid.index_fill_(3, col, 0.0)
        cos, sin = st["cos"][pos].unsqueeze(2), st["sin"][pos].unsqueeze(2)  # [B, 1, 1, D]
        x = F.embedding(tokens[:, None], self.embed)
        attend = decode_attention if self.matmul_decode else grouped_attention
        if self.varlen:  # each row from its own sequence's first column (an ended one's start may precede lo)
            rows = torch.tensor(st["starts"]).sub_(st["base"]).clamp_(lo, hi - 1)
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, x, cos, sin)
            st["k"][i].index_copy_(2, col, k.to(self.attn))  # fp16/bf16 values kept in fp32 where attention is
            st["v"][i].index_copy_(2, col, v.to(self.attn))  # slow in 16 bits (exact casts, as a slice write does)
            if self.varlen:
                a = cpu_attention.varlen_decode_attention(q, st["k"][i], st["v"][i], valid, rows, lo, hi,
                                                          self.head_dim**-0.5)
            else:
                a = attend(q, st["k"][i, :, :, lo:hi], st["v"][i, :, :, lo:hi], valid[..., lo:hi], self.head_dim**-0.5)
            x = self._mlp(layer, x, a)
        pos.add_(1).clamp_(max=st["total"] - 1)  # a live row stays below; an ended one waiting for a queued
        return self._head(x[:, -1])              # sequence decodes on, masked, at the last

    def use_cuda_graphs(self) -> None:
        """Decode steps from CUDA graphs (`rollout.cuda_graphs`): a step's ~45 kernels per layer replayed by one launch
        instead of launched one by one from Python (on a GPU a small batch's decode step waits on those launches:
        bench/launch/budget.py's 12 us each). A graph is captured per (batch rows, attended key columns): the key
        columns change every ATTN_BUCKET_CUDA steps until the cache is full, and a graph attends from the cache's first
        column (a refilled cache's window moves to its front, `_shift`, so the graphs captured for it are reused); the
        rows at a compaction. On a CPU nothing is captured and every step runs eagerly (the graphs' CPU twin in the tests)."""
        self.graphs = {}
        cuda = self.device.type == "cuda"
        self.graph_pool = torch.cuda.graph_pool_handle() if cuda else None
        self.graph_stream = torch.cuda.Stream(self.device) if cuda else None  # warm-ups and captures (`_graph_step`)

    def _graph_step(self, tokens: torch.Tensor, keys: int) -> torch.Tensor:
        """One decode step replayed from its graph when one was captured for these (rows, keys); else run eagerly
        (this step) and, on a GPU, captured for the next ones (a capture records, it does not compute). The token is
        copied into a static buffer the graph reads; the logits are a copy: the next replay overwrites its output."""
        st = self._state
        if st.get("graph_rows") != tokens.shape[0]:  # a new batch (a compaction): new static inputs, new graphs
            st["graph_rows"], st["graph_tok"] = tokens.shape[0], torch.empty_like(tokens)
            self.graphs = {}
        st["graph_tok"].copy_(tokens)
        if keys in self.graphs:
            graph, out = self.graphs[keys]
            graph.replay()
            return out.clone()
        if not tokens.is_cuda:
            return self._decode(st["graph_tok"], 0, keys)
        # The eager step (the warm-up) and the capture run on one side stream, as torch's CUDA-graph docs ask: state
        # that CUDA libraries make lazily per stream (cuBLAS's workspace) then exists before the capture records.
        stream, current = self.graph_stream, torch.cuda.current_stream()
        stream.wait_stream(current)
        with torch.cuda.stream(stream):
            logits = self._decode(st["graph_tok"], 0, keys)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.graph_pool, stream=stream):
                out = self._decode(st["graph_tok"], 0, keys)
        current.wait_stream(stream)
        logits.record_stream(current)  # made on the side stream, read on the current one
        self.graphs[keys] = (graph, out)
        return logits

    def admit(self, slots: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Put the sequences `ids` [n, P] (left-padded as `start`'s) into the batch's rows `slots` [n], whose
        sequences ended: their prompts run (attending to themselves, as in `start`) and are written to the P
        columns before the next step's, everything else of the slot masked; logits [n, V] of each last position.
        A row's attention then covers its own columns and masked ones (exact zeros), so it computes what it would in
        a cache of its own up to summation order (tests/unit/test_engine.py)."""
        st = self._state
        P, length = ids.shape[1], st["length"]
        cols = torch.arange(length - P, length, device=ids.device) - st["base"]  # >= 0 (`_shift`)
        pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
        cos, sin = st["cos"][pos].unsqueeze(2), st["sin"][pos].unsqueeze(2)
        attn_mask = prompt_attention_mask(mask)
        x = F.embedding(ids, self.embed)
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, x, cos, sin)
            k, v = k.to(self.attn), v.to(self.attn)  # the values the cache holds, attended as `_prefill` does
            st["k"][i][slots[:, None], :, cols] = k.transpose(1, 2)
            st["v"][i][slots[:, None], :, cols] = v.transpose(1, 2)
            x = self._mlp(layer, x, grouped_attention(q, k, v, attn_mask, self.head_dim**-0.5))
        st["valid"][slots] = float("-inf")
        prompt = torch.zeros_like(mask, dtype=self.attn).masked_fill_(~mask, float("-inf"))
        st["valid"][slots[:, None], 0, 0, cols] = prompt
        st["next_pos"][slots] = mask.sum(1, keepdim=True)
        for slot in slots.tolist():
            st["starts"][slot] = length - P
        return self._head(x[:, -1])

    def keep(self, rows: torch.Tensor) -> None:
        """Keep only `rows` (indices into the batch) in the batch and the KV cache: the other sequences finished.
        Rows are independent, so the kept rows decode exactly as before (EmbeddedEngine.generate)."""
        st = self._state
        b, end = rows.numel(), st["length"] - st["base"]
        for key in ("k", "v"):  # in place, the positions written so far: the kept rows move to the front
            cache = st[key]
            for layer in cache:  # a layer at a time: the gathered rows' temporary is one layer's, not the cache's
                layer[:b, :, :end] = layer[rows, :, :end]
            st[key] = cache[:, :b]
        st["valid"], st["next_pos"] = st["valid"].index_select(0, rows), st["next_pos"].index_select(0, rows)
        st["starts"] = [st["starts"][r] for r in rows.tolist()]
        st.pop("graph_rows", None)  # new buffers: a captured decode graph would read the old ones

    def use_compiled(self) -> None:
        """Run each layer's two pieces (`_qkv`, `_mlp`) and the head through torch.compile (Inductor: a layer's
        elementwise ops and activation quantization fused; C++ on a CPU, Triton on a GPU). One compiled graph per
        piece serves every layer (they are passed in, not baked in) and every step: shapes are dynamic, as the
        batch shrinks at every compaction. The attention and the cache stay eager. No CUDA graphs: they would need
        a static attention length (the whole cache read every step) and one graph per batch size."""
        self._qkv, self._mlp, self._head = (compiled(f) for f in (self._qkv, self._mlp, self._head))

    def _prefill(self, ids: torch.Tensor, pos: torch.Tensor, attn_mask: torch.Tensor) -> torch.Tensor:
        """Logits [B, V] (fp32) of the prompts' last positions; writes their K/V to the cache's first P columns.

        Per layer: `_qkv` (norm, projections, RoPE), the cache write and the attention, then `_mlp` (output
        projection, residuals, MLP). With `compile` the two pieces run compiled and the cache is written here,
        eagerly, in place: a compiled graph that wrote into its input cache would copy the whole cache every step."""
        st = self._state
        P = ids.shape[1]
        cos, sin = st["cos"][pos].unsqueeze(2), st["sin"][pos].unsqueeze(2)  # [B, P, 1, D]
        x = F.embedding(ids, self.embed)
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, x, cos, sin)
            st["k"][i, :, :, :P] = k
            st["v"][i, :, :, :P] = v
            a = grouped_attention(q, st["k"][i, :, :, :P], st["v"][i, :, :, :P], attn_mask, self.head_dim**-0.5)
            x = self._mlp(layer, x, a)
        return self._head(x[:, -1])

    def _qkv(self, layer: _Layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [B, H, S, D] in the attention dtype, k and v [B, Hkv, S, D] as the cache stores them. The q and k heads
        are normalized (Qwen3) and rotated together, as one [B, S, H + Hkv, D] block of the fused projection's
        output: the same elementwise arithmetic as head by head, in a third of the kernels."""
        B, S = x.shape[:2]
        H, Hkv, D = self.n_heads, self.n_kv, self.head_dim
        h = _rms_norm(x, layer.ln1, self.eps)
        qkv = layer.qkv(h).view(B, S, H + 2 * Hkv, D)
        qk, v = qkv[:, :, : H + Hkv], qkv[:, :, H + Hkv:]
        if layer.qk_norm is not None:
            qk = _rms_norm(qk, layer.qk_norm, self.eps)
        qk = qk * cos + qk.roll(D // 2, -1) * sin  # HF's rotation; cos, sin [B, S, 1, D], sin signed (`start`)
        if self.kv_cache_dtype is not None:  # what an fp8 KV cache stores (K after RoPE, V), scale 1
            k, v = fake_quant_kv(qk[:, :, H:], self.kv_cache_dtype), fake_quant_kv(v, self.kv_cache_dtype)
        else:
            k = qk[:, :, H:]
        return qk[:, :, :H].transpose(1, 2).to(self.attn), k.transpose(1, 2), v.transpose(1, 2)

    def _mlp(self, layer: _Layer, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """The residual stream after the attention output `a` [B, H, S, D] and the layer's MLP."""
        B, S = x.shape[:2]
        x = x + layer.o(a.to(self.act).transpose(1, 2).reshape(B, S, self.n_heads * self.head_dim))
        g, u = layer.gate_up(_rms_norm(x, layer.ln2, self.eps)).chunk(2, dim=-1)
        return x + layer.down(F.silu(g) * u)

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(_rms_norm(x, self.norm, self.eps)).float()


def prompt_attention_mask(mask: torch.Tensor) -> torch.Tensor:
    """The prompt forward's bool mask [B, 1, P, P]: causal over the unpadded positions; a pad query row attends to
    itself, so that no softmax row is empty (an all-masked row gives NaN in SDPA, which the cache would carry)."""
    P = mask.shape[1]
    causal = torch.ones(P, P, dtype=torch.bool, device=mask.device).tril()
    return (causal & mask[:, None, None, :]) | torch.eye(P, dtype=torch.bool, device=mask.device)


def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """GQA attention [B, H, S, D] of q [B, H, S, D] over k, v [B, Hkv, L, D] with a bool mask [B, 1, S, L].

    The G = H / Hkv query heads sharing a KV head are folded into the query axis ([B, Hkv, G*S, D], the mask
    repeated G times), so SDPA sees plain multi-head attention and takes a fused kernel on every backend; with
    `enable_gqa=True` and an explicit mask only cuDNN attention accepts the call (flash and memory-efficient refuse
    it), and where cuDNN is unavailable SDPA falls back to its math kernel, which repeat-interleaves the whole KV
    cache at every decode step. Measured on an H100 (torch 2.11, results/gpu_check/): folded 0.05-0.21 ms per decode
    call, 12-27 % longer than cuDNN with enable_gqa, repeating the cache 11-20x slower. Query rows are independent, so
    the result is the same attention (tests/unit/test_engine.py compares it with enable_gqa)."""
    B, H, S, D = q.shape
    Hkv, L = k.shape[1], k.shape[2]
    G = H // Hkv
    folded = q.reshape(B, Hkv, G * S, D)  # query head h = kv * G + g (HF's repeat_kv order)
    m = mask.unsqueeze(2).expand(mask.shape[0], 1, G, S, L).reshape(mask.shape[0], 1, G * S, L)
    out = F.scaled_dot_product_attention(folded, k, v, attn_mask=m, scale=scale)
    return out.reshape(B, H, S, D)


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
                     ) -> torch.Tensor:
    """A decode step's GQA attention [B, H, 1, D] of q [B, H, 1, D] over k, v [B, Hkv, L, D] with the additive mask
    [B, 1, 1, L] (0 / -inf), as softmax(q k^T * scale + mask) v in two batched matmuls, the G = H / Hkv query heads of
    a KV head as the rows of one. SDPA's CPU kernel costs 1.0-2.5x that at one query row (its blocked online softmax
    is built for long queries: 330 against 130 us at 64 rows, 2 KV heads, 100 keys, on this project's 2-core
    machine); the two are the same attention in fp32 (last-bit differences of the summation order and the exp)."""
    B, H, _, D = q.shape
    Hkv = k.shape[1]
    scores = torch.matmul(q.reshape(B, Hkv, H // Hkv, D), k.transpose(-1, -2)).mul_(scale).add_(mask)
    return torch.matmul(torch.softmax(scores, dim=-1), v).reshape(B, H, 1, D)


class HFDecoder:
    """Any HF causal LM, driven through its own forward with a KV cache, linears swapped to the precision.

    The copy's linears are built from the trainer's fp32 weights; the remaining parameters (norms,
    embeddings) are cast to the activation dtype, as in an HF model loaded in that dtype.
    """

    def __init__(self, model: nn.Module, quantizer: Quantizer, act_dtype: torch.dtype, knobs: EmbeddedRolloutConfig):
        if knobs.kv_cache_dtype is not None:
            raise ValueError(f"rollout.kv_cache_dtype={knobs.kv_cache_dtype!r} needs the fast decoder (Llama/Qwen2/Qwen3); "
                             f"{type(model).__name__} runs on the generic HF path, whose cache stays in the activation dtype")
        m = copy.deepcopy(model).eval()
        inp, out = m.get_input_embeddings(), m.get_output_embeddings()
        plain = plain_quantizer(act_dtype)
        overrides = {} if out is None else {out: quantizer if knobs.quantize_lm_head else plain}
        self.quant_errors = QuantErrors()

        def count(name: str, weight: torch.Tensor, layer: nn.Module) -> None:
            if quantizer.is_scaled:
                self.quant_errors.add(weight, layer.dequantized_weight(), [(layer_type(name), weight.shape[0])])

        n = swap_linears(m, quantizer, act_dtype, overrides, knobs.int8_kernel, knobs.fp8_kernel, on_build=count)  # unties a tied lm_head
        if quantizer.is_scaled and n == 0:
            raise ValueError(f"{type(model).__name__} has no nn.Linear layers to quantize to {quantizer.format}")
        if knobs.quantize_embeddings:
            inp.weight.data = quantizer.fake_quant_weight(inp.weight.detach().float())
        for p in m.parameters():
            p.grad = None
            p.requires_grad_(False)
            p.data = p.data.to(act_dtype)
        self.model = m
        self._keep = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(m.forward).parameters else {}
        self._state: dict = {}

    @property
    def device(self) -> torch.device:
        return self.model.get_input_embeddings().weight.device

    def start(self, ids: torch.Tensor, mask: torch.Tensor, max_new_tokens: int, refills: bool = False) -> torch.Tensor:
        """FastDecoder.start; `refills` is never set here (the generic path generates one chunk at a time)."""
        B, P = ids.shape
        attn = torch.cat([mask.long(), torch.ones(B, max_new_tokens, dtype=torch.long, device=ids.device)], dim=1)
        pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=ids, attention_mask=attn[:, :P], position_ids=pos, use_cache=True, **self._keep)
        self._state = dict(attn=attn, length=P, next_pos=mask.sum(1, keepdim=True), cache=out.past_key_values)
        return out.logits[:, -1].float()

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        st = self._state
        st["length"] += 1
        out = self.model(
            input_ids=tokens[:, None],
            attention_mask=st["attn"][:, : st["length"]],
            position_ids=st["next_pos"],
            past_key_values=st["cache"],
            use_cache=True,
        )
        st["next_pos"] = st["next_pos"] + 1
        st["cache"] = out.past_key_values
        return out.logits[:, -1].float()

    def keep(self, rows: torch.Tensor) -> None:
        """Keep only `rows` of the batch and of HF's cache (FastDecoder.keep)."""
        st = self._state
        st["cache"].reorder_cache(rows)
        st["attn"], st["next_pos"] = st["attn"].index_select(0, rows), st["next_pos"].index_select(0, rows)

    def use_compiled(self) -> None:
        """The generic path keeps HF's eager forward (its cache object does not trace cleanly); only the quantized
        linears are compiled (EmbeddedEngine.load_weights)."""


@ENGINES.register("embedded", schema=EmbeddedRolloutConfig)
class EmbeddedEngine:
    """The default rollout engine (bench.rollout.base.RolloutEngine): own policy copy, batched sampler.

    precision           a format of bench/quant/ (fp32 | bf16 | fp8_e4m3 | int8 | ...)
    weight_granularity  the format's (per_channel | per_tensor for the 8-bit formats; fused QKV / gate-up
                        share a per-tensor scale, as in vLLM's fused layers); None = the format's default
    act_granularity     the format's (per_token | per_tensor | none; none = weight-only); None = default
    quantize_lm_head, quantize_embeddings              off by default (vLLM keeps both in bf16)
    eos_id, pad_id      a row stops after emitting eos_id (one id, several, or None: never); pad_id fills after it
    max_len             optional cap on prompt + new tokens (ValueError beyond)
    backend             auto (fast decoder when the family allows, else HF) | fast | hf
    act_dtype           fp32 | bf16 | fp16: override the activation dtype of the precision (None: its format's
                        for the device the weights are on: `act_dtype_on`, e.g. INT8 fp32 on CPU, bf16 on CUDA)
    int8_kernel         auto | int_mm | emulated (bench.quant.int8.int8_matmul; identical results)
    fp8_kernel          auto | scaled_mm | emulated (bench.quant.fp8.choose_fp8_kernel): torch._scaled_mm accumulates
                        in fewer bits than the emulation's fp32 (docs/gpu.md); method=matched takes the emulation
    cpu_kernels         auto | onednn | plain (bench.quant.linear.CPU_KERNELS): on a CPU, auto packs the weights of
                        2^18+ elements for oneDNN's GEMM at each sync (2-2.5x sgemm's speed on a decode step's few
                        rows) and computes a decode step's attention as two batched matmuls (`decode_attention`);
                        onednn packs every fp32 weight; plain is torch's F.linear and SDPA (the engine before the key)
    cpu_attention       matmul | varlen (bench.rollout.cpu_attention.CPU_ATTENTION): on a CPU, how a fast-decoder step's
                        fp32 attention reads the cache. matmul (the default): `decode_attention` over the window from
                        the batch's oldest live sequence; varlen: a C kernel over each row's own columns, built at the
                        first engine with the system's C compiler (refused where there is none). The same attention
                        up to summation order; with continuous batching varlen reads ~half the columns (1.2-1.3x the
                        rollout at the 10m preset, docs/benchmarks.md). Not the default: the committed reference
                        reports were sampled with matmul, and another summation order is another run. An attention
                        in bf16 (a CPU with bf16 matmuls at a bf16 activation dtype) is SDPA's with either value
    kv_cache_dtype      None | fp8 | fp8_e4m3 | fp8_e5m2: K (after RoPE) and V rounded as an FP8 KV cache
                        without calibrated scales stores them (vLLM's k_scale = v_scale = 1)
    chunk_tokens        KV-cache positions per generate chunk (None: one chunk): a batch is generated
                        chunk_tokens // (prompt + max new tokens) sequences at a time, so its cache is bounded
                        whatever the batch; per-sequence uniforms make the tokens independent of the chunking
    sync_every          decode steps between host syncs (SYNC_EVERY): the stop check waits for the device only
                        every k tokens, not every token
    compact             at each sync, rows that emitted a stop id leave the batch and the KV cache, so a chunk's
                        step costs what its unfinished rows cost (long-tail lengths: most rows end early). Exact:
                        rows are independent and each samples from its own uniforms, so the tokens are those of
                        an uncompacted chunk (tests/unit/test_engine.py); log-probs agree to rounding, as across
                        chunk sizes (a GEMM's kernel may depend on the batch size)
    refill              continuous batching, on the fast decoder: a batch larger than a chunk's rows decodes in one
                        KV cache of that many slots, and at each sync the slots of ended sequences take the queued
                        ones (`FastDecoder.admit`); without it the batch decodes a chunk at a time, each chunk until
                        its longest row ends. The same tokens up to summation order (a refilled row attends over
                        masked columns too); a batch that fits one chunk is unaffected
    cuda_graphs         on a GPU, the fast decoder's decode steps replayed from CUDA graphs, one per (rows, attended
                        key columns), instead of ~45 kernel launches per layer from Python; the same arithmetic
                        (`FastDecoder._decode`, the eager step, captured; tested on the CPU without capture). Off by
                        default: not yet run on a GPU
    compile             torch.compile the fast decoder's decode step and every quantized linear (the FP8 / INT8
                        activation quantization becomes one fused kernel per linear computing the same codes)
    """

    gathers_by_module = True  # load_weights takes a `Gather`: a sharded model is read one FSDP unit at a time

    def __init__(self, precision: str = "fp32", *, eos_id: int | Sequence[int] | None = None, pad_id: int = 0,
                 max_len: int | None = None, **knobs: Any):
        """`knobs`: any key of EmbeddedRolloutConfig (the schema states and checks each, once)."""
        self.cfg = EmbeddedRolloutConfig(precision=precision, **knobs)
        check_schema(self.cfg, "rollout")
        self.quantizer = self.cfg.quantizer()
        self.precision = precision
        # None: the format's activation dtype for the device the weights are on (set again at load_weights)
        self.act_dtype = DTYPES[self.cfg.act_dtype or self.quantizer.fmt.act_dtype]
        self.eos_id = eos_id
        self.stop_ids = torch.tensor(token_ids(eos_id), dtype=torch.long)
        self.pad_id = pad_id
        self.max_len = max_len
        self.decoder: FastDecoder | HFDecoder | None = None
        self.decode_steps = 0  # the last generate chunk's decode steps (the GPU check traces them)

    def quant_metrics(self) -> dict[str, float]:
        return {} if self.decoder is None else self.decoder.quant_errors.metrics()

    @property
    def sampling_device(self) -> torch.device:
        """Where `generate` samples (the trainer's weights' device once loaded; bench.rollout.base.sampling_device)."""
        return torch.device("cpu") if self.decoder is None else self.decoder.device

    @property
    def active_backend(self) -> str | None:
        """"fast" or "hf" once weights are loaded."""
        if self.decoder is None:
            return None
        return "fast" if isinstance(self.decoder, FastDecoder) else "hf"

    def release(self) -> None:
        """Drop the policy copy (its memory goes back to the device); `load_weights` builds a new one."""
        self.decoder = None

    @torch.no_grad()
    def load_weights(self, model: nn.Module, gather: Gather = as_is) -> None:
        """Rebuild the engine's copy from the trainer's weights: fresh quantization scales every call.

        `gather` (see `Gather`) makes a sharded model's parameters whole: the fast decoder holds one decoder
        layer's (or the root's) at a time; the generic HF path, which deep-copies the model, cannot copy a sharded
        one (FSDP2 refuses a deep copy)."""
        problem = fast_path_problem(model)
        if self.cfg.backend == "fast" and problem:
            raise ValueError(f"backend='fast' cannot serve {type(model).__name__}: {problem}")
        use_fast = self.cfg.backend == "fast" or (self.cfg.backend == "auto" and problem is None)
        device = next(model.parameters()).device
        self.act_dtype = DTYPES[self.cfg.act_dtype or self.quantizer.fmt.act_dtype_on(device.type)]
        self.decoder = None  # free the old copy before building the new one
        if not use_fast and gather is not as_is:
            raise ValueError(f"rollout.backend={self.cfg.backend} serves {type(model).__name__} on the generic HF "
                             f"path, which deep-copies the model, and FSDP2 refuses to deep-copy a sharded one"
                             f"{f' (the fast decoder cannot serve it: {problem})' if problem else ''}: run it with "
                             "train.nproc_per_node=1, or use rollout.backend=auto with a Llama / Qwen2 / Qwen3 model")
        self.decoder = (FastDecoder(model, self.quantizer, self.act_dtype, self.cfg, gather) if use_fast
                        else HFDecoder(model, self.quantizer, self.act_dtype, self.cfg))
        modules = list(self.decoder.modules() if isinstance(self.decoder, nn.Module) else self.decoder.model.modules())
        use_cpu_gemm(modules, self.cfg.cpu_kernels)
        if self.cfg.compile:
            fuse_activation_quantization(modules)
            self.decoder.use_compiled()
        if self.cfg.cuda_graphs and device.type == "cuda" and isinstance(self.decoder, FastDecoder):
            self.decoder.use_cuda_graphs()

    @torch.no_grad()
    def generate(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, n: int, sampling: SamplingParams,
                 generator: torch.Generator | None = None) -> Rollout:
        """`n` responses per prompt row, at most `chunk_rows` sequences decoding at once: in one KV cache of that many
        rows refilled from a queue (`refill`, fast decoder), else one chunk after another. Every sequence samples
        with its own uniforms (drawn up front from `generator`, row by row), so the result does not depend on the
        chunking or on which row a sequence decodes in."""
        if self.decoder is None:
            raise RuntimeError("EmbeddedEngine.generate called before load_weights")
        if not sampling.greedy and not sampling.temperature > 0:
            raise ValueError(f"temperature={sampling.temperature} must be positive (or use greedy=True)")
        if not 0.0 < sampling.top_p <= 1.0:
            raise ValueError(f"top_p={sampling.top_p} must be in (0, 1]")
        if sampling.top_k < 0:
            raise ValueError(f"top_k={sampling.top_k} must be >= 0 (0: off)")
        T = sampling.max_new_tokens
        if T < 1:
            raise ValueError(f"max_new_tokens={T} must be at least 1")
        if not prompt_mask[:, -1].all():
            raise ValueError("prompts must be left-padded: prompt_mask[:, -1] has a padding position")
        device = self.decoder.device  # the engine computes where the trainer's weights live; so do its buffers
        ids = prompt_ids.to(device).long().repeat_interleave(n, dim=0)
        mask = prompt_mask.to(device).bool().repeat_interleave(n, dim=0)
        if self.max_len is not None and ids.shape[1] + T > self.max_len:
            raise ValueError(f"prompt length {ids.shape[1]} + max_new_tokens {T} exceeds max_len={self.max_len}")
        B = ids.shape[0]
        uniforms = None
        if not sampling.greedy:  # drawn where the generator lives (any device), then moved to the engine's
            where = generator.device if generator is not None else device
            uniforms = torch.rand(B, T, dtype=torch.float64, generator=generator, device=where).to(device)
        rows = chunk_rows(ids.shape[1] + T, self.cfg.chunk_tokens)
        if self.cfg.refill and isinstance(self.decoder, FastDecoder):  # one cache of `rows` slots, refilled
            rows = B
        parts = [self._generate_chunk(ids[i:i + rows], mask[i:i + rows], sampling,
                                      None if uniforms is None else uniforms[i:i + rows])
                 for i in range(0, B, rows)]
        steps = max(part[0].shape[1] for part in parts)
        tokens, resp_mask, logp = (torch.cat([F.pad(part[j], (0, steps - part[j].shape[1]), value=fill) for part in parts])
                                   for j, fill in ((0, self.pad_id), (1, False), (2, 0.0)))
        return Rollout(ids, mask, tokens, resp_mask, logp)

    def _generate_chunk(
        self, ids: torch.Tensor, mask: torch.Tensor, sampling: SamplingParams, uniforms: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(tokens, response mask, log mu) [b, steps] of the sequences `ids`; their KV caches are freed before
        returning.

        At most `chunk_rows` sequences decode at once, in the slots of one KV cache; the rest wait in a queue (only
        with `refill`, on the fast decoder: otherwise `generate` hands over a chunk at a time). The host syncs every
        `sync_every` steps: it stops when every sequence has ended (a stop id, or max_new_tokens), gives the slots of
        the ended ones to queued sequences (`FastDecoder.admit`: their prompts run, their first tokens are sampled at
        the next step) and, once the queue is empty, with `compact`, drops the ended rows from the batch. A slot's
        sequence (`seq`) writes its t-th token at [seq, t] (`t` per slot); an ended one writes into a scratch column."""
        B, T, device = ids.shape[0], sampling.max_new_tokens, ids.device
        slots = min(B, chunk_rows(ids.shape[1] + T, self.cfg.chunk_tokens))
        tokens = torch.full((B, T + 1), self.pad_id, dtype=torch.long, device=device)  # column T: the scratch
        logp = torch.zeros(B, T + 1, dtype=torch.float32, device=device)
        resp_mask = torch.zeros(B, T + 1, dtype=torch.bool, device=device)
        seq = torch.arange(slots, device=device)  # the sequence each slot of the batch decodes
        t = torch.zeros(slots, dtype=torch.long, device=device)  # the tokens it has so far
        done = torch.zeros(slots, dtype=torch.bool, device=device)
        queued = slots  # the next sequence to admit
        logits = self.decoder.start(ids[:slots], mask[:slots], T, refills=queued < B)
        stops = self.stop_ids.to(logits.device)
        step, deadline = 0, T  # the host's count of decode steps; every admitted sequence has ended by `deadline`
        while True:
            u = None if uniforms is None else uniforms[seq, t.clamp(max=T - 1)]
            tok, lp = _sample(logits, sampling, u)
            col = t.masked_fill(done, T)  # an ended slot writes into the scratch column
            tokens[seq, col], logp[seq, col], resp_mask[seq, col] = tok, lp, True
            t = t + ~done
            done = done | (t >= T)
            if stops.numel():
                done |= torch.isin(tok, stops)
            step += 1
            sync = step % self.cfg.sync_every == 0 or step == deadline  # the host waits for the device here only
            if sync and queued == B:
                if bool(done.all()):
                    break
                if self.cfg.compact and bool(done.any()) and done.numel() > COMPACT_MIN_ROWS:
                    keep = compaction(done)
                    seq, t, tok, done = seq[keep], t[keep], tok[keep], done[keep]
                    self.decoder.keep(keep)
            logits = self.decoder.step(tok.masked_fill(done, self.pad_id))
            if sync and queued < B and bool(done.any()):
                free = done.nonzero().squeeze(1)[: B - queued]
                new = torch.arange(queued, queued + free.numel(), device=device)
                logits[free] = self.decoder.admit(free, ids[new], mask[new])
                seq[free], t[free], done[free] = new, 0, False
                queued += free.numel()
                deadline = step + T
        self.decoder._state = {}  # free the KV cache now: on a GPU the next chunk or the training step needs it
        self.decode_steps = step  # with refill more than the width below (the longest row's)
        steps = int(resp_mask[:, :T].sum(1).max())  # the longest row: steps past it (a sync's last k - 1) are dropped
        return tokens[:, :steps], resp_mask[:, :steps], logp[:, :steps]


#: torch.compile's backend for `compile=True` (the tests trace with "eager": the same graphs run eagerly, no C++ build)
COMPILE_BACKEND = "inductor"


#: Inductor options that keep eager PyTorch's numerics in the compiled pieces, each under its spellings (the first this
#: torch knows is set): the bf16 roundings between fused ops (`emulate_precision_casts`; without it a fused kernel
#: keeps fp32 intermediates) and IEEE division (Triton's `x / y` is an approximate division; `emulate_divison_rounding`,
#: sic, in torch 2.10, `eager_numerics.division_rounding` from 2.11). Without them the H200 check of 2026-11-28 found
#: the fused activation quantizer's scales off the emulation's in the last bit and a compiled bf16 engine's tokens
#: equal to the eager engine's on 47 of 64 rows over 160 tokens.
EAGER_NUMERICS = (("emulate_precision_casts",), ("eager_numerics.division_rounding", "emulate_divison_rounding"))


def inductor_options() -> dict[str, bool]:
    """The EAGER_NUMERICS options set, each by the first of its spellings this torch's Inductor knows (none: left
    out, as Inductor refuses an unknown option; tests/unit/test_engine.py checks that this torch knows every one)."""
    import torch._inductor.config as config

    def known(name: str) -> bool:
        obj = config
        for part in name.split("."):
            if not hasattr(obj, part):
                return False
            obj = getattr(obj, part)
        return True

    spelt = (next((name for name in names if known(name)), None) for names in EAGER_NUMERICS)
    return {name: True for name in spelt if name is not None}


def compiled(fn):
    """`fn` through torch.compile with dynamic shapes (module docstring of EmbeddedEngine: `compile`), with eager
    numerics under Inductor (EAGER_NUMERICS)."""
    options = inductor_options() if COMPILE_BACKEND == "inductor" else None
    return torch.compile(fn, dynamic=True, backend=COMPILE_BACKEND, options=options)


def compaction(done: torch.Tensor) -> torch.Tensor:
    """Indices of the rows to keep at a compaction: every unfinished row, topped up with finished ones (in batch
    order) to COMPACT_MIN_ROWS, so that no decode GEMM gets fewer rows than that (COMPACT_MIN_ROWS says why)."""
    order = torch.argsort(done.to(torch.int8), stable=True)  # unfinished rows first, each group in batch order
    keep = order[: max(int((~done).sum()), COMPACT_MIN_ROWS)]
    return keep.sort().values


def fuse_activation_quantization(modules) -> int:
    """Give every quantized linear among `modules` a quantizer whose dynamic activation quantization runs as one
    compiled kernel (`FusedActQuantizer`); returns how many. One compiled function per quantizer, shared by its
    linears (shapes dynamic: any number of tokens)."""
    fused: dict[Quantizer, FusedActQuantizer] = {}
    count = 0
    for m in modules:
        q = getattr(m, "quantizer", None)
        if isinstance(q, Quantizer) and q.quantizes_activations:
            m.quantizer = fused.setdefault(q, FusedActQuantizer(q))
            count += 1
    return count


class FusedActQuantizer:
    """A Quantizer whose `quantize_act` / `fake_quant_act` are torch.compile'd: the amax reduction, the scale, the
    rounding and the dequantization of one activation in one fused kernel instead of ~10-17 eager ones. Compiled
    from the same functions, so the same codes and scales (tests/unit/test_engine.py compares them bit for bit
    on the CPU; a GPU check compares the CUDA kernel with the CPU emulation). Everything else is the Quantizer's."""

    def __init__(self, quantizer: Quantizer):
        self.quantizer = quantizer
        self.quantize_act = compiled(quantizer.quantize_act)
        self.fake_quant_act = compiled(quantizer.fake_quant_act)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.quantizer, name)


def chunk_rows(seq_len: int, chunk_tokens: int | None) -> int:
    """Sequences per generate chunk: as many as fit `chunk_tokens` KV-cache positions at `seq_len` each
    (prompt + max new tokens), at least one; all of them when chunk_tokens is None."""
    if chunk_tokens is None:
        return 2**62
    return max(1, chunk_tokens // seq_len)


def _sample(
    logits: torch.Tensor, sampling: SamplingParams, uniform: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token and its log-prob under the distribution it was drawn from: softmax(logits / T), fp32, truncated to
    the top-k tokens (top_k > 0), then to the top-p nucleus (top_p < 1), renormalized.

    Greedy takes the argmax and reports the T=1 log-prob (SamplingParams). Sampling inverts the row's CDF at
    its own uniform [B] (float64): a token is a function of its row's logits and uniform alone, whatever else is
    in the batch (so chunking a batch, or splitting it across ranks, draws the same tokens).
    """
    if sampling.greedy:
        logp_all = torch.log_softmax(logits.float(), dim=-1)
        tok = logp_all.argmax(-1)
    else:
        logp_all = torch.log_softmax(logits.float() / sampling.temperature, dim=-1)
        if sampling.top_k > 0:
            logp_all = top_k_logprobs(logp_all, sampling.top_k)
        if sampling.top_p < 1.0:
            logp_all = top_p_logprobs(logp_all, sampling.top_p)
        tok = inverse_cdf(logp_all.exp(), uniform)
    return tok, logp_all.gather(-1, tok[:, None]).squeeze(-1)


#: Rows whose float64 CDF exists at once in `inverse_cdf` (8 B x vocabulary each: 1.2 MB at 152k).
CDF_ROWS = 64


def inverse_cdf(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Index k [B] with cdf[k-1] <= u * total < cdf[k] for each row of probs [B, V] (float64 CDF): token k is
    drawn with probability p_k / total, and a zero-probability token never (it has an empty interval).

    CDF_ROWS rows at a time, so the float64 CDF is [CDF_ROWS, V] at most, not [B, V]. The CDF itself stays: a
    cheaper form (float32 prefix sums, or float64 block sums and a search within the block) sums in another order,
    and would draw another token wherever u * total falls within the rounding of a boundary; a float32 CDF over
    152k entries also misplaces the small tokens' intervals by more than their width. Each row's draw is its own,
    so the row chunks draw exactly the tokens of one pass."""
    toks = []
    for rows in range(0, probs.shape[0], CDF_ROWS):
        p = probs[rows: rows + CDF_ROWS]
        cdf = p.double().cumsum(-1)
        x = uniform[rows: rows + CDF_ROWS].to(cdf)[:, None] * cdf[:, -1:]
        tok = torch.searchsorted(cdf, x, right=True).squeeze(-1).clamp_(max=p.shape[-1] - 1)
        # u * total rounding up to total (odds ~2^-53) would land past the last token of positive probability
        toks.append(torch.where(p.gather(-1, tok[:, None]).squeeze(-1) > 0, tok, p.argmax(-1)))
    return torch.cat(toks)


def top_k_logprobs(logp: torch.Tensor, top_k: int) -> torch.Tensor:
    """Log-probs [B, V] of the top-k distribution: the k most likely tokens renormalized (log p - log S, S their
    mass), -inf elsewhere; k >= V keeps every token. Ties at the k-th value are broken by the sort, as in vLLM."""
    if top_k >= logp.shape[-1]:
        return logp
    keep = torch.zeros_like(logp, dtype=torch.bool).scatter(-1, logp.topk(top_k, dim=-1).indices, True)
    kept = logp.masked_fill(~keep, float("-inf"))
    return kept - torch.logsumexp(kept, dim=-1, keepdim=True)


def top_p_logprobs(logp: torch.Tensor, top_p: float) -> torch.Tensor:
    """Log-probs [B, V] of the top-p (nucleus) distribution: the most likely tokens, in order, while the mass
    before each is below `top_p` (so the set reaches top_p, and the first token is always kept), renormalized;
    -inf elsewhere. The sampled token's entry is its log-prob under the distribution actually sampled from.
    The same rule as vLLM's and HF's top-p (tokens tied at the boundary are ordered by the sort)."""
    sorted_logp, order = logp.sort(dim=-1, descending=True)
    probs = sorted_logp.exp()
    mass_before = probs.cumsum(-1) - probs
    keep_sorted = mass_before < top_p
    keep_sorted[..., 0] = True
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    kept = logp.masked_fill(~keep, float("-inf"))
    return kept - torch.logsumexp(kept, dim=-1, keepdim=True)
