"""The SLURM launcher's GPU/CPU request coherence (bench.launch.requests.check_gpu_request); the sbatch text itself is
checked against the real cluster in tests/integration/test_slurm.py."""

import pytest

from bench.launch.requests import check_gpu_request


def test_one_gpu_per_job_is_the_coherent_request():
    assert check_gpu_request({"gpus_per_node": 1, "cpus_per_task": 8}) == []
    assert check_gpu_request({"gpus_per_node": None, "cpus_per_task": 1}) == []  # a CPU sweep


def test_contradictory_requests_fail_naming_the_keys():
    with pytest.raises(ValueError, match=r"GPUs requested twice \(gpus_per_node=1, gpus_per_task=None, gres='gpu:1'\)"):
        check_gpu_request({"gpus_per_node": 1, "gres": "gpu:1"})
    with pytest.raises(ValueError, match=r"cpus_per_gpu=4 needs gpus_per_task"):
        check_gpu_request({"gpus_per_node": 1, "cpus_per_gpu": 4})
    assert check_gpu_request({"gpus_per_task": 1, "cpus_per_gpu": 4}) == []
    assert check_gpu_request({"gres": "gpu:a100:1"}) == []  # gres alone is a valid way to ask


def test_gpus_per_node_are_checked_against_the_ranks_a_job_runs():
    """Issue 33 N10: a job runs `train.nproc_per_node` ranks (or `tasks_per_node` SLURM tasks) per node, one GPU
    each: the 8-GPU recipes' own command (gpus_per_node=8, nproc_per_node=8) is coherent; GPUs beyond the ranks
    idle (a warning naming both fixes); fewer GPUs than ranks cannot start (an error)."""
    assert check_gpu_request({"gpus_per_node": 4}) == []  # the ranks are not known at construction
    assert check_gpu_request({"gpus_per_node": 8, "cpus_per_task": 32}, ranks_per_node=8) == []
    assert check_gpu_request({"gpus_per_task": 1, "tasks_per_node": 8, "cpus_per_task": 4}, ranks_per_node=8) == []
    assert check_gpu_request({"gpus_per_task": 1, "tasks_per_node": 8, "cpus_per_gpu": 4}, ranks_per_node=8) == []
    [warning] = check_gpu_request({"gpus_per_node": 4}, ranks_per_node=1)
    assert "4 GPUs per node" in warning and "3 idle" in warning and "train.nproc_per_node=4" in warning
    with pytest.raises(ValueError, match=r"1 GPU\(s\) per node, but a job runs 8 ranks per node.*gpus_per_node=8"):
        check_gpu_request({"gpus_per_node": 1}, ranks_per_node=8)


def test_a_job_of_several_ranks_gets_a_core_per_rank_at_least():
    """SLURM confines a task and every process it spawns to the task's cores: the default cpus_per_task=1 put the 8
    ranks of a recipe's one task (train.nproc_per_node=8) on one core, each driving a GPU and scoring rollouts."""
    [warning] = check_gpu_request({"gpus_per_node": 8, "cpus_per_task": 1}, ranks_per_node=8)
    assert "1 CPU core(s) per node for its 8 ranks" in warning and "cpus_per_task=8 at least" in warning
    assert check_gpu_request({"gpus_per_node": 8, "cpus_per_task": 64}, ranks_per_node=8) == []


def test_ranks_per_node_are_the_tasks_or_the_processes_a_task_spawns():
    from omegaconf import OmegaConf

    from bench.launch.requests import ranks_per_node

    jobs = [OmegaConf.create({"train": {"nproc_per_node": n}}) for n in (1, 8)]
    assert ranks_per_node({"tasks_per_node": 1}, jobs) == 8
    assert ranks_per_node({"tasks_per_node": 4}, jobs) == 4  # each task is one rank (nproc_per_node is ignored)
    assert ranks_per_node({}, []) == 1
    # two nodes of one task each: two tasks, each one rank (SLURM_NTASKS=2), so nproc_per_node is ignored too: the
    # 8 GPUs of each node asked for would idle but one, which the check now says
    params = {"nodes": 2, "tasks_per_node": 1, "gpus_per_node": 8}
    assert ranks_per_node(params, jobs) == 1
    [warning] = check_gpu_request(params, ranks_per_node(params, jobs))
    assert "7 idle" in warning and "hydra.launcher.tasks_per_node=8 (a task per GPU)" in warning


def test_local_workers_get_gpu_blocks_of_nproc_per_node():
    """Issue 33 N7: the local launcher gives worker i the i-th block of `train.nproc_per_node` visible GPUs (a run's
    rank r takes GPU r of its block) and runs no more workers than whole blocks; without a GPU nothing changes.
    A pure function of the visible devices: tested with faked device lists, as an 8-GPU node would show them."""
    from bench.launch.requests import gpu_blocks

    eight = [str(i) for i in range(8)]
    assert gpu_blocks(eight, 1, 7) == ["0", "1", "2", "3", "4", "5", "6"]  # qurl_table1: 7 jobs, one GPU each
    assert gpu_blocks(eight, 1, 16) == eight  # capped at the GPUs
    assert gpu_blocks(eight, 8, 9) == ["0,1,2,3,4,5,6,7"]  # qurl_table2: one run of 8 ranks at a time
    assert gpu_blocks(eight, 4, 5) == ["0,1,2,3", "4,5,6,7"]  # p3o_fp8: two runs of 4 ranks side by side
    assert gpu_blocks(eight, 3, 5) == ["0,1,2", "3,4,5"]  # GPUs 6 and 7 would make no whole block
    assert gpu_blocks(["GPU-a", "GPU-b"], 1, 3) == ["GPU-a", "GPU-b"]  # CUDA_VISIBLE_DEVICES as the scheduler set it
    assert gpu_blocks([], 8, 3) is None  # no GPU: the workers inherit the environment
    with pytest.raises(ValueError, match=r"train.nproc_per_node=8 needs 8 GPUs, one per rank; 2 visible"):
        gpu_blocks(["0", "1"], 8, 1)


def test_visible_gpus_follow_cuda_visible_devices(monkeypatch):
    from bench.launch.requests import visible_gpus

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert visible_gpus() == ["2", "3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible_gpus() == []


def test_each_worker_process_starts_with_its_gpu_block():
    """The block is in the worker's environment from its start (before anything in it can initialize CUDA), and
    the launching process's own environment is left as it was."""
    import os
    from pathlib import Path

    from bench.launch.sweep_pool import WorkerPool
    from tests.hang import wait_until

    def environ(pid: int) -> dict[str, str]:
        """The environment the process was started with, once it runs its own program (before, /proc shows the
        forking parent's)."""
        cmdline = Path(f"/proc/{pid}/cmdline")
        wait_until("the worker to run its own program", lambda: b"spawn_main" in cmdline.read_bytes(), every=0.01)
        text = Path(f"/proc/{pid}/environ").read_text()
        return dict(item.split("=", 1) for item in text.split("\0") if "=" in item)

    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    pool = WorkerPool(2, ["0,1", "2,3"])
    try:
        envs = [environ(w.process.pid) for w in pool.workers]
        assert [e.get("CUDA_VISIBLE_DEVICES") for e in envs] == ["0,1", "2,3"]
        assert [w.gpus for w in pool.workers] == ["0,1", "2,3"]
        assert os.environ.get("CUDA_VISIBLE_DEVICES") == before
    finally:
        for w in pool.workers:
            w.process.kill()
        pool.close()


def composed(*overrides: str):
    from hydra import compose, initialize_config_dir

    from bench.launch.config import CONF_DIR, register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def test_a_sweep_that_wants_gpus_but_asks_slurm_for_none_is_warned():
    """A recipe launched on SLURM without a GPU request found no GPU (`train.device=auto`) and ran on the node's
    CPUs, silently: a 7B job's first step hours away. The launcher now warns, naming the request to add; a CPU sweep
    (the quickstart, a recipe's CPU mini, `train.device=cpu`) and a request in any of SLURM's spellings stay quiet."""
    from bench.launch.requests import asks_for_gpus, check_gpus_asked

    recipe = composed("+experiment=paper/qurl_table2", "method=tis", "rollout.precision=int8")
    [warning] = check_gpus_asked({"gpus_per_node": None}, [recipe, composed()])
    assert "1 job(s) of this sweep want 8" in warning and "hydra.launcher.gpus_per_node=8" in warning
    [warning] = check_gpus_asked({}, [composed("+experiment=paper/qurl_table1")])  # one rank, a 0.5B model
    assert "want 1" in warning and "gpus_per_node=1" in warning
    [warning] = check_gpus_asked({}, [composed("train.device=cuda")])  # the tiny default model, on a GPU by choice
    assert "gpus_per_node=1" in warning
    quiet = [composed(), composed("+experiment=paper/qurl_table2_mini"),
             composed("+experiment=paper/qurl_table2", "method=tis", "rollout.precision=int8", "train.device=cpu")]
    assert check_gpus_asked({}, quiet) == []
    for asked in ({"gpus_per_node": 8}, {"gpus_per_task": 1}, {"gres": "gpu:a100:8"},
                  {"additional_parameters": {"gpus": 8}}, {"additional_parameters": {"gres": "gpu:8"}}):
        assert asks_for_gpus(asked) and check_gpus_asked(asked, [recipe]) == []
    assert asks_for_gpus({"additional_parameters": {"gpus-per-node": 8}})
    for not_gpus in ({"gres": "nvme:1", "additional_parameters": {"qos": "normal"}},
                     {"additional_parameters": {"mem_per_gpu": "80G", "cpus_per_gpu": 8, "gpu_bind": "closest"}}):
        assert not asks_for_gpus(not_gpus) and check_gpus_asked(not_gpus, [recipe])
    # one task per GPU (tasks_per_node, train.nproc_per_node unused): the node's 8 ranks are its tasks
    [warning] = check_gpus_asked({"tasks_per_node": 8}, [composed("model=qwen2.5-1.5b-instruct")])
    assert "want 8" in warning and "gpus_per_node=8" in warning


def test_a_sweep_of_large_models_states_its_host_memory():
    """Every rank builds the whole model on the host before sharding it: 8 ranks x 30 GB for a 7B recipe at start,
    which a partition's default memory per job does not hold (the job dies at start-up, after its queue wait)."""
    from bench.launch.requests import check_host_memory

    recipe = composed("+experiment=paper/qurl_table2", "method=tis", "rollout.precision=int8")
    [warning] = check_host_memory({"mem_gb": None}, [recipe, composed()])
    assert "~244 GB at start" in warning and "hydra.launcher.mem_gb=320" in warning  # 8 x 4 B x 7.62e9
    for stated in ({"mem_gb": 400}, {"mem_per_gpu": "40G"}, {"additional_parameters": {"mem": "400G"}}):
        assert check_host_memory(stated, [recipe]) == []
    assert check_host_memory({}, [composed(), composed("+experiment=paper/qurl_table2_mini")]) == []  # tiny models
    # one task per GPU: the node's 8 tasks each build the model (train.nproc_per_node is 1 there)
    [warning] = check_host_memory({"tasks_per_node": 8, "nodes": 2},
                                  [composed("+experiment=paper/qurl_table2", "method=tis", "rollout.precision=int8",
                                            "train.nproc_per_node=1")])
    assert "~244 GB at start" in warning


@pytest.mark.parametrize("name", ["qurl_table1", "flashrl_gsm8k", "qurl_table2", "qurl_table3", "qurl_table4",
                                  "ais_table3", "p3o_fp8"])
def test_every_paper_recipes_slurm_command_is_a_coherent_request(name):
    """The SLURM command at the top of each paper recipe (conf/experiment/paper/<name>.yaml) asks for what its jobs
    need, every launcher check quiet: GPUs one per rank, a core per rank, host memory for the ranks' models. The
    commands of qurl_table1 and flashrl_gsm8k asked for no GPU: their jobs would have trained on the CPUs."""
    import re

    from bench.launch.config import CONF_DIR
    from bench.launch.dryrun import expand
    from bench.launch.requests import check_gpus_asked, check_host_memory, ranks_per_node

    text = (CONF_DIR / "experiment" / "paper" / f"{name}.yaml").read_text()
    [command] = [line for line in text.splitlines() if "hydra/launcher=slurm" in line]
    params = {k: int(v) for k, v in re.findall(r"hydra\.launcher\.(\w+)=(\d+)", command)}
    configs = [composed(*job) for job in expand([f"+experiment=paper/{name}"])[:3]]
    ranks = ranks_per_node(params, configs)
    assert params["gpus_per_node"] == ranks == configs[0].budget.gpus
    warnings = check_gpu_request(params, ranks) + check_gpus_asked(params, configs) + check_host_memory(params, configs)
    assert warnings == []


def test_a_time_limit_signal_the_launcher_could_not_use_is_refused_before_submission():
    """SLURM sends the time-limit signal signal_delay_s before timeout_min: one at or before the start never lets a
    run checkpoint, and one before submitit's last max(20 %, 10 min) of the limit is taken for a preemption (requeued
    without bound, each allocation training about one step). The launcher refuses both; the dry run and the quick
    check too, in one line with exit 2 (tests/unit/test_cli_front.py)."""
    from bench.launch.requests import check_signal_delay

    check_signal_delay({"signal_delay_s": 120, "timeout_min": 60})  # the defaults
    check_signal_delay({"signal_delay_s": 60, "timeout_min": 2})  # a short job: the 10-minute floor
    check_signal_delay({"signal_delay_s": 720, "timeout_min": 60})  # the last 20 % of an hour
    with pytest.raises(ValueError, match="signal_delay_s=721 comes before submitit counts .*timeout_min>=61 or "
                                         "signal_delay_s<=720"):
        check_signal_delay({"signal_delay_s": 721, "timeout_min": 60})
    with pytest.raises(ValueError, match="signal_delay_s=100 is not less than the time limit .*timeout_min>=9 or "
                                         "signal_delay_s<=30"):
        check_signal_delay({"signal_delay_s": 100, "timeout_min": 1})
