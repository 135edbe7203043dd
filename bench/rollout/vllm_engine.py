"""Optional vLLM rollout engine behind the same protocol. UNTESTED HERE: vllm is not installed in this
environment (and its CPU build has no FP8 kernels without AMX, perf-notes 5); this is the shape of the
integration, to be validated on a GPU machine.

Log-probs: vLLM V1 returns raw (pre-temperature) log-probs by default, which is not the distribution sampled
from when T != 1 (methods.md section 0). The engine therefore asks for `logprobs_mode="processed_logprobs"`
and samples with top_k=-1 and the SamplingParams' top_p (1 in training: no truncation), so log mu = log
softmax(logits / T) of the sampled token, as in the embedded engine; with top_p < 1 (evaluation) vLLM's
processed log-probs are those of the renormalized nucleus, as the embedded engine's are. (Greedy maps to vLLM's temperature 0; its log-probs then follow vLLM's convention,
not necessarily the T=1 of SamplingParams: use greedy for evaluation only.)

Weight sync: every `load_weights` saves the trainer's weights and rebuilds the vLLM engine from them, so
vLLM's online quantization runs again with fresh scales (methods.md 2.3: new weights under old FP8 scales are
a bug). That is correct but pays the engine start (~20 s) per sync; an in-place reload with re-quantization
(vLLM's layerwise reload, `vllm.model_executor.model_loader.reload`) is the faster path once it can be tested.
"""

from __future__ import annotations

import gc
import tempfile
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from bench.rollout.base import ENGINES, Rollout, RolloutConfig, SamplingParams, token_ids


@dataclass
class VLLMRolloutConfig(RolloutConfig):
    """`rollout=vllm`."""

    engine: str = "vllm"

#: rollout precision -> LLM(...) arguments. vLLM's online FP8 is per-tensor weights, dynamic activations.
VLLM_PRECISIONS = {
    "fp32": dict(dtype="float32"),
    "bf16": dict(dtype="bfloat16"),
    "fp8_e4m3": dict(dtype="bfloat16", quantization="fp8"),
}


def _import_vllm():
    try:
        import vllm
    except ImportError as err:
        raise ImportError(
            "the vllm rollout engine needs vLLM: `pip install qrl-bench[vllm]` (or use rollout.engine=embedded)"
        ) from err
    return vllm


@ENGINES.register("vllm", schema=VLLMRolloutConfig)
class VLLMEngine:
    def __init__(
        self,
        precision: str = "bf16",
        weight_granularity: str = "per_tensor",
        act_granularity: str = "per_token",
        eos_id: int | None = None,
        pad_id: int = 0,
        max_len: int = 2048,
        **llm_kwargs,
    ):
        if precision not in VLLM_PRECISIONS:
            raise ValueError(
                f"vllm engine: precision {precision!r} is not supported; valid: {', '.join(VLLM_PRECISIONS)} "
                "(int8 W8A8 needs a compressed-tensors checkpoint; use the embedded engine)"
            )
        if precision == "fp8_e4m3" and weight_granularity != "per_tensor":
            raise ValueError("vllm online fp8 quantizes weights per tensor; set rollout.weight_granularity=per_tensor")
        self.vllm = _import_vllm()
        self.precision = precision
        self.act_granularity = act_granularity  # chosen by vLLM per GPU (methods.md 12.5); recorded only
        self.eos_id, self.pad_id, self.max_len = eos_id, pad_id, max_len
        self.llm_kwargs = llm_kwargs
        self.llm = None
        self._dir = tempfile.TemporaryDirectory(prefix="qrl-vllm-")

    @classmethod
    def from_config(cls, cfg: Any, *, eos_id: int | None, pad_id: int, max_len: int | None, **overrides: Any):
        kwargs = {"precision": cfg.precision, "weight_granularity": cfg.weight_granularity or "per_tensor",
                  "act_granularity": cfg.act_granularity or "per_token"} | overrides
        return cls(**kwargs, eos_id=eos_id, pad_id=pad_id, **({} if max_len is None else {"max_len": max_len}))

    def quant_metrics(self) -> dict[str, float]:
        return {}

    def load_weights(self, model: nn.Module) -> None:
        model.save_pretrained(self._dir.name)
        self.llm = None
        gc.collect()
        self.llm = self.vllm.LLM(
            model=self._dir.name,
            skip_tokenizer_init=True,
            max_model_len=self.max_len,
            logprobs_mode="processed_logprobs",
            **VLLM_PRECISIONS[self.precision],
            **self.llm_kwargs,
        )

    def generate(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        n: int,
        sampling: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> Rollout:
        if self.llm is None:
            raise RuntimeError("VLLMEngine.generate called before load_weights")
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
        params = self.vllm.SamplingParams(
            n=n,
            temperature=0.0 if sampling.greedy else sampling.temperature,
            top_p=sampling.top_p,
            top_k=-1,
            max_tokens=sampling.max_new_tokens,
            logprobs=0,
            seed=seed,
            stop_token_ids=list(token_ids(self.eos_id)),
            ignore_eos=not token_ids(self.eos_id),
        )
        prompts = [{"prompt_token_ids": ids[m].tolist()} for ids, m in zip(prompt_ids, prompt_mask.bool())]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        seqs = [c for out in outputs for c in out.outputs]  # group-contiguous: n completions per prompt
        T = max(len(c.token_ids) for c in seqs)
        B = len(seqs)
        ids = torch.full((B, T), self.pad_id, dtype=torch.long)
        logp = torch.zeros(B, T)
        for i, c in enumerate(seqs):
            toks = list(c.token_ids)
            ids[i, : len(toks)] = torch.tensor(toks)
            logp[i, : len(toks)] = torch.tensor([lp[t].logprob for t, lp in zip(toks, c.logprobs)])
        mask = torch.arange(T)[None, :] < torch.tensor([len(c.token_ids) for c in seqs])[:, None]
        return Rollout(
            prompt_ids.long().repeat_interleave(n, 0), prompt_mask.bool().repeat_interleave(n, 0), ids, mask, logp
        )
