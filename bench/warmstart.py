"""Warm start of the built-in tiny model: supervised fine-tuning on the task's answer format, cached on disk.

Why: GRPO learns nothing from a group whose rewards are all equal, and a randomly initialised model scores
0 on every prompt. A short SFT on (prompt -> reference completion + EOS) teaches the answer format and part
of the skill, so RL starts from nonzero but imperfect accuracy (aim: 10-60 % greedy test accuracy), which is
the regime where the treatments of the rollout/trainer mismatch can differ. SFT stops once greedy accuracy on
train examples reaches `model.warmstart_target_acc`, or after `model.warmstart_steps` steps (see `sft`).
Measured with the defaults (Qwen2, one thread, shared 2-core CPU): arithmetic runs all 1500 steps (45-52 s,
13.5 % greedy test accuracy), countdown stops after 350 steps (16 s, 21 %).

The result is deterministic for a given torch build (fixed init and data-order seeds, a thread count fixed by
`model.warmstart_threads`) and cached under `model.cache_dir`/warmstart/<task>-<arch>-<hash>, where the hash
covers everything that changes the weights: the model config, the task's fingerprint (config, data files), the
warm-start hyper-parameters, the tokenizer vocabulary and `CODE_VERSION` (bump it whenever this file's training
recipe changes). The cache directory is an ordinary HF model directory (model + tokenizer + warmstart.json),
loaded by the same code as any user model. It is built under a file lock into a temporary directory and renamed into place, so
concurrent sweep jobs neither corrupt it nor build it twice, and a crash never leaves a half-written cache.

Shipped warm starts: the SFT's result depends on the CPU's float kernels (the long-chain warm start ended at 8 %
test accuracy on one CPU and 27 % on another with the same seed), so a reference number reproduced on another
machine would start from other weights. The warm starts of the quickstart and the severity sweep are therefore
committed under `bench/warmstarts/<task>-<arch>-<key16>/` (the cache's own layout and key, ~4 MB each, with the
sha256 of their weights and the CPU that built them in warmstart.json). `warm_start_dir` uses a shipped directory
whose key matches, after checking its hash, before its own cache (which may hold this machine's build of the same
key) and before building anything. Build or refresh one with
`python -m bench.launch.ship_warmstart <the run's overrides>` (scripts/ship_warmstarts.sh lists the shipped ones).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock, Timeout
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from bench.models.tiny import build_tiny_model
from bench.evaluation import greedy_eval
from bench.models.tokenizer import build_char_tokenizer, pad_id, prompt_token_rows
from bench.tasks.base import Task, config_to_dict, stable_seed

CODE_VERSION = "warmstart-v2"  # v2: small-batch cosine recipe + accuracy stopping rule
INFO_FILE = "warmstart.json"
WEIGHTS_FILE = "model.safetensors"
SHIPPED_DIR = Path(__file__).resolve().parent / "warmstarts"  # committed warm starts (module docstring)
WARMUP_STEPS = 50
EVAL_EVERY = 50  # steps between accuracy checks of the stopping rule
EVAL_EXAMPLES = 128  # train examples in each check (~0.2 s)
# ModelConfig keys that do not change the warm-started weights (labels, locations, how the result is loaded and
# prompted: the built-in model always has plain prompts), so that adding such a key keeps existing caches valid.
_NOT_IN_KEY = ("name", "path", "cache_dir", "dtype", "max_length", "chat_template", "chat_template_kwargs", "stop_tokens")


def resolve_cache_dir(cache_dir: str) -> Path:
    """`~` expanded; an unresolved OmegaConf interpolation (a dataclass used outside Hydra) resolved too."""
    if "${" in cache_dir:
        from omegaconf import OmegaConf

        cache_dir = OmegaConf.create({"d": cache_dir}).d
    return Path(os.path.expanduser(cache_dir))


def cache_key(model_cfg: Any, task: Task, tokenizer: PreTrainedTokenizerBase) -> str:
    """Hex digest of everything that determines the warm-started weights."""
    model = {k: v for k, v in config_to_dict(model_cfg).items() if k not in _NOT_IN_KEY}
    if model.get("warmstart_threads", 1) == 1:  # the recipe before the knob existed: keep those caches' keys
        model.pop("warmstart_threads", None)
    payload = {
        "code": CODE_VERSION,
        "model": model,
        "task": task.fingerprint(),
        "vocab": sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1]),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def policy_path(model_cfg: Any, task: Task) -> str:
    """Where the policy's weights are: `model.path`, or for the built-in model (`model.path: null`) its
    warm-start directory for `task`, built first if it is missing."""
    return str(model_cfg.path) if model_cfg.path is not None else str(warm_start_dir(model_cfg, task))


def warm_start_name(model_cfg: Any, task: Task, key: str | None = None) -> str:
    """`<task>-<arch>-<first 16 hex digits of cache_key>`: the directory name in the cache and in SHIPPED_DIR."""
    key = key or cache_key(model_cfg, task, build_char_tokenizer(model_cfg.max_position_embeddings))
    return f"{task.name}-{model_cfg.arch}-{key[:16]}"


def warm_start_dir(model_cfg: Any, task: Task) -> Path:
    """The cached warm-start directory for (model_cfg, task), built first if it is missing."""
    tokenizer = build_char_tokenizer(model_cfg.max_position_embeddings)
    key = cache_key(model_cfg, task, tokenizer)
    root = resolve_cache_dir(model_cfg.cache_dir) / "warmstart"
    final = root / warm_start_name(model_cfg, task, key)
    shipped = shipped_dir(final.name)  # before the cache: a build of this machine's may differ (module docstring)
    if shipped is not None:
        return shipped
    if _complete(final):  # it only appears by an atomic rename of a checked directory
        return final
    root.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(final) + ".lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        _say(f"waiting for another job to finish the {task.name} warm start ({final})")
        lock.acquire()
    try:
        if _complete(final):  # another job built it while we waited for the lock
            return final
        if final.is_dir():  # left without its model by an older build (saved on a rank other than 0): rebuilt
            _say(f"{final} lacks {', '.join(_missing(final))}: rebuilding it")
            shutil.rmtree(final)
        _say(f"building the {task.name} warm start once (at most {model_cfg.warmstart_steps} SFT steps on "
             f"{getattr(model_cfg, 'warmstart_threads', 1)} thread(s)); cached at {final}")
        tmp = Path(tempfile.mkdtemp(prefix=final.name + ".tmp-", dir=root))
        try:
            model, info = train_warm_start(model_cfg, task, tokenizer)
            info["cache_key"] = key
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            (tmp / INFO_FILE).write_text(json.dumps(info, indent=2, default=str))
            if _missing(tmp):  # never install a directory that cannot be loaded: every later run would fail on it
                raise RuntimeError(f"the warm start saved into {tmp} lacks {', '.join(_missing(tmp))} "
                                   "(save_pretrained wrote no model: was it called on a rank other than 0 of an "
                                   "initialized process group?)")
            os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is shared by every job of the user
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    finally:
        lock.release()
    _say(f"{task.name} warm start built: {info['steps_run']} SFT steps in {info['sft_seconds']:.0f} s, "
         f"greedy test accuracy {info['test_greedy_accuracy']:.1%}")
    target, checks = model_cfg.warmstart_target_acc, info["train_checks"]
    if target is not None and checks and checks[-1][1] < target:
        _say(f"WARNING: the SFT used its whole budget (model.warmstart_steps={model_cfg.warmstart_steps}) and ended "
             f"at {checks[-1][1]:.1%} train accuracy, below model.warmstart_target_acc={target}: RL groups from it "
             "may all score 0 and learn nothing; a larger model.warmstart_steps gives the SFT time to get there")
    return final


#: what a loadable warm start holds (bench.models.load reads the first two; the info says how it was built)
REQUIRED_FILES = ("config.json", WEIGHTS_FILE, INFO_FILE)


def _missing(directory: Path) -> list[str]:
    return [name for name in REQUIRED_FILES if not (directory / name).is_file()]


def _complete(directory: Path) -> bool:
    return directory.is_dir() and not _missing(directory)


def weights_sha256(directory: Path) -> str:
    return hashlib.sha256((directory / WEIGHTS_FILE).read_bytes()).hexdigest()


def shipped_dir(name: str) -> Path | None:
    """The committed warm start `name` (`<task>-<arch>-<key16>`), its weights checked against their recorded hash;
    None if none is shipped under that name."""
    shipped = SHIPPED_DIR / name
    if not (shipped / INFO_FILE).is_file():
        return None
    info = json.loads((shipped / INFO_FILE).read_text())
    if weights_sha256(shipped) != info.get("weights_sha256"):
        raise RuntimeError(f"the shipped warm start {shipped} does not match its recorded sha256 "
                           f"{info.get('weights_sha256')!r} (a partial checkout or a Git LFS pointer?); restore it "
                           f"with git, or rebuild it: python -m bench.launch.ship_warmstart <the run's overrides>")
    _say(f"using the shipped {info['task']} warm start {name} ({info['steps_run']} SFT steps, greedy test accuracy "
         f"{info['test_greedy_accuracy']:.1%}, built on {info.get('built_on', 'an unrecorded CPU')})")
    return shipped


def ship(model_cfg: Any, task: Task) -> Path:
    """Copy the warm start of (model_cfg, task), built here first if it is not cached, into SHIPPED_DIR with the
    sha256 of its weights and the CPU that built it; returns the shipped directory. The build runs here, so the
    shipped weights are this machine's: ship from the machine whose reference numbers the repository keeps."""
    from bench.device import cpu_model

    built = warm_start_dir(model_cfg, task)
    if built.parent == SHIPPED_DIR:
        return built
    tmp = Path(tempfile.mkdtemp(prefix=built.name + ".tmp-", dir=SHIPPED_DIR.parent))
    try:
        for name in (WEIGHTS_FILE, "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
            if (built / name).is_file():
                shutil.copy2(built / name, tmp / name)
        info = json.loads((built / INFO_FILE).read_text())
        info.update(weights_sha256=weights_sha256(tmp), built_on=f"{cpu_model()}, torch {torch.__version__}")
        (tmp / INFO_FILE).write_text(json.dumps(info, indent=2, default=str) + "\n")
        for f in tmp.iterdir():
            os.chmod(f, 0o644)
        SHIPPED_DIR.mkdir(exist_ok=True)
        os.chmod(tmp, 0o755)
        os.rename(tmp, SHIPPED_DIR / built.name)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return SHIPPED_DIR / built.name


def _say(message: str) -> None:
    """One progress line on stderr (a sweep job's run.log): a first build takes seconds to tens of minutes."""
    print(f"qrl-bench: warm start: {message}", file=sys.stderr, flush=True)


def train_warm_start(
    model_cfg: Any, task: Task, tokenizer: PreTrainedTokenizerBase
) -> tuple[PreTrainedModel, dict[str, Any]]:
    """Build the tiny model, SFT it on the task's train split, measure greedy test accuracy. No caching.

    Runs on `model.warmstart_threads` torch threads (default 1) whatever the caller uses: the reduction order,
    hence the weights, then do not depend on which sweep job happened to build the cache first (the thread
    count is part of the cache key). Two threads run an SFT step faster (tiny_long: 286 -> 174 ms on this 2-core
    CPU), but the long-answer warm start learns through a sudden transition whose timing the reduction order
    moves: with 2 threads the chain SFT had loss 0.28 and 0% train accuracy at step 2300, where 1 thread had
    0.04 and 30 %. So every preset keeps 1; the knob is for experiments, and `warm_start_dir` warns when a
    build ends below its target.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(int(getattr(model_cfg, "warmstart_threads", 1)))
    try:
        return _train_warm_start(model_cfg, task, tokenizer)
    finally:
        torch.set_num_threads(threads)


def _train_warm_start(
    model_cfg: Any, task: Task, tokenizer: PreTrainedTokenizerBase
) -> tuple[PreTrainedModel, dict[str, Any]]:
    t0 = time.perf_counter()
    model = build_tiny_model(model_cfg, tokenizer, seed=model_cfg.warmstart_seed)
    run = sft(
        model,
        tokenizer,
        task,
        steps=model_cfg.warmstart_steps,
        lr=model_cfg.warmstart_lr,
        batch_size=model_cfg.warmstart_batch,
        seed=model_cfg.warmstart_seed,
        target_acc=model_cfg.warmstart_target_acc,
    )
    sft_s = time.perf_counter() - t0
    info = {
        "code_version": CODE_VERSION,
        "task": task.name,
        "max_steps": model_cfg.warmstart_steps,
        "steps_run": run["steps_run"],
        "final_loss": run["losses"][-1] if run["losses"] else None,
        "train_checks": run["train_checks"],
        "sft_seconds": round(sft_s, 2),
        "test_greedy_accuracy": greedy_accuracy(model, tokenizer, task),
    }
    return model.eval(), info


def _sft_rows(task: Task, tokenizer: PreTrainedTokenizerBase) -> list[tuple[list[int], int]]:
    """(BOS + prompt + target + EOS ids, number of prompt ids incl. BOS) for every train example."""
    examples = task.examples("train")
    rows = []
    for ex, p in zip(examples, prompt_token_rows(tokenizer, task, examples)):
        c = tokenizer(task.target(ex), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append((p + c, len(p)))
    return rows


def _batch(rows: list[tuple[list[int], int]], pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded inputs, next-token labels and the loss mask (completion + EOS positions only).

    Right padding needs no attention mask under causal attention (real tokens never see the pads) and
    keeps positions 0.. on the real tokens, as the trainer's left-padded convention does.
    """
    width = max(len(ids) for ids, _ in rows)
    seq = torch.full((len(rows), width), pad, dtype=torch.long)
    loss_mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, (ids, n_prompt) in enumerate(rows):
        seq[i, : len(ids)] = torch.tensor(ids)
        loss_mask[i, n_prompt : len(ids)] = True
    return seq[:, :-1], seq[:, 1:], loss_mask[:, 1:]


def _lr_factor(step: int, total: int) -> float:
    """Linear warm-up, then cosine decay to 10 %: the decay matters, arithmetic barely improves at a
    constant learning rate (measured: loss stuck near 1.1 at 2e-3 after 3000 steps)."""
    if step < WARMUP_STEPS:
        return (step + 1) / WARMUP_STEPS
    progress = min(1.0, (step - WARMUP_STEPS) / max(1, total - WARMUP_STEPS))
    return 0.1 + 0.45 * (1.0 + math.cos(math.pi * progress))


def sft(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    steps: int,
    lr: float,
    batch_size: int,
    seed: int,
    target_acc: float | None = None,
) -> dict[str, Any]:
    """AdamW on the completion tokens until greedy accuracy on a train slice reaches `target_acc`
    (checked every EVAL_EVERY steps), or for `steps` steps at most. Returns the loss curve and the checks.

    Why stop on accuracy rather than after a fixed number of steps: tasks learn at very different speeds
    (countdown reaches 25 % about four times sooner than 1-2 digit +/- arithmetic), and arithmetic can learn
    through a sudden transition (measured once: 11 % -> 56 % between steps 500 and 750), so a fixed budget
    that suits one task over- or under-shoots another. Stopping at a target puts every task in the same
    "nonzero but imperfect" regime. The check uses train examples, never test ones. Data order is a pure
    function of `seed` (shuffled epochs over the split).
    """
    rows = _sft_rows(task, tokenizer)
    if not rows:
        raise ValueError(f"task {task.name!r} has no training examples to warm-start on")
    pad = pad_id(tokenizer)
    rng = random.Random(stable_seed("warmstart", seed))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.0, fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_factor(s, steps))
    order: list[int] = []
    losses: list[float] = []
    checks: list[tuple[int, float]] = []
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        model.train()
        if len(order) < batch_size:
            perm = list(range(len(rows)))
            rng.shuffle(perm)
            order += perm
        idx, order = order[:batch_size], order[batch_size:]
        inputs, labels, mask = _batch([rows[i] for i in idx], pad)
        logits = model(input_ids=inputs, use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits[mask], labels[mask])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if target_acc is not None and step % EVAL_EVERY == 0:
            acc = greedy_accuracy(model, tokenizer, task, n=EVAL_EXAMPLES, split="train")
            checks.append((step, acc))
            _say(f"{task.name}: step {step}/{steps}, loss {losses[-1]:.3f}, greedy accuracy on {EVAL_EXAMPLES} train "
                 f"examples {acc:.1%} (stops at {target_acc:.0%}), {time.perf_counter() - t0:.0f} s")
            if acc >= target_acc:
                break
    model.eval()
    return {"losses": losses, "steps_run": len(losses), "train_checks": checks}


def greedy_accuracy(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Task, n: int | None = None, split: str = "test"
) -> float:
    """Greedy accuracy (bench.evaluation, the trainer's definition) on the first `n` examples of `split`."""
    from bench.rollout.embedded import EmbeddedEngine

    examples = task.examples(split)[:n]
    if not examples:
        raise ValueError(f"task {task.name!r} has no {split} examples")
    was_training = model.training
    model.eval()
    engine = EmbeddedEngine("fp32", eos_id=tokenizer.eos_token_id, pad_id=pad_id(tokenizer))
    acc = greedy_eval(engine, model, tokenizer, task, examples)["eval/accuracy"]
    model.train(was_training)
    return acc

