"""Cost of each arm's own work (method.prepare + method.loss) relative to a whole training step.

    python -m bench.benchmarks.overhead [--steps 12] [--warmup 2] [--task arithmetic] [--threads 2]

Runs the real trainer's step (bench.train.train_step) on the embedded default for every arm, timing the
method's prepare and loss calls around the unchanged code. Reports per-step milliseconds, the share of the
step, and the extra cost against the bf16 arm's own prepare + loss as a share of the bf16 step. The policy
forward/backward that produces log pi_theta is the trainer's, not the method's, and is not counted.
"""

from __future__ import annotations

import argparse
import time

import torch
from hydra import compose, initialize_config_dir

from bench.launch.cli import CONF_DIR
from bench.methods.base import method_info
from bench.registry import METHODS
from bench.train import build, train_step


def timed(fn, box: list[float]):
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        box.append(time.perf_counter() - t0)
        return out

    return wrapper


def measure(arm: str, task: str, steps: int, warmup: int) -> dict[str, float]:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"method={arm}", f"task={task}", "tracking=disabled"])
    p = build(cfg)
    p.method.setup_model(p.policy)
    method_time: list[float] = []
    p.method.prepare = timed(p.method.prepare, method_time)
    p.method.loss = timed(p.method.loss, method_time)
    step_times = []
    for step in range(warmup + steps):
        method_time.clear()
        t0 = time.perf_counter()
        train_step(p, step)
        if step >= warmup:
            step_times.append((time.perf_counter() - t0, sum(method_time)))
    step_s = sorted(s for s, _ in step_times)[len(step_times) // 2]
    method_s = sorted(m for _, m in step_times)[len(step_times) // 2]
    return {"step_ms": 1e3 * step_s, "method_ms": 1e3 * method_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--task", default="arithmetic")
    ap.add_argument("--threads", type=int, default=2)
    every_arm = sorted(METHODS.names(), key=lambda a: method_info(a).get("order", 1000))  # every registered arm
    ap.add_argument("--arms", nargs="+", default=every_arm, choices=every_arm)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    res = {arm: measure(arm, args.task, args.steps, args.warmup) for arm in args.arms}
    base = res.get("bf16")
    print(f"\nprepare + loss per training step, embedded default (task={args.task}, {args.threads} threads, "
          f"median of {args.steps} steps after {args.warmup} warm-up)\n")
    print("| arm | step (ms) | prepare+loss (ms) | share of step | extra vs bf16 (share of bf16 step) |")
    print("|---|---:|---:|---:|---:|")
    for arm, r in res.items():
        extra = f"{100 * (r['method_ms'] - base['method_ms']) / base['step_ms']:+.2f} %" if base else "n/a"
        print(f"| {arm} | {r['step_ms']:.1f} | {r['method_ms']:.2f} | {100 * r['method_ms'] / r['step_ms']:.2f} % | {extra} |")


if __name__ == "__main__":
    main()
