"""How good a sampler mu is before any update: the rollout engine's own accuracy at each precision on the test split,
against bf16's on the same problems, as Markdown.

    python -m bench.benchmarks.sampler_accuracy --precisions bf16,fp8_e4m3,fp8_e5m2,int8 +experiment=literature

Why: the literature's phenomenon (FlashRL, QuRL, Jet-RL, P3O) is a small per-token mismatch, mu as good a sampler as
pi, compounding over length and steps into a collapse. Where mu answers worse than bf16 from step 0 (W4A4 on a 1M
model), a naive gap mixes a worse sampler with the off-policy gradient; the control arm (`matched`) separates them,
but a setting meant to reproduce the literature should first have mu within ~2 pp of bf16. The training batch's
step-0 accuracy (reward/accuracy, 64 samples) is too noisy for that; this scores every test problem.

For each precision the engine is loaded with the run's warm start (the config's task and model; any Hydra override
after the options) and answers every test problem by sampling at rollout.temperature, with the same uniforms for
every precision (common random numbers: a token differs only where mu's distribution does), and greedily (the
evaluation's decoding); `--modes` picks. Each row: accuracy (%), and its paired difference to the first precision with
a 95 % t-interval over the problems (n = problems).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import torch

from bench.evaluation import sample_rewards
from bench.rollout.base import SamplingParams


def paired_gap(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float, float]:
    """mean(a - b) in pp with its 95 % t-interval over the paired entries (problems)."""
    from scipy.stats import t

    d = (a.double() - b.double()).flatten() * 100
    n = d.numel()
    half = float(t.ppf(0.975, n - 1) * d.std(unbiased=True) / n**0.5) if n > 1 else float("nan")
    return float(d.mean()), float(d.mean()) - half, float(d.mean()) + half


MODES = ("sampled", "greedy")


def measure(overrides: list[str], precisions: list[str], seed: int = 0, each: Any = lambda rows: None,
            modes: tuple[str, ...] = MODES, batch_size: int = 1000) -> list[dict[str, Any]]:
    """Per precision: greedy and sampled accuracy on the test split, and their paired gaps to the first precision;
    `each(rows so far)` after every precision (the command prints its table as it grows: a run may be stopped)."""
    from dataclasses import replace

    from hydra import compose, initialize_config_dir

    from bench.launch.config import CONF_DIR, register_configs
    from bench.models.load import load_policy
    from bench.models.tokenizer import PromptFormat, engine_ids
    from bench.models.load import context_length
    from bench.rollout import build_engine
    from bench.tasks.base import build_task
    from bench.warmstart import policy_path

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    torch.manual_seed(cfg.seed)
    task = build_task(cfg.task)
    policy, tokenizer = load_policy(cfg.model, policy_path(cfg.model, task))
    fmt = PromptFormat.from_config(cfg.model)
    examples = task.examples("test")
    ids = engine_ids(tokenizer, policy)
    out, ref = [], None
    for precision in precisions:
        rollout = cfg.rollout.copy()
        rollout.precision = precision
        engine = build_engine(rollout, **ids, max_len=context_length(cfg.model, policy))
        engine.load_weights(policy)
        sampling = SamplingParams(task.max_new_tokens, temperature=cfg.rollout.temperature)
        row: dict[str, Any] = {"precision": precision, "n": len(examples)}
        for mode in modes:
            params = replace(sampling, greedy=mode == "greedy")
            rewards, _ = sample_rewards(engine, tokenizer, task, examples, 1, params, fmt, batch_size,
                                        torch.Generator().manual_seed(seed))
            row[mode] = (rewards >= 1).float()
        ref = ref or row
        out.append(row | {f"{k}_gap": paired_gap(row[k], ref[k]) for k in modes})
        each(out)
    return out


def markdown(rows: list[dict[str, Any]]) -> str:
    base = rows[0]["precision"]
    modes = [m for m in MODES if m in rows[0]]
    lines = ["| precision | " + " | ".join(f"{m} acc. (%) | Δ vs {base} (pp)" for m in modes) + " | problems |",
             "|---|" + "---:|---:|" * len(modes) + "---:|"]
    for r in rows:
        cells = [r["precision"]]
        for k in modes:
            g, lo, hi = r[f"{k}_gap"]
            cells += [f"{100 * float(r[k].mean()):.1f}",
                      "–" if r["precision"] == base else f"{g:+.1f} [{lo:+.1f}, {hi:+.1f}]"]
        lines.append("| " + " | ".join(cells + [str(r["n"])]) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.benchmarks.sampler_accuracy", description=__doc__.split("\n\n")[0])
    p.add_argument("--precisions", default="bf16,fp8_e4m3,fp8_e5m2,int8",
                   help="comma-separated; the first is the reference (default: bf16,fp8_e4m3,fp8_e5m2,int8)")
    p.add_argument("--seed", type=int, default=0, help="the sampling stream shared by every precision")
    p.add_argument("--modes", default=",".join(MODES), help="sampled (at rollout.temperature: mu as the sampler of "
                   "step 0) and/or greedy (the evaluation's decoding); default: both")
    p.add_argument("overrides", nargs="*", help="Hydra overrides of the run config (task, model, rollout options)")
    args = p.parse_args(argv)
    def show(rows: list[dict[str, Any]]) -> None:
        sys.stdout.write(markdown(rows) + "\n")
        sys.stdout.flush()

    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    if not modes or not set(modes) <= set(MODES):
        p.error(f"--modes {args.modes!r}: choose from {', '.join(MODES)}")
    measure(args.overrides, [s.strip() for s in args.precisions.split(",") if s.strip()], args.seed, show, modes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
