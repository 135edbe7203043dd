"""The SLURM launcher's GPU/CPU request coherence (bench.launch.launchers.check_gpu_request); the sbatch text itself is
checked against the real cluster in tests/integration/test_slurm.py."""

import pytest

from bench.launch.launchers import check_gpu_request


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


def test_more_than_one_gpu_per_job_warns_that_they_idle():
    [warning] = check_gpu_request({"gpus_per_node": 4})
    assert "4 GPUs per job" in warning and "one job per GPU" in warning
