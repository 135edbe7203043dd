"""A rank > 0 of a multi-process run: it trains along with rank 0, which alone writes the run directory and W&B
(bench/launch/cli.py runs it on rank 0's plan)."""

from __future__ import annotations

from typing import Any

from bench.run.store import RunDir

class FollowerRun(RunDir):
    """A rank > 0's view of the run directory: it reads (run.json, metrics) and writes nothing."""

    def start(self, *args: Any, **kw: Any) -> dict[str, Any]:
        return self.info()

    def update_info(self, **fields: Any) -> dict[str, Any]:
        return self.info()

    def finish(self, *args: Any, **kw: Any) -> None: ...

    def append(self, *args: Any, **kw: Any) -> None: ...

    def truncate_to(self, *args: Any, **kw: Any) -> None: ...

    def reset(self) -> None: ...

    def save_checkpoint(self, *args: Any, **kw: Any) -> None: ...

    def drop_checkpoint(self) -> None: ...

    def clean_temporaries(self) -> list:
        return []

    def set_aside_bad_lines(self) -> list:
        return []
