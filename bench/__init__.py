"""qrl-bench: GRPO with low-precision rollouts, six treatments of the rollout/trainer mismatch."""

__version__ = "0.1.0"
