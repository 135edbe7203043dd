"""Model presets (conf/model/<name>.yaml): each names its hub id and settings, composes as a Hydra choice and a
run-path segment, and loads from a local copy through the same code as from the hub. Per architecture family
(Qwen2, Qwen3, Llama), a random-init model of the preset's config shape (tiny dims, tests/chat_models.py) saved
locally loads through the preset, generates through the embedded engine with chat-template prompts, and its
log mu equals the teacher-forced log-probs of the trainer."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from bench.launch.cli import CONF_DIR
from bench.launch.config import validate
from bench.run.identity import RunId, parse_run_path, run_path
from bench.models.load import load_policy
from bench.models.logprobs import token_logprobs
from bench.models.tokenizer import PromptFormat, encode_prompts, engine_ids, stop_token_ids
from bench.rollout import build_engine
from bench.rollout.base import SamplingParams
from bench.run.store import RunDir
from bench.tasks.base import build_task
from tests.chat_models import save_chat_model

FIXTURES = os.path.normpath(os.path.join(os.path.dirname(__file__), os.pardir, "fixtures", "data"))

# name -> (hub id, architecture family, max_length = the model's context). Written from the model cards.
PRESETS = {
    "qwen2.5-0.5b-instruct": ("Qwen/Qwen2.5-0.5B-Instruct", "qwen2", 32768),
    "qwen2.5-1.5b-instruct": ("Qwen/Qwen2.5-1.5B-Instruct", "qwen2", 32768),
    "qwen2.5-math-1.5b": ("Qwen/Qwen2.5-Math-1.5B", "qwen2", 4096),
    "qwen2.5-math-7b": ("Qwen/Qwen2.5-Math-7B", "qwen2", 4096),
    "qwen3-1.7b": ("Qwen/Qwen3-1.7B", "qwen3", 40960),
    "qwen3-4b": ("Qwen/Qwen3-4B", "qwen3", 40960),
    "qwen3-8b": ("Qwen/Qwen3-8B", "qwen3", 40960),
    "r1-distill-qwen-1.5b": ("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", "qwen2", 131072),
    "llama-3.2-1b-instruct": ("meta-llama/Llama-3.2-1B-Instruct", "llama", 131072),
}
# One preset per family for the load/generate test (the others differ only in hub id and sizes).
FAMILY_PRESET = {"qwen2": "qwen2.5-math-1.5b", "qwen3": "qwen3-1.7b", "llama": "llama-3.2-1b-instruct"}


def compose_cfg(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=["tracking=disabled", *overrides])


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_names_its_hub_id_and_settings(name, tmp_path):
    hub, _, max_length = PRESETS[name]
    cfg = compose_cfg(f"model={name}", f"out_root={tmp_path}")
    validate(cfg)
    assert (cfg.model.name, cfg.model.path, cfg.model.max_length) == (name, hub, max_length)
    assert cfg.model.chat_template is True and cfg.model.dtype == "fp32"
    # the name is a run-path segment and a run-name part as it is
    path = RunDir.of(cfg).path
    assert path == run_path(tmp_path, "default", "bf16", "bf16", "arithmetic", name, 0)
    assert parse_run_path(path) == {"method": "bf16", "precision": "bf16", "task": "arithmetic", "model": name,
                                     "variant": "", "seed": 0}
    assert RunId("s", "bf16", "bf16", "gsm8k", name, 1).name == f"bf16@bf16-gsm8k-{name}-s1"


def test_every_preset_yaml_is_in_the_table():
    shipped = {p.stem for p in (CONF_DIR / "model").glob("*.yaml")}
    assert set(PRESETS) <= shipped
    # built-in models: the tiny ones, and the paper recipes' random-init mini stand-ins
    assert shipped - set(PRESETS) <= {"hf", "tiny", "tiny10m", "tiny_llama", "tiny_long", "mini_qwen2", "mini_qwen3"}


def test_preset_without_a_local_copy_offline_names_the_hub_id():
    cfg = compose_cfg("model=qwen2.5-0.5b-instruct")
    if os.environ.get("HF_HUB_OFFLINE") != "1":
        pytest.skip("the hub may be reachable")
    try:
        load_policy(cfg.model)
    except OSError as err:
        assert "model 'Qwen/Qwen2.5-0.5B-Instruct' not found locally and the hub is offline" in str(err)
        assert "pass a local directory" in str(err)
    else:
        pytest.skip("Qwen2.5-0.5B-Instruct is in this machine's HF cache")


@pytest.fixture(scope="module")
def gsm8k():
    return build_task(compose_cfg("task=gsm8k", f"task.source={FIXTURES}/gsm8k").task)


@pytest.mark.parametrize("family", sorted(FAMILY_PRESET))
def test_family_model_loads_through_its_preset_generates_and_matches_teacher_forcing(family, tmp_path, gsm8k):
    local = save_chat_model(family, tmp_path / family)
    cfg = compose_cfg(f"model={FAMILY_PRESET[family]}", f"model.path={local}", "model.max_length=512")
    validate(cfg)
    model, tok = load_policy(cfg.model)
    assert model.config.model_type == family and model.dtype == torch.float32 and not model.training
    if family == "qwen2":  # the qwen2.5-math preset adds <|im_end|> to the base model's stop ids
        assert tok.convert_tokens_to_ids("<|im_end|>") in stop_token_ids(tok, model)
    engine = build_engine(cfg.rollout, **engine_ids(tok, model), max_len=512, precision="fp32")
    assert sorted(engine.stop_ids.tolist()) == sorted(stop_token_ids(tok, model))
    assert len(engine.stop_ids) >= 2  # several EOS ids from generation_config
    engine.load_weights(model)
    assert engine.active_backend == "fast"

    ids, mask = encode_prompts(tok, gsm8k, gsm8k.examples("test")[:2], PromptFormat.from_config(cfg.model))
    assert tok.decode(ids[0, mask[0]]).count(gsm8k.examples("test")[0]["problem"]) == 1
    rollout = engine.generate(ids, mask, 2, SamplingParams(16, temperature=0.8), torch.Generator().manual_seed(0))
    assert rollout.response_ids.shape[0] == 4 and rollout.response_mask[:, 0].all()
    with torch.no_grad():
        logp, _ = token_logprobs(model, rollout, 0.8, "fp32")
    gap = (logp - rollout.logp_mu)[rollout.response_mask].abs()
    assert gap.max() < 1e-4, gap.max()


def test_model_path_overrides_a_presets_hub_id_with_a_local_copy(tmp_path, gsm8k):
    local = save_chat_model("qwen3", tmp_path / "Qwen3-1.7B")
    cfg = compose_cfg("model=qwen3-1.7b", f"model.path={local}", "model.max_length=256",
                      "+model.chat_template_kwargs.enable_thinking=false")
    model, tok = load_policy(cfg.model)
    ids, mask = encode_prompts(tok, gsm8k, gsm8k.examples("test")[:1], PromptFormat.from_config(cfg.model))
    assert tok.decode(ids[0, mask[0]]).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert Path(model.name_or_path) == local


def test_max_position_embeddings_overrides_a_loaded_models_context(tmp_path):
    """`model.max_position_embeddings` replaces the loaded config's context before the model is built (as verl's
    override_config), so `model.max_length` may exceed the saved 512; the config an engine saves (vLLM's, from
    `model.config`) says so too. Null keeps the model's own, and then the longer max_length is refused."""
    from transformers import AutoConfig

    local = save_chat_model("qwen2", tmp_path / "m", max_positions=512)
    cfg = compose_cfg("model=qwen2.5-math-7b", f"model.path={local}", "model.max_length=2048",
                      "model.max_position_embeddings=2048")
    model, _ = load_policy(cfg.model)
    assert model.config.max_position_embeddings == 2048
    model.config.save_pretrained(tmp_path / "engine")  # what bench/rollout/vllm_engine.py hands vLLM
    assert AutoConfig.from_pretrained(tmp_path / "engine").max_position_embeddings == 2048
    own = compose_cfg("model=qwen2.5-math-7b", f"model.path={local}", "model.max_length=2048")
    assert own.model.max_position_embeddings is None
    with pytest.raises(ValueError, match=r"model.max_length=2048 exceeds the model's max_position_embeddings=512 .*"
                                         r"set model.max_position_embeddings=2048"):
        load_policy(own.model)
