"""Rollout throughput: the embedded engine at each precision against HF `generate`, as a Markdown table.

    python -m bench.benchmarks.rollout [--model-size 1m|10m] [--batch 16 64] [--new-tokens 64]
                                       [--prompt-len 32] [--threads 2] [--repeats 3]

Protocol (perf-notes 2): a Qwen2 model built from a config (random init, std 0.02, tied embeddings), pure
sampling at T=1 with no EOS stop, every method returning the sampled tokens *and* their log-probs.
Throughput = generated tokens / wall time, prefill included; one warm-up, then the best of `--repeats`
interleaved rounds (the machine is shared: the best is the least disturbed run). The last column is the
time of one `load_weights` (copy + fresh quantization), paid once per GRPO step. HF `generate` gets its log-probs from
`output_logits` + log-softmax + gather, as a trainer-side rollout without an engine would.
"""

from __future__ import annotations

import argparse
import copy
import platform
import time
from collections.abc import Callable

import torch

from bench.quant.linear import fast_int_mm, native_bf16_matmul
from bench.rollout.base import SamplingParams
from bench.rollout.embedded import EmbeddedEngine

PRECISIONS = ("fp32", "bf16", "fp8_e4m3", "int8")
#: perf-notes table of sizes (Qwen2, GQA 4/2 heads, tied embeddings).
SIZES = {
    "1m": dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
               intermediate_size=512, vocab_size=128),
    "10m": dict(hidden_size=256, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=1792, vocab_size=1024),
}


def build_model(size: str) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(**SIZES[size], initializer_range=0.02, tie_word_embeddings=True,
                      max_position_embeddings=4096)
    return Qwen2ForCausalLM(cfg).eval()


def best_tokens_per_s(runs: dict[str, Callable[[], int]], repeats: int) -> dict[str, float]:
    """Warm up every runner, then time them in interleaved rounds (a burst of load from elsewhere hits one
    round of every method rather than all repeats of one) and keep each one's best."""
    for run in runs.values():
        run()
    best = dict.fromkeys(runs, 0.0)
    for _ in range(repeats):
        for name, run in runs.items():
            t0 = time.perf_counter()
            tokens = run()
            best[name] = max(best[name], tokens / (time.perf_counter() - t0))
    return best


def sync_ms(model, precision: str, repeats: int) -> float:
    """Best time of `load_weights` (copy + fresh quantization), paid once per GRPO step."""
    engine = EmbeddedEngine(precision)
    engine.load_weights(model)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        engine.load_weights(model)
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def engine_runner(model, precision: str, prompts: torch.Tensor, new_tokens: int) -> Callable[[], int]:
    engine = EmbeddedEngine(precision)
    engine.load_weights(model)
    mask = torch.ones_like(prompts, dtype=torch.bool)
    sampling = SamplingParams(max_new_tokens=new_tokens)
    gen = torch.Generator().manual_seed(0)

    def run() -> int:
        return engine.generate(prompts, mask, 1, sampling, gen).num_tokens()

    return run


def hf_runner(model, prompts: torch.Tensor, new_tokens: int) -> Callable[[], int]:
    mask = torch.ones_like(prompts)

    @torch.no_grad()
    def run() -> int:
        out = model.generate(
            prompts, attention_mask=mask, do_sample=True, top_k=0, top_p=1.0, temperature=1.0,
            max_new_tokens=new_tokens, min_new_tokens=new_tokens, output_logits=True,
            return_dict_in_generate=True, pad_token_id=0,
        )
        new = out.sequences[:, prompts.shape[1]:]
        logp = torch.log_softmax(torch.stack(out.logits, dim=1).float(), dim=-1).gather(-1, new[..., None])
        return int(logp.numel())

    return run


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-size", choices=tuple(SIZES), default="1m")
    ap.add_argument("--batch", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=list(PRECISIONS))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    model = build_model(args.model_size)
    model_bf16 = copy.deepcopy(model).to(torch.bfloat16)
    rows: dict[str, dict[int, float]] = {}
    for B in args.batch:
        prompts = torch.randint(1, model.config.vocab_size, (B, args.prompt_len),
                                generator=torch.Generator().manual_seed(B))
        runs = {f"embedded | {prec}": engine_runner(model, prec, prompts, args.new_tokens) for prec in args.precisions}
        runs["hf_generate | fp32"] = hf_runner(model, prompts, args.new_tokens)
        runs["hf_generate | bf16"] = hf_runner(model_bf16, prompts, args.new_tokens)
        for name, tok_s in best_tokens_per_s(runs, args.repeats).items():
            rows.setdefault(name, {})[B] = tok_s

    syncs = {f"embedded | {prec}": f"{sync_ms(model, prec, args.repeats):.1f}" for prec in args.precisions}
    n_params = sum(p.numel() for p in model.parameters())
    print(f"## Rollout throughput: {args.model_size} ({n_params / 1e6:.2f}M params), prompt {args.prompt_len}, "
          f"{args.new_tokens} new tokens, {args.threads} threads, best of {args.repeats}\n")
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"CPU capability {torch.backends.cpu.get_cpu_capability()}, fast int8 _int_mm (VNNI): {fast_int_mm()}, "
          f"native bf16 matmul: {native_bf16_matmul()}\n")
    ref = rows["hf_generate | fp32"]
    header = "| engine | precision | " + " | ".join(f"B={B} tok/s | B={B} vs HF fp32" for B in args.batch)
    print(header + " | weight sync ms |")
    print("|" + "---|" * (3 + 2 * len(args.batch)))
    for name, by_batch in rows.items():
        cells = " | ".join(f"{by_batch[B]:.0f} | {by_batch[B] / ref[B]:.2f}x" for B in args.batch)
        print(f"| {name} | {cells} | {syncs.get(name, '-')} |")


if __name__ == "__main__":
    main()
