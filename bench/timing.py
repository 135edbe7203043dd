"""Wall-clock timing that measures device work, not kernel launches.

CUDA kernels run asynchronously: a timer read right after a call on the GPU sees only the launches, and the
work lands in whichever phase next waits for the device (a `.item()`, a host copy). So every timer boundary
first waits for the device (`synchronize`); on the CPU that is a no-op and the timings are unchanged.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait until `device` (None: the current CUDA device, if CUDA is in use) has finished its queued work.
    A no-op on the CPU and wherever CUDA was never initialized (nothing can be queued there)."""
    if device is not None and torch.device(device).type != "cuda":
        return
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize(device)


class Timer(dict):
    """Seconds per named phase, summed over repeated uses: `with t("rollout"): ...`.

    Each phase starts and ends with `sync(device)` (None: this module's `synchronize`), so a GPU phase is charged for its
    own kernels (train.py's time/sync_s, time/recompute_s; the issue this fixes under-reported them).
    """

    def __init__(self, *args: Any, device: torch.device | str | None = None,
                 sync: Callable[[Any], None] | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.device, self.sync = device, sync

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        sync = self.sync or synchronize
        sync(self.device)
        t0 = time.perf_counter()
        yield
        sync(self.device)
        self[name] = self.get(name, 0.0) + time.perf_counter() - t0


def fmt_duration(seconds: float) -> str:
    """`42s`, `3m07s`, `1h05m`: durations in progress and result lines (a run's log, the sweep line)."""
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"
