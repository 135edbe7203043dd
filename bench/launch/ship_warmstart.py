"""Ship a warm start: `python -m bench.launch.ship_warmstart [hydra overrides]`.

Builds (or takes from the cache) the warm start that a run with these overrides starts from and copies it into
bench/warmstarts/ with the sha256 of its weights and this machine's CPU (bench.warmstart: why warm starts are
shipped). scripts/ship_warmstarts.sh runs it for every shipped one; commit the directories it prints.
"""

from __future__ import annotations

import sys

from hydra import compose, initialize_config_dir

from bench.launch.config import CONF_DIR, register_configs
from bench.launch.overrides import check_overrides
from bench.tasks.base import build_task
from bench.warmstart import ship


def main(argv: list[str] | None = None) -> int:
    overrides = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in overrides):
        print(__doc__ + "\ne.g.  python -m bench.launch.ship_warmstart task=chain model=tiny_long")
        return 0
    register_configs()
    error = check_overrides(overrides)  # one line naming the bad override and the valid choices
    if error:
        print(f"ship_warmstart: error: {error}", file=sys.stderr)
        return 2
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    if cfg.model.path is not None:
        print(f"model.path={cfg.model.path}: only the built-in tiny models (model.path: null) are warm-started",
              file=sys.stderr)
        return 2
    print(ship(cfg.model, build_task(cfg.task)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
