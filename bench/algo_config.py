"""The `algo` config: the policy-gradient knobs every arm shares, the advantage estimator and DAPO's data-side knobs.

Torch-free, apart from the math it configures (bench/grpo.py, bench/advantages.py, bench/dapo.py), so that the
configuration (bench/launch/config.py) and `make_method` read one schema without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from bench.domains import num

LOSS_AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
#: whose rewards make a group's GRPO baseline: "all" its responses (verl, TRL, SkyRL, AReaL, ROLL, miles, prime-rl
#: at their commits in docs/arms.md §8), or only those the arm kept ("kept": verl PR #6452, NeMo-RL's valid_mask)
BASELINES = ("all", "kept")


@dataclass
class AlgoConfig:
    """`algo.*`: the policy-gradient knobs every arm shares (docs/arms.md §5), the advantage estimator
    (GRPO or PPO's critic + GAE) and DAPO's data-side knobs. The arms' own knobs live in their schemas
    (bench/methods/<arm>.py); checks that need `train.*` or `task.*` too are in bench/launch/config.py
    `check_across`."""

    clip_eps_low: float = num(0.2, "[0, 1)")  # the lower clip bound is 1 - eps
    clip_eps_high: float = num(0.2, "[0, inf)")  # DAPO clip-higher: 0.28
    # verl: 3.0; off here, as in the QuRL/FlashRL equations
    dual_clip_c: Optional[float] = num(None, "(1, inf)", {None: "no dual clip"})
    loss_agg: str = "token-mean"
    adv_eps: float = num(1e-6, "[0, 1]")  # added to the group std; inf would zero every advantage
    norm_adv_by_std: bool = True  # False: Dr.GRPO
    baseline: str = "all"  # grpo: all responses of a group set its mean/std | kept: the ones the arm did not reject
    kl_ref_beta: float = num(0.0, "[0, 100]", {0.0: "no reference model"})  # KL(pi_theta || pi_ref) coefficient
    # |log ratio| clamp before every exp (verl SAFETY_BOUND 20); above ~88 exp overflows fp32
    log_ratio_clamp: float = num(20.0, "(0, 80]")
    # advantage estimator (ESTIMATORS: bench/advantages.py): grpo = group-normalized [B]; gae = PPO critic + GAE [B, T]
    advantage: str = "grpo"
    gamma: float = num(1.0, "[0, 1]")  # gae: discount (verl algorithm.gamma)
    lam: float = num(1.0, "[0, 1]")  # gae: GAE lambda (verl algorithm.lam)
    whiten_advantages: bool = True  # gae: whiten advantages over the rollout batch (verl)
    # gae: critic clip range around the old values (verl 0.5)
    value_clip: Optional[float] = num(0.5, "(0, inf)", {None: "an unclipped value loss"})
    critic_lr: float = num(1e-5, "(0, 1]")  # gae: the critic's own AdamW (verl critic.optim.lr)
    critic_path: Optional[str] = None  # gae: null = a copy of the policy backbone; else a model dir / hub id
    # DAPO data-side knobs (bench/dapo.py, bench/sampling.py); clip-higher is clip_eps_high, token-level is loss_agg
    dynamic_sampling: bool = False  # drop groups whose rewards are all equal, refill from further prompts
    # generation rounds per step at most (verl max_num_gen_batches)
    dynamic_sampling_max_rounds: int = num(10, "[1, inf)")
    overlong_filter: bool = False  # truncated responses (no EOS) leave the loss
    overlong_penalty: bool = False  # DAPO soft overlong punishment (Eq. 13) added to the reward
    overlong_buffer_len: int = num(4096, "[0, inf)")  # L_cache of the penalty; L_max is task.max_new_tokens
    overlong_penalty_factor: float = num(1.0, "[0, 100]")

    def check(self) -> None:
        """What the declared domains cannot say: the choices, and the baseline's estimator (the estimator's name is
        checked against its registry in bench/launch/config.py `check_across`)."""
        for key, valid in (("loss_agg", LOSS_AGGS), ("baseline", BASELINES)):
            if getattr(self, key) not in valid:
                raise ValueError(f"algo.{key}={getattr(self, key)!r} is not valid; choose one of: {', '.join(valid)}")
        if self.baseline == "kept" and self.advantage != "grpo":
            raise ValueError(f"algo.baseline=kept re-centres a GRPO group over its kept responses; "
                             f"algo.advantage={self.advantage} has no group baseline (use algo.baseline=all)")
