"""Tasks with verifiable rewards: synthetic (arithmetic, countdown) and datasets-backed (JSONL)."""
