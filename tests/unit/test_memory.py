"""The dry run's peak-memory estimate (bench/launch/memory.py): shapes against the model cards, terms by hand, and every
paper recipe within its GPUs (issue H2: null micro-batches and no checkpointing ran out of memory in step 0)."""

from __future__ import annotations

import math

import pytest
import transformers as tr
from hydra import compose, initialize_config_dir

from bench.launch.config import CONF_DIR
from bench.launch.dryrun import dry_run
from bench.launch.memory import GB, SAMPLER_BYTES, SHAPES, Shape, engine_bytes, estimate_memory, model_shape
from bench.models.logprobs import HEAD_CHUNK_TOKENS
from bench.rollout.embedded import CDF_ROWS

RECIPES = ("qurl_table1", "qurl_table2", "qurl_table3", "qurl_table4", "ais_table3", "flashrl_gsm8k", "p3o_fp8")


def recipe(name: str, *overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=[f"+experiment=paper/{name}", *overrides])


@pytest.mark.parametrize("path, billions", [
    ("Qwen/Qwen2.5-0.5B-Instruct", 0.494), ("Qwen/Qwen2.5-1.5B-Instruct", 1.544), ("Qwen/Qwen2.5-Math-7B", 7.62),
    ("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", 1.78), ("Qwen/Qwen3-8B", 8.19)])
def test_shapes_give_the_model_cards_parameter_counts(path, billions):
    assert Shape(*SHAPES[path]).params / 1e9 == pytest.approx(billions, rel=0.01)


def test_built_in_model_shape_counts_its_parameters():
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config")
    shape = model_shape(cfg.model)
    m = cfg.model
    model = tr.Qwen2ForCausalLM(tr.Qwen2Config(vocab_size=m.vocab_size, hidden_size=m.hidden_size,
                                               num_hidden_layers=m.num_layers, num_attention_heads=m.num_heads,
                                               num_key_value_heads=m.num_kv_heads, intermediate_size=m.intermediate_size,
                                               tie_word_embeddings=True))
    weights = sum(p.numel() for n, p in model.named_parameters() if "norm" not in n and "bias" not in n)
    assert shape.params == weights


def test_qurl_table1_terms_by_hand():
    est = estimate_memory(recipe("qurl_table1"))
    s = Shape(*SHAPES["Qwen/Qwen2.5-0.5B-Instruct"])
    assert est.parts["trainer states"] == pytest.approx(16 * s.params / GB)
    assert est.parts["critic"] == pytest.approx(18 * (s.linear + s.embed) / GB)  # PPO's critic: backbone + AdamW + autocast
    engine = 2 * s.linear + 4 * s.embed  # the bf16 row's copy, built at each sync, dropped after the rollouts
    assert "rollout engine" not in est.parts
    seq = 105 + 512
    tokens = 4096 // seq * seq  # micro-batches of 8 sequences, at most train.micro_batch_tokens=4096 tokens: 6
    assert est.phases["training"] == pytest.approx(
        (tokens * (24 * (26 * 896 + 8 * 4864) + 2 * 896 * 16) + HEAD_CHUNK_TOKENS * 20 * s.vocab) / GB)
    assert est.phases["recompute"] == pytest.approx((4096 * 2 * 896 * 16 + HEAD_CHUNK_TOKENS * 14 * s.vocab) / GB)
    sampler = 256 * s.vocab * SAMPLER_BYTES + CDF_ROWS * s.vocab * 8
    # a layer's activations; the P x P mask, repeated for the 7 query heads of a KV head, and its additive copy
    prefill = 256 * 105 * (4 * 896 + 3 * 4864) * 2 + 256 * 105**2 * (1 + 7 * (1 + 2))
    assert prefill > sampler  # 256 prompts' forward (0.98 GB) outweighs the sampler's transient (0.70 GB) here
    assert est.phases["generation"] == pytest.approx((engine + 256 * seq * 2 * 24 * 2 * 64 * 2 + prefill) / GB)
    assert not est.sharded and est.fits and est.gpus == est.booked == 1


@pytest.mark.parametrize("name", RECIPES)
def test_every_paper_recipe_fits_its_gpus(name):
    from bench.launch.dryrun import expand

    jobs = [set(job) for job in expand([f"+experiment=paper/{name}"])]
    # the rollout settings every row of the recipe makes (p3o_fp8: vLLM's memory share, a row-level setting)
    shared = sorted(o for o in set.intersection(*jobs) if o.startswith("rollout."))
    cfg = recipe(name, *shared)
    est = estimate_memory(cfg)
    assert est is not None and est.fits, est.line()
    assert est.sharded == (cfg.budget.gpus > 1) and est.idle == 0  # it uses every GPU it books (N3)
    assert cfg.train.micro_batch_size is not None and cfg.train.micro_batch_tokens is not None


@pytest.mark.parametrize("name, ranks, row", [("qurl_table2", 8, "task=dapo_math"), ("ais_table3", 8, "task=gsm8k")])
def test_7b_8b_recipes_per_gpu_estimate_divides_the_states_by_the_fsdp_shards(name, ranks, row):
    """Item 5 of the scale-out issue: one run on the recipe's GPUs, one rank each; the sharded states (trainer,
    snapshot) are 1/ranks of one process's, the engine is whole on every rank, and the weight sync gathers one
    FSDP unit (vLLM's one tensor) at a time. On one process the run does not fit an 80 GB GPU; sharded it does."""
    cfg = recipe(name, "method=bf16", row)
    alone = estimate_memory(recipe(name, "method=bf16", row, "train.nproc_per_node=1", "budget.gpus=1"))
    est = estimate_memory(cfg)
    P = model_shape(cfg.model).params
    assert cfg.train.nproc_per_node == cfg.budget.gpus == ranks and est.gpus == est.booked == ranks
    assert est.parts["trainer states"] == pytest.approx(16 * P / ranks / GB)
    for part in ("trainer states", "update snapshot", "autocast copies"):
        assert est.parts[part] * ranks == pytest.approx(alone.parts[part])
    assert est.phases["generation"] == alone.phases["generation"]  # the engine's copy and its cache, whole
    # a sync gathers one FSDP unit at a time (the root's embedding + lm_head, or a layer) while the engine's copy
    # is built, not the whole model
    shape = model_shape(cfg.model)
    engine = engine_bytes(shape, "bf16", 2)
    assert est.phases["weight sync"] == pytest.approx((4 * shape.unit + engine) / GB)
    assert "weight sync" not in alone.phases and 4 * P > 6 * 4 * shape.unit
    assert "rollout engine" not in est.parts  # dropped after the rollouts: not resident through the training step
    assert not alone.fits and est.fits and alone.peak - est.peak > 30
    assert f"FSDP2 over {ranks} ranks" in est.line()
    int8 = estimate_memory(recipe(name, "method=tis", row))
    assert int8.fits and not int8.tight


def test_a_sharded_run_gathers_one_unit_or_one_tensor_at_a_time():
    """qurl_table2's FP8 rows: vLLM's sync gathers one tensor at a time (the embedding is the largest), the fp32
    evaluation engine is built one FSDP unit at a time beside its own copy (bench/distributed/engines.py)."""
    cfg = recipe("qurl_table2", "method=naive", "rollout=vllm", "rollout.precision=fp8_e4m3", "eval.engine=embedded",
                 "rollout.gpu_memory_utilization=0.25")
    shape, est = model_shape(cfg.model), estimate_memory(cfg)
    assert shape.tensor == shape.embed and est.phases["weight sync"] == pytest.approx(4 * shape.tensor / GB)
    engine = 4 * (shape.linear + 2 * shape.embed) / GB  # the evaluation's fp32 copy
    assert engine + 4 * shape.unit / GB <= est.phases["evaluation"] < 2 * engine  # never a second, gathered copy
    assert est.fits


def test_a_vllm_evaluation_counts_its_engine_where_it_has_one_of_its_own():
    """eval.engine=vllm: beside an embedded rollout engine the evaluation builds a vLLM engine at vLLM's default share
    of the GPU (not the fp32 embedded engine's copy); a vLLM rollout engine evaluates in itself or in one built at
    its share after it closed: nothing beside it."""
    from bench.rollout.vllm_engine import GPU_MEMORY_UTILIZATION

    own = estimate_memory(recipe("qurl_table1", "eval.engine=vllm"))
    assert own.phases["evaluation"] == pytest.approx(GPU_MEMORY_UTILIZATION * own.device_gb)
    for precision in ("bf16", "fp8_e4m3"):
        shared = estimate_memory(recipe("qurl_table1", "rollout=vllm", f"rollout.precision={precision}",
                                        "eval.engine=vllm"))
        assert shared.phases["evaluation"] == 0.0 and "vllm engine" in shared.parts


def test_dry_run_names_the_tight_jobs_and_the_ranks(capsys, tmp_path):
    """qurl_table2's FP8 rows: vLLM's fixed 20 GB beside the fp32 evaluation engine of 7B, within 10 % of 80 GB."""
    assert dry_run(["+experiment=paper/qurl_table2", f"out_root={tmp_path}"]) == 0
    out, err = capsys.readouterr()
    assert out.count("FSDP2 over 8 ranks") == 9 and out.count("TIGHT") == 4 and "EXCEEDS" not in out
    assert "note: 4 job(s) within 10% of the GPU's memory" in err and "tis@fp8_e4m3-dapo_math-qwen2.5-math-7b-s0" in err
    assert out.count("GPUs 8 used / 8 booked") == 9 and "IDLE" not in out + err
    assert dry_run(["+experiment=paper/ais_table3", f"out_root={tmp_path}"]) == 0
    out, err = capsys.readouterr()
    assert out.count("FSDP2 over 8 ranks") == 12 and "TIGHT" not in out and "IDLE" not in out + err
    dry_run(["+experiment=paper/ais_table3", "train.nproc_per_node=1", f"out_root={tmp_path}"])
    out, err = capsys.readouterr()
    assert out.count("GPUs 1 used / 8 booked  IDLE GPUs") == 12
    assert err.count("WARNING: booked GPUs idle or missing:") == 12 and "uses 1 of the 8 GPUs it books" in err


def test_null_micro_batch_does_not_fit_and_the_dry_run_warns(capsys, tmp_path):
    uncapped = ["train.micro_batch_size=null", "train.micro_batch_tokens=null"]  # the whole minibatch per forward
    cfg = recipe("qurl_table1", *uncapped)
    assert not estimate_memory(cfg).fits  # the recipe as it was: ~240 GB of activations in step 0's update
    assert estimate_memory(recipe("qurl_table1", uncapped[0])).fits  # the token cap alone bounds the training pass
    assert dry_run(["+experiment=paper/qurl_table1", *uncapped, f"out_root={tmp_path}"]) == 0
    out, err = capsys.readouterr()
    assert out.count("EXCEEDS 80 GB") == 7 and "mem ~" in out
    assert "WARNING: memory estimate exceeds the GPU" in err
    dry_run(["+experiment=paper/qurl_table1", f"out_root={tmp_path}"])
    out, err = capsys.readouterr()
    assert out.count("GB/GPU") == 7 and "EXCEEDS" not in out and "WARNING: memory" not in err  # (1 seed: power warns)


def test_cpu_configs_have_no_gpu_estimate_in_the_dry_run(capsys, tmp_path):
    dry_run(["+experiment=smoke", f"out_root={tmp_path}"])
    assert "GB/GPU" not in capsys.readouterr().out


LONG_STEP = "take longer for an evaluation and a training step"
LONG_RUN = "need more wall time"


def test_dry_run_warns_where_a_step_outlasts_the_slurm_signal_delay(capsys, tmp_path):
    """SLURM sends the preemption signal hydra.launcher.signal_delay_s (120 s) before a time limit, and the run
    checkpoints at the end of its step (after the step's evaluation, where one is due): a 7B recipe's step of many
    minutes cannot make it, so the job ends TIMEOUT, not requeued. The dry run says so with the value that would (twice
    an evaluation and a step), and not once it is set."""
    dry_run(["+experiment=paper/qurl_table2", f"out_root={tmp_path}"])
    err = capsys.readouterr().err
    [line] = [x for x in err.splitlines() if LONG_STEP in x]
    assert line.startswith("WARNING: 9 job(s)") and "signal_delay_s=120:" in line
    suggested = int(line.split("hydra.launcher.signal_delay_s=")[1].split()[0])
    assert 600 < suggested <= 65535  # minutes-long steps; SLURM's --signal takes at most 65535 s
    # ... and the time limit submitit needs to take that signal for the time limit's (the last 20 % of it): with the
    # default 60 min, such a signal would requeue the job as a preemption, without bound (the launcher refuses it)
    limit = int(line.split("hydra.launcher.timeout_min>=")[1].split()[0])
    assert limit == math.ceil(5 * suggested / 60)
    from bench.launch.requests import check_signal_delay

    with pytest.raises(ValueError, match=f"timeout_min>={limit} or signal_delay_s<=720"):  # 9300 s > the hour
        check_signal_delay({"signal_delay_s": suggested, "timeout_min": 60})
    check_signal_delay({"signal_delay_s": suggested, "timeout_min": limit})
    # the run's ~259 h do not fit 1 + 3 requeues of that limit: the dry run says how many it needs at the limit above
    [line] = [x for x in err.splitlines() if LONG_RUN in x]
    assert line.startswith("WARNING: 9 job(s)") and "1 + max_num_timeout=3 requeues of timeout_min=60" in line
    assert f"(with timeout_min={limit} and signal_delay_s={suggested} as above)" in line
    requeues = int(line.split("hydra.launcher.max_num_timeout>=")[1].split()[0])
    assert 3 < requeues < 100
    ok = ["+experiment=paper/qurl_table2", "hydra/launcher=slurm", f"hydra.launcher.signal_delay_s={suggested}",
          f"hydra.launcher.timeout_min={limit}", f"out_root={tmp_path}"]
    dry_run([*ok, f"hydra.launcher.max_num_timeout={requeues - 1}"])
    err = capsys.readouterr().err
    assert LONG_STEP not in err and LONG_RUN in err  # one allocation short
    dry_run([*ok, f"hydra.launcher.max_num_timeout={requeues}"])
    err = capsys.readouterr().err
    assert LONG_STEP not in err and LONG_RUN not in err


def test_the_evaluations_are_priced_on_the_engine_that_runs_them():
    """p3o_fp8 rolls out on vLLM but evaluates its 16k-token pass@k on the embedded engine (eval.engine=embedded):
    the GPU-hours priced every evaluation at vLLM's rate (~2.3 GPU-h a job, the evaluations alone ~58 h on the
    embedded engine by the dry run's own column). Through vLLM the same job costs less by the evaluations' share."""
    from bench.launch.budget import estimate

    embedded, vllm = (estimate(recipe("p3o_fp8", "method=ess", f"eval.engine={e}"), False) for e in ("embedded", "vllm"))
    assert embedded.eval_slowdown > 5 and vllm.eval_slowdown == 1
    assert embedded.gpu_hours > 2 * vllm.gpu_hours
    assert embedded.step_s == vllm.step_s and embedded.eval_s == pytest.approx(vllm.eval_s * embedded.eval_slowdown)
    assert "evaluations on embedded" in embedded.line("fp8_e4m3") and "evaluations on" not in vllm.line("fp8_e4m3")


def test_the_dry_run_shows_what_the_slurm_launcher_warns_about(capsys, tmp_path):
    """The dry run ignored hydra.launcher.gpus_per_node: qurl_table1's one-GPU jobs on an 8-GPU request printed
    'GPUs 1 used / 1 booked' while the launcher would warn of 7 idle GPUs; and a request for fewer GPUs than a job's
    ranks passed the dry run (exit 0) that the launcher refuses (tests/unit/test_cli_front.py)."""
    dry_run(["+experiment=paper/qurl_table1", "hydra/launcher=slurm", "hydra.launcher.gpus_per_node=8",
             "hydra.launcher.cpus_per_task=16", "hydra.launcher.mem_gb=200", f"out_root={tmp_path}"])
    err = capsys.readouterr().err
    assert "WARNING: hydra.launcher asks for 8 GPUs per node, but a job runs 1 rank(s) per node, one GPU each: 7 idle" \
        in err
    dry_run(["+experiment=paper/qurl_table1", "hydra/launcher=slurm", "hydra.launcher.gpus_per_node=1",
             "hydra.launcher.cpus_per_task=16", "hydra.launcher.mem_gb=200", f"out_root={tmp_path}"])
    assert "hydra.launcher asks" not in capsys.readouterr().err


def test_the_scaling_docs_table_states_the_dry_runs_peaks():
    """docs/scaling.md's table of the multi-GPU recipes states what the dry run estimates for their jobs: each row's
    peaks per GPU (a value or a range per engine), the GPUs used and booked, and the one-process peaks (that column
    had gone stale: ~104 GB for 7B where the estimate gave ~200)."""
    import re

    from bench.launch.dryrun import expand

    text = (CONF_DIR.parent / "docs" / "scaling.md").read_text()
    rows = re.findall(r"^\| (\w+) \([^)]*\) \| ([^|]*) \| (\d+) / (\d+) \| ~([\d-]+) GB \| \w+ \|$", text, re.M)
    assert sorted(r[0] for r in rows) == ["ais_table3", "p3o_fp8", "qurl_table2", "qurl_table3", "qurl_table4"]

    def stated(cell: str) -> list[tuple[int, int]]:
        return [(int(lo), int(hi or lo)) for lo, hi in re.findall(r"(\d+)(?:-(\d+))? GB", cell)]

    def agree(spans: list[tuple[int, int]], peaks: set[int]) -> bool:
        ends = {n for span in spans for n in span}
        return ends <= peaks and all(any(lo <= p <= hi for lo, hi in spans) for p in peaks)

    for name, cell, used, booked, alone in rows:
        jobs = expand([f"+experiment=paper/{name}"])
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            ests = [estimate_memory(compose("config", overrides=job)) for job in jobs]
            ones = [estimate_memory(compose("config", overrides=[*job, "train.nproc_per_node=1", "budget.gpus=1"]))
                    for job in jobs]
        peaks, alone_peaks = {round(e.peak) for e in ests}, {round(e.peak) for e in ones}
        assert agree(stated(cell), peaks), (name, sorted(peaks))
        assert {(e.gpus, e.booked) for e in ests} == {(int(used), int(booked))}
        assert agree(stated(f"{alone} GB"), alone_peaks), (name, sorted(alone_peaks))
