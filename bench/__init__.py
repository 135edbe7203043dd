"""qrl-bench: GRPO with low-precision rollouts, six treatments of the rollout/trainer mismatch."""

__version__ = "0.1.0"

from pathlib import Path

#: conf/: the Hydra config tree (groups method/ model/ task/ rollout/ tracking/ experiment/, hydra/launcher/)
CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
