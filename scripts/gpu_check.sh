#!/usr/bin/env bash
# One command that asks a machine with an NVIDIA GPU the questions that now decide the project, in this order, each
# step with its own time limit inside ~580 s, and writes one Markdown report after every step, stamped with the
# commit and the card (bench/launch/gpu_check.py lists the steps): (1) the FP8 accumulator and the CUDA FP8 engine
# test's ratio; (2) a decode step's attention cold / warm, then the embedded engine's rollout at real shapes (0.5B, 1.5B; bf16 / fp8 / int8; eager and
# compiled); (3) one step of each qurl_table1 precision row at its real shape; (4) trainer memory at 1.5B
# for 8.4k / 16.4k tokens; (5) the cuda-marked tests; (6) the INT8 layouts, then vLLM's rows and the preflight.
#
#   bash scripts/gpu_check.sh                 install (.venv-gpu: CUDA torch + vLLM) and run; report in gpu_check_report.md
#   bash scripts/gpu_check.sh --dry-run       the CPU self-test only (what a machine without a GPU runs)
#
# Environment: GPU_CHECK_REPORT (report path), VLLM_SPEC (default vllm==0.32.*; it brings the CUDA torch it
# pins), TORCH_SPEC (optional: a particular torch build), PIP_EXTRA_INDEX_URL (e.g. the PyTorch cu128 index),
# GPU_CHECK_PYTHON (an interpreter that already has a CUDA torch and the project's dependencies, e.g. on a machine
# without network access: nothing is installed, and the vLLM rows say they did not run unless it has vLLM),
# GPU_CHECK_COMMIT (the commit to stamp where the copy has no .git). The time limits count from when the environment
# is ready (the install is not in them); the whole check is also killed at GPU_CHECK_LIMIT seconds (default 590), and
# the report then holds every step that finished. On a machine without a usable GPU it says so, runs the CPU
# self-test and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."
REPORT=${GPU_CHECK_REPORT:-gpu_check_report.md}
dry=0
case "${1:-}" in
  --dry-run) dry=1 ;;
  "") ;;
  *) echo "gpu_check.sh: unknown argument '$1'; valid: --dry-run (or nothing)" >&2; exit 2 ;;
esac

has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q "^GPU"; }

self_test() {
  local py=.venv/bin/python
  [ -x "$py" ] || { bash scripts/install.sh; }
  "$py" -m bench.launch.gpu_check --self-test --report "$REPORT"
}

if [ "$dry" = 1 ] || ! has_gpu; then
  [ "$dry" = 1 ] || echo "gpu_check.sh: this check needs an NVIDIA GPU (nvidia-smi sees none); running its CPU self-test instead" >&2
  self_test
  echo "gpu_check.sh: CPU self-test passed; report in $REPORT (no GPU was used)" >&2
  exit 0
fi

VENV=.venv-gpu
t0=$(date +%s)
if [ -n "${GPU_CHECK_PYTHON:-}" ]; then
  PY=$GPU_CHECK_PYTHON
  echo "[gpu_check] using $PY as it is (GPU_CHECK_PYTHON): nothing installed" >&2
elif [ ! -x $VENV/bin/python ]; then
  PY=$VENV/bin/python
  echo "[gpu_check] installing ${VLLM_SPEC:-vllm==0.32.*} (with the CUDA torch it pins${TORCH_SPEC:+, $TORCH_SPEC}) into $VENV" >&2
  python3 -m venv $VENV
  # vLLM pins its torch: let it choose unless TORCH_SPEC names one (then both must agree)
  $VENV/bin/python -m pip install -q --disable-pip-version-check ${TORCH_SPEC:+"$TORCH_SPEC"} "${VLLM_SPEC:-vllm==0.32.*}" -e ".[dev]" \
    || { echo "gpu_check.sh: the install failed (no network? then set GPU_CHECK_PYTHON to a python with a CUDA torch)" >&2; exit 1; }
else
  PY=$VENV/bin/python
fi
$PY -c "import torch; assert torch.cuda.is_available(), 'torch sees no GPU: ' + str(torch.version.cuda)"
echo "[gpu_check] environment ready after $(( $(date +%s) - t0 )) s" >&2
timeout "${GPU_CHECK_LIMIT:-590}" $PY -m bench.launch.gpu_check --report "$REPORT" \
  || echo "[gpu_check] the check ended with exit $? (124: GPU_CHECK_LIMIT); the report holds the steps that finished" >&2
echo "[gpu_check] done in $(( $(date +%s) - t0 )) s; report in $REPORT" >&2
