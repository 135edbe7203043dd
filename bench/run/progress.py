"""A run's per-step progress: a tqdm bar on a terminal, plain lines in a file.

tqdm redraws its bar with carriage returns; written to a file (a sweep job's run.log, a SLURM job's log) its frames
become one ever-growing line that `tail -f` shows as nothing, then as a wall of `\\r`. So when stderr is not a
terminal, `progress` writes one complete line every `every` seconds (and at the last step) instead:

    tis@int8-arithmetic-tiny-s0: step 12/40 (30%) · 1.32 s/step · ETA 37s · reward=0.412 kl=1.2e-04
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Iterator, TextIO

from bench.timing import fmt_duration

#: seconds between two progress lines in a log file
LOG_EVERY_S = 15.0
#: the Hugging Face libraries' own bars (weights loading, datasets), off in a log file (read at their import)
HF_BARS_OFF = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}


def quiet_hf_bars(stream: TextIO | None = None) -> None:
    """Turn the Hugging Face bars off when `stream` (stderr) is not a terminal; before transformers is imported."""
    if not getattr(stream or sys.stderr, "isatty", lambda: False)():
        for key, value in HF_BARS_OFF.items():
            os.environ.setdefault(key, value)


def progress(steps: range, desc: str, stream: TextIO | None = None, every: float = LOG_EVERY_S) -> Any:
    """An iterable over `steps` that shows progress: tqdm on a terminal, `LogProgress` otherwise. Both take
    `set_postfix(refresh=False, **values)` and `close()`."""
    stream = stream or sys.stderr
    if getattr(stream, "isatty", lambda: False)():
        from tqdm import tqdm

        return tqdm(steps, initial=steps.start, total=steps.stop, desc=desc, mininterval=1.0, dynamic_ncols=True,
                    file=stream)
    return LogProgress(steps, desc, stream, every)


class LogProgress:
    """Plain progress lines, at most one per `every` seconds, and one at the last step."""

    def __init__(self, steps: range, desc: str, stream: TextIO, every: float = LOG_EVERY_S,
                 clock: Any = time.monotonic) -> None:
        self.steps, self.desc, self.stream, self.every, self.clock = steps, desc, stream, every, clock
        self.postfix: dict[str, Any] = {}
        self.t0 = self.last = clock()

    def __iter__(self) -> Iterator[int]:
        done = 0
        for step in self.steps:
            yield step
            done += 1
            now = self.clock()
            if now - self.last >= self.every or step + 1 == self.steps.stop:
                self.stream.write(self.line(step + 1, done, now) + "\n")
                self.stream.flush()
                self.last = now

    def line(self, step: int, done: int, now: float) -> str:
        """'<desc>: step 12/40 (30%) · 1.32 s/step · ETA 37s · key=value ...' (steps of this attempt timed)."""
        total = self.steps.stop
        per_step = (now - self.t0) / max(1, done)
        parts = [f"{self.desc}: step {step}/{total} ({100 * step // max(1, total)}%)", f"{per_step:.2f} s/step"]
        if step < total:
            parts.append(f"ETA {fmt_duration(per_step * (total - step))}")
        if self.postfix:
            parts.append(" ".join(f"{k}={v}" for k, v in self.postfix.items()))
        return " · ".join(parts)

    def set_postfix(self, refresh: bool = False, **values: Any) -> None:
        self.postfix = values

    def close(self) -> None:
        pass


__all__ = ["LogProgress", "progress", "quiet_hf_bars"]
