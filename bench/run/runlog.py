"""The one writer of a run's metrics: a row goes to the run directory, then to its W&B mirror.

    log = RunLog.open(run, cfg, run_name, start=step)   W&B started (or resumed), rows it lost replayed
    log.log(row)        metrics.jsonl + W&B, at row["step"]       (one line per training step)
    log.log_eval(row)   eval.jsonl + W&B, at row["step"]          (one line per evaluation)
    log.close(exit_code)

The shape of lingua's MetricLogger: the loop calls one method per row and never reaches the file or W&B itself,
so the two can never disagree on a row's keys or step. The file is written first (bench/run/store.py, the source
of truth); the mirror (bench/run/tracking.py) cannot stop or lose a run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig

from bench.run.store import RunDir
from bench.run.tracking import Tracker, start_tracking


#: run.json fields the W&B summary carries as run/<field> when the run ends
MIRRORED_INFO = ("status", "reason", "diverged_step")


@dataclass
class RunLog:
    """A run directory's metrics and eval rows, mirrored by `tracker` (a no-op Tracker: no mirror)."""

    run: RunDir
    tracker: Tracker = field(default_factory=Tracker)

    @classmethod
    def open(cls, run: RunDir, cfg: DictConfig, run_name: str, start: int, mirror: bool = True,
             run_info: dict[str, Any] | None = None) -> "RunLog":
        """Start (or resume, with run.json's W&B id) the mirror and replay the rows before `start` that an earlier
        attempt's mirror lost. `mirror=False` (a follower rank: rank 0 alone mirrors) keeps the id, mirrors nothing."""
        resume_id = run.info().get("wandb_id")
        tracker = (start_tracking(cfg, run.path, run_name, resume_id=resume_id, run_info=run_info) if mirror
                   else Tracker(resume_id))
        tracker.replay(run.metrics(), run.evals(), below=start)
        return cls(run, tracker)

    @property
    def wandb_id(self) -> str | None:
        """The W&B run id to keep in run.json (the stored one when the mirror failed to start)."""
        return self.tracker.run_id

    def log(self, row: dict[str, Any]) -> None:
        """One training step's metrics row (it holds its `step`)."""
        self.run.append(self.run.metrics_file, row)
        self.tracker.log(row, row["step"])

    def log_eval(self, row: dict[str, Any]) -> None:
        """One evaluation's row (it holds its `step`: that of the training row it precedes)."""
        self.run.append(self.run.eval_file, row)
        self.tracker.log(row, row["step"])

    def close(self, exit_code: int = 0, preempting: bool = False) -> None:
        """End the mirror; `preempting` tells W&B the process exits for a requeue (shown 'preempted', not 'crashed').

        The run's own status goes into the mirror's summary (`run/status`, `run/reason`, `run/diverged_step`, from
        run.json): W&B's state calls a divergence 'failed', and an analysis from W&B would leave the run out where
        one from the run directory keeps it as a result (analysis/wandb_source.py reads them back)."""
        if preempting:
            self.tracker.mark_preempting()
        info = self.run.info()
        summary = {f"run/{k}": info[k] for k in MIRRORED_INFO if info.get(k) is not None}
        self.tracker.finish(exit_code=exit_code, summary=summary)
