"""Peak GPU memory of a run, estimated from its composed config (`qrl-bench -m +experiment=... --dry-run`).

Not a measurement: arithmetic over the model's shape and the run's batch settings, in decimal GB (1e9 bytes),
so a recipe can be checked against its GPU before a job is queued. `scripts/gpu_check.sh` compares it with the
peak torch reports for two steps of `qurl_table1` on a real GPU. Terms (P = parameters, P_lin = decoder linear
weights, emb = V x h, L layers, h hidden, i MLP width, V vocabulary; per token of a batch padded to
prompt + max new tokens, the worst case):

resident, held through the whole step
    trainer states      fp32 master weights + grads + AdamW m, v: 16 B x P (model.dtype=bf16: 8 B x P)
    autocast copies     bf16/fp16 weight copies under autocast: 2 B x P
    update snapshot     the weight-update diagnostic's copy of the linear weights: 4 B x P_lin
    critic              algo.advantage=gae: a copy of the backbone with its own AdamW (16 B x (P_lin + emb))
    reference           algo.kl_ref_beta > 0: an fp32 copy, 4 B x P
    vllm engine         rollout=vllm: gpu_memory_utilization x the GPU, reserved at start (weights + KV cache)
transient, one phase at a time (the peak is the resident part plus the largest)
    generation          the embedded engine's copy of the policy, built at the sync and dropped once the step's
                        rollouts are done (`release`, bench/train.py): its weights in the rollout precision (8-bit
                        linears 1 B, bf16 2 B, fake-quant formats 4 B x P_lin; embedding and lm_head in the
                        activation dtype, both kept even when tied), plus its
                        KV cache at its chunk size: min(rollout.chunk_tokens, sequences x tokens) x
                        2 L kv_heads head_dim x bytes (bf16 2, fp32 4), plus the sampler's [rows, V] logits,
                        their / T, log-probs and probabilities (16 B x V per row) and the float64 CDF of CDF_ROWS
                        rows at a time (8 B x V each), or before them the prompts' forward (`prefill_bytes`: one
                        layer's activations of the chunk's prompts and their P x P mask), whichever is larger;
                        evaluation the same for the fp32 engine at eval.batch_size
                        sequences, and that engine's weights, 4 B x (P_lin + 2 emb) (built for each evaluation and
                        released after it); with eval.engine=vllm nothing beside a vLLM rollout engine (the
                        evaluation runs in it, bf16, or in one built at its share after it closed), beside an
                        embedded one a vLLM engine's default share (GPU_MEMORY_UTILIZATION of the GPU)
    recompute           no-grad log-prob passes over train.micro_batch_tokens tokens: one layer's activations per
                        token, and the lm_head's logits of one slice of HEAD_CHUNK_TOKENS positions at a time
                        (bench.models.logprobs: bf16 logits, their fp32 copy, / T, log-softmax: ~14 B x V each)
    training            train.micro_batch_size sequences (null: the minibatch), at most train.micro_batch_tokens
                        tokens (at least one sequence): activations per token (with gradient checkpointing the layer
                        inputs, L x h x 2 B; without it ~L x (26 h + 8 i) B, the README's GPU section) and one
                        slice's logits with their gradients (~20 B x V x HEAD_CHUNK_TOKENS, recomputed in backward)
Sequences count at prompt + max new tokens, the padded worst case: a micro-batch is cut to its own rows
(bench/compute.py), but the one holding the longest rows runs at full length.

GPUs: a run uses train.nproc_per_node GPUs on its node, one rank each; budget.gpus is what the recipe books (and
what its GPU-hours count). `MemoryEstimate.line` says both, and the dry run warns when they differ.
Several processes (N = train.nproc_per_node > 1; bench/distributed/): the trainer states, autocast copies,
snapshot, critic and reference are divided by the FSDP shard count N (the ranks of one node: across nodes the
model is replicated, HSDP, so N is the shard count at any node count); the engine, the KV cache, logits and
activations are per rank, whole. A copy into an engine gathers what it reads one piece at a time
(bench/distributed/engines.py BlockEngine), each freed before the next: the embedded engine one FSDP unit (the
root's embedding and lm_head, or one decoder layer: `Shape.unit`), vLLM one tensor (`Shape.tensor`), in the master
weights' dtype; the weight sync adds that as a transient phase, and the evaluation's build takes the larger of it
and the evaluation's KV cache. `tight` marks a peak above TIGHT of the device.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.eval_config import eval_engine_kind
from bench.models.logprobs import HEAD_CHUNK_TOKENS
from bench.rollout.embedded import CDF_ROWS, CHUNK_TOKENS
from bench.rollout.vllm_engine import GPU_MEMORY_UTILIZATION

GB = 1e9
#: Published config.json shapes of the hub models the recipes name (Hugging Face model cards):
#: hidden, layers, attention heads, kv heads, head_dim, MLP width, vocabulary, tied embeddings.
SHAPES: dict[str, tuple[int, int, int, int, int, int, int, bool]] = {
    "Qwen/Qwen2.5-0.5B-Instruct": (896, 24, 14, 2, 64, 4864, 151936, True),
    "Qwen/Qwen2.5-1.5B-Instruct": (1536, 28, 12, 2, 128, 8960, 151936, True),
    "Qwen/Qwen2.5-Math-1.5B": (1536, 28, 12, 2, 128, 8960, 151936, True),
    "Qwen/Qwen2.5-Math-7B": (3584, 28, 28, 4, 128, 18944, 152064, False),
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B": (1536, 28, 12, 2, 128, 8960, 151936, False),
    "Qwen/Qwen3-1.7B": (2048, 28, 16, 8, 128, 6144, 151936, True),
    "Qwen/Qwen3-4B": (2560, 36, 32, 8, 128, 9728, 151936, True),
    "Qwen/Qwen3-8B": (4096, 36, 32, 8, 128, 12288, 151936, False),
    "meta-llama/Llama-3.2-1B-Instruct": (2048, 16, 32, 8, 64, 8192, 128256, True),
}
#: The published config.json max_position_embeddings of the same models: the context a run gets unless
#: `model.max_position_embeddings` overrides it (tests/integration/test_paper_recipes.py starts every recipe on it).
CONTEXTS: dict[str, int] = {
    "Qwen/Qwen2.5-0.5B-Instruct": 32768, "Qwen/Qwen2.5-1.5B-Instruct": 32768, "Qwen/Qwen2.5-Math-1.5B": 4096,
    "Qwen/Qwen2.5-Math-7B": 4096, "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B": 131072, "Qwen/Qwen3-1.7B": 40960,
    "Qwen/Qwen3-4B": 40960, "Qwen/Qwen3-8B": 40960, "meta-llama/Llama-3.2-1B-Instruct": 131072,
}
LOGIT_BYTES_NO_GRAD = 14  # per position of an lm_head slice and vocabulary entry (module docstring)
LOGIT_BYTES_GRAD = 20
SAMPLER_BYTES = 16  # per row and vocabulary entry: fp32 logits, / T, log-probs, probabilities
EIGHT_BIT = ("int8", "fp8_e4m3")
TIGHT = 0.9  # of the device: less than 10 % headroom for the allocator's fragmentation and what is not counted  # real 1-byte kernels on a GPU (_int_mm, _scaled_mm)


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    mlp: int
    vocab: int
    tied: bool

    @property
    def linear(self) -> int:
        """P_lin: q/k/v/o and gate/up/down weights of every layer."""
        h, D = self.hidden, self.head_dim
        return self.layers * (h * (self.heads + 2 * self.kv_heads) * D + self.heads * D * h + 3 * h * self.mlp)

    @property
    def embed(self) -> int:
        return self.vocab * self.hidden

    @property
    def params(self) -> int:
        return self.linear + self.embed * (1 if self.tied else 2)

    @property
    def unit(self) -> int:
        """Parameters of the largest FSDP unit, the most a sharded run gathers at once to copy its policy into the
        embedded engine (bench/distributed/engines.py): the root's (embedding, lm_head unless tied) or a layer's."""
        return max(self.embed * (1 if self.tied else 2), self.linear // self.layers)

    @property
    def tensor(self) -> int:
        """Parameters of the largest single weight, the most vLLM's sync gathers at once: the embedding or an MLP
        projection."""
        return max(self.embed, self.hidden * self.mlp)

    def kv_bytes(self, itemsize: int) -> int:
        """KV-cache bytes per token position."""
        return 2 * self.layers * self.kv_heads * self.head_dim * itemsize


def model_shape(model: Any) -> Shape | None:
    """The shape of `cfg.model`: the built-in model's own fields, a hub model from SHAPES, a local directory's
    config.json (nothing is downloaded), else None."""
    if model.get("path") is None:
        return Shape(model.hidden_size, model.num_layers, model.num_heads, model.num_kv_heads,
                     model.hidden_size // model.num_heads, model.intermediate_size, model.vocab_size, True)
    known = SHAPES.get(str(model.path))
    if known is not None:
        return Shape(*known)
    config = Path(str(model.path)) / "config.json"
    if not config.is_file():
        return None
    c = json.loads(config.read_text())
    return Shape(c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"],
                 c.get("num_key_value_heads", c["num_attention_heads"]),
                 c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"], c["intermediate_size"],
                 c["vocab_size"], bool(c.get("tie_word_embeddings", True)))


@dataclass
class MemoryEstimate:
    """GB per GPU: resident parts, transient phases, the peak; `sharded` when the trainer is sharded over `gpus`
    ranks (FSDP2, train.nproc_per_node), `booked` the GPUs the recipe states (budget.gpus)."""

    parts: dict[str, float]
    phases: dict[str, float]
    gpus: int
    sharded: bool
    device_gb: float
    booked: int = 1

    @property
    def resident(self) -> float:
        return sum(self.parts.values())

    @property
    def peak(self) -> float:
        return self.resident + max(self.phases.values(), default=0.0)

    @property
    def fits(self) -> bool:
        return self.peak <= self.device_gb

    @property
    def tight(self) -> bool:
        return self.fits and self.peak > TIGHT * self.device_gb

    @property
    def idle(self) -> int:
        """Booked GPUs the run leaves idle (negative: it uses more than it books)."""
        return self.booked - self.gpus

    def line(self) -> str:
        """The dry run's per-job text."""
        phase = max(self.phases, key=self.phases.get) if self.phases else "-"
        where = "/GPU" + (f", FSDP2 over {self.gpus} ranks" if self.sharded else "")
        warn = (f"  EXCEEDS {self.device_gb:g} GB" if not self.fits else
                f"  TIGHT: {self.peak / self.device_gb:.0%} of {self.device_gb:g} GB" if self.tight else "")
        use = f"  GPUs {self.gpus} used / {self.booked} booked" + ("  IDLE GPUs" if self.idle > 0 else "")
        return (f"mem ~{self.peak:,.0f} GB{where} (resident {self.resident:,.0f} + {phase} "
                f"{self.phases.get(phase, 0):,.0f}){warn}{use}")


def engine_bytes(shape: Shape, precision: str, act_bytes: int) -> float:
    """The embedded engine's weights on a GPU: linears in the precision's storage, embedding + lm_head in the
    activation dtype (M1: bf16 around the 8-bit GEMMs)."""
    per_linear = {"fp32": 4, "bf16": 2, "fp16": 2}.get(precision, 1 if precision in EIGHT_BIT else 4)
    return shape.linear * per_linear + 2 * shape.embed * act_bytes


def sampler_bytes(rows: float, vocab: int) -> float:
    """The sampler's transient per decode step: [rows, V] in fp32 a few times, the fp64 CDF of CDF_ROWS rows."""
    return rows * vocab * SAMPLER_BYTES + min(rows, CDF_ROWS) * vocab * 8


def prefill_bytes(shape: Shape, rows: float, prompt: float, itemsize: int) -> float:
    """The prompts' forward of one generate chunk (EmbeddedEngine.start), before its first decode step: one layer's
    activations of every prompt position at a time (residual, q/k/v, attention output, the MLP's gate/up and their
    product: ~4 h + 3 i values) and the attention mask: [rows, 1, P, P] bool, repeated for the G = heads / kv_heads
    query heads of a KV head (bench.rollout.embedded.grouped_attention), and SDPA's additive copy of that."""
    groups = shape.heads // shape.kv_heads
    return (rows * prompt * (4 * shape.hidden + 3 * shape.mlp) * itemsize
            + rows * prompt**2 * (1 + groups * (1 + itemsize)))


def evaluation_bytes(cfg: Any, shape: Shape, prompt: float, gather_bytes: int, device_gb: float) -> float:
    """The evaluation phase's transient bytes: a vLLM engine's share, or the embedded evaluation engine's fp32 copy
    plus the largest of what a sharded run gathers to build it (`gather_bytes` per parameter of a unit; 0 unsharded)
    and its KV cache + sampler (module docstring)."""
    eval_cfg = cfg.get("eval") or {}
    eval_seq = prompt + (eval_cfg.get("max_new_tokens") or cfg.task.max_new_tokens)
    eval_positions = min(eval_cfg.get("batch_size", 64) * eval_seq, CHUNK_TOKENS)  # the engine's default chunk_tokens
    eval_kind = eval_engine_kind(eval_cfg.get("engine", "auto"), cfg.rollout.engine)
    if eval_kind == "vllm" and cfg.rollout.engine == "vllm":
        return 0.0  # the rollout's vLLM engine (bf16), or one built in its place at its share
    if eval_kind == "vllm":  # a vLLM engine beside the embedded rollout engine, for each evaluation
        return GPU_MEMORY_UTILIZATION * device_gb * GB
    eval_rows = eval_positions / eval_seq
    cache = eval_positions * shape.kv_bytes(4) + max(prefill_bytes(shape, eval_rows, prompt, 4),
                                                     sampler_bytes(eval_rows, shape.vocab))
    return 4 * (shape.linear + 2 * shape.embed) + max(gather_bytes * shape.unit, cache)


def estimate_memory(cfg: Any) -> MemoryEstimate | None:
    """Peak GB per GPU of one composed run config (the module docstring), or None for an unknown model shape."""
    shape = model_shape(cfg.model)
    if shape is None:
        return None
    b, train, algo, rollout, task = cfg.budget, cfg.train, cfg.algo, cfg.rollout, cfg.task
    device_gb = float(b.get("gpu_memory_gb", 80.0))
    P, V = shape.params, shape.vocab
    master = 8 if cfg.model.get("dtype") == "bf16" else 16
    weight_bytes = master // 4  # a master weight's bytes: what a gather holds per parameter
    nproc, booked = int(train.get("nproc_per_node", 1)), int(b.get("gpus", 1))
    sharded = nproc > 1
    low = train.dtype in ("bf16", "fp16")
    act_bytes = 2 if rollout.precision != "fp32" else 4
    critic = algo.get("advantage") == "gae"
    sharded_parts = {
        "trainer states": master * P,
        "autocast copies": 2 * P if low else 0,
        "update snapshot": 4 * shape.linear,
        "critic": (master + (2 if low else 0)) * (shape.linear + shape.embed) if critic else 0,
        "reference": 4 * P if algo.get("kl_ref_beta", 0) > 0 else 0,
    }
    parts = {}
    engine = 0.0  # the embedded engine's copy: built at the sync, dropped after the rollouts (module docstring)
    if rollout.engine == "vllm":
        parts["vllm engine"] = float(rollout.get("gpu_memory_utilization", GPU_MEMORY_UTILIZATION)) * device_gb * GB
    else:
        engine = engine_bytes(shape, rollout.precision, act_bytes)

    prompt = float(b.prompt_tokens)
    seq = prompt + task.max_new_tokens
    chunk = rollout.get("chunk_tokens")
    phases = {}
    if rollout.engine != "vllm":
        positions = train.batch_size * seq if chunk is None else min(chunk, train.batch_size * seq)
        rows = positions / seq
        phases["generation"] = engine + positions * shape.kv_bytes(act_bytes) + max(
            prefill_bytes(shape, rows, prompt, act_bytes), sampler_bytes(rows, V))
    phases["evaluation"] = evaluation_bytes(cfg, shape, prompt, weight_bytes if sharded else 0, device_gb)
    layer_act = 2 * shape.hidden * 16  # one layer's transient activations per token (bf16), rough
    recompute_tokens = train.micro_batch_tokens or train.batch_size * seq
    phases["recompute"] = (recompute_tokens * layer_act
                           + min(HEAD_CHUNK_TOKENS, recompute_tokens) * LOGIT_BYTES_NO_GRAD * V)
    micro = train.micro_batch_size or train.batch_size // train.minibatches
    rows = micro if train.micro_batch_tokens is None else max(1, min(micro, int(train.micro_batch_tokens // seq)))
    tokens = rows * seq
    per_token = (shape.layers * shape.hidden * 2 if train.gradient_checkpointing
                 else shape.layers * (26 * shape.hidden + 8 * shape.mlp))
    phases["training"] = tokens * (per_token + layer_act) + min(HEAD_CHUNK_TOKENS, tokens) * LOGIT_BYTES_GRAD * V

    if sharded:  # the sync gathers a unit (embedded) or a tensor (vLLM) at a time (module docstring)
        phases["weight sync"] = weight_bytes * (shape.tensor if rollout.engine == "vllm" else shape.unit) + engine
    out_parts = {k: v / nproc / GB for k, v in sharded_parts.items() if v} | {k: v / GB for k, v in parts.items()}
    return MemoryEstimate(out_parts, {k: v / GB for k, v in phases.items()}, nproc, sharded, device_gb, booked)


__all__ = ["CONTEXTS", "GB", "MemoryEstimate", "SHAPES", "Shape", "estimate_memory", "model_shape"]
