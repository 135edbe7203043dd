"""The treatments of the rollout/trainer mismatch, one module per arm (methods.md), behind `METHODS`.

Each arm module registers itself (bench.methods.base); `METHODS` imports every module of this package the
first time a name is looked up, so nothing here lists them.
"""
