#!/usr/bin/env bash
# Refresh requirements.lock: the exact versions of every package qrl-bench[dev] installs, except torch.
#   bash scripts/lock.sh            then review `git diff requirements.lock`, run the tests, commit
# scripts/install.sh installs with `-c requirements.lock`, so a fresh clone gets these versions whatever PyPI
# serves that day (transformers 5.23 -> 5.24 alone moved the reference numbers). torch is left out: install.sh
# installs TORCH_SPEC itself (the CPU wheel by default, a CUDA build on a GPU cluster). It is resolved here as
# the CPU wheel TORCH_CPU, so the lock holds no CUDA packages (nvidia-*, triton) that a PyPI torch would pull.
# Uses uv (PyPI: `pip install uv`), installed into a throw-away venv when not on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_CPU=${TORCH_CPU:-torch==2.13.0+cpu}
# where the CPU wheel comes from: a local wheel directory (TORCH_WHEELS) or PyTorch's CPU index
TORCH_WHEELS=${TORCH_WHEELS:-/opt/wheels}
if [ -d "$TORCH_WHEELS" ]; then source_args=(--find-links "$TORCH_WHEELS")
else source_args=(--extra-index-url https://download.pytorch.org/whl/cpu --index-strategy unsafe-best-match); fi
uv=$(command -v uv || true)
if [ -z "$uv" ]; then
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  python3 -m venv "$tmp/venv" && "$tmp/venv/bin/pip" install -q uv && uv="$tmp/venv/bin/uv"
fi
override=$(mktemp); echo "$TORCH_CPU" > "$override"
"$uv" pip compile pyproject.toml --extra dev --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
  "${source_args[@]}" --override "$override" --no-emit-package torch --no-emit-find-links --no-emit-index-url \
  --custom-compile-command "bash scripts/lock.sh" -o requirements.lock
rm -f "$override"
