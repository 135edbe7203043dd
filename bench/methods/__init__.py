"""The treatments of the rollout/trainer mismatch, one module per arm (docs/arms.md), behind `METHODS`.

Each arm module registers itself in `METHODS` (bench/registry.py), which imports every module of this package the
first time a name is looked up, so nothing here lists them.

A new arm is two files: `bench/methods/<arm>.py` (a `Method` subclass, usually of `PPOClipMethod` or
`ConstantWeightMethod`, under `@METHODS.register("<arm>", schema=<its config>, color=..., order=...)`, with its
`diagnostics` and the `metric_keys` its steps write) and `conf/method/<arm>.yaml`. The property tests
(tests/unit/test_method_properties.py) and the end-to-end test (tests/integration/test_arms.py) pick it up from
the registry.
"""

from bench.registry import METHODS

#: the rollout precision of an arm that does not declare one (`rollout.precision=...` overrides it)
DEFAULT_LOW_PRECISION = "fp8_e4m3"


def arm_precision(name: str) -> str:
    """The rollout precision `method=<name>` runs at unless `rollout.precision` says otherwise (torch-free: the
    configuration's default precision resolver reads it)."""
    return str(METHODS.entry(name).meta.get("precision") or DEFAULT_LOW_PRECISION)
