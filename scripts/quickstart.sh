#!/usr/bin/env bash
# THE main command: installs what it needs, runs the short smoke sweep (+experiment=smoke_short: seven arms at W4A4
# on 3-6-step chains from the shipped warm start, 4 seeds, 28 runs; tiny model, CPU, local launcher, jobs in
# parallel) and writes the analysis report into results/smoke_short/report, the committed reference: `git diff --stat
# results/smoke_short/report` then shows what your machine changed (throughput and dates; see README).
# Finished runs are skipped on a second call, interrupted ones resumed. Extra arguments go to qrl-bench.
# W&B is off here: the report reads the run directories, and each run's W&B mirror costs a few CPU seconds
# (its service process) on a machine that has none to spare; WANDB_MODE=offline bash scripts/quickstart.sh
# mirrors every run as usual.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS=0
bash scripts/install.sh
echo "[quickstart] install: ${SECONDS}s" >&2
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export WANDB_MODE=${WANDB_MODE:-disabled} WANDB_SILENT=true
t=$SECONDS
.venv/bin/qrl-bench -m +experiment=smoke_short "$@"
echo "[quickstart] sweep: $((SECONDS - t))s" >&2
t=$SECONDS
.venv/bin/qrl-analyze results/smoke_short --out results/smoke_short/report
echo "[quickstart] report: $((SECONDS - t))s; total ${SECONDS}s" >&2
