"""Test-wide settings: no network, one torch thread per test process, W&B offline."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import signal  # noqa: E402

import torch  # noqa: E402

torch.set_num_threads(1)

# A suite started in the background (`nohup`, `&` in a script) inherits SIGINT ignored, and so would every job a test
# starts: the Ctrl-C tests would then test a process that cannot be interrupted. Give SIGINT its usual meaning.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

import pytest  # noqa: E402


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Tests marked `cuda` need a GPU; without one they skip, saying why (pytest -ra prints the reason)."""
    if item.get_closest_marker("cuda") is not None and not torch.cuda.is_available():
        why = "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}, no visible GPU"
        pytest.skip(f"needs a CUDA GPU: torch {torch.__version__} is {why}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test gets a last-resort hang guard (issue 32 F8): a test that hangs fails instead of stalling the
    suite, and no test is bounded tighter. It is twice tests/hang.py's HANG_S, so that a test's own guards (its
    subprocess timeouts, `wait_until`) trip first with their message; and it runs in a thread, not on SIGALRM,
    which the reward time limit (bench/run/timelimit.py) and its tests own."""
    from tests.hang import HANG_S

    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(2 * HANG_S, method="thread"))
