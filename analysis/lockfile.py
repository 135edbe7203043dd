"""requirements.lock against the versions each run recorded: which runs were not produced with the pinned stack.

scripts/install.sh installs every package but torch at the version requirements.lock pins (refresh: bash
scripts/lock.sh); run.json records the versions a run actually imported (bench/run/store.py `versions`). A package
whose recorded version differs from the pin marks the run as off the lock: its numbers may differ for that
reason alone (transformers 5.23 -> 5.24 moved the reference accuracies), so the report says so.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Iterable

#: the lock of the checkout this analysis runs from (an editable install: the repository root)
LOCK_FILE = Path(__file__).resolve().parents[1] / "requirements.lock"
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)")


def normalize(name: str) -> str:
    """PEP 503 name: 'hydra_core' and 'Hydra-Core' are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: Path = LOCK_FILE) -> dict[str, str]:
    """{normalized package: pinned version} of a pip requirements/constraints file; {} when it does not exist."""
    if not path.is_file():
        return {}
    pins = {}
    for line in path.read_text().splitlines():
        m = _PIN.match(line.strip())
        if m:
            pins[normalize(m.group(1))] = m.group(2)
    return pins


def lock_sha256(path: Path = LOCK_FILE) -> str | None:
    """The first 16 hex digits of the lock file's sha256 (None when absent): names the lock in a report."""
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.is_file() else None


def off_lock(versions: dict[str, str], pins: dict[str, str]) -> dict[str, tuple[str, str]]:
    """{package: (recorded, pinned)} for each recorded package whose version differs from its pin (packages the
    lock does not pin, such as torch, python and qrl-bench itself, are not compared)."""
    out = {}
    for pkg, version in versions.items():
        pinned = pins.get(normalize(pkg))
        if pinned is not None and str(version) != pinned:
            out[pkg] = (str(version), pinned)
    return out


def drift(runs: Iterable, pins: dict[str, str]) -> dict[str, dict[str, tuple[str, str]]]:
    """{run_id: off_lock(...)} for the runs whose recorded versions differ from the lock."""
    out = {}
    for r in runs:
        diff = off_lock(r.info.get("versions") or {}, pins)
        if diff:
            out[r.run_id] = diff
    return out
