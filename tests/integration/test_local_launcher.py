"""The default local launcher (hydra/launcher=local): parallel worker processes, code and config frozen at start.

Runs the probe app of launch_probe.py on a copy of the project: 3 jobs on 2 workers, the first two held
until the test has edited code and config, so the third job is still queued when the edits land.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.hang import HANG_S, wait_until
from tests.integration.launch_probe import edit_after_submission, make_probe, ran_from_the_snapshot, waiting

def test_local_sweep_runs_in_parallel_with_the_code_and_config_of_submission(tmp_path):
    go = tmp_path / "go"
    paths = make_probe(tmp_path, "local", {"n_jobs": 2}, wait_for=str(go))
    env = {**os.environ, "PYTHONPATH": str(paths["code"])}
    proc = subprocess.Popen([sys.executable, str(paths["app"]), "-m", "n=0,1,2"], cwd=paths["workdir"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # both workers hold a job (job 2 waits for a free worker): the events, not a time, say when to edit
        wait_until("two jobs held by the two workers", lambda: len(waiting(paths)) == 2, proc)
        edit_after_submission(paths)
        go.touch()
        out, _ = proc.communicate(timeout=HANG_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-4000:]

    recs = ran_from_the_snapshot(paths, 3, out)
    workers = {rec["pid"] for rec in recs}
    assert len(workers) == 2 and proc.pid not in workers  # two worker processes, not the launcher itself
