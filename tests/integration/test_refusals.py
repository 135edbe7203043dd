"""Issue 19 R5-R9: every bad value and input is refused before any work, in one line, with exit code 2.

Each case is a real `qrl-bench` command line (run by tests/integration/cli_cases.py, one process per case) with
an empty warm-start cache, and must:
- exit 2 with exactly one output line, `qrl-bench: error: ...`, naming the value and what is valid;
- write nothing: no file under out_root, and no warm start built (the data checks come before the warm start,
  which must not be the first reader of the data: R5, R7).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.run.store import RunDir
from tests.hang import HANG_S
from tests.helpers import FAST, REPO, make_cfg
from tests.integration.test_faults import env

pytestmark = pytest.mark.slow

MB5 = 5 * 1024 * 1024
MATH_ROW = {"problem": "What is 1+1?", "solution": "\\boxed{2}", "answer": "2", "unique_id": "a"}


def jsonl(*rows: dict) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


# name -> (arguments, fragment of the error line, extra environment, files to write {name: bytes})
EVAL = ["eval.sets=[math500]", "+eval.overrides.math500.source={d}/math500.jsonl"]
JSONL = ["task=jsonl", "task.train_file={d}/train.jsonl", "task.test_file={d}/test.jsonl"]
QA = [{"question": f"{a}+{b}", "answer": str(a + b)} for a, b in ((1, 1), (2, 3), (4, 4), (5, 1))]
CASES: dict[str, tuple[list[str], str, dict[str, str], dict[str, bytes]]] = {
    # R5: eval.sets data, checked before the warm start
    "eval_set_file_missing": (["eval.sets=[math500]", "+eval.overrides.math500.source={d}/none.jsonl"],
                              "eval set 'math500': task.source '{d}/none.jsonl': no such file or folder", {}, {}),
    "eval_set_file_empty": (EVAL, "eval set 'math500': {d}/math500.jsonl: the file is empty", {}, {"math500.jsonl": b""}),
    "eval_set_not_utf8": (EVAL, "eval set 'math500': {d}/math500.jsonl: not UTF-8 text (byte 0xe9", {},
                          {"math500.jsonl": json.dumps({**MATH_ROW, "problem": "café"}, ensure_ascii=False).encode("latin-1")
                           + b"\n"}),
    "eval_set_5mb_line": (EVAL, "eval set math500: 1 of 2 test prompts do not fit the model's context of 128 tokens "
                          "and leave room for a response", {},
                          {"math500.jsonl": jsonl(MATH_ROW, {**MATH_ROW, "unique_id": "b", "problem": "9" * MB5})}),
    "eval_set_no_columns": (EVAL, "missing column(s) problem, solution, unique_id; columns found: question, answer", {},
                            {"math500.jsonl": jsonl(QA[0])}),
    "eval_set_hub_id_offline": (["eval.sets=[math500]"], "eval set 'math500': dataset 'HuggingFaceH4/MATH-500' "
                                "(split 'test') cannot be loaded: offline mode is on", {"HF_DATASETS_CACHE": "{d}/hf"}, {}),
    # R6: values that wreck training
    "grad_clip_negative": (["train.grad_clip=-1"], "train.grad_clip=-1 is out of range; allowed: (0, inf)", {}, {}),
    "epochs_0": (["train.epochs=0"], "train.epochs=0 is out of range; allowed: [1, inf)", {}, {}),
    "temperature_inf": (["rollout.temperature=inf"], "rollout.temperature=inf is out of range; allowed: (0, 10]", {}, {}),
    "temperature_nan": (["rollout.temperature=nan"], "rollout.temperature=nan is out of range; allowed: (0, 10]", {}, {}),
    "temperature_0": (["rollout.temperature=0"], "rollout.temperature=0 is out of range; allowed: (0, 10]", {}, {}),
    "eval_every_negative": (["train.eval_every=-5"], "train.eval_every=-5 is out of range; allowed: [1, inf)", {}, {}),
    "eval_every_0": (["train.eval_every=0"], "train.eval_every=0 is out of range; allowed: [1, inf)", {}, {}),
    "checkpoint_every_0": (["train.checkpoint_every=0"], "train.checkpoint_every=0 is out of range; allowed: [1, inf)", {}, {}),
    "lr_inf": (["train.lr=inf"], "train.lr=inf is out of range; allowed: (0, 1]", {}, {}),
    "lr_nan": (["train.lr=nan"], "train.lr=nan is out of range; allowed: (0, 1]", {}, {}),
    # R7: over-long training prompts, found on the data before the warm start reads it (801 characters with the
    # "{question}=" template, + BOS)
    "train_prompt_801_chars": (JSONL, "task 'jsonl': 1 of 3 train prompts do not fit the model's context of 128 "
                               "tokens with task.max_new_tokens=8 (the longest, train example 2, has 802 prompt tokens", {},
                               {"train.jsonl": jsonl(*QA[:2], {"question": "1" * 800, "answer": "1"}),
                                "test.jsonl": jsonl(*QA[2:])}),
    "train_5mb_line": (JSONL, "task 'jsonl': 1 of 3 train prompts do not fit the model's context of 128 tokens with "
                       "task.max_new_tokens=8 (the longest, train example 2, has more than ", {},
                       {"train.jsonl": jsonl(*QA[:2], {"question": "1" * MB5, "answer": "1"}),
                        "test.jsonl": jsonl(*QA[2:])}),
    # R8: configuration errors in one line, with the valid choices and a close match
    "unknown_method": (["method=bogus"], "method=bogus: unknown method 'bogus'; valid choices: acr, ", {}, {}),
    "unknown_task": (["task=arithmetc"], "task=arithmetc: unknown task 'arithmetc' (did you mean 'arithmetic'?); "
                     "valid choices: aime24, ", {}, {}),
    "unknown_model": (["model=tinyy"], "model=tinyy: unknown model 'tinyy' (did you mean 'tiny'?); valid choices: ", {}, {}),
    "misspelt_key": (["train.stepz=3"], "train.stepz=3: train has no key 'stepz' (did you mean 'steps'?); its keys: "
                     "batch_size, ", {}, {}),
    "seed_not_an_integer": (["seed=abc"], "seed=abc: 'abc' is not a valid seed (Value 'abc' of type 'str' could not be "
                            "converted to Integer)", {}, {}),
    "vllm_not_installed": (["rollout=vllm"], "rollout=vllm needs vLLM, which ", {}, {}),
    "vllm_int8": (["rollout=vllm", "rollout.precision=int8"], "vllm engine: precision 'int8' is not supported: ", {}, {}),
    "wandb_mode_bogus": ([], "WANDB_MODE=bogus is not a W&B mode; choose one of: offline, online, disabled", {"WANDB_MODE": "bogus"}, {}),
    # R9: a read-only run directory
    "read_only_run_directory": ([], "run directory {run} is not writable (", {}, {}),
}


def case_dir(root: Path, name: str) -> Path:
    return root / name


def fill(text: str, d: Path, run: Path | None = None) -> str:
    return text.replace("{d}", str(d)).replace("{run}", str(run))


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, tuple[int, str, Path, Path]]:
    """name -> (exit code, output, case directory, run directory) of every case, all run once."""
    root = tmp_path_factory.mktemp("refusals")
    cases, mounted = [], []
    for name, (args, _, extra_env, files) in CASES.items():
        d = case_dir(root, name)
        d.mkdir()
        for file, content in files.items():
            (d / file).write_bytes(content)
        args = [*FAST, *(fill(a, d) for a in args), f"out_root={d / 'results'}"]
        run = RunDir.of(make_cfg(d / "results", *[a for a in args if not a.startswith("eval.sets")], fast=False)).path \
            if name == "read_only_run_directory" else None
        if run is not None:
            run.mkdir(parents=True)
            if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(run)],
                              capture_output=True).returncode == 0:
                mounted.append(run)
            else:
                run.chmod(0o555)
        case_env = {"QRL_BENCH_CACHE": str(d / "cache"), **{k: fill(v, d) for k, v in extra_env.items()}}
        cases.append({"name": name, "args": args, "env": case_env, "log": str(d / "output.log")})
        (d / "run_dir").write_text(str(run or ""))
    (root / "cases.json").write_text(json.dumps(cases))
    try:
        proc = subprocess.run([sys.executable, "-m", "tests.integration.cli_cases", str(root / "cases.json"),
                               str(root / "results.json")], cwd=REPO, env=env(), capture_output=True, text=True,
                              timeout=HANG_S)
    finally:
        for run in mounted:
            subprocess.run(["umount", "-l", str(run)], capture_output=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    codes = json.loads((root / "results.json").read_text())
    out = {}
    for name in CASES:
        d = case_dir(root, name)
        run_text = (d / "run_dir").read_text()
        out[name] = (codes[name], (d / "output.log").read_text(), d, Path(run_text) if run_text else None)
    out["_mounted"] = bool(mounted)
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_refused_before_any_work_in_one_line_with_exit_2(outcomes, name):
    if name == "vllm_not_installed" and importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here: rollout=vllm is not a configuration error")
    if name == "read_only_run_directory" and not outcomes["_mounted"] and os.geteuid() == 0:
        pytest.skip("root ignores a read-only mode and no read-only tmpfs could be mounted here")
    code, output, d, run = outcomes[name]
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("qrl-bench: error: "), output[-3000:]
    assert fill(CASES[name][1], d, run) in lines[0], lines[0]
    assert code == 2, output[-3000:]
    # nothing written: no file in the results directory, no warm start built (the data checks come first)
    results = d / "results"
    if run is None:  # not even an empty folder: one the launch made is removed by the refusal
        assert not results.exists(), list(results.rglob("*"))
    else:  # the case made the (read-only) run directory itself
        assert not any(p.is_file() for p in results.rglob("*")), list(results.rglob("*"))
    assert not (d / "cache" / "warmstart").exists() or not any((d / "cache" / "warmstart").iterdir())
