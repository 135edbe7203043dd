"""Benchmark commands (not tests): `python -m bench.benchmarks.<name>`; each prints a Markdown table."""
