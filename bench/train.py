"""One GRPO run with a low-precision rollout engine: the training loop.

    engine.load_weights(policy)   sync: the rollout copy is re-quantized with fresh scales
    rollout = engine.generate()   tokens, response mask, log mu of every sampled token
    rewards -> advantages         GRPO group-normalized (bench/grpo.py)
    lold = policy.logprobs()      recompute pass, only for methods that need pi_old
    stats = method.prepare()      per-batch constants (IS weights, alpha, ...), detached
    for minibatch: loss = method.loss(policy.logprobs(mb)); step
    metrics -> run dir (+ W&B mirror); every k steps: eval, checkpoint

Everything that differs between arms is behind `Method` (bench/methods) and everything that differs between
precisions is behind the engine (bench/rollout, bench/quant): this file never branches on either.
"""

from __future__ import annotations

import copy
import random
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from omegaconf import DictConfig
from tqdm import tqdm

from bench.evaluation import greedy_eval
from bench.grpo import group_advantages
from bench.methods.base import Batch, Method, arm_info, build_method, select_stats
from bench.mismatch import mismatch_metrics, sanitize
from bench.models.load import load_policy
from bench.models.logprobs import TRAINER_DTYPES, token_logprobs
from bench.models.tokenizer import decode_responses, encode_prompts
from bench.preempt import PreemptionGuard
from bench.quant import diagnostics
from bench.quant.quantizers import Quantizer
from bench.rollout import build_engine
from bench.resume import RESUME_FROM, Plan, decide, final_status
from bench.rollout.base import Rollout, RolloutEngine, SamplingParams
from bench.store import RunDir
from bench.tasks.base import Task, build_task
from bench.tracking import start_tracking


@dataclass
class TrainConfig:
    """`train.*`: the loop's settings."""

    steps: int = 100
    batch_size: int = 64  # sequences per rollout batch = prompts x group_size
    group_size: int = 8
    minibatches: int = 1  # optimizer steps per rollout batch
    epochs: int = 1
    lr: float = 1e-4  # Adam on a ~1M model: 3e-4+ destroys the warm start's accuracy, 2e-5 barely moves
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    dtype: str = "bf16"  # trainer compute: bf16 (fp32 master weights + bf16 weights/autocast) | fp32
    eval_every: int = 10
    checkpoint_every: int = 10
    threads: int = 0  # torch threads; 0 = leave torch's default (sweeps set 1 per job)
    keep_checkpoint: bool = False  # keep ckpt/last.pt after completion (it is always kept while resumable)
    overwrite: bool = False  # restart from step 0 even if the run directory holds results (bench/resume.py)
    resume_from: str = "last"  # last | previous: the checkpoint to resume from (previous = ckpt/prev.pt)

    def check(self) -> None:
        if self.group_size < 2:
            raise ValueError(f"train.group_size={self.group_size} is too small: GRPO needs at least 2 responses per prompt")
        if self.batch_size <= 0 or self.batch_size % self.group_size:
            raise ValueError(f"train.batch_size={self.batch_size} is not divisible by train.group_size={self.group_size}")
        if self.minibatches < 1 or (self.batch_size // self.group_size) % self.minibatches:
            raise ValueError(f"train.minibatches={self.minibatches} must divide the "
                             f"{self.batch_size // self.group_size} prompts per step")
        if not self.lr > 0:
            raise ValueError(f"train.lr={self.lr} must be positive")
        if self.steps < 1:
            raise ValueError(f"train.steps={self.steps} must be at least 1")
        if self.dtype not in TRAINER_DTYPES:
            raise ValueError(f"train.dtype={self.dtype!r} is not valid; choose one of: {', '.join(TRAINER_DTYPES)}")
        if self.resume_from not in RESUME_FROM:
            raise ValueError(f"train.resume_from={self.resume_from!r} is not valid; choose one of: {', '.join(RESUME_FROM)}")


class Diverged(RuntimeError):
    """A non-finite loss or gradient: the run stops, keeps its metrics, and is marked diverged."""


@dataclass
class Parts:
    cfg: DictConfig
    task: Task
    policy: torch.nn.Module
    tokenizer: Any
    method: Method
    engine: RolloutEngine
    eval_engine: RolloutEngine
    optimizer: torch.optim.Optimizer
    generator: torch.Generator
    ref_policy: torch.nn.Module | None = None


def build(cfg: DictConfig) -> Parts:
    """Everything a run needs; raises a clear error on bad input before any training."""
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    task = build_task(cfg.task)
    policy, tokenizer = load_policy(cfg.model, task)
    return Parts(
        cfg=cfg, task=task, policy=policy, tokenizer=tokenizer, method=build_method(cfg.method, cfg.algo),
        engine=build_engine(cfg.rollout, tokenizer, policy),
        # evaluate the trainer's policy itself, not its quantized copy
        eval_engine=build_engine(cfg.rollout, tokenizer, policy, precision="fp32"),
        optimizer=torch.optim.AdamW(policy.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay),
        generator=torch.Generator().manual_seed(cfg.seed),
    )


class Timer(dict):
    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        yield
        self[name] = self.get(name, 0.0) + time.perf_counter() - t0


def score(p: Parts, examples: list[dict], rollout: Rollout, n: int) -> torch.Tensor:
    completions = decode_responses(p.tokenizer, rollout.response_ids, rollout.response_mask)
    return torch.tensor([p.task.reward(ex, c) for ex, c in zip((e for e in examples for _ in range(n)), completions)])


def train_step(p: Parts, step: int) -> dict[str, float]:
    cfg, t = p.cfg, Timer()
    G, T = cfg.train.group_size, cfg.rollout.temperature
    with t("sync"):
        p.engine.load_weights(p.policy)
    examples = p.task.sample(step, cfg.train.batch_size // G, cfg.seed)
    prompt_ids, prompt_mask = encode_prompts(p.tokenizer, [p.task.prompt(e) for e in examples])
    with t("rollout"):
        rollout = p.engine.generate(prompt_ids, prompt_mask, G, SamplingParams(cfg.task.max_new_tokens, T), p.generator)
    rewards = score(p, examples, rollout, G)
    adv = group_advantages(rewards, G, eps=cfg.algo.adv_eps, norm_by_std=cfg.algo.norm_adv_by_std)

    with t("train"), t("recompute"), torch.no_grad():
        logp_old = token_logprobs(p.policy, rollout, T, cfg.train.dtype)[0] if p.method.needs_recompute else None
        logp_ref = token_logprobs(p.ref_policy, rollout, T, cfg.train.dtype)[0] if p.ref_policy else None
    mask, frac_nonfinite = sanitize(logp_old if logp_old is not None else rollout.logp_mu, rollout.logp_mu, rollout.response_mask)
    batch = Batch(logp_old, rollout.logp_mu, adv, mask, max(1.0, float(mask.sum())), logp_ref)
    before = diagnostics.snapshot(p.policy)
    with t("train"):
        stats = p.method.prepare(batch)
        logs, logp_theta0 = update(p, rollout, batch, stats, step)
    # bypass arms have no pi_old: their mismatch uses log pi_theta at theta_old (methods.md section 11)
    measured = mismatch_metrics(logp_old if logp_old is not None else logp_theta0, rollout.logp_mu, mask)
    measured |= {"mismatch/frac_nonfinite_logprob": frac_nonfinite}
    measured |= diagnostics.weight_update(before, p.policy) | p.engine.quant_metrics()
    return step_metrics(p, step, rollout, rewards, logs, stats, measured, t)


def update(p: Parts, rollout: Rollout, batch: Batch, stats: dict, step: int) -> tuple[dict[str, float], torch.Tensor]:
    """The optimizer steps on one rollout batch; returns mean metrics and epoch-0 log pi_theta (detached)."""
    cfg = p.cfg.train
    B, logs = batch.size, defaultdict(list)
    logp_theta0 = torch.zeros_like(batch.logp_mu)
    for epoch in range(cfg.epochs):
        for idx in torch.arange(B).chunk(cfg.minibatches):
            mb = batch.select(idx)
            logp, entropy = token_logprobs(p.policy, rollout.select(idx), p.cfg.rollout.temperature, cfg.dtype, with_entropy=True)
            mb = mb.drop_nonfinite(logp)  # a non-finite log pi_theta leaves the mask too (methods.md section 0)
            loss, metrics = p.method.loss(logp, mb, select_stats(stats, idx, B))
            if not torch.isfinite(loss):
                raise Diverged(f"step {step}: non-finite loss ({loss.item()})")
            p.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(p.policy.parameters(), cfg.grad_clip)
            if not torch.isfinite(grad_norm):
                raise Diverged(f"step {step}: non-finite gradient norm ({grad_norm.item()})")
            p.optimizer.step()
            if epoch == 0:
                logp_theta0[idx] = logp.detach()
            logs["loss"].append(loss.item())
            logs["grad_norm"].append(grad_norm.item())
            logs["entropy"].append((entropy * mb.mask).sum().item() / mb.n_tokens)
            for k, v in metrics.items():
                logs[k].append(float(v))
    return {k: sum(v) / len(v) for k, v in logs.items()}, logp_theta0


TRAIN_KEYS = ("loss", "grad_norm", "entropy", "clipfrac", "ppo_kl")


def step_metrics(p: Parts, step: int, rollout: Rollout, rewards: torch.Tensor, logs: dict[str, float],
                 stats: dict[str, Any], measured: dict[str, float], t: Timer) -> dict[str, float]:
    """The metrics row of one step, in the namespaces of bench/identity.py; `measured` holds the mismatch/*
    and quant/* metrics, already named."""
    arm = p.method.name
    row: dict[str, float] = {"step": step}
    row |= {"reward/mean": rewards.mean().item(), "reward/std": rewards.std().item(),
            "reward/accuracy": (rewards >= 1.0).float().mean().item(),
            "reward/response_length": rollout.response_mask.sum(1).float().mean().item()}
    row |= {f"train/{k}": v for k, v in logs.items() if k in TRAIN_KEYS}
    row["train/lr"] = p.optimizer.param_groups[0]["lr"]
    row |= {k: v for k, v in measured.items() if k.startswith("mismatch/")}
    row |= {f"method/{arm}/{k}": v for k, v in stats.items() if isinstance(v, (int, float))}
    row |= {f"method/{arm}/{k}": v for k, v in logs.items() if k not in ("loss", "grad_norm", "entropy")}
    row |= {k: v for k, v in measured.items() if not k.startswith("mismatch/")}
    n_tok = rollout.response_mask.sum().item()
    row |= {"time/rollout_s": t["rollout"], "time/sync_s": t["sync"], "time/recompute_s": t["recompute"],
            "time/train_s": t["train"], "time/step_s": sum(t[k] for k in ("sync", "rollout", "train")),
            "time/rollout_tokens_per_s": n_tok / max(t["rollout"], 1e-9)}
    return row


def evaluate(p: Parts, step: int) -> dict[str, float]:
    """Greedy accuracy of the trainer's policy on the test split."""
    return {"step": step} | greedy_eval(p.eval_engine, p.policy, p.tokenizer, p.task, p.task.examples("test"),
                                        p.cfg.task.max_new_tokens)


def precision_info(cfg: DictConfig) -> dict[str, Any]:
    """The rollout precision as reports name it (label, bit widths), recorded in run.json for the analysis."""
    r = cfg.rollout
    return Quantizer(r.precision, r.weight_granularity, r.act_granularity).describe()


def checkpoint(p: Parts, next_step: int) -> dict[str, Any]:
    return {"step": next_step, "policy": p.policy.state_dict(), "optimizer": p.optimizer.state_dict(),
            "generator": p.generator.get_state(), "torch_rng": torch.get_rng_state(), "python_rng": random.getstate(),
            "ref_policy": p.ref_policy.state_dict() if p.ref_policy else None}


def restore(p: Parts, ckpt: dict[str, Any]) -> int:
    p.policy.load_state_dict(ckpt["policy"])
    p.optimizer.load_state_dict(ckpt["optimizer"])
    p.generator.set_state(ckpt["generator"])
    torch.set_rng_state(ckpt["torch_rng"])
    random.setstate(ckpt["python_rng"])
    if p.ref_policy is not None and ckpt["ref_policy"] is not None:
        p.ref_policy.load_state_dict(ckpt["ref_policy"])
    return int(ckpt["step"])


def train(p: Parts, run: RunDir, config_yaml: str, run_name: str, plan: Plan | None = None,
          overrides: list[str] | None = None) -> str:
    """Run (or resume) training in `run`; returns the final status. The caller holds the run's lock and
    has decided what to do with the directory (`plan`, bench/resume.py; made here when not given)."""
    cfg = p.cfg
    plan = plan or decide(run, cfg)
    if plan.action not in ("start", "resume"):
        raise RuntimeError(f"{run_name}: {plan.message}")
    ckpt = plan.checkpoint
    # UAQ and the like: once, before training, never again on resume (the checkpoint holds the result)
    setup = p.method.setup_model(p.policy) if ckpt is None else {}
    if cfg.algo.kl_ref_beta > 0:
        p.ref_policy = copy.deepcopy(p.policy).requires_grad_(False)
    start = restore(p, ckpt) if ckpt is not None else 0
    info = run.start(config_yaml, run_name, overrides)
    declared = {"arm": arm_info(p.method.name), "precision": precision_info(cfg)}  # for the analysis
    tracker = start_tracking(cfg, run.path, run_name, resume_id=info.get("wandb_id"), run_info=declared)
    tracker.replay(run.metrics(), run.evals(), below=start)  # rows an earlier attempt's W&B mirror lost
    run.update_info(wandb_id=tracker.run_id, setup=setup, **declared)
    t0, every = time.perf_counter(), cfg.train
    bar = tqdm(range(start, every.steps), initial=start, total=every.steps, desc=run_name, mininterval=1.0, dynamic_ncols=True)
    with PreemptionGuard() as guard:
        try:
            for step in bar:
                if step % every.eval_every == 0:
                    run.append_eval(ev := evaluate(p, step))
                    tracker.log(ev, step)
                row = train_step(p, step)
                run.append_metrics(row)
                tracker.log(row, step)
                bar.set_postfix(reward=f"{row['reward/mean']:.3f}", kl=f"{row['mismatch/kl_k3']:.1e}", refresh=False)
                if (step + 1) % every.checkpoint_every == 0 or guard.requested:
                    run.save_checkpoint(checkpoint(p, step + 1))
                if guard.requested and step + 1 < every.steps:
                    run.finish("preempted", reason=f"signal {guard.signal_name} after step {step}")
                    tracker.mark_preempting()
                    tracker.finish(exit_code=1)
                    guard.exit_after_checkpoint()
        except Diverged as e:
            run.finish("diverged", reason=str(e), wall_s=time.perf_counter() - t0)
            tracker.finish(exit_code=1)
            return "diverged"
        # the final evaluation is guarded too: a signal during it lets it finish, then ends the run cleanly
        run.append_eval(ev := evaluate(p, every.steps))
        tracker.log(ev, every.steps)
        final = {"final/eval_accuracy": ev["eval/accuracy"], "final/wall_s": time.perf_counter() - t0}
        status, reason = final_status(run, every.steps, every.eval_every)
        run.finish(status, reason=reason, **final)
        tracker.finish(exit_code=0)
        if not cfg.train.keep_checkpoint:
            run.drop_checkpoint()
        bar.close()
        if guard.requested:
            print(f"qrl-bench: {run_name}: {guard.signal_name} arrived during the final evaluation; the run is {status}",
                  file=sys.stderr, flush=True)
            guard.exit_after_checkpoint()
    return status
