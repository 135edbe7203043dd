"""Synthetic run directories with known values, in the trainer's run-directory format.

The analysis tests need sweeps whose table cells can be computed by hand, so the final eval accuracies are
literal numbers below (FINAL_ACC) and throughput is constant per precision after a slow warm-up step.
Everything else (reward curves, mismatch metrics) is smooth, deterministic and plausible, so the figures
can be looked at. `add_broken_runs` adds the directories a real sweep accumulates: bad JSON, missing
metrics, running/failed/preempted jobs, an incomplete "completed" run, an empty seed directory.

Run `python -m tests.analysis.synth OUT_DIR` to write a sweep to look at.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import yaml

STEPS = 12
EVAL_STEPS = [0, 4, 8, 12]  # step 0 = before training, 12 = after the last step
SEEDS = [0, 1, 2]
TASKS = ["arithmetic", "countdown"]
MODEL = "tiny"
PRECISION = {"bf16": "bf16", "naive": "fp8_e4m3", "tis": "fp8_e4m3", "acr_uaq": "int8", "ess": "fp8_e4m3", "ais": "fp8_e4m3"}
METHODS = list(PRECISION)
# Final eval accuracy per method, task, seed (fractions). Chosen so means/stds are easy by hand, and so that no arm's
# per-seed differences to bf16 or to naive are all equal (some arms list their values out of order): a gap with no
# spread has no t-interval (analysis.stats.gap), and a fixture of such gaps would test only that corner.
FINAL_ACC: dict[str, dict[str, list[float]]] = {
    "bf16": {"arithmetic": [0.60, 0.80, 0.70], "countdown": [0.30, 0.50, 0.40]},
    "naive": {"arithmetic": [0.20, 0.30, 0.40], "countdown": [0.10, 0.10, 0.10]},
    "tis": {"arithmetic": [0.50, 0.40, 0.60], "countdown": [0.25, 0.30, 0.35]},
    "acr_uaq": {"arithmetic": [0.65, 0.55, 0.75], "countdown": [0.28, 0.38, 0.48]},
    "ess": {"arithmetic": [0.60, 0.50, 0.70], "countdown": [0.20, 0.30, 0.40]},
    "ais": {"arithmetic": [0.45, 0.60, 0.75], "countdown": [0.22, 0.32, 0.42]},
}
INITIAL_ACC = {"arithmetic": 0.20, "countdown": 0.05}
# Rollout tokens/s after the warm-up step; step 0 is always WARMUP_TPS (compilation, cache allocation).
TOKENS_PER_S = {"bf16": 1000.0, "fp8_e4m3": 1600.0, "int8": 1800.0}
WARMUP_TPS = 100.0
TIME_SPLIT = {"sync_s": 0.1, "recompute_s": 0.2, "train_s": 0.5}
TOKENS_PER_STEP = 2000.0
DIVERGED = ("naive", "arithmetic", 2, 8)  # method, task, seed, step at which it diverged
LAYER_TYPES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
GIT_SHA = "0123456789abcdef0123456789abcdef01234567"
# What each arm and precision declares about itself, as the trainer records it in run.json (bench/methods/<arm>.py
# `METHODS.register(..., color=, order=)` + `diagnostics`; bench/quant/<format>.py label and bits).
ARM_INFO = {
    "bf16": {"color": "#000000", "order": 0, "diagnostics": {}},
    "naive": {"color": "#D55E00", "order": 10, "diagnostics": {}},
    "tis": {"color": "#0072B2", "order": 30, "diagnostics": {"is_frac_high": "TIS truncated frac. (ρ>C)"}},
    "acr_uaq": {"color": "#009E73", "order": 45, "diagnostics": {"frac_acr_active": "ACR active frac. (ρ>C)"}},
    "ess": {"color": "#CC79A7", "order": 50, "diagnostics": {"ess_factor": "P3O ESS factor"}},
    "ais": {"color": "#8C510A", "order": 60, "diagnostics": {"alpha": "AIS α"}},
    "fp16": {"color": "#332288", "order": 5, "diagnostics": {}},
}
PRECISION_INFO = {
    "bf16": {"name": "bf16", "label": "BF16", "weight_bits": 16, "act_bits": None},
    "fp8_e4m3": {"name": "fp8_e4m3", "label": "FP8", "weight_bits": 8, "act_bits": 8},
    "int8": {"name": "int8", "label": "INT8", "weight_bits": 8, "act_bits": 8},
    "int4": {"name": "int4", "label": "INT4", "weight_bits": 4, "act_bits": None},
    "fp16": {"name": "fp16", "label": "FP16", "weight_bits": 16, "act_bits": None},
}
VERSIONS = {"python": "3.11.9", "torch": "2.13.0", "transformers": "4.57.1"}
# Where the runs computed, as the trainer records it in run.json (bench/train.py runtime_info): all on a CPU,
# so every quantized row of the throughput table is "emulated".
RUNTIME = {"engine": "embedded", "device": "cpu", "device_name": "cpu (AVX2)", "cpu_model": "Intel Xeon [avx2]",
           "trainer_dtype": "bf16"}


def _config(method: str, task: str, seed: int, steps: int = STEPS, precision: str | None = None,
            rollout: dict[str, Any] | None = None) -> dict[str, Any]:
    precision = precision or PRECISION.get(method, "fp8_e4m3")
    return {
        "method": {"name": method, "precision": PRECISION.get(method, "fp8_e4m3"), "is_cap_C": 2.0},
        "rollout": {"engine": "embedded", "precision": precision, "act_granularity": "per_token", **(rollout or {})},
        "task": {"name": task, "max_new_tokens": 6, "n_test": 200},
        "model": {"name": MODEL, "path": None, "hidden_size": 128},
        "train": {"steps": steps, "batch_size": 64, "group_size": 8, "lr": 2e-4},
        "tracking": {"mode": "offline", "project": "qrl-bench"},
        "seed": seed,
        "sweep": "synthetic",
    }


def _mismatch(method: str, precision: str, step: int, rng: np.random.Generator) -> dict[str, float]:
    """Plausible mismatch: tiny for bf16, larger and growing for low precision, worst for naive fp8."""
    base = 1e-5 if precision == "bf16" else (2e-3 if precision == "fp8_e4m3" else 1e-3)
    growth = 1.0 + (0.25 * step if method == "naive" else 0.05 * step)
    kl = base * growth * (1 + 0.1 * rng.standard_normal())
    spread = math.sqrt(2 * kl)
    return {
        "mismatch/kl_k1": kl * (1 + 0.3 * rng.standard_normal()),
        "mismatch/kl_k3": abs(kl),
        "mismatch/kl_k2": abs(kl),
        "mismatch/ratio_max": math.exp(12 * spread) * (1 + 0.05 * rng.random()),
        "mismatch/ratio_min": math.exp(-10 * spread),
        "mismatch/ratio_mean": 1.0 + 0.1 * spread * rng.standard_normal(),
        "mismatch/logp_diff_mean": 0.8 * spread,
        "mismatch/logp_diff_max": 10 * spread,
        "mismatch/is_ess": 1.0 / (1.0 + 4 * kl * 50),
        "mismatch/max_prob_diff": min(1.0, 5 * spread),
        "mismatch/frac_nonfinite_logprob": 0.0,
    }


def _method_keys(method: str, step: int, rng: np.random.Generator) -> dict[str, float]:
    p = f"method/{method}/"
    if method == "tis":
        return {p + "is_frac_high": 0.002 + 0.0004 * step + 0.0002 * rng.random(), p + "is_mean": 0.99, p + "is_max": 2.0}
    if method in ("acr", "acr_uaq"):
        return {p + "frac_acr_active": 0.001 + 0.0002 * step + 0.0001 * rng.random()}
    if method == "ess":
        return {p + "ess_factor": 0.97 - 0.004 * step + 0.003 * rng.random(), p + "kl_behavioral": 0.002}
    if method == "ais":
        a = 0.8 - 0.03 * step + 0.02 * rng.random()
        return {p + "alpha": a, p + "R": 0.9, p + "B": 0.1, p + "V": 0.05}
    return {}


def _quant_keys(method: str, step: int, rng: np.random.Generator) -> dict[str, float]:
    """QuRL Eq. 13-14; UAQ (s=1.5 on q/k/v) scales the squared update up and the squared error down by s^2."""
    out = {}
    for i, lt in enumerate(LAYER_TYPES):
        s2 = 1.5**2 if method == "acr_uaq" and lt in ("q_proj", "k_proj", "v_proj") else 1.0
        out[f"quant/weight_update/{lt}"] = s2 * 1e-7 * (1 + i) * math.exp(-0.1 * step) * (1 + 0.1 * rng.random())
        out[f"quant/quant_error/{lt}"] = 1e-4 * (1 + 0.2 * i) * (1 + 0.01 * rng.random()) / s2
    return out


def write_run(
    root: Path,
    method: str,
    task: str,
    seed: int,
    *,
    status: str = "completed",
    reason: str | None = None,
    steps_logged: int | None = None,
    final_acc: float | None = None,
    steps_planned: int = STEPS,
    precision: str | None = None,
    rollout: dict[str, Any] | None = None,
    kl: float | None = None,
    eval_values: list[float] | None = None,
) -> Path:
    """Write one run directory; returns it. `steps_logged` < planned makes a short (diverged/incomplete) run.

    For the severity sweep: `precision` / `rollout` override the rollout precision and add rollout options,
    `kl` makes mismatch/kl_k3 that constant at every step, `eval_values` are the eval accuracies (and rewards)
    at EVAL_STEPS. Left at None, the run is exactly the one the other tests were written against.
    """
    precision = precision or PRECISION.get(method, "fp8_e4m3")
    run_dir = root / method / task / MODEL / f"seed{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng([METHODS.index(method) if method in METHODS else 99, TASKS.index(task), seed])
    n = steps_planned if steps_logged is None else steps_logged
    final = (eval_values[-1] if eval_values else FINAL_ACC[method][task][seed]) if final_acc is None else final_acc
    init = INITIAL_ACC[task]
    config = _config(method, task, seed, steps_planned, precision, rollout)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    with open(run_dir / "metrics.jsonl", "w") as f:
        for step in range(n):
            frac = (step + 1) / steps_planned
            acc_now = init + (final - init) * (1 - math.exp(-3 * frac)) / (1 - math.exp(-3))
            tps = WARMUP_TPS if step == 0 else TOKENS_PER_S.get(precision, 1200.0)
            rollout_s = TOKENS_PER_STEP / tps
            rec: dict[str, Any] = {
                "step": step,
                "reward/mean": acc_now + 0.03 * rng.standard_normal(),
                "reward/std": 0.3,
                "reward/accuracy": acc_now,
                "reward/response_length": 5.0,
                "train/loss": 0.1 * rng.standard_normal(),
                "train/grad_norm": 0.5,
                "train/entropy": 1.0 - 0.02 * step,
                "train/lr": 2e-4,
                "time/rollout_s": rollout_s,
                "time/sync_s": TIME_SPLIT["sync_s"],
                "time/recompute_s": TIME_SPLIT["recompute_s"],
                "time/train_s": TIME_SPLIT["train_s"],
                "time/step_s": rollout_s + sum(TIME_SPLIT.values()),
                "time/rollout_tokens_per_s": tps,
            }
            rec.update(_mismatch(method, precision, step, rng))
            if kl is not None:
                rec["mismatch/kl_k3"] = kl
            rec.update(_method_keys(method, step, rng))
            if method in ("naive", "acr_uaq"):
                rec.update(_quant_keys(method, step, rng))
            f.write(json.dumps(rec) + "\n")
    with open(run_dir / "eval.jsonl", "w") as f:
        for step in [s for s in EVAL_STEPS if s <= n]:
            frac = step / steps_planned
            acc = init + (final - init) * (1 - math.exp(-3 * frac)) / (1 - math.exp(-3))
            if step == n:
                acc = final
            if eval_values is not None:
                acc = eval_values[EVAL_STEPS.index(step)]
            f.write(json.dumps({"step": step, "eval/accuracy": acc, "eval/reward_mean": acc, "eval/response_length": 5.0}) + "\n")
    info = {
        "status": status,
        "reason": reason,
        "step": n - 1,
        "run_name": f"{method}-{task}-{MODEL}-s{seed}",
        "git_sha": GIT_SHA,
        "git_dirty": False,
        "versions": VERSIONS,
        "host": "synthetic-host",
        "started_at": "2025-01-01T00:00:00",
        "finished_at": "2025-01-01T00:10:00",
        "wandb_id": None,
        "timings": {"total_s": 600.0},
    }
    if method in ARM_INFO:
        info["method"] = ARM_INFO[method]
    if precision in PRECISION_INFO:
        info["precision"] = PRECISION_INFO[precision]
    info["runtime"] = RUNTIME
    (run_dir / "run.json").write_text(json.dumps(info, indent=1))
    return run_dir


def make_sweep(root: Path) -> Path:
    """The clean sweep: every method x task x seed, one diverged run, one truncated last metrics line."""
    for method in METHODS:
        for task in TASKS:
            for seed in SEEDS:
                if (method, task, seed) == DIVERGED[:3]:
                    write_run(root, method, task, seed, status="diverged", reason="non-finite loss", steps_logged=DIVERGED[3])
                else:
                    write_run(root, method, task, seed)
    # A preempted writer leaves half a line behind: the run is still good (the line must be dropped).
    with open(root / "bf16" / "arithmetic" / MODEL / "seed2" / "metrics.jsonl", "a") as f:
        f.write('{"step": 12, "reward/me')
    return root


# (relative path, expected fragment of the skip reason)
BROKEN = {
    "tis/countdown/tiny/seed3": "run.json: invalid JSON",
    "naive/countdown/tiny/seed3": "missing metrics.jsonl",
    "ess/arithmetic/tiny/seed3": "status=running",
    "ais/arithmetic/tiny/seed3": "status=failed (CUDA out of memory)",
    "ais/countdown/tiny/seed3": "status=preempted",
    "bf16/countdown/tiny/seed3": "incomplete",
    "acr_uaq/countdown/tiny/seed3": "empty run directory",
    "tis/arithmetic/tiny/seed3": "metrics.jsonl: invalid JSON on line 2",
    "ess/countdown/tiny/seed3": "missing config.yaml",
}


def add_broken_runs(root: Path) -> dict[str, str]:
    """Add the broken directories of BROKEN to a sweep; they all use seed 3 so that, were any of them
    wrongly loaded, it would change a known table cell."""
    d = write_run(root, "tis", "countdown", 3, final_acc=0.99)
    (d / "run.json").write_text('{"status": "compl')
    d = write_run(root, "naive", "countdown", 3, final_acc=0.99)
    (d / "metrics.jsonl").unlink()
    write_run(root, "ess", "arithmetic", 3, status="running", steps_logged=5, final_acc=0.99)
    write_run(root, "ais", "arithmetic", 3, status="failed", reason="CUDA out of memory", steps_logged=3, final_acc=0.99)
    write_run(root, "ais", "countdown", 3, status="preempted", steps_logged=7, final_acc=0.99)
    write_run(root, "bf16", "countdown", 3, steps_logged=5, final_acc=0.99)  # says completed, is not
    (root / "acr_uaq" / "countdown" / MODEL / "seed3").mkdir(parents=True)
    d = write_run(root, "tis", "arithmetic", 3, final_acc=0.99)
    lines = (d / "metrics.jsonl").read_text().splitlines()
    lines[1] = lines[1][:20]  # corrupt a middle line
    (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    d = write_run(root, "ess", "countdown", 3, final_acc=0.99)
    (d / "config.yaml").unlink()
    return dict(BROKEN)


# ------------------------------------------------------------------ severity sweep
# One task (arithmetic), seeds 0-2 unless listed. Per (severity dir, method): rollout precision, extra rollout
# options, final accuracies per seed (fractions) and the base KL (each seed logs KL = base * (0.9, 1.0, 1.1)[seed],
# so the mean over seeds is the base). Chosen for hand-computable cells:
#   bf16 at bf16: mean 62.0 %
#   fp8_e4m3:   fp8 61.0, tis 62.0  -> naive gap 1.0 pp, its CI contains 0 -> recovered n/a (within noise)
#   int4:       fp8 32.0, tis 47.0  -> naive gap 30 pp, tis gap -15 pp, recovered (47-32)/(62-32) = 0.5
#   int8 + w=per_tensor + kv=fp8_e4m3: one seed each -> no CI, recovered n/a (fewer than 2 seeds)
#   fp16 at fp16: no naive run there -> recovered n/a (no naive run at this severity)
# fp8 at int4 seed 2 collapses (eval below its step-0 value by more than the binomial margin at 200 problems, 9.8 pp
# from 0.50, at steps 4, 8, 12: collapse step 4 for k <= 3); seed 1 is that far below at steps 8 and 12 only (collapses
# for k <= 2, at step 8; its 0.45 at step 4 is within the margin). Both keep their AUC (37.7 and 34.0).
SEVERITY_TASK = "arithmetic"
SEVERITY_RUNS: list[tuple[str, str, str, dict[str, Any], list[float], float]] = [
    ("sev_bf16", "bf16", "bf16", {}, [0.60, 0.64, 0.62], 1e-5),  # out of order: every gap to it has a spread
    ("sev_fp8", "naive", "fp8_e4m3", {}, [0.60, 0.61, 0.62], 1e-3),
    ("sev_fp8", "tis", "fp8_e4m3", {}, [0.61, 0.62, 0.63], 1.1e-3),
    ("sev_int4", "naive", "int4", {"act_granularity": "none"}, [0.30, 0.32, 0.34], 0.1),
    ("sev_int4", "tis", "int4", {"act_granularity": "none"}, [0.47, 0.45, 0.49], 0.09),
    ("sev_int8kv", "naive", "int8", {"weight_granularity": "per_tensor", "kv_cache_dtype": "fp8_e4m3"}, [0.50], 0.01),
    ("sev_int8kv", "tis", "int8", {"weight_granularity": "per_tensor", "kv_cache_dtype": "fp8_e4m3"}, [0.55], 0.01),
    ("sev_fp16", "fp16", "fp16", {}, [0.61, 0.63], 2e-6),
]
SEVERITY_EVALS = {("sev_int4", "naive", 1): [0.50, 0.45, 0.27, 0.32], ("sev_int4", "naive", 2): [0.50, 0.30, 0.30, 0.34]}


def make_severity_sweep(root: Path) -> Path:
    """A severity sweep (SEVERITY_RUNS): one sub-directory per severity, as separate sweeps would write it."""
    for sev, method, precision, rollout, finals, kl in SEVERITY_RUNS:
        for seed, final in enumerate(finals):
            evals = SEVERITY_EVALS.get((sev, method, seed))
            write_run(root / sev, method, SEVERITY_TASK, seed, precision=precision, rollout=rollout,
                      kl=kl * (0.9, 1.0, 1.1)[seed], final_acc=None if evals else final, eval_values=evals)
    return root


def write_paper_run(
    root: Path,
    method: str,
    precision: str,
    task: str,
    seed: int,
    evals: dict[int, dict[str, float]],
    *,
    config: dict[str, Any] | None = None,
    status: str = "completed",
    model: str = "qwen2.5-0.5b-instruct",
    steps: int | None = None,
    variant: str = "",
) -> Path:
    """A run of a paper recipe with literal evaluations ({step: {metric: value}}) and extra config settings
    (nested dicts merged into the config, e.g. {"train": {"lr": 1.5e-6}}), under root/<precision>/... as the
    recipes write them. Metrics are plain rows: the paper tables read only evaluations. `steps` (train.steps)
    defaults to the last evaluation's step: a completed run's final evaluation is at step = train.steps. `variant`:
    the sweep's label of a row that differs from another row of its arm in a setting (bench/launch/sweeper.py)."""
    steps = max(evals) if steps is None else steps
    run_dir = root / precision / method / task / model / variant / f"seed{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = _config(method, task, seed, steps)
    cfg["method"]["precision"] = cfg["rollout"]["precision"] = precision
    cfg["model"]["name"] = model
    cfg["variant"] = variant
    for section, values in (config or {}).items():
        cfg.setdefault(section, {}).update(values)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": k, "reward/mean": 0.5}) + "\n" for k in range(steps)))
    (run_dir / "eval.jsonl").write_text("".join(json.dumps({"step": k, **v}) + "\n" for k, v in sorted(evals.items())))
    info = {"status": status, "reason": None, "step": steps - 1, "run_name": f"{method}-{task}-{model}-s{seed}",
            "git_sha": GIT_SHA, "versions": VERSIONS, "arm": ARM_INFO.get(method, {}),
            "precision": PRECISION_INFO[precision]}
    (run_dir / "run.json").write_text(json.dumps(info, indent=1))
    return run_dir


if __name__ == "__main__":
    out = Path(sys.argv[1])
    make_sweep(out)
    add_broken_runs(out)
    print(out)
