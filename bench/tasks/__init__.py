"""Tasks with verifiable rewards: synthetic (arithmetic, chain, countdown) and datasets-backed (JSONL, hub sets).

A new task is two files: `bench/tasks/<task>.py` (a `GeneratedTask` that writes `_make`, `prompt`, `target` and
`reward`, or a `Task`/`HubTask`, under `@TASKS.register("<task>", schema=<its config>)`) and `conf/task/<task>.yaml`.
A synthetic task gets the split and reward tests of tests/unit/test_tasks.py from the registry.
"""
