"""The paper recipes (conf/experiment/paper/): every recipe dry-runs with a GPU-hours estimate, every recipe has a
CPU `_mini` variant and a reference CSV, and every mini runs to completion through the real trainer.

The recipe list comes from conf/ itself, so a new recipe is covered without editing this file.
"""

from __future__ import annotations

import csv
import importlib.util
import re
from pathlib import Path

import pytest
import torch
import transformers as tr
from hydra import compose, initialize_config_dir
from omegaconf import open_dict

from bench.launch.cli import CONF_DIR, execute
from bench.launch.dryrun import dry_run, expand
from bench.run.store import RunDir
from tests.helpers import REPO, cli

PAPER = CONF_DIR / "experiment" / "paper"
RECIPES = sorted(p.stem for p in PAPER.glob("*.yaml") if not p.stem.endswith("_mini"))
# rows x seeds of each recipe (the tables' rows; RECIPES.md gives each)
JOBS = {"qurl_table1": 7, "qurl_table2": 9, "qurl_table3": 5, "qurl_table4": 5, "ais_table3": 12,
        "flashrl_gsm8k": 5, "p3o_fp8": 4}


def test_the_recipes_are_the_papers_tables():
    assert set(RECIPES) == set(JOBS)
    for name in RECIPES:
        assert (PAPER / f"{name}_mini.yaml").exists(), f"{name} has no _mini variant"
        assert (PAPER / f"{name}.reference.csv").exists(), f"{name} has no reference CSV"


@pytest.mark.slow  # composing a job takes ~1 s
@pytest.mark.parametrize("name", RECIPES)
def test_every_recipe_dry_runs_with_a_gpu_hours_estimate(name, tmp_path, capsys):
    assert dry_run([f"+experiment=paper/{name}", f"out_root={tmp_path}"]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert len(lines) == JOBS[name]
    assert all(re.search(r"~[\d,.]+ GPU-h on (embedded|vllm) \(rollout \d+% of a step", line) for line in lines), out
    assert len({line.split()[3] for line in lines}) == len(lines), "two jobs share a run directory"
    total = float(re.search(r"estimated GPU-hours \(all jobs\): ~([\d,]+)", err).group(1).replace(",", ""))
    per_job = [float(re.search(r"~([\d,.]+) GPU-h", line).group(1).replace(",", "")) for line in lines]
    assert total == pytest.approx(sum(per_job), abs=1.0)
    assert "assuming L_p" in err and "tokens/s" in err
    assert not list(tmp_path.rglob("run.json"))  # nothing launched


@pytest.mark.slow  # composing a job takes ~1 s
def documented_slurm_commands() -> list[tuple[str, list[str]]]:
    """(where, overrides) of every paper recipe's SLURM command in a code block of the README or docs/, with its
    continuation lines joined and its comment dropped (placeholders such as <p> are skipped)."""
    out = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = re.sub(r"\\\n\s*", " ", page.read_text(encoding="utf-8"))
        for n, line in enumerate(text.splitlines(), 1):
            command = line.split(" #", 1)[0].strip()
            if command.startswith("qrl-bench -m +experiment=paper/") and "hydra/launcher=slurm" in command \
                    and "<" not in command:
                out.append((f"{page.name}:{n}", command.split()[2:]))
    return out


@pytest.mark.slow  # composing a job takes ~1 s
@pytest.mark.parametrize("where, overrides", documented_slurm_commands(), ids=lambda v: v if isinstance(v, str) else "")
def test_the_documented_slurm_commands_give_their_runs_the_time_they_need(where, overrides, tmp_path, capsys):
    """A command the docs give for a recipe on SLURM is one its dry run does not warn about: its time limits let a
    run checkpoint at a signal and finish within its requeues (qurl_table1's and qurl_table2's asked for more)."""
    assert dry_run([*overrides, f"out_root={tmp_path}"]) == 0
    err = capsys.readouterr().err
    assert "take longer for an evaluation" not in err and "need more wall time" not in err, (where, err)


@pytest.mark.slow  # composing a job takes ~1 s
def test_the_gpu_page_gives_each_recipes_memory_estimate():
    """docs/gpu.md's per-recipe table: the largest estimate of the recipe's bf16 rows and of its other rows, GB per
    GPU, as the dry run prints them (it had drifted to other engines' numbers: qurl_table2 74 where the dry run said
    54 and 79)."""
    from bench.launch.memory import estimate_memory

    table = {m[1]: (m[2], m[3]) for m in re.finditer(r"^\| `(\w+)` \|[^|]*\|[^|]*\|[^|]*\| (\S+) / (\S+)",
                                                      (REPO / "docs" / "gpu.md").read_text(), flags=re.M)}
    assert set(table) == set(RECIPES)
    jobs = {name: expand([f"+experiment=paper/{name}"]) for name in RECIPES}
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for name in RECIPES:
            peaks: dict[bool, list[float]] = {True: [], False: []}
            for job in jobs[name]:
                cfg = compose("config", overrides=job)
                peaks[cfg.rollout.precision == "bf16"].append(estimate_memory(cfg).peak)
            shown = tuple(f"{max(p):,.0f}" if p else "-" for p in (peaks[True], peaks[False]))
            assert table[name] == shown, (name, table[name], shown)


@pytest.mark.parametrize("name", RECIPES)
def test_the_reference_csv_names_the_recipes_tasks_and_model(name, tmp_path):
    """`qrl-analyze --paper` matches a run to a line only on the line's task and model: they must be the recipe's,
    or its own runs would never fill the table. The paper's (task, model) pairs are exactly those the recipe runs."""
    with open(PAPER / f"{name}.reference.csv", newline="") as f:
        wanted = {(line["task"], line["model"]) for line in csv.DictReader(f)}
    ran = set()
    for job in expand([f"+experiment=paper/{name}", f"out_root={tmp_path}"]):
        cfg = compose_job(job)
        ran.add((cfg.task.name, cfg.model.name))
    assert wanted == ran


@pytest.mark.slow
def test_qurl_table1_estimate_by_hand(tmp_path, capsys):
    """7 jobs of 11.302 GPU-hours (tests/unit/test_budget.py computes one by hand)."""
    dry_run(["+experiment=paper/qurl_table1", f"out_root={tmp_path}"])
    out, err = capsys.readouterr()
    assert out.count("~11.3 GPU-h") == 7 and "estimated GPU-hours (all jobs): ~79" in err
    assert "per GPU 2,851 generated / 4,335 trained / 15,184 forward tokens/s: measured: verl quickstart" in err


@pytest.mark.slow
def test_a_sweep_whose_jobs_evaluate_differently_is_warned(tmp_path, capsys):
    """qurl_table3's BF16 row rolls out on vLLM and so evaluates there, in bf16 (eval.engine=auto); its INT8 rows roll
    out on the embedded engine and evaluate in fp32 there: the dry run says which jobs evaluate how. qurl_table1's
    rows all evaluate on the embedded engine: no warning."""
    dry_run(["+experiment=paper/qurl_table3", f"out_root={tmp_path}"])
    err = capsys.readouterr().err
    warning = next(line for line in err.splitlines() if "evaluate with different engines" in line)
    assert "embedded fp32 (4: naive@int8-deepscaler-r1-distill-qwen-1.5b-s0, " in warning
    assert "vllm bf16 (1: bf16@bf16-deepscaler-r1-distill-qwen-1.5b-s0)" in warning and "set eval.engine" in warning
    dry_run(["+experiment=paper/qurl_table1", f"out_root={tmp_path}"])
    assert "evaluate with different engines" not in capsys.readouterr().err


@pytest.mark.slow
def test_mini_variants_have_no_gpu_estimate(tmp_path, capsys):
    dry_run(["+experiment=paper/qurl_table1_mini", f"out_root={tmp_path}"])
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 7 and "GPU-h" not in out + err


def compose_job(job: list[str]):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=job)


@pytest.mark.slow
@pytest.mark.parametrize("name", RECIPES)
def test_every_mini_variant_runs_to_completion(name, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # the minis read tests/fixtures/data relative to the repository root
    jobs = expand([f"+experiment=paper/{name}_mini", f"out_root={tmp_path}"])
    assert len(jobs) == JOBS[name]
    for job in jobs:
        cfg = compose_job(job)
        assert cfg.train.nproc_per_node == 1, "a CPU mini runs one process (8 gloo ranks on 2 cores took 4 min)"
        assert execute(cfg) == "completed", job
        run = RunDir.of(cfg)
        rows, evals = run.metrics(), run.evals()
        assert [r["step"] for r in rows] == list(range(cfg.train.steps))
        assert [e["step"] for e in evals] == [0, cfg.train.steps]
        keys = set().union(*rows)
        if cfg.algo.advantage == "gae":
            assert {"critic/vf_loss", "critic/values_mean"} <= keys
        if cfg.algo.dynamic_sampling:
            assert {"sampling/generated", "sampling/kept", "sampling/rounds"} <= keys
        else:
            assert "train/loss" in keys
        assert run.info()["precision"]["name"] == cfg.rollout.precision
        for eval_set in cfg.eval.sets:  # the recipe's evaluation mode on every eval set
            metric = {"avg@k": f"avg@{cfg.eval.k}", "pass@k": f"pass@{cfg.eval.k}", "greedy": "accuracy"}[cfg.eval.mode]
            assert f"eval/{eval_set}/{metric}" in evals[-1], (eval_set, evals[-1])
    # ... and ends in the recipe's table (`qrl-analyze --paper <recipe>_mini`): every row the mini ran is filled
    from analysis.paper import load_runs, paper_table

    table = paper_table(f"{name}_mini", load_runs([tmp_path]))
    assert (table.data.groupby(["paper_label", "method", "bitwidth", "config"])["n_runs"].max() > 0).sum() >= 1


@pytest.mark.slow
def test_a_mini_through_the_cli_row_sweeper_and_local_launcher(tmp_path):
    """The real multirun path: Hydra instantiates the row sweeper, the local launcher runs the jobs (in-process:
    n_jobs=1, so the test pays one interpreter start, not one per job)."""
    proc = cli("-m", "+experiment=paper/p3o_fp8_mini", f"out_root={tmp_path}", "hydra.launcher.n_jobs=1")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    done = sorted(str(p.parent.relative_to(tmp_path)) for p in tmp_path.rglob("run.json"))
    # one sweep; the three GRPO rows of one arm differ in eps only, which becomes their variant level
    assert done == ["p3o_fp8_mini/ess@fp8_e4m3/deepscaler/mini_qwen2/seed0"] + [
        f"p3o_fp8_mini/naive_ppo_is@fp8_e4m3/deepscaler/mini_qwen2/algo.clip_eps_high={e},algo.clip_eps_low={e}/seed0"
        for e in ("0.2", "0.4", "0.6")]
    assert (tmp_path / "p3o_fp8_mini" / "multirun.yaml").exists()


# ---------------------------------------------------------------- start-up at the real models' shapes (issue 33 N1)
#: the fixtures stand in for each task's data (tests/fixtures/data, as in the minis): a few rows each, so the held-out
#: test sizes are the minis' too
FIXTURE = {"math500": {"train_split": "test", "test_split": None, "test_size": 2}, "dapo_math": {"test_size": 2},
           "deepscaler": {"test_size": 2}, "countdown_tasks": {"test_size": 4}}


def real_shape_model(path: str, root: Path) -> Path:
    """A model directory with the config.json of hub model `path` (its shape from bench/launch/memory.py SHAPES, its
    published max_position_embeddings from CONTEXTS) and a character tokenizer with the family's chat template
    (tests/chat_models.py); no weights: the model is built on the meta device from its config."""
    from bench.launch.memory import CONTEXTS, SHAPES
    from tests.chat_models import chat_tokenizer

    out = root / path.replace("/", "--")
    if out.exists():
        return out
    hidden, layers, heads, kv, head_dim, mlp, vocab, tied = SHAPES[path]
    family = "qwen3" if "Qwen3" in path else "llama" if "Llama" in path else "qwen2"
    config_class = {"qwen3": tr.Qwen3Config, "llama": tr.LlamaConfig, "qwen2": tr.Qwen2Config}[family]
    config_class(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                 head_dim=head_dim, intermediate_size=mlp, vocab_size=vocab, tie_word_embeddings=tied,
                 max_position_embeddings=CONTEXTS[path]).save_pretrained(out)
    chat_tokenizer(family).save_pretrained(out)
    return out


def start_up(cfg, model_dir: Path) -> None:
    """Every check a run makes before its first step that a configuration can fail, in the order a run makes them
    (bench/launch/cli.py `_execute`, bench/train.py `build`), with the model on the meta device: the config's
    values, the data, the context and chat template, the prompts' lengths, the engines a multi-process run can
    use, the memory estimate and the GPUs. What needs the weights or a GPU (moving the model, building the engines'
    copies) is not run here."""
    from bench.launch.config import validate
    from bench.distributed.engines import check_engine
    from bench.eval_config import eval_engine_kind
    from bench.evaluation import build_eval_sets
    from bench.launch.memory import estimate_memory
    from bench.models.load import _load_tokenizer, apply_overrides, config_overrides
    from bench.preflight import check_data
    from bench.tasks.base import build_task
    from bench.train import check_startup

    with open_dict(cfg):
        cfg.model.path = str(model_dir)
        cfg.task.source = f"tests/fixtures/data/{cfg.task.name}"
        for key, value in FIXTURE.get(cfg.task.name, {}).items():
            cfg.task[key] = value
        cfg.eval.overrides = {name: {"source": f"tests/fixtures/data/{name}"} for name in cfg.eval.sets}
    validate(cfg)
    task = build_task(cfg.task)
    eval_sets = build_eval_sets(cfg.eval, task)
    check_data(cfg, task, eval_sets)
    config = apply_overrides(tr.AutoConfig.from_pretrained(model_dir), config_overrides(cfg.model))
    with torch.device("meta"):
        policy = tr.AutoModelForCausalLM.from_config(config)
    check_startup(cfg, task, eval_sets, policy, _load_tokenizer(str(model_dir)))
    world, blocks = cfg.train.nproc_per_node, cfg.train.sampling_shards or cfg.train.nproc_per_node
    if world > 1:
        vllm_eval = eval_engine_kind(cfg.eval.engine, cfg.rollout.engine) == "vllm"
        check_engine(cfg.rollout.engine, world, blocks,
                     (cfg.rollout.engine == "vllm" and cfg.rollout.precision == "bf16") if vllm_eval else None)
    mem = estimate_memory(cfg)
    assert mem is not None and mem.fits and mem.gpus == mem.booked == cfg.budget.gpus, mem.line()


@pytest.mark.slow
@pytest.mark.parametrize("name", RECIPES)
def test_every_recipe_starts_at_its_real_models_shape(name, tmp_path_factory, monkeypatch):
    """Every job of every paper recipe, against its hub model's real config (shape and published context) on the
    meta device, passes every check that precedes training: no recipe fails at start-up for a configuration reason
    (qurl_table2's 32,768-token context on Qwen2.5-Math-7B's 4,096 did, in all 14 of its jobs). The model's
    config carries `model.max_position_embeddings` (the config every engine, vLLM's too, is built from)."""
    monkeypatch.chdir(REPO)  # the fixtures' paths are relative to the repository root
    root = tmp_path_factory.getbasetemp() / "real-shape-models"
    for job in expand([f"+experiment=paper/{name}", f"out_root={tmp_path_factory.mktemp(name)}"]):
        cfg = compose_job(job)
        if cfg.rollout.engine == "vllm" and importlib.util.find_spec("vllm") is None:
            # vLLM is not installed in this interpreter: its own check says so (a GPU machine installs it); the
            # recipe's checks run with the engine check set aside
            monkeypatch.setattr("importlib.util.find_spec", lambda name, *a, _real=importlib.util.find_spec:
                                object() if name == "vllm" else _real(name, *a))
        start_up(cfg, real_shape_model(str(cfg.model.path), root))
