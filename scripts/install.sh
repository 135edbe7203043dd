#!/usr/bin/env bash
# Create ./.venv and install qrl-bench into it (editable, with test extras). Idempotent: a second call
# does nothing unless pyproject.toml changed. torch is installed first with an exact version so that pip
# takes the CPU wheel (a loose spec on a fresh machine pulls a multi-GB CUDA build); override with
# TORCH_SPEC='torch==X' (e.g. a CUDA build on a GPU cluster). Every other package is pinned by requirements.lock
# (a pip constraints file: the versions the reference numbers were produced with; refresh: bash scripts/lock.sh);
# LOCK= (empty) installs without it, taking whatever versions pyproject.toml allows today.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
LOCK=${LOCK-requirements.lock}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
stamp=.venv/.qrl-bench-installed
want="$(cat pyproject.toml ${LOCK:+"$LOCK"} | sha256sum | cut -c1-16) $TORCH_SPEC ${LOCK:-unlocked}"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[install] installing $TORCH_SPEC and qrl-bench[dev]${LOCK:+ (versions from $LOCK)} into .venv (first time: ~2 min)" >&2
  # one resolution for torch (exact version) and the project; --no-compile: pip would byte-compile every
  # file of torch, transformers, ... (measured: ~100 s of a 3-minute install on 2 busy cores); Python
  # compiles the modules actually imported on first use instead (the import check below does it once)
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-compile "$TORCH_SPEC" -e ".[dev]" \
    ${LOCK:+-c "$LOCK"} 2>&1 \
    | grep -v "^WARNING: Location" >&2 || true
  # (env -u: with PYTHONDONTWRITEBYTECODE set, as some sandboxes do, nothing would be cached and every later
  # process would compile torch's Python again: 19-22 s instead of 7.5 s to import bench.train, measured)
  env -u PYTHONDONTWRITEBYTECODE \
    .venv/bin/python -c "import torch, transformers, hydra, submitit, wandb, bench.launch.cli, bench.train, analysis.cli" \
    || { echo "[install] FAILED: the venv does not import qrl-bench's dependencies" >&2; exit 1; }
  echo "$want" > "$stamp"
fi
