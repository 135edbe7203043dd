"""`qrl-bench -m ... --dry-run`: list the jobs a sweep would launch, and which would be skipped as done,
without launching anything (no SLURM submission, no training). Expands the sweep exactly as its sweeper does:
the rows of `hydra/sweeper=rows` (bench/launch/sweeper.py) crossed with `hydra.sweeper.params` and the command-line
overrides (with no rows: Hydra's basic sweeper).

Where a job's config sets `budget.params_b` (the paper recipes), its line ends with the estimated GPU-hours, priced
with the rollout engine the job runs (bench/launch/budget.py: vLLM at its rate, the embedded engine by a model of its
own decode), the rollout's share of a step, and, where the embedded engine costs more than 3x vLLM, vLLM's hours and
the override (a warning in the summary); the summary gives the total and the assumptions behind it. Where the model's shape is known
(the recipes' hub models, the built-in ones) and the job runs on a GPU, the line also gives its peak memory per GPU
(bench/launch/memory.py; per GPU, with the trainer states divided by the FSDP shard count when the job runs one
rank per GPU, `train.nproc_per_node`), a job whose estimate exceeds `budget.gpu_memory_gb` gets a warning, and one
within 10 % of it is named as tight; the line says how many GPUs the job uses and how many it books
(`budget.gpus`), and a job that leaves booked GPUs idle gets a warning (with hydra/launcher=slurm, also what the
launcher will warn about its request: bench/launch/requests.py). Where a job's evaluation and step outlast the SLURM
signal delay, or its wall time the SLURM allocations its requeues give it, a warning names the settings that fit. It also gives the hours of the run's evaluations through the embedded eager
decoder and through vLLM (`eval.engine`; bench/launch/budget.py `eval_estimate`, an upper bound: every response at
its max tokens).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from bench.eval_config import eval_setup
from bench.launch.budget import CHEAPER_BY, describe, describe_embedded, describe_eval, estimate, eval_estimate
from bench.launch.config import CONF_DIR, register_configs
from bench.launch.memory import estimate_memory
from bench.launch.power import naive_family, power_lines
from bench.launch.requests import SIGNAL_MAX_S, check_launcher_values, request_warnings, slurm_params
from bench.methods.base import build_method
from bench.run.identity import RunId
from bench.run.resume import preview, refusal_reason
from bench.run.store import RunDir
from bench.launch import sweeper

register_configs()


def expand(overrides: list[str]) -> list[list[str]]:
    """Every job's override list, in the sweeper's order (bench/launch/sweeper.py `expand`); its notes printed."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        jobs, notes = sweeper.expand(overrides, compose)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    return jobs


def dry_run(overrides: list[str]) -> int:
    jobs = expand(overrides)
    counts: dict[str, int] = {}
    refusals: dict[str, int] = {}  # why, how many
    seeds: dict[str, set] = {}  # arm -> its seeds (the power lines below)
    evals: dict[str, list[str]] = {}  # the evaluation's engine and precision -> the jobs evaluating that way
    cfg, configs = None, []
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        launcher = compose("config", overrides=jobs[0], return_hydra_config=True).hydra.launcher if jobs else None
        slurm = slurm_params(launcher)  # None: the sweep does not launch on SLURM
        costs = Costs(slurm_settings(slurm, overrides))
        for job in jobs:
            cfg = compose("config", overrides=job)
            configs.append(cfg)
            rid = RunId.of(cfg)
            seeds.setdefault(str(rid.path("").parent), set()).add(rid.seed)  # an arm in a cell: its path sans seed
            run = RunDir.of(cfg)
            status = run.status or "new"
            action = preview(run, cfg)  # what the launch will decide under the run's lock (bench/run/resume.py)
            counts[action] = counts.get(action, 0) + 1
            if action == "refuse":
                why = refusal_reason(run, cfg)
                refusals[why] = refusals.get(why, 0) + 1
            evals.setdefault(eval_setup(cfg.eval.engine, cfg.rollout.engine), []).append(RunDir.name_of(cfg))
            cost = costs.add(cfg)
            print(f"{action:7s} {status:10s} {RunDir.name_of(cfg):40s} {run.path}{cost}")
    todo = len(jobs) - counts.get("skip", 0) - counts.get("refuse", 0)
    refused = f", {counts['refuse']} refused" if counts.get("refuse") else ""
    noun = "job" if len(jobs) == 1 else "jobs"
    print(f"{len(jobs)} {noun}: {todo} to launch, {counts.get('skip', 0)} already finished{refused}", file=sys.stderr)
    for why, n in refusals.items():
        print(f"  refused ({n}): {why}", file=sys.stderr)
    if slurm is not None:  # what the SLURM launcher will warn about when it submits
        for line in request_warnings(slurm, configs):
            print(f"WARNING: {line}", file=sys.stderr)
    costs.warn()
    warn_mixed_evaluations(evals)
    if cfg is not None:  # the seeds the sweep needs for its target effect (bench/launch/power.py)
        lines, _ = power_lines(cfg, min(len(s) for s in seeds.values()), Path(cfg.out_root) / str(cfg.sweep) / "report",
                               naive_family(configs))
        for line in lines:
            print(line, file=sys.stderr)
    costs.total()
    return 0


def warn_mixed_evaluations(evals: dict[str, list[str]]) -> None:
    """A sweep whose jobs evaluate on different engines or precisions (eval.engine, whose auto follows the rollout
    engine: a paper recipe's vLLM rows evaluate in bf16 on vLLM, its embedded rows in fp32 on the embedded engine)
    compares accuracies measured by different samplers; say which jobs evaluate how, and the key that aligns them."""
    if len(evals) < 2:
        return
    groups = "; ".join(f"{setup} ({len(jobs)}: {', '.join(jobs[:3])}{', ...' if len(jobs) > 3 else ''})"
                       for setup, jobs in sorted(evals.items()))
    print(f"WARNING: the jobs evaluate with different engines or precisions: {groups}. A difference between two "
          "of them is then partly the evaluation's (its precision, kernels and random streams); set eval.engine for "
          "every job to compare like with like, or compare each row only with rows evaluated as it is "
          "(qrl-analyze --paper names each row's evaluation in the caption)", file=sys.stderr)


#: the SLURM launcher's settings the dry run's time-limit advice reads
SLURM_TIMING = ("signal_delay_s", "timeout_min", "max_num_timeout")


def slurm_settings(slurm: dict | None, overrides: list[str]) -> dict[str, float]:
    """SLURM_TIMING of the sweep's SLURM launcher (`slurm`: its composed parameters), or, for a sweep launched
    elsewhere, what hydra/launcher=slurm would give it: the command line's hydra.launcher.* override, else
    conf/hydra/launcher/slurm.yaml's value (its QRL_SLURM_* variable or its default)."""
    if slurm is not None:
        return {key: float(slurm[key]) for key in SLURM_TIMING}
    given = {item.split("=", 1)[0].removeprefix("hydra.launcher."): item.split("=", 1)[1] for item in overrides
             if item.startswith("hydra.launcher.") and "=" in item}
    defaults = OmegaConf.load(CONF_DIR / "hydra" / "launcher" / "slurm.yaml")
    values = {key: yaml.safe_load(given[key]) if key in given else defaults[key] for key in SLURM_TIMING}
    check_launcher_values(values)  # a QRL_SLURM_* variable that is not a number: named, not a float() traceback
    return {key: float(v) for key, v in values.items()}


@dataclass
class Costs:
    """The estimates the dry run prints beside each job, added up over the jobs, and what they warn about."""

    slurm: dict[str, float]  # SLURM_TIMING (slurm_settings)
    gpu_hours: float = 0.0
    assumptions: set[str] = field(default_factory=set)
    too_big: list[str] = field(default_factory=list)
    tight: list[str] = field(default_factory=list)
    idle: list[str] = field(default_factory=list)
    slow: list[str] = field(default_factory=list)
    long_steps: dict[str, float] = field(default_factory=dict)  # job -> seconds to end its work at a signal, > delay
    long_runs: dict[str, float] = field(default_factory=dict)  # job -> its wall seconds, > what its allocations hold

    def add(self, cfg: DictConfig) -> str:
        """One job's cost columns ("" for a config without a budget estimate), added to the totals."""
        est = estimate(cfg, build_method(cfg.method, cfg.algo).needs_recompute)  # an arm's knob may set it
        if est is None:
            return ""
        # a signal may come as an evaluation starts: the run ends its evaluation and its step, then checkpoints
        to_stop = est.step_s + (est.eval_s if est.evals else 0.0)
        if to_stop > self.slurm["signal_delay_s"]:
            self.long_steps[RunDir.name_of(cfg)] = to_stop
        if est.wall_hours * 3600 > self.allocations_s():
            self.long_runs[RunDir.name_of(cfg)] = est.wall_hours * 3600
        self.gpu_hours += est.gpu_hours
        self.assumptions.add(describe(cfg))
        if est.engine == "embedded":
            self.assumptions.add(describe_embedded())
        if est.vllm_would_save:
            self.slow.append(f"{RunDir.name_of(cfg)}: {est.line(cfg.rollout.precision).split('  ')[-1]}")
        cost = f"  {est.line(cfg.rollout.precision)}"
        ev = eval_estimate(cfg)  # the evaluations through either engine (eval.engine)
        if ev is not None:
            cost += f"  {ev.line()}"
            self.assumptions.add(describe_eval())
        mem = estimate_memory(cfg)  # GPU recipes only: a CPU config has no GPU to fit
        if mem is not None:
            cost += f"  {mem.line()}"
            if not mem.fits:
                self.too_big.append(f"{RunDir.name_of(cfg)}: ~{mem.peak:,.0f} GB > {mem.device_gb:g} GB")
            elif mem.tight:
                self.tight.append(RunDir.name_of(cfg))
            if mem.idle:
                self.idle.append(f"{RunDir.name_of(cfg)}: uses {mem.gpus} of the {mem.booked} GPUs it books "
                                 f"(train.nproc_per_node={mem.gpus}, budget.gpus={mem.booked})")
        return cost

    def warn(self) -> None:
        """The jobs that do not fit their GPU, leave booked GPUs idle, fit tightly, or would be cheaper on vLLM."""
        for line in self.too_big:
            print(f"WARNING: memory estimate exceeds the GPU: {line} (bench/launch/memory.py; docs/gpu.md)", file=sys.stderr)
        for line in self.idle:
            print(f"WARNING: booked GPUs idle or missing: {line}; its GPU-hours count budget.gpus", file=sys.stderr)
        if self.tight:
            print(f"note: {len(self.tight)} job(s) within 10% of the GPU's memory (an estimate: check with "
                  f"scripts/gpu_check.sh before a long run): {', '.join(self.tight)}", file=sys.stderr)
        for line in self.slow:
            print(f"WARNING: the embedded engine costs more than {CHEAPER_BY:g}x vLLM's rollout: {line}", file=sys.stderr)
        delay_s, timeout_min = self.slurm["signal_delay_s"], self.slurm["timeout_min"]
        if self.long_steps:
            longest = max(self.long_steps.values())
            twice = math.ceil(2 * longest / 60) * 60
            delay_s = min(twice, SIGNAL_MAX_S)  # twice the estimate, at most what --signal takes
            how = "twice that" if delay_s == twice else f"SLURM's longest; twice that would be {twice}"
            # submitit counts a signal as the time limit's only in the limit's last max(20 %, 10 min)
            limit = ""
            if delay_s > max(12 * timeout_min, 600):
                timeout_min = math.ceil(5 * delay_s / 60)
                limit = f" and hydra.launcher.timeout_min>={timeout_min} (submitit takes a signal for the time " \
                        "limit's only in the limit's last 20 %)"
            beyond = (f"; ~{longest / 60:,.0f} min is beyond SLURM's longest signal delay ({SIGNAL_MAX_S} s): evaluate "
                      "less often or less at a time (train.eval_every, eval.samples, eval.engine=vllm)"
                      if 2 * longest > SIGNAL_MAX_S else "")
            print(f"WARNING: {len(self.long_steps)} job(s) take longer for an evaluation and a training step (up to "
                  f"~{longest / 60:,.0f} min estimated) than the SLURM launcher's signal_delay_s="
                  f"{self.slurm['signal_delay_s']:g}: at a time limit such a run cannot finish its step and checkpoint "
                  f"before SLURM kills it, and the job is not requeued; on SLURM set hydra.launcher.signal_delay_s="
                  f"{delay_s} ({how}){limit} for: {', '.join(self.long_steps)}{beyond}", file=sys.stderr)
        if self.long_runs:
            longest, per = max(self.long_runs.values()), 60 * timeout_min - delay_s
            needed, have = math.ceil(longest / per) - 1, self.slurm["max_num_timeout"]
            at = f" (with timeout_min={timeout_min:g} and signal_delay_s={delay_s:g} as above)" if self.long_steps else ""
            way = (f"the settings above are enough: with them max_num_timeout={have:g} gives {1 + have:g} allocations "
                   f"of ~{per / 3600:,.1f} h" if needed <= have else
                   f"on SLURM set hydra.launcher.max_num_timeout>={needed}{at}, fewer at a longer timeout_min")
            print(f"WARNING: {len(self.long_runs)} job(s) need more wall time (up to ~{longest / 3600:,.1f} h estimated) "
                  f"than SLURM's allocations give them: 1 + max_num_timeout={have:g} requeues "
                  f"of timeout_min={self.slurm['timeout_min']:g} less signal_delay_s={self.slurm['signal_delay_s']:g} = "
                  f"~{self.allocations_s() / 3600:,.1f} h; submitit then stops requeueing and the run stays unfinished; "
                  f"{way}, for: {', '.join(self.long_runs)}", file=sys.stderr)

    def allocations_s(self) -> float:
        """The training seconds SLURM's allocations hold for one run: the first and max_num_timeout requeues, each
        ending signal_delay_s before its time limit (start-up not counted)."""
        s = self.slurm
        return (1 + s["max_num_timeout"]) * max(0.0, 60 * s["timeout_min"] - s["signal_delay_s"])

    def total(self) -> None:
        """The sweep's GPU-hours and what the estimate assumes."""
        if self.assumptions:
            print(f"estimated GPU-hours (all jobs): ~{self.gpu_hours:,.0f}", file=sys.stderr)
            for line in sorted(self.assumptions):
                print(f"  assuming {line}", file=sys.stderr)
