"""The sweep line's ETA, from what each job has been measured to take, scheduled on the sweep's workers.

A rate averaged over the whole sweep (steps done / time since the start) promises hours during the first
minutes, which go to warm starts and not to steps; a recent rate freezes while every worker builds a warm start.
Here each job's time is split into the parts that differ, each measured on the jobs that have shown it:

    lead-in     job start -> its first metrics row: config, model build, the warm start (cold: the first job
                of its task and model builds it; warm: a later one loads it), and step 0
    per step    between its first and its latest row (evaluations every k steps included), per kind of job
                (task and model, arm) where measured, else per task and model, else over every job
    tail        its latest row -> the job's end: the final evaluation and saving

A running job's remaining time is what is left of its own parts (its own per-step time once it has two rows);
a pending job costs lead-in + (steps - 1) x per step + tail (nothing when its run.json already says completed:
the launch will skip it). The remaining jobs are then handed, in order, to whichever worker frees first, as the
pool does (bench/launch/sweep_pool.py): the ETA is when the last worker finishes. Until one lead-in and one
per-step time are measured there is no ETA ("?").

Synthetic sweeps (tests/unit/test_eta.py) and a replay of a smoke sweep's timings check that after the first
10 % of the work the ETA is within 30 % of the time that was really left.
"""

from __future__ import annotations

import heapq
import json
from dataclasses import dataclass
from statistics import mean
from typing import Any, Sequence


@dataclass
class _Seen:
    """What the estimator has observed of one job (times on the sweep's monotonic clock)."""

    started: float
    rows0: int  # rows already in metrics.jsonl when the job started (a resumed run)
    cold: bool  # no job of its warm-start key had started training when it started
    first: float | None = None  # when its first new row was seen
    rows_first: int = 0
    last: float | None = None  # when its latest new row was seen
    rows_last: int = 0
    ended: float | None = None

    def per_step(self) -> float | None:
        if self.first is None or self.last is None or self.rows_last <= self.rows_first:
            return None
        return (self.last - self.first) / (self.rows_last - self.rows_first)


class Eta:
    """Call `update(now, jobs)` at each refresh; `seconds()` is then the estimate (None while unknown)."""

    def __init__(self, slots: int | None = None) -> None:
        self.slots = slots  # workers; None: as many as have been seen running at once (SLURM)
        self.seen: dict[int, _Seen] = {}
        self.max_running = 1
        self._estimate: float | None = None

    # ------------------------------------------------------------------------------------------ observing
    def update(self, now: float, jobs: Sequence[Any]) -> float | None:
        """Observe `jobs` (JobView-like: idx, key, steps, state, outcome, rows(), will_skip()) at time `now`."""
        running = [j for j in jobs if j.state == "running"]
        self.max_running = max(self.max_running, len(running))
        trained = {j.key for j in jobs if j.idx in self.seen and self.seen[j.idx].first is not None}
        for j in jobs:
            s = self.seen.get(j.idx)
            if j.state == "pending":
                continue
            if s is None:
                if j.state == "done":  # ended between two looks: nothing measured of it
                    continue
                s = self.seen[j.idx] = _Seen(started=now, rows0=j.rows(), cold=j.key not in trained)
            if s.ended is not None:
                continue
            rows = j.rows() - s.rows0
            if rows > s.rows_last:
                if s.first is None:
                    s.first, s.rows_first = now, rows
                s.last, s.rows_last = now, rows
            if j.state == "done":
                s.ended = now
        self._estimate = self._remaining(now, jobs)
        return self._estimate

    def seconds(self) -> float | None:
        return self._estimate

    # ------------------------------------------------------------------------------------------ estimating
    def _measured(self) -> dict[str, Any]:
        done_ok = [s for s in self.seen.values() if s.first is not None]
        lead_cold = [s.first - s.started for s in done_ok if s.cold]
        lead_warm = [s.first - s.started for s in done_ok if not s.cold]
        tails = [s.ended - s.last for s in done_ok if s.ended is not None and s.last is not None]
        return {"lead_cold": mean(lead_cold) if lead_cold else None,
                "lead_warm": mean(lead_warm) if lead_warm else None,
                "tail": mean(tails) if tails else None}

    def _per_step(self, jobs: Sequence[Any]) -> tuple[dict[Any, float], float | None]:
        """Mean seconds per step by kind, ("kind", key, arm) and ("key", key) (the task sets the response length,
        the arm the precision: an emulated FP8 rollout steps slower than bf16), and over every job."""
        by: dict[Any, list[float]] = {}
        everything: list[float] = []
        for j in jobs:
            s = self.seen.get(j.idx)
            ps = s.per_step() if s else None
            if ps is not None:
                by.setdefault(("kind", j.key, getattr(j, "arm", "")), []).append(ps)
                by.setdefault(("key", j.key), []).append(ps)
                everything.append(ps)
        return {k: mean(v) for k, v in by.items()}, (mean(everything) if everything else None)

    @staticmethod
    def _step_of(job: Any, per: dict[Any, float], per_all: float) -> float:
        return per.get(("kind", job.key, getattr(job, "arm", "")), per.get(("key", job.key), per_all))

    def _remaining(self, now: float, jobs: Sequence[Any]) -> float | None:
        m = self._measured()
        per_key, per_all = self._per_step(jobs)
        lead_cold = m["lead_cold"] if m["lead_cold"] is not None else m["lead_warm"]
        if per_all is None or lead_cold is None:
            return None
        tail = m["tail"] if m["tail"] is not None else per_all
        # until a warm lead-in is measured, none: loading a warm start is short next to building one, and taking
        # the cold lead-in for every later job would promise the first minutes' ETA several times too long
        lead_warm = m["lead_warm"] if m["lead_warm"] is not None else 0.0
        started_keys = {j.key for j in jobs if j.idx in self.seen}

        busy: list[float] = []  # each running job's remaining seconds: its worker frees then
        for j in jobs:
            s = self.seen.get(j.idx)
            if j.state != "running" or s is None or s.ended is not None:
                continue
            step = s.per_step() or self._step_of(j, per_key, per_all)
            todo = max(0, j.steps - s.rows0)
            if s.first is None:  # still in its lead-in
                left = max(0.0, (lead_cold if s.cold else lead_warm) - (now - s.started))
                busy.append(left + max(0, todo - 1) * step + tail)
            else:
                left_steps = max(0, todo - s.rows_last)
                since = now - s.last  # the current step is under way
                busy.append(max(0.0, left_steps * step - since) + tail)
        slots = self.slots or self.max_running
        heap = sorted(busy)
        heap += [0.0] * max(0, slots - len(heap))  # idle workers
        heap = heap[:max(slots, len(busy))]
        heapq.heapify(heap)
        for j in jobs:
            if j.state != "pending" or j.will_skip():
                continue
            lead = lead_warm if j.key in started_keys else lead_cold
            started_keys.add(j.key)
            cost = lead + max(0, j.steps - 1) * self._step_of(j, per_key, per_all) + tail
            heapq.heappush(heap, heapq.heappop(heap) + cost)
        return max(heap) if heap else 0.0


def completed_before(run_dir: Any) -> bool:
    """Whether the run directory's run.json says completed (such a pending job will be skipped)."""
    try:
        return json.loads((run_dir / "run.json").read_text()).get("status") == "completed"
    except (OSError, ValueError, AttributeError):
        return False


__all__ = ["Eta", "completed_before"]
