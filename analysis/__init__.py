"""qrl-bench analysis: run directories (and optionally W&B) -> figures, tables and report.md.

Modules, one concern each: `load` (discovery, validation, DataFrames), `stats` (mean/std, t-intervals over seeds),
`arms` (colours, order, labels), `plots`, `tables`, `report`, `wandb_source`, `cli` (`qrl-analyze`).
"""
