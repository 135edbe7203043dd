"""Timers wait for the device (bench/timing.py, issue M3): a GPU phase's asynchronous kernels are charged to it.

No GPU here: the device wait is replaced by an instrumented hook that stands for the queued work it waits for.
"""

from __future__ import annotations

import time

import torch

import bench.timing as timing
from bench.timing import Timer, synchronize
from tests.helpers import make_cfg


class QueuedWork:
    """A fake device queue: the body 'launches' work (returns at once); a sync waits for it."""

    def __init__(self):
        self.pending, self.calls = 0.0, []

    def launch(self, seconds: float) -> None:
        self.pending += seconds

    def __call__(self, device) -> None:
        self.calls.append(device)
        time.sleep(self.pending)
        self.pending = 0.0


def test_a_phase_is_charged_for_the_work_it_queued():
    queue = QueuedWork()
    t = Timer(device="cuda", sync=queue)
    queue.launch(0.05)  # queued before the phase: not its work
    with t("sync"):
        queue.launch(0.2)  # returns at once, as a CUDA launch does
    assert queue.calls == ["cuda", "cuda"]  # waited at both boundaries
    assert t["sync"] >= 0.2  # without the closing wait the phase would read ~0 (a lower bound: sleep never runs short)
    with t("sync"):
        pass
    assert set(t) == {"sync"} and len(queue.calls) == 4  # phases add up


def test_synchronize_is_a_no_op_on_the_cpu():
    synchronize("cpu")
    synchronize(torch.device("cpu"))
    synchronize()  # CUDA never initialized here


def test_a_training_step_times_each_phase_on_the_runs_device(tmp_path, monkeypatch):
    from bench.train import build, train_step

    seen = []
    monkeypatch.setattr(timing, "synchronize", lambda device=None: seen.append(device))
    p = build(make_cfg(tmp_path, "train.device=cpu"))
    row = train_step(p, 0)
    assert seen and all(d == torch.device("cpu") for d in seen)
    assert len(seen) >= 2 * 4  # sync, rollout, recompute, train: a wait at each boundary
    assert row["time/step_s"] > 0
