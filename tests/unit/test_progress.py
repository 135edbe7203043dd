"""Issue 25 item 3: a run's progress in a log file is whole lines (no carriage returns), one per interval and one
at the last step; a run ends with one result line with its numbers."""

from __future__ import annotations

import io

from bench.run.progress import LogProgress, progress


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_log_progress_writes_a_line_per_interval_and_at_the_end():
    out, clock = io.StringIO(), Clock()
    bar = LogProgress(range(5, 40), "arm-task-s0", out, every=10.0, clock=clock)
    for step in bar:
        clock.t += 2.0  # 2 s per step: a line every 5 steps
        bar.set_postfix(reward="0.400", refresh=False)
    text = out.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert [int(ln.split("step ")[1].split("/")[0]) for ln in lines] == [10, 15, 20, 25, 30, 35, 40]  # every 10 s
    assert lines[-1].startswith("arm-task-s0: step 40/40 (100%) · 2.00 s/step")
    assert "ETA" not in lines[-1]
    first = lines[0]
    assert first.startswith("arm-task-s0: step 10/40 (25%) · 2.00 s/step · ETA 1m00s")
    assert first.endswith("reward=0.400")


def test_progress_is_tqdm_only_on_a_terminal():
    assert isinstance(progress(range(3), "x", stream=io.StringIO()), LogProgress)


def test_result_line_gives_the_numbers(tmp_path):
    from bench.launch.cli import result_line
    from bench.run.runlog import RunLog
    from bench.run.store import RunDir

    run = RunDir(tmp_path / "run")
    run.start("seed: 0\n", "tis@int8-arithmetic-tiny-s0")
    log = RunLog(run)  # no W&B mirror
    for step, kl in enumerate([1e-4, 3e-4]):
        log.log({"step": step, "mismatch/kl_k3": kl})
    log.log_eval({"step": 0, "eval/accuracy": 0.25})
    log.log_eval({"step": 2, "eval/accuracy": 0.415})
    run.finish("completed", **{"final/eval_accuracy": 0.415, "final/wall_s": 92.4})
    line = result_line(run, "completed")
    assert line == (f"completed · eval accuracy 41.5 % (step 2) · KL(mu||pi_old) 2.00e-04 · 2 steps · 1m32s -> "
                    f"{run.path}")
