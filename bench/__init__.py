"""qrl-bench: GRPO with low-precision rollouts, six treatments of the rollout/trainer mismatch."""

__version__ = "0.1.0"

from pathlib import Path

#: conf/: the Hydra config tree (the CONFIG_GROUPS, convention_preset/, hydra/launcher/, hydra/sweeper/)
CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
#: the config groups a user picks from with `group=option` (`+experiment=`: not in the defaults), in `--help`'s order
CONFIG_GROUPS = ("method", "convention", "rollout", "task", "model", "tracking", "experiment")
