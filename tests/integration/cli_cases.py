"""Run many `qrl-bench` command lines, each in its own process, paying the imports once.

    python -m tests.integration.cli_cases CASES.json RESULTS.json

CASES.json: [{"name", "args", "env", "log"}]. Each case is the real `bench.launch.entry.main()` in a process of its own,
forked from this one after the heavy imports (torch, transformers, Hydra: ~10 s of CPU per process, minutes for
the dozens of refusal cases of tests/integration/test_refusals.py). Its stdout and stderr go to `log`, its
environment gets `env`; RESULTS.json maps each name to its exit code.
"""

from __future__ import annotations

import json
import os
import sys


def run_case(case: dict) -> int:
    pid = os.fork()
    if pid == 0:  # the child: one qrl-bench process
        code = 1
        try:
            fd = os.open(case["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.environ.update(case.get("env") or {})
            sys.argv = ["qrl-bench", *case["args"]]
            from bench.launch.entry import main

            try:
                main()
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def main() -> None:
    import bench.launch.cli  # noqa: F401  (the imports every case shares)
    import bench.train  # noqa: F401

    cases = json.loads(open(sys.argv[1]).read())
    results = {case["name"]: run_case(case) for case in cases}
    with open(sys.argv[2], "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
