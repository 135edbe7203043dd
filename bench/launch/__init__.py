"""Launching: the command line, the sweep's launchers/pool/sweeper, the dry run and budget.

Imports nothing heavy at package level: `qrl-bench --help` and config errors must answer before torch loads.
"""
