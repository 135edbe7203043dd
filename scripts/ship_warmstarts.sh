#!/usr/bin/env bash
# Build (or reuse from the cache) and ship the warm starts that the committed reference runs start from, into
# bench/warmstarts/ (bench/warmstart.py says why). Run it on the machine whose reference numbers the repository
# keeps, after a change that alters a warm start's key (tests/unit/test_shipped_warmstarts.py fails until then);
# delete a directory under bench/warmstarts/ to rebuild it. Then commit bench/warmstarts/.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
ship() { .venv/bin/python -m bench.launch.ship_warmstart "$@"; }
# the quickstart (conf/experiment/smoke_short.yaml): short chains on tiny
ship task=chain task.min_steps=3 task.max_steps=6 task.max_new_tokens=48 model.warmstart_lr=2e-3 model.warmstart_target_acc=0.3
# conf/experiment/smoke.yaml: arithmetic and countdown on tiny
ship task=arithmetic
ship task=countdown
# the severity sweep (conf/experiment/severity.yaml): long chains on tiny_long
ship task=chain model=tiny_long
