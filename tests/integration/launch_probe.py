"""A tiny Hydra app for launcher tests: each job records which `bench` it imported and the config it got.

Used on a *copy* of the project, so that a test can edit code and config after submitting a sweep and
check that queued jobs still see the originals, without ever touching the repository.
"""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path
from typing import Any

from bench.launch.launchers import SNAPSHOT_PATHS
from tests.hang import HANG_S
from tests.helpers import REPO

APP = '''
import json, os, sys, time
import hydra
from hydra.core.hydra_config import HydraConfig

@hydra.main(version_base="1.3", config_path="conf", config_name="probe")
def main(cfg):
    if cfg.wait_for:  # hold this job until the test has made its edits; say so first (the test waits for it)
        open(os.path.join(HydraConfig.get().runtime.output_dir, "waiting"), "w").close()
        deadline = time.time() + HANG_S  # a hang guard only: the test itself gives up at HANG_S
        while not os.path.exists(cfg.wait_for) and time.time() < deadline:
            time.sleep(0.1)
    import bench  # only now: a launcher without a snapshot would import the edited code
    out = HydraConfig.get().runtime.output_dir
    rec = {"bench_file": bench.__file__, "probe": getattr(bench, "PROBE", None), "value": cfg.value,
           "cwd": os.getcwd(), "pythonpath": os.environ.get("PYTHONPATH", ""),
           "preempt_signal": os.environ.get("SUBMITIT_PREEMPT_SIGNAL"), "job": os.environ.get("SLURM_JOB_ID"),
           "pid": os.getpid()}
    with open(os.path.join(out, "probe.json"), "w") as f:
        json.dump(rec, f)

if __name__ == "__main__":
    main()
'''


def make_probe(tmp: Path, launcher: str, launcher_cfg: dict[str, Any], wait_for: str | None = None) -> dict[str, Path]:
    """Copy the project to tmp/project and write the probe app to tmp/app; returns the paths a test needs."""
    code = tmp / "project"
    for name in SNAPSHOT_PATHS:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, code / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        elif src.exists():
            shutil.copy2(src, code / name)
    app = tmp / "app"
    (app / "conf").mkdir(parents=True)
    (app / "app.py").write_text(APP.replace("HANG_S", str(HANG_S)))
    sweep = tmp / "sweep"
    config = app / "conf" / "probe.yaml"
    config.write_text(textwrap.dedent(f"""\
        defaults:
          - override hydra/launcher: {launcher}
          - _self_
        value: original
        n: 0
        wait_for: {json.dumps(wait_for)}
        hydra:
          searchpath: ["file://{code / 'conf'}"]
          sweep: {{dir: "{sweep}", subdir: "job${{n}}"}}
          launcher: {json.dumps(launcher_cfg)}
        """))
    workdir = tmp / "work"  # the submission directory (not the project copy)
    workdir.mkdir()
    return {"code": code, "app": app / "app.py", "config": config, "sweep": sweep, "workdir": workdir}


def edit_after_submission(paths: dict[str, Path]) -> None:
    """What a user does while the sweep waits: change the code and the config."""
    with open(paths["code"] / "bench" / "__init__.py", "a") as f:
        f.write('\nPROBE = "edited after submission"\n')
    config = paths["config"]
    config.write_text(config.read_text().replace("value: original", "value: edited"))


def waiting(paths: dict[str, Path]) -> list[Path]:
    """The jobs that have started and are held (wait_for): their output directories."""
    return sorted(p.parent for p in paths["sweep"].glob("job*/waiting"))


def probes(paths: dict[str, Path]) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(paths["sweep"].glob("job*/probe.json"))]


def snapshot_of(paths: dict[str, Path]) -> Path:
    [snapshot] = sorted((paths["sweep"] / ".code").iterdir())
    return snapshot


def ran_from_the_snapshot(paths: dict[str, Path], jobs: int, out: str) -> list[dict[str, Any]]:
    """Assert that `jobs` jobs ran from the sweep's one code snapshot, with the config as submitted and in the
    submission directory, whatever was edited after submission; returns their probe records."""
    snapshot = snapshot_of(paths)
    recs = probes(paths)
    assert len(recs) == jobs, out[-4000:]
    for rec in recs:
        assert Path(rec["bench_file"]) == snapshot / "bench" / "__init__.py", rec  # imported from the snapshot
        assert rec["probe"] is None and rec["value"] == "original", rec              # not the edited code/config
        assert rec["cwd"] == str(paths["workdir"]), rec                              # relative paths as submitted
    return recs
