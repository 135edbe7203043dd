"""W&B as a mirror of the run directory.

The run directory (metrics.jsonl, eval.jsonl, run.json) is the source of truth; W&B is a convenience view.
Hence two rules:
- Nothing here may stop or lose a run: if W&B cannot start (no network, no API key, bad settings) or a
  later call fails, we warn once and become a no-op. RunLog (bench/run/runlog.py), the one caller, writes each
  row to the run directory before mirroring it.
- Every row is logged exactly as written to metrics.jsonl (same keys, same step), so a W&B chart and the
  analysis of the run directory show the same numbers under the same names.

Mode: cfg.tracking.mode (offline | online | disabled), overridden by the WANDB_MODE environment variable
(the usual W&B switch, e.g. WANDB_MODE=disabled in a quick test). Offline runs are written under
<run_dir>/wandb/ and can be uploaded later with `wandb sync <run_dir>/wandb/offline-run-*`.
The W&B run id is stored by the caller in run.json and passed back as `resume_id` on restart, so a
preempted-and-resumed run stays one W&B run.

Resume replays history. An attempt's mirror can lose its last rows: W&B's service process dies with the job on
a SLURM SIGTERM, and after a kill -9 the offline file lacks its last unflushed block. So on every resume the
rows of metrics.jsonl / eval.jsonl before the resume step are logged again (`replay`), from the first step the
resumed W&B run does not have yet (`run.step`: 0 for an offline run, which is a fresh file per attempt; the
server's next step for an online one). The history read back after any interrupted run then equals the run
directory's rows.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from bench.run.identity import RunId

MODES = ("offline", "online", "disabled")


@dataclass
class TrackingConfig:
    """`tracking.*` (conf/tracking/<mode>.yaml)."""

    mode: str = "offline"  # offline | online | disabled; WANDB_MODE overrides
    project: str = "qrl-bench"
    entity: Optional[str] = None
    tags: list[str] = field(default_factory=list)

    def check(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"tracking.mode={self.mode!r} is not valid; choose one of: {', '.join(MODES)}")
_MODE_ALIASES = {"dryrun": "offline", "run": "online"}  # older spellings W&B still accepts in WANDB_MODE


def tracking_mode(cfg: DictConfig) -> str:
    """WANDB_MODE wins over cfg.tracking.mode, so a user can switch W&B off without editing configs."""
    env = os.environ.get("WANDB_MODE")
    mode = env or str(cfg.tracking.mode)
    mode = _MODE_ALIASES.get(mode, mode)
    if mode not in MODES:
        where = f"WANDB_MODE={env}" if env else f"tracking.mode={mode}"
        raise ValueError(f"{where} is not a W&B mode; choose one of: {', '.join(MODES)}"
                         + (" (or unset WANDB_MODE to use tracking.mode)" if env else ""))
    return mode


class Tracker:
    """No-op tracker: used when tracking is disabled and as the fallback when W&B fails."""

    def __init__(self, run_id: str | None = None) -> None:
        # on a W&B failure during a resume we keep the stored id, so run.json does not forget it
        self.run_id = run_id

    @property
    def active(self) -> bool:
        return False

    def log(self, row: dict[str, Any], step: int) -> None:
        pass

    def replay(self, metrics: list[dict[str, Any]], evals: list[dict[str, Any]], below: int) -> int:
        """Log again the rows with step < `below` that this W&B run lacks; returns how many steps were logged."""
        return 0

    def mark_preempting(self) -> None:
        pass

    def finish(self, exit_code: int = 0, summary: dict[str, Any] | None = None) -> None:
        pass


class WandbTracker(Tracker):
    """Mirrors rows to a live wandb Run; any exception turns it into the no-op Tracker with a warning."""

    def __init__(self, run: Any) -> None:
        super().__init__(run.id)
        self._run = run

    @property
    def active(self) -> bool:
        return self._run is not None

    def _fail(self, what: str, err: Exception) -> None:
        warnings.warn(f"W&B {what} failed ({type(err).__name__}: {err}); continuing without W&B, "
                      "the run directory still has every metric", RuntimeWarning, stacklevel=3)
        run, self._run = self._run, None
        try:
            run.finish(exit_code=1)
        except Exception:  # noqa: BLE001 -- already degraded; nothing more to do
            pass

    def log(self, row: dict[str, Any], step: int) -> None:
        if self._run is None:
            return
        try:
            self._run.log(dict(row), step=step)
        except Exception as err:  # noqa: BLE001 -- W&B must never stop a run
            self._fail("log", err)

    def replay(self, metrics: list[dict[str, Any]], evals: list[dict[str, Any]], below: int) -> int:
        if self._run is None or below <= 0:
            return 0
        try:
            first = int(self._run.step or 0)
        except Exception:  # noqa: BLE001
            first = 0
        by_step: dict[int, list[dict[str, Any]]] = {}
        for row in [*evals, *metrics]:  # an eval row precedes the training row of its step (as in the loop)
            step = row.get("step")
            if isinstance(step, int) and first <= step < below:
                by_step.setdefault(step, []).append(row)
        for step in sorted(by_step):
            for row in by_step[step]:
                self.log(row, step)
        return len(by_step)

    def mark_preempting(self) -> None:
        """Tell W&B the process is about to exit for a requeue (shown as 'preempted', not 'crashed')."""
        if self._run is None:
            return
        try:
            self._run.mark_preempting()
        except Exception as err:  # noqa: BLE001
            self._fail("mark_preempting", err)

    def finish(self, exit_code: int = 0, summary: dict[str, Any] | None = None) -> None:
        """End the run; `summary`: what W&B's state cannot say (a run that diverged and one that crashed are both
        'failed' there), written to the run's summary first."""
        if self._run is None:
            return
        run, self._run = self._run, None
        try:
            if summary:
                run.summary.update(summary)
            run.finish(exit_code=exit_code)
        except Exception as err:  # noqa: BLE001
            warnings.warn(f"W&B finish failed ({type(err).__name__}: {err}); the run directory is complete",
                          RuntimeWarning, stacklevel=2)


def start_tracking(
    cfg: DictConfig, run_dir: Path, run_name: str, resume_id: str | None = None, run_info: dict[str, Any] | None = None
) -> Tracker:
    """Start (or resume, with the id stored in run.json) the W&B mirror of one run.

    project/entity from cfg.tracking; group = the sweep (a paper recipe is one group), job_type = the arm
    (`<method>@<precision>`), tags = the identity axes (`method:tis`, `precision:int8`, `task:...`, `model:...`,
    `seed:0`; bench/run/identity.py RunId.tags) then cfg.tracking.tags, so W&B's grouping matches
    results/<sweep>/<method>@<precision>/...; the resolved config is attached, with `run_info` (what the arm and
    the precision declare for reports, as in run.json) under the key `run_info`; files go to <run_dir>/wandb.
    """
    mode = tracking_mode(cfg)
    if mode == "disabled":
        return Tracker(resume_id)  # write nothing, not even import wandb
    rid = RunId.of(cfg)
    try:
        import wandb

        run = wandb.init(
            project=cfg.tracking.project,
            entity=cfg.tracking.entity,
            group=rid.sweep,
            job_type=str(rid.arm),
            name=run_name,
            tags=rid.tags + [str(t) for t in cfg.tracking.tags],
            config={**OmegaConf.to_container(cfg, resolve=True), "run_info": run_info or {}},
            dir=str(run_dir),
            mode=mode,
            id=resume_id,
            resume="allow" if resume_id else None,
            reinit="create_new",  # several runs in one process (tests, in-process launchers) stay separate
        )
    except Exception as err:  # noqa: BLE001 -- any W&B failure (UsageError, CommError, ...) degrades
        warnings.warn(f"W&B init failed ({type(err).__name__}: {err}); run continues without W&B "
                      f"(mode={mode}); every metric is still in {run_dir}", RuntimeWarning, stacklevel=2)
        return Tracker(resume_id)
    return WandbTracker(run)
