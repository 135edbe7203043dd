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
# the separation sweep's middle rung (conf/experiment/separation*.yaml): chains of 6-10 steps on tiny_long. SFT seed 1:
# with seed 0 the 4500 SFT steps ended at 2.3 % train accuracy; seed 1 reached the 30 % target at step 2850
ship task=chain task.min_steps=6 task.max_steps=10 task.max_new_tokens=80 model=tiny_long model.warmstart_seed=1
# the full separation sweep (conf/experiment/separation.yaml): the same three rungs with 1,000 test problems, which
# draws another train split (test first, then train disjoint from it), hence another warm start each
ship task=chain task.min_steps=3 task.max_steps=6 task.max_new_tokens=48 model.warmstart_lr=2e-3 model.warmstart_target_acc=0.3 task.n_test=1000
ship task=chain task.min_steps=6 task.max_steps=10 task.max_new_tokens=80 model=tiny_long model.warmstart_seed=1 task.n_test=1000
ship task=chain model=tiny_long task.n_test=1000
