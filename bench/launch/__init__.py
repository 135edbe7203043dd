"""Launching: the command line, the sweep's launchers/pool/sweeper, the dry run, budget and preflight checks.

Imports nothing heavy at package level: `qrl-bench --help` and config errors must answer before torch loads.
"""
