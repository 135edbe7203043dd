"""The six treatments behind one registry (methods.md). Importing this package registers every method name:
bf16, fp8 (naive), fp8_ppo_is, tis, acr, acr_uaq, ess, ais."""

from bench.methods import acr, ais, ess, naive, ppo_is, tis  # noqa: F401  (fills REGISTRY)
from bench.methods.base import REGISTRY, Batch, Method, build_method, select_stats

__all__ = ["REGISTRY", "Batch", "Method", "build_method", "select_stats"]
