#!/usr/bin/env bash
# THE test command (README and .ci/run both call it): installs what it needs, brings up the single-node
# SLURM cluster when it can (root + apt; QRL_SLURM=0 to skip), runs pytest offline, tears SLURM down.
# Extra arguments go to the main pytest run, e.g. `bash scripts/test.sh -m "not slow"`.
# The main run uses one pytest-xdist worker per core, at most 8 (QRL_TEST_WORKERS=N sets it; `-n 0` among the
# extra arguments runs in one process): the tests are single-threaded (train.threads=1), so on the 2-core CI
# machine one process left a core idle and the suite ran past CI's limit.
# Then the real-vLLM tests (tests/vllm) run in their own venv (.venv-vllm, scripts/install_vllm.sh: ~4 min the
# first time, 2.9 GB), on as many workers, a module to a worker (their time is engine starts and `import vllm`:
# Python on one core; 414 s on two workers against 557-768 s in one process, 2-core Xeon); QRL_VLLM=0 skips them
# outside CI. The main venv never collects tests/vllm. The venv is built while the main run goes (mostly download
# and unpacking), its log printed after.
# Without --quick, as root with apt-get, it also installs TeX (texlive-latex-recommended) for the LaTeX table check.
# --quick (first argument): no side effects beyond .venv: no apt packages, no SLURM cluster, no vLLM venv; runs
# the tests not marked slow or slurm (`-m "not slow and not slurm"`; a later -m replaces it); the LaTeX compile
# check skips, saying why, unless TeX with booktabs is already there. CI (.ci/run) never passes it.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
if [ "${1:-}" = --quick ]; then
  quick=1
  shift
  set -- -m "not slow and not slurm" "$@"
fi
bash scripts/install.sh
at_exit=()  # what the EXIT trap undoes: the SLURM cluster we started, the vLLM install still running
trap 'for c in "${at_exit[@]}"; do eval "$c"; done' EXIT
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=offline WANDB_SILENT=true
export TOKENIZERS_PARALLELISM=false
# The tests start hundreds of Python processes; with PYTHONDONTWRITEBYTECODE set (some sandboxes set it) each one
# compiled torch's and the project's Python again (an import of bench.train 19-22 s instead of 7.5 s): let the
# first import of each module write its cache (.venv and the gitignored __pycache__ folders).
unset PYTHONDONTWRITEBYTECODE
if [ $quick = 0 ] && [ "${QRL_SLURM:-1}" != 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  if bash scripts/slurm_up.sh; then
    at_exit+=('bash scripts/slurm_down.sh >/dev/null 2>&1 || true')
  else
    echo "[test] SLURM bring-up failed; SLURM tests will fail in CI and skip elsewhere" >&2
  fi
fi
if [ $quick = 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null \
    && ! { command -v pdflatex >/dev/null && kpsewhich booktabs.sty >/dev/null; }; then
  # pdflatex with booktabs for tests/analysis/test_latex.py (compiles every .tex table the report writes and checks
  # it fits a page; texlive-latex-recommended has booktabs.sty and pulls in texlive-latex-base: ~130 MB of TeX)
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q texlive-latex-recommended >/dev/null \
    || echo "[test] texlive-latex-recommended not installed; the LaTeX compile test will fail in CI, skip elsewhere" >&2
fi
vllm_part=1
if [ $quick = 1 ]; then vllm_part=0
elif [ "${QRL_VLLM:-1}" = 0 ] && [ -z "${CI:-}" ]; then vllm_part=0; fi
t0=$(date +%s)
if [ $vllm_part = 1 ]; then
  vllm_log=$(mktemp)
  bash scripts/install_vllm.sh >"$vllm_log" 2>&1 &
  vllm_pid=$!
  at_exit+=("kill $vllm_pid 2>/dev/null || true; rm -f '$vllm_log'")
fi
workers=${QRL_TEST_WORKERS:-$(nproc)}
[ "$workers" -gt 8 ] && workers=8
set +e
timeout 4200 .venv/bin/python -m pytest -q -p no:cacheprovider --durations=25 -n "$workers" --dist worksteal \
  --ignore=tests/vllm "$@"
rc=$?
set -e
[ $rc = 5 ] && { echo "[test] pytest collected no tests" >&2; rc=1; }
echo "[test] main suite: $(( $(date +%s) - t0 )) s, exit $rc ($workers workers)" >&2
if [ $quick = 1 ]; then
  echo "[test] --quick: skipped the slow and SLURM tests and the real-vLLM tests (tests/vllm)" >&2
  exit $rc
fi
if [ $vllm_part = 0 ]; then
  echo "[test] QRL_VLLM=0: skipping the real-vLLM tests (tests/vllm)" >&2
  exit $rc
fi
rc_install=0
wait $vllm_pid || rc_install=$?
cat "$vllm_log" >&2
[ $rc_install = 0 ] || { echo "[test] FAILED: scripts/install_vllm.sh" >&2; exit 1; }
t1=$(date +%s)
set +e
# --dist loadfile: each module builds its engine once (module-scoped fixtures), so a module stays on one worker
timeout 1200 .venv-vllm/bin/python -m pytest tests/vllm -q -p no:cacheprovider --durations=10 -n "$workers" --dist loadfile
rc_vllm=$?
set -e
[ $rc_vllm = 5 ] && { echo "[test] tests/vllm collected no tests" >&2; rc_vllm=1; }
echo "[test] vLLM tests: $(( $(date +%s) - t1 )) s, exit $rc_vllm" >&2
[ $rc != 0 ] && exit $rc
exit $rc_vllm
