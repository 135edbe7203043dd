"""Quantizers (format x granularity), quantized linear modules and UAQ invariant scaling.

A new precision is one file: `bench/quant/<name>.py` with a `Format` (or a `BlockFormat`, for block/group scales
emulated by FakeQuantLinear) under `@FORMATS.register("<name>")`; `rollout.precision=<name>` then selects it and
the engine tests (tests/unit/test_engine.py) run it from the registry. Its name also goes into the docs' three
hand-kept lists of precisions (docs/configuration.md, "Adding an arm, task, engine or precision").
"""
