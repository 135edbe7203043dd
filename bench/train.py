"""One GRPO run with a low-precision rollout engine: the training loop.

    engine.load_weights(policy)   sync: the rollout copy is re-quantized with fresh scales
    sample = sampler.collect()    engine.generate round(s) + rewards (+ DAPO's knobs, bench/sampling.py)
    engine.release()              its memory to the training step (vLLM with sleep_level > 0 sleeps)
    lold = policy.logprobs()      recompute pass, only for methods that need pi_old
    adv = estimator.estimate()    GRPO group-normalized [B], or the critic's values + GAE [B, T] (bench/advantages.py)
    stats = method.prepare()      per-batch constants (IS weights, alpha, ...), detached
    for minibatch: loss = method.loss(policy.logprobs(mb)); step
    estimator.update()            the critic's own optimizer steps (GAE; nothing for GRPO)
    log.log(row)                  metrics -> run dir + W&B mirror (bench/run/runlog.py); every k steps: eval, checkpoint

Everything that differs between arms is behind `Method` (bench/methods) and everything that differs between
precisions is behind the engine (bench/rollout, bench/quant): this file never branches on either.
"""

from __future__ import annotations

import dataclasses
import random
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch
from omegaconf import DictConfig

from bench import checkpoint
from bench.advantages import build_estimator
from bench.checkpoint import TrainState
from bench.compute import Diverged, TrainerCompute, enable_gradient_checkpointing
from bench.distributed.engines import block_engines
from bench.distributed.group import agree, init, is_follower, resume_note, say, settle
from bench.distributed.sharding import frozen_copy
from bench.device import describe, make_generator, resolve_device
from bench.evaluation import build_eval_engine, build_eval_sets, evaluate_policy
from bench.methods.base import Batch, Method, method_info, build_method, select_stats
from bench.mismatch import mismatch_metrics, sanitize
from bench.models.load import config_overrides, context_length, load_policy
from bench.models.tokenizer import PromptFormat, engine_ids, uses_chat_template
from bench.run.preempt import PreemptionGuard
from bench.preflight import check_data, check_inputs
from bench.run.progress import progress
from bench.quant import diagnostics
from bench.rollout import build_engine
from bench.rewards import scorer_metrics
from bench.run.identity import method_metric
from bench.run.resume import Plan, decide, final_status
from bench.rollout.base import Rollout, RolloutEngine, rollout_quantizer
from bench.sampling import Sample, Sampler
from bench.run.runlog import RunLog
from bench.run.store import RunDir
from bench.tasks.base import Task, build_task
from bench.train_config import TrainConfig
from bench.warmstart import policy_path
from bench.timing import Timer


@dataclass(kw_only=True)
class Parts(TrainState):
    """Everything a run uses: its resumable state (TrainState, saved and restored by bench/checkpoint.py) and what
    every start builds again from the config."""

    cfg: DictConfig
    task: Task
    tokenizer: Any
    method: Method
    engine: RolloutEngine
    eval_engine: RolloutEngine
    prompt_format: PromptFormat = PromptFormat()
    eval_sets: dict[str, Task] = field(default_factory=dict)
    sampler: Sampler = field(init=False)  # what collect() reads; built last by build(), around the final engine


def build(cfg: DictConfig) -> Parts:
    """Everything a run needs; raises a clear error on bad input before any training."""
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    task = build_task(cfg.task)
    eval_sets = build_eval_sets(cfg.eval, task)
    check_data(cfg, task, eval_sets)  # every split read and checked before the warm start trains on the data
    # the built-in model is warm-started, by whichever rank gets the build's lock: before the process group
    # exists, since transformers' save_pretrained writes nothing on a rank other than 0 of an initialized group
    policy, tokenizer = load_policy(cfg.model, policy_path(cfg.model, task))
    init(cfg.train.device)  # one process of several (torchrun, SLURM): join the group
    device = resolve_device(cfg.train.device)
    policy.to(device)  # before the optimizer: its states are allocated beside the parameters
    method = build_method(cfg.method, cfg.algo)
    method.setup_trainer(policy, cfg.rollout)  # how the trainer computes (the control: at the rollout's precision)
    if cfg.train.gradient_checkpointing:
        enable_gradient_checkpointing(policy)
    prompt_format, max_len = check_startup(cfg, task, eval_sets, policy, tokenizer)
    ids = engine_ids(tokenizer, policy)  # every EOS id the model may emit, and the pad id
    engine = build_engine(cfg.rollout, **ids, max_len=max_len)
    # the trainer's policy itself, not its quantized copy: eval.engine (bench/evaluation.py)
    eval_engine = build_eval_engine(cfg.eval, cfg.rollout, engine, ids, max_len)
    engine, eval_engine = block_engines(engine, eval_engine, cfg, tokenizer)  # the same at world size 1
    parts = Parts(
        cfg=cfg, task=task, policy=policy, tokenizer=tokenizer, method=method, engine=engine, eval_engine=eval_engine,
        optimizer=torch.optim.AdamW(policy.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay),
        generator=make_generator(device, cfg.seed), seed=cfg.seed,
        compute=TrainerCompute(device, cfg.train.dtype, cfg.rollout.temperature, cfg.train.micro_batch_size,
                               micro_batch_tokens=cfg.train.micro_batch_tokens),
        advantage=build_estimator(cfg, policy),
        prompt_format=prompt_format, eval_sets=eval_sets,
    )
    parts.shard()  # FSDP2 across the ranks (bench/distributed/); nothing at world size 1
    parts.sampler = Sampler.from_config(cfg, task, tokenizer, parts.engine, parts.generator, parts.compute.device,
                                        prompt_format)
    return parts


def check_startup(cfg: DictConfig, task: Task, eval_sets: dict[str, Task], policy: torch.nn.Module, tokenizer: Any
                  ) -> tuple[PromptFormat, int | None]:
    """The checks of a loaded model against the run's settings, before any engine is built: the chat template of
    every task, the context (`model.max_length` within the model's max_position_embeddings, after
    `model.max_position_embeddings`), every prompt's length (bench/preflight.py). They read the model's config only,
    so tests/integration/test_paper_recipes.py runs them on every paper recipe at its real model's shape (on the
    meta device). Returns the prompt format and the context the engines get."""
    prompt_format = PromptFormat.from_config(cfg.model)
    for t in (task, *eval_sets.values()):
        uses_chat_template(tokenizer, t, prompt_format)  # a template asked for but missing fails here
    max_len = context_length(cfg.model, policy)
    check_inputs(cfg, task, eval_sets, policy, tokenizer, prompt_format)
    return prompt_format, max_len


def train_step(p: Parts, step: int) -> dict[str, float]:
    t = Timer(device=p.compute.device)  # waits for the GPU at every phase boundary
    with t("sync"):
        p.engine.load_weights(p.policy)
    sample = p.sampler.collect(step, t)
    quant = p.engine.quant_metrics()  # the engine's copy holds them: read before the release
    with t("rollout"):
        p.engine.release()  # the training step gets its memory (a vLLM engine sleeps, the embedded copy goes)
    if sample.rollout is None:  # dynamic sampling kept no group within its round cap: no update this step
        return {"step": step} | sample.metrics | time_metrics(t, sample.generated_tokens)
    rollout = sample.rollout

    with t("recompute"):
        # cut into the update's minibatches' micro-batches: log pi_old is then exactly log pi_theta at theta_old
        mbs = p.cfg.train.minibatches
        logp_old = p.compute.logprobs(p.policy, rollout, minibatches=mbs)[0] if p.method.needs_recompute else None
        logp_ref = p.compute.logprobs(p.ref_policy, rollout, minibatches=mbs)[0] if p.ref_policy else None
        adv, measured = p.advantage.estimate(rollout, sample.rewards)
    mask, frac_nonfinite = sanitize(logp_old if logp_old is not None else rollout.logp_mu, rollout.logp_mu, rollout.response_mask)
    mask = sample.loss_mask(mask)
    batch = Batch(logp_old, rollout.logp_mu, adv, mask, max(1.0, float(mask.sum())), logp_ref)
    before = diagnostics.snapshot(p.policy)
    with t("train"):
        stats = p.method.prepare(batch)
        batch = rebaseline(p, rollout, sample.rewards, batch, stats)
        logs, logp_theta0 = update(p, rollout, batch, stats, step)
        measured |= p.advantage.update(rollout, mask, step)
    # bypass arms have no pi_old: their mismatch uses log pi_theta at theta_old (docs/arms.md §7)
    measured |= mismatch_metrics(logp_old if logp_old is not None else logp_theta0, rollout.logp_mu, mask,
                                 kept=p.method.kept_tokens(batch, stats, logp_theta0))
    measured |= {"mismatch/frac_nonfinite_logprob": frac_nonfinite}
    measured |= diagnostics.weight_update(before, p.policy) | quant | scorer_metrics(p.task, "reward")
    return step_metrics(p, step, sample, logs, stats, measured, t)


def rebaseline(p: Parts, rollout: Rollout, rewards: torch.Tensor, batch: Batch, stats: dict) -> Batch:
    """algo.baseline=kept: the GRPO advantages again, each group's mean and std over the responses the arm did not
    reject in `prepare` (a rejected response gets 0); the batch unchanged otherwise (docs/arms.md §2.1)."""
    rejected = p.method.rejected_rows(batch, stats) if p.cfg.algo.baseline == "kept" else None
    if rejected is None or not bool(rejected.any()):
        return batch
    adv, _ = p.advantage.estimate(rollout, rewards, keep=~rejected)
    return dataclasses.replace(batch, adv=adv)


def update(p: Parts, rollout: Rollout, batch: Batch, stats: dict, step: int) -> tuple[dict[str, float], torch.Tensor]:
    """The optimizer steps on one rollout batch; returns mean metrics and epoch-0 log pi_theta (detached)."""
    cfg = p.cfg.train
    B, logs = batch.size, defaultdict(list)
    logp_theta0 = torch.zeros_like(batch.logp_mu)
    for group in p.optimizer.param_groups:
        group["lr"] = scheduled_lr(cfg, step)
    for epoch in range(cfg.epochs):
        for idx in torch.arange(B).chunk(cfg.minibatches):
            mb, mb_stats = batch.select(idx), select_stats(stats, idx, B)
            p.optimizer.zero_grad(set_to_none=True)
            loss, metrics, logp, entropy = p.compute.backward(
                p.policy, rollout.select(idx), lambda lp, mb=mb, st=mb_stats: p.method.loss(lp, mb.drop_nonfinite(lp), st), step)
            # (a non-finite log pi_theta leaves the mask too: docs/arms.md §1)
            grad_norm = p.compute.step(p.policy, p.optimizer, cfg.grad_clip, step)  # None: fp16 overflow, skipped
            if epoch == 0:
                logp_theta0[idx] = logp
            logs["loss"].append(loss.item())
            logs["grad_norm"] += [] if grad_norm is None else [grad_norm]
            logs["entropy"].append((entropy * mb.mask).sum().item() / mb.n_tokens)
            for k, v in metrics.items():
                logs[k].append(float(v))
    return {k: sum(v) / len(v) for k, v in logs.items() if v} | p.compute.metrics(), logp_theta0


def scheduled_lr(cfg: TrainConfig, step: int) -> float:
    """The policy's learning rate at rollout step `step`: train.lr after a linear warm-up from 0 over
    train.lr_warmup_steps (verl's constant schedule with warm-up, as its DAPO recipes set it: lr x step / W for step
    < W, so step 0 moves only the optimizer's moments). A function of the step alone: a resumed run needs no
    scheduler state to continue it."""
    warmup = cfg.lr_warmup_steps
    return cfg.lr * (step / warmup if step < warmup else 1.0)


#: bench/compute.py's own metrics, train/* only: the padded share of the forwards' tokens; fp16 loss scaling
COMPUTE_KEYS = ("pad_fraction", "grad_scale", "skipped_steps")
TRAIN_KEYS = ("loss", "grad_norm", "entropy", "clipfrac", "ppo_kl", *COMPUTE_KEYS)


def step_metrics(p: Parts, step: int, sample: Sample, logs: dict[str, float],
                 stats: dict[str, Any], measured: dict[str, float], t: Timer) -> dict[str, float]:
    """The metrics row of one step, in the namespaces of bench/run/identity.py; `measured` holds the mismatch/*,
    quant/* and critic/* metrics, already named."""
    arm, rollout, rewards = p.method.name, sample.rollout, sample.rewards
    row: dict[str, float] = {"step": step}
    row |= {"reward/mean": rewards.mean().item(), "reward/std": rewards.std().item(),
            "reward/accuracy": (sample.scores >= 1.0).float().mean().item(),
            "reward/response_length": rollout.response_mask.sum(1).float().mean().item()}
    row |= {f"train/{k}": v for k, v in logs.items() if k in TRAIN_KEYS}
    row["train/lr"] = p.optimizer.param_groups[0]["lr"]
    row |= {k: v for k, v in measured.items() if k.startswith("mismatch/")}
    row |= {method_metric(arm, k): v for k, v in stats.items() if isinstance(v, (int, float))}
    row |= {method_metric(arm, k): v for k, v in logs.items() if k not in TRAIN_KEYS}  # train/* holds those once
    row |= {k: v for k, v in measured.items() if not k.startswith("mismatch/")}
    return row | sample.metrics | time_metrics(t, sample.generated_tokens)


def time_metrics(t: Timer, generated_tokens: int) -> dict[str, float]:
    """time/*: disjoint parts (generation, weight sync + re-quantization, recompute pass, optimizer steps) and
    rollout throughput over every token generated in the step (all of dynamic sampling's rounds)."""
    t = Timer({"sync": 0.0, "rollout": 0.0, "recompute": 0.0, "train": 0.0} | t)
    return {"time/rollout_s": t["rollout"], "time/sync_s": t["sync"], "time/recompute_s": t["recompute"],
            "time/train_s": t["train"], "time/step_s": sum(t[k] for k in ("sync", "rollout", "recompute", "train")),
            "time/rollout_tokens_per_s": generated_tokens / max(t["rollout"], 1e-9)}


def evaluate(p: Parts, step: int) -> dict[str, float]:
    """Greedy accuracy of the trainer's policy on the test split, and the eval sets' metrics (bench/evaluation.py)."""
    return {"step": step} | evaluate_policy(p.eval_engine, p.policy, p.tokenizer, p.task, p.eval_sets, p.cfg.eval,
                                            p.prompt_format, p.cfg.seed, step)


def shares_engine(p: Parts) -> bool:
    """Whether the evaluation generates in the rollout engine itself (a vLLM evaluation at the rollout precision),
    which it then builds first anyway. Otherwise the run builds the rollout engine before its first evaluation
    (unless the vLLM preflight already started it: `build_s`), so that an engine which cannot start fails in
    seconds, not after an evaluation of hours."""
    return p.eval_engine is p.engine or bool(getattr(p.eval_engine, "shares_rollout_engine", False))


def runtime_info(p: Parts) -> dict[str, Any]:
    """Where the run computes (engine, device, trainer dtype) and the model's context (its max_position_embeddings,
    and the config.json fields `model.*` overrode), recorded in run.json so that the analysis can label throughput
    rows (and call CPU low-precision rollouts emulated) without importing torch."""
    return {"engine": p.cfg.rollout.engine, **describe(p.compute.device), "trainer_dtype": p.cfg.train.dtype,
            "max_position_embeddings": getattr(p.policy.config, "max_position_embeddings", None),
            "config_overrides": config_overrides(p.cfg.model)}  # what the model's config.json was given


# 63 lines: the whole loop (start, steps, evaluations, checkpoints, the end) on one screen, as CleanRL keeps it
def train(p: Parts, run: RunDir, config_yaml: str, run_name: str, plan: Plan | None = None,
          overrides: list[str] | None = None) -> str:
    """Run (or resume) training in `run`; returns the final status. The caller holds the run's lock and
    has decided what to do with the directory (`plan`, bench/run/resume.py; made here when not given)."""
    cfg = p.cfg
    plan = plan or decide(run, cfg)
    if plan.action not in ("start", "resume"):
        raise RuntimeError(f"{run_name}: {plan.message}")
    ckpt = plan.checkpoint
    # UAQ and the like: once, before training, never again on resume (the checkpoint holds the result)
    setup = p.method.setup_model(p.policy) if ckpt is None else {}
    if cfg.algo.kl_ref_beta > 0:
        p.ref_policy = frozen_copy(p.policy)
    start = checkpoint.restore(p, ckpt) if ckpt is not None else 0
    if note := resume_note(ckpt, cfg):
        say(f"{run_name}: warning: {note}")
    run.start(config_yaml, run_name, overrides)
    declared = {"method": method_info(p.method.name), "precision": rollout_quantizer(cfg.rollout).describe(), "runtime": runtime_info(p)}
    # rank 0 alone mirrors the run to W&B (a follower's run.json is not written)
    log = RunLog.open(run, cfg, run_name, start, mirror=not is_follower(), run_info=declared)
    run.update_info(wandb_id=log.wandb_id, setup=setup, **declared)
    t0, every = time.perf_counter(), cfg.train
    if start < every.steps and start % every.eval_every == 0 and not shares_engine(p) \
            and getattr(p.engine, "build_s", None) is None:
        p.engine.load_weights(p.policy)  # the rollout engine before the first evaluation: its failure costs seconds
        p.engine.release()  # as after every rollout: the evaluation gets its memory (the embedded copy goes)
    bar = progress(range(start, every.steps), run_name)  # a tqdm bar on a terminal, plain lines in a log file
    with PreemptionGuard() as guard:
        try:
            for step in bar:
                if step % every.eval_every == 0:
                    log.log_eval(evaluate(p, step))
                row = train_step(p, step)
                if step == start:  # start-up is over: a rank stuck from now on ends the run within minutes
                    settle()
                log.log(row)
                bar.set_postfix(reward=f"{row.get('reward/mean', float('nan')):.3f}",
                                kl=f"{row.get('mismatch/kl_k3', float('nan')):.1e}", refresh=False)
                stop = agree(guard)  # a signal to any rank stops every rank after this step
                if (step + 1) % every.checkpoint_every == 0 or stop:
                    checkpoint.save(p, run, step + 1)
                if stop and step + 1 < every.steps:
                    run.finish("preempted", reason=f"signal {guard.signal_name} after {step + 1} of {every.steps} steps")
                    log.close(exit_code=1, preempting=True)
                    guard.exit_after_checkpoint()
        except Diverged as e:  # diverged_step: analysis keeps a divergence as a result only after step 0
            run.finish("diverged", reason=str(e), wall_s=time.perf_counter() - t0, diverged_step=step)
            log.close(exit_code=1)
            return "diverged"
        # the final evaluation is guarded too: a signal during it lets it finish, then ends the run cleanly
        log.log_eval(ev := evaluate(p, every.steps))
        final = {"final/eval_accuracy": ev["eval/accuracy"], "final/wall_s": time.perf_counter() - t0}
        status, reason = final_status(run, every.steps, every.eval_every)
        run.finish(status, reason=reason, **final)
        log.close(exit_code=0)
        if not cfg.train.keep_checkpoint:
            run.drop_checkpoint()
        bar.close()
        if guard.requested:
            print(f"qrl-bench: {run_name}: {guard.signal_name} arrived during the final evaluation; the run is {status}",
                  file=sys.stderr, flush=True)
            guard.exit_after_checkpoint()
    return status
