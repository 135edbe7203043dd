"""The dry run's GPU-hours estimate (bench/launch/budget.py) on hand-computed cases, and the row sweeper's expansion."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from bench.launch.budget import BudgetConfig, embedded_rollout_s, estimate, throughputs
from bench.launch.memory import model_shape
from bench.algo_config import AlgoConfig
from bench.launch.sweeper import expand_rows
from bench.train_config import TrainConfig
from bench.domains import check_schema


def cfg(budget: dict, algo: dict | None = None, train: dict | None = None):
    return OmegaConf.create({"budget": OmegaConf.structured(BudgetConfig(**budget)),
                             "algo": OmegaConf.structured(AlgoConfig(**(algo or {}))),
                             "train": OmegaConf.structured(TrainConfig(**(train or {})))})


def test_no_throughput_and_no_model_size_means_no_estimate():
    assert estimate(cfg({}), needs_recompute=True) is None


def test_stated_throughputs_ppo_step_by_hand():
    """QuRL Table 1's numbers: 256 x 1 sequences, L_p 105, L_r 300, PPO (critic), recompute arm, 435 steps.

    generated 256 * 300 = 76,800 -> / 2,851 = 26.938 s
    trained   256 * 405 * 2 (actor + critic) = 207,360 -> / 4,335 = 47.834 s
    forward   256 * 405 * 2 (recompute + values) = 207,360 -> / 15,184 = 13.657 s   => 88.429 s per step
    evals     ceil(435 / 29) + 1 = 16, each 395,700 / 2,851 = 138.79 s             => 2,220.7 s
    total     (435 * 88.429 + 2,220.7) / 3600 = 11.302 GPU-hours
    """
    c = cfg({"params_b": 0.494, "prompt_tokens": 105, "response_tokens": 300, "eval_tokens": 395700,
             "gen_tokens_per_s": 2851, "train_tokens_per_s": 4335, "forward_tokens_per_s": 15184},
            {"advantage": "gae"}, {"steps": 435, "batch_size": 256, "group_size": 1, "eval_every": 29})
    e = estimate(c, needs_recompute=True)
    assert (e.generated_per_step, e.trained_per_step, e.forward_per_step, e.evals) == (76800, 207360, 207360, 16)
    assert e.gpu_hours == pytest.approx(11.302, abs=1e-3)
    assert e.wall_hours == e.gpu_hours


def test_flops_model_grpo_with_dynamic_sampling_by_hand():
    """7.62B at 989 TFLOP/s: generation 0.1 * 989e12 / (2 * 7.62e9) = 6,489.5 tokens/s; training
    0.3 * 989e12 / (6 * 7.62e9) = 6,489.5; forward 19,468.5. 8,192 sequences, L 200 + 1,500, keep rate 0.6:
    generated 8,192 * 1,500 / 0.6 = 20,480,000 (3,155.9 s); trained 13,926,400 (2,146.0 s); forward (recompute
    only, no KL, no critic) 13,926,400 (715.3 s) => 6,017.2 s per step; 200 steps = 334.29 GPU-h, no evaluation;
    8 GPUs => 41.79 h wall-clock."""
    c = cfg({"params_b": 7.62, "prompt_tokens": 200, "response_tokens": 1500, "keep_rate": 0.6, "gpus": 8},
            {"dynamic_sampling": True}, {"steps": 200, "batch_size": 8192, "group_size": 16})
    gen, trained, fwd = throughputs(c.budget)
    assert gen == pytest.approx(6489.5, abs=0.1) and trained == pytest.approx(6489.5, abs=0.1)
    assert fwd == pytest.approx(19468.5, abs=0.1)
    e = estimate(c, needs_recompute=True)
    assert e.generated_per_step == pytest.approx(20_480_000)
    assert e.gpu_hours == pytest.approx(334.29, abs=0.01) and e.wall_hours == pytest.approx(41.79, abs=0.01)
    # without dynamic sampling the keep rate does not apply; a bypass arm has no recompute pass
    c.algo.dynamic_sampling = False
    e2 = estimate(c, needs_recompute=False)
    assert e2.generated_per_step == 8192 * 1500 and e2.forward_per_step == 0


def test_kl_reference_adds_a_forward_pass():
    c = cfg({"params_b": 1.0, "prompt_tokens": 10, "response_tokens": 10}, {"kl_ref_beta": 1e-3},
            {"batch_size": 16, "group_size": 8})
    assert estimate(c, needs_recompute=True).forward_per_step == 16 * 20 * 2


def embedded_cfg(precision: str = "bf16", **rollout):
    c = cfg({"params_b": 1.54, "prompt_tokens": 100, "response_tokens": 1000}, {},
            {"steps": 10, "batch_size": 256, "group_size": 8})
    c.rollout = OmegaConf.create({"engine": "embedded", "precision": precision, "chunk_tokens": 2**18, **rollout})
    c.task = OmegaConf.create({"max_new_tokens": 4096})
    c.model = OmegaConf.create({"path": "Qwen/Qwen2.5-1.5B-Instruct"})
    return c


def test_embedded_engine_rollout_by_hand():
    """Qwen2.5-1.5B (28 layers, bf16 engine weights 3,553,886,208 B, KV 28,672 B per token, vocabulary 151,936), 256
    sequences on one GPU, L_p 100, L_r 1,000, T 4,096, rollout.refill=false: chunks of 262,144 // 4,196 = 62 rows -> 5
    chunks of 4,096 steps,
    each step 3,553,886,208 / 3.35e12 + 28 x 45 x 1.2e-5 = 0.0161809 s -> 331.38 s; live rows' KV 256 x 1,000 x
    (100 + 500) x 28,672 / 3.35e12 = 1.3146 s; their sampling 256 x 1,000 x 151,936 x 1.9e-10 = 7.3902 s; prefill
    256 x 100 x 2 x 1,543,569,408 / (989e12 x 0.1) = 0.7991 s => 340.89 s. Without compaction every row runs 4,096
    steps: KV 256 x 4,096 x (100 + 2,048) x 28,672 / 3.35e12 = 19.276 s instead of 1.3146, and 256 x 3,096 more rows'
    sampling steps (22.880 s). FP8 adds 4 linears x 17 eager activation-quantization kernels per layer: 28 x 68 x
    1.2e-5 s per step."""
    c = embedded_cfg(refill=False)
    shape = model_shape(c.model)
    assert embedded_rollout_s(c, shape, 256) == pytest.approx(340.89, abs=0.01)
    no_compaction = embedded_cfg(compact=False, refill=False)
    assert embedded_rollout_s(no_compaction, shape, 256) - embedded_rollout_s(c, shape, 256) == pytest.approx(
        19.276 - 1.3146 + 22.880, abs=0.01)
    fp8 = embedded_cfg("fp8_e4m3", refill=False)  # and 1-byte linears: 1,310,195,712 B less to read per step
    extra = 5 * 4096 * (28 * 68 * 1.2e-5 - 1_310_195_712 / 3.35e12)
    assert embedded_rollout_s(fp8, shape, 256) - embedded_rollout_s(c, shape, 256) == pytest.approx(extra, abs=0.01)


def test_continuous_batching_by_hand():
    """rollout.refill (the default), the case above: 62 slots, 194 sequences queued behind the first 62. The slots stay
    busy until the queue is empty: 4,096 + 194 x 1,000 / 62 = 7,225.03 steps (against 5 x 4,096 = 20,480) of
    0.0161809 s -> 116.907 s; the first 62 sequences' KV as before, the queued ones' over the whole ring of 100 +
    4,096 columns: (62 x 1,000 x 600 + 194 x 1,000 x 4,196) x 28,672 / 3.35e12 = 7.2855 s; sampling and prefill as
    above (7.3902 + 0.7991 s) => 132.38 s, 0.39x the chunked engine's 340.89 s. A batch that fits one cache (62
    sequences or fewer) has nothing to refill: the same seconds either way."""
    c = embedded_cfg()
    shape = model_shape(c.model)
    assert embedded_rollout_s(c, shape, 256) == pytest.approx(132.38, abs=0.01)
    assert embedded_rollout_s(c, shape, 62) == embedded_rollout_s(embedded_cfg(refill=False), shape, 62)


def test_the_model_reproduces_the_gpu_record_it_was_calibrated_on_and_the_benchmark_it_was_checked_on():
    """bench/launch/budget.py's calibration, H200 2026-11-28 (n = 1 run each): the trainer's rollout in one
    qurl_table1 step (0.5B, 256 rows x 512 tokens, prompts 156) took 10.6 s in bf16 and 20.7 s in fp8_e4m3 (the fit);
    the rollout benchmark's long-tail rows (B = 256, prompt 128, mean 32, cap 256) took 256 x 32 tokens at 2,340 /
    1,059 tok/s eager and 2,150 / 2,075 compiled (the check). The model is within 0.95-1.25x of each, never
    optimistic by more than 5 %."""
    shape = model_shape(OmegaConf.create({"path": "Qwen/Qwen2.5-0.5B-Instruct"}))

    def seconds(precision: str, L_p: int, L_r: int, T: int, compile: bool = False) -> float:
        c = cfg({"prompt_tokens": L_p, "response_tokens": L_r}, {}, {"batch_size": 256, "group_size": 1})
        c.rollout = OmegaConf.create({"engine": "embedded", "precision": precision, "chunk_tokens": 2**18,
                                      "compile": compile})
        c.task = OmegaConf.create({"max_new_tokens": T})
        return embedded_rollout_s(c, shape, 256)

    measured = {("bf16", 156, 512, 512, False): 10.6, ("fp8_e4m3", 156, 512, 512, False): 20.7,
                ("bf16", 128, 32, 256, False): 8192 / 2340, ("fp8_e4m3", 128, 32, 256, False): 8192 / 1059,
                ("bf16", 128, 32, 256, True): 8192 / 2150, ("fp8_e4m3", 128, 32, 256, True): 8192 / 2075}
    for key, s in measured.items():
        assert 0.95 <= seconds(*key) / s <= 1.25, (key, seconds(*key), s)


def test_embedded_jobs_are_priced_by_their_engine_and_name_the_override():
    e = estimate(embedded_cfg(), needs_recompute=True)
    vllm = 256 * 1000 / throughputs(embedded_cfg().budget)[0]  # 7.97 s at the FLOPs model's 32,110 tokens/s
    assert e.engine == "embedded" and e.vllm_would_save and e.gpu_hours > 5 * e.vllm_gpu_hours
    assert 0.9 < e.rollout_share < 1.0 and e.vllm_gpu_hours * 3600 / 10 > vllm
    assert "set rollout=vllm" in e.line("bf16") and "vLLM has no int8: no override" in e.line("int8")
    # a job the model would price below vLLM's rate is priced at vLLM's (the floor), and no override is named
    short = embedded_cfg()
    short.task.max_new_tokens, short.budget.response_tokens, short.budget.gen_tokens_per_s = 16, 10, 100.0
    e = estimate(short, needs_recompute=True)
    assert e.gpu_hours == pytest.approx(e.vllm_gpu_hours) and not e.vllm_would_save and "x vLLM" not in e.line("bf16")


@pytest.mark.parametrize("bad", [{"keep_rate": 0.0}, {"gpus": 0}, {"gen_mfu": 0.0}, {"params_b": -1.0},
                                 {"train_tokens_per_s": 0.0}])
def test_budget_checks_name_the_key(bad):
    key = next(iter(bad))
    with pytest.raises(ValueError, match=f"budget.{key}"):
        check_schema(BudgetConfig(**bad), "budget")


def test_rows_cross_the_cartesian_part_and_the_command_line_wins():
    jobs = expand_rows(["method=bf16", "method=naive rollout.precision=int8"], [["seed=0"], ["seed=1"]])
    assert jobs == [["method=bf16", "seed=0"], ["method=bf16", "seed=1"],
                    ["method=naive", "rollout.precision=int8", "seed=0"], ["method=naive", "rollout.precision=int8", "seed=1"]]
    assert expand_rows([], [["a=1"], ["a=2"]]) == [["a=1"], ["a=2"]]
    # a job override of a key the row sets replaces it (here the precision)
    assert expand_rows(["method=naive rollout.precision=int8"], [["rollout.precision=fp8_e4m3"]]) == [
        ["method=naive", "rollout.precision=fp8_e4m3"]]


def test_the_rollout_benchmark_fits_the_decode_step_cost_in_the_budget_form():
    """bench.benchmarks.rollout decode_fit: timings made from t(B) = f + B x r give back f, r and f per layer-kernel
    (the measured counterpart of KERNEL_S); from the `before` rows only when rows stop (their steps run to the
    longest row); a per-row cost below zero is flagged as noise, not reported as a fit."""
    from argparse import Namespace

    from bench.benchmarks.rollout import build_model, decode_fit
    from bench.launch.budget import ACT_QUANT_KERNELS, KERNELS_PER_LAYER, LINEARS_PER_LAYER

    shape = build_model("1m", device="meta")  # 4 layers
    f, r = 2e-3, 50e-6

    def cells(line):
        return [c.strip() for c in line.strip("|").split("|")]

    no_stops = Namespace(batch=[4, 16, 64], stops=None)
    rows = {f"embedded | {p}": {b: b / (f + b * r) for b in no_stops.batch} for p in ("fp32", "int8")}
    table = decode_fit(rows, no_stops, shape, {})
    (_, p32, f32, r32, k32), (_, p8, f8, r8, k8) = map(cells, table[2:])
    assert (p32, p8) == ("fp32", "int8") and float(f32) == pytest.approx(2.0, rel=1e-3)
    assert float(r32) == pytest.approx(50, rel=1e-3) and float(f8) == pytest.approx(2.0, rel=1e-3)
    assert float(k32) == pytest.approx(f / (4 * KERNELS_PER_LAYER["eager"]) * 1e6, rel=1e-2)
    eight_bit = KERNELS_PER_LAYER["eager"] + LINEARS_PER_LAYER * ACT_QUANT_KERNELS["eager"]
    assert float(k8) == pytest.approx(f / (4 * eight_bit) * 1e6, rel=1e-2)

    stops = Namespace(batch=[8, 32], stops=[127])  # one call's lengths: B rows, the longest 40 steps
    lengths = {b: [10] * (b - 1) + [40] for b in stops.batch}
    useful = {b: sum(lengths[b]) for b in stops.batch}
    rows = {"embedded (before) | fp32": {b: useful[b] / (40 * (f + b * r)) for b in stops.batch},
            "embedded | fp32": {b: 1e9 for b in stops.batch}}  # compacted: its steps are not B rows each
    table = decode_fit(rows, stops, shape, lengths)
    assert len(table) == 3 and cells(table[2])[0] == "embedded (before)"
    assert float(cells(table[2])[2]) == pytest.approx(2.0, rel=1e-3)

    noisy = {"embedded | fp32": {4: 4 / 0.01, 16: 16 / 0.005}}  # more rows, less time per step
    assert "not a fit" in decode_fit(noisy, Namespace(batch=[4, 16], stops=None), shape, {})[2]
    assert decode_fit(noisy, Namespace(batch=[16], stops=None), shape, {}) == []
