#!/usr/bin/env bash
# THE test command (README and .ci/run both call it): installs what it needs, brings up the single-node
# SLURM cluster when it can (root + apt; QRL_SLURM=0 to skip), runs pytest offline, tears SLURM down.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow"`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=offline WANDB_SILENT=true
export TOKENIZERS_PARALLELISM=false
if [ "${QRL_SLURM:-1}" != 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  if bash scripts/slurm_up.sh; then
    trap 'bash scripts/slurm_down.sh >/dev/null 2>&1 || true' EXIT
  else
    echo "[test] SLURM bring-up failed; SLURM tests will fail in CI and skip elsewhere" >&2
  fi
fi
set +e
timeout 3000 .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
rc=$?
set -e
[ $rc = 5 ] && { echo "[test] pytest collected no tests" >&2; exit 1; }
exit $rc
