"""Rollout engines: the embedded torch engine (default) and an optional vLLM engine."""
