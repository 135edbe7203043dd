"""Advantage estimators (bench/advantages.py) and PPO's critic (bench/critic.py) on hand-computed cases.

* Every arm computes the same loss and gradient from per-token advantages [B, T] whose rows are constant as from
  the sequence advantages [B] they repeat: per-token advantages change where the advantage comes from, never
  an arm's correction.
* GAE with the critic's zero-initialised head: V = 0, so with gamma = lambda = 1 the returns are the outcome reward
  on every valid token and the advantages are those returns whitened over the batch (numbers below by hand).
* The critic is a copy of the policy's backbone, trains on its own optimizer, lowers its value loss on a fixed
  batch, never touches the policy, and round-trips through its state dict.
"""

from __future__ import annotations

import math

import re

import pytest
import torch
from omegaconf import OmegaConf

from bench.advantages import GAEAdvantage, GRPOAdvantage, build_estimator
from bench.critic import Critic, token_values
from bench.algo_config import AlgoConfig
from bench.methods.base import Batch, make_method, token_advantages
from bench.registry import METHODS
from bench.methods.ais import ais_alpha
from bench.models.tiny import build_tiny_model
from bench.models.tokenizer import build_char_tokenizer
from bench.rollout.base import Rollout
from bench.train_config import TrainConfig

D = torch.float64


def close(a, b, atol=1e-6):
    torch.testing.assert_close(torch.as_tensor(a, dtype=D), torch.as_tensor(b, dtype=D), atol=atol, rtol=0)


def test_token_advantages_broadcasts_sequence_advantages_and_passes_token_advantages():
    like = torch.zeros(2, 3, dtype=D)
    close(token_advantages(torch.tensor([1.0, -2.0]), like), [[1, 1, 1], [-2, -2, -2]])
    per_token = torch.tensor([[0.5, 1.0, 0.0], [2.0, -1.0, 3.0]])
    close(token_advantages(per_token, like), per_token)
    assert token_advantages(per_token, like).dtype == D
    with pytest.raises(ValueError, match="do not match"):
        token_advantages(torch.zeros(2, 4), like)


# ------------------------------------------------------------------------- every arm: [B] == constant [B, T]
LOLD = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.6, 0.9], [0.4, 0.4, 0.1]], dtype=D))
LMU = torch.log(torch.tensor([[0.25, 0.35, 0.1], [0.4, 0.5, 0.95], [0.45, 0.1, 0.1]], dtype=D))
LTHETA = torch.log(torch.tensor([[0.6, 0.2, 0.3], [0.15, 0.7, 0.85], [0.4, 0.5, 0.2]], dtype=D))
MASK = torch.tensor([[True, True, False], [True, True, True], [True, False, False]])
SEQ_ADV = torch.tensor([1.0, -0.5, 2.0], dtype=D)


def run(name: str, adv: torch.Tensor) -> tuple[float, torch.Tensor, dict]:
    m = make_method(name, kl_ref_beta=0.0)
    lold = LOLD if m.needs_recompute else None
    batch = Batch(lold, LMU, adv, MASK, float(MASK.sum()))
    lt = LTHETA.clone().requires_grad_(True)
    stats = m.prepare(batch)
    loss, metrics = m.loss(lt, batch, stats)
    loss.backward()
    return loss.item(), lt.grad, metrics


@pytest.mark.parametrize("name", METHODS.names())
def test_every_arm_gives_the_same_loss_for_broadcast_per_token_advantages(name):
    loss_seq, grad_seq, met_seq = run(name, SEQ_ADV)
    loss_tok, grad_tok, met_tok = run(name, SEQ_ADV[:, None].expand(3, 3).clone())
    close(loss_tok, loss_seq, atol=1e-12)
    close(grad_tok, grad_seq, atol=1e-12)
    assert met_tok.keys() == met_seq.keys()


def test_ppo_clip_with_per_token_advantages_by_hand():
    """At theta = theta_old every ratio is 1 (nothing clipped): loss = -sum(m * A) / n, dL/dl_t = -A_t m_t / n."""
    adv = torch.tensor([[1.0, -2.0, 9.0], [0.5, 0.0, 3.0], [-1.0, 7.0, 7.0]], dtype=D)
    m = make_method("bf16")
    batch = Batch(LOLD, LMU, adv, MASK, float(MASK.sum()))
    lt = LOLD.clone().requires_grad_(True)
    loss, _ = m.loss(lt, batch, m.prepare(batch))
    loss.backward()
    # valid: 1, -2 | 0.5, 0, 3 | -1  -> sum 1.5 over 6 tokens
    close(loss.item(), -1.5 / 6)
    close(lt.grad, [[-1 / 6, 2 / 6, 0], [-0.5 / 6, 0, -3 / 6], [1 / 6, 0, 0]])


def test_ais_alpha_per_token_generalises_the_sequence_form():
    rho_bar = torch.exp(LOLD - LMU).clamp(max=2.0)
    seq = ais_alpha(rho_bar, SEQ_ADV, MASK)
    tok = ais_alpha(rho_bar, SEQ_ADV[:, None].expand(3, 3), MASK)
    for key in ("alpha", "c_mean", "c_var", "R", "n"):
        close(tok[key], seq[key], atol=1e-12)
    # per-token: c_i = mean_t A_it (rho_bar - 1); a row whose valid advantages are all 0 leaves S
    adv = torch.tensor([[2.0, 0.0, 5.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]], dtype=D)
    out = ais_alpha(rho_bar, adv, MASK)
    c0 = (2.0 * (rho_bar[0, 0] - 1) + 0.0) / 2
    c2 = 1.0 * (rho_bar[2, 0] - 1)
    assert out["n"] == 2.0
    close(out["c_mean"], (c0 + c2) / 2)
    close(out["c_var"], ((c0 - c2) ** 2) / 2)  # Bessel variance of two values


# ------------------------------------------------------------------------------------------ GRPO and GAE
def tiny_policy():
    cfg = OmegaConf.create({"arch": "qwen2", "vocab_size": 128, "hidden_size": 32, "intermediate_size": 64,
                            "num_layers": 2, "num_heads": 2, "num_kv_heads": 1, "max_position_embeddings": 64})
    return build_tiny_model(cfg, build_char_tokenizer(64), seed=0)


def configs(**algo):
    return OmegaConf.structured(AlgoConfig(**algo)), OmegaConf.structured(TrainConfig(group_size=1, batch_size=2))


def rollout_2x3() -> Rollout:
    """Two responses: row 0 has 3 tokens, row 1 has 2 (then padding); prompts of 2 and 1 tokens (left-padded)."""
    return Rollout(prompt_ids=torch.tensor([[1, 10], [0, 1]]), prompt_mask=torch.tensor([[True, True], [False, True]]),
                   response_ids=torch.tensor([[20, 21, 2], [30, 2, 0]]),
                   response_mask=torch.tensor([[True, True, True], [True, True, False]]),
                   logp_mu=torch.zeros(2, 3))


def test_grpo_estimator_is_group_normalized():
    algo, train = configs()
    train.group_size = 2
    adv, metrics = GRPOAdvantage(algo, train).estimate(rollout_2x3(), torch.tensor([1.0, 0.0]))
    close(adv, [0.5 / math.sqrt(0.5), -0.5 / math.sqrt(0.5)], atol=1e-5)  # (R - 0.5) / (std 0.7071 + 1e-6)
    assert metrics == {}


def test_gae_with_a_fresh_critic_whitens_the_outcome_returns():
    """V = 0 (zero head), gamma = lambda = 1: returns = R on every valid token: [1, 1, 1 | 0, 0];
    raw advantages the same; mean 3/5, Bessel variance (3 * 0.16 + 2 * 0.36) / 4 = 0.3."""
    algo, train = configs(advantage="gae")
    est = build_estimator(OmegaConf.create({"algo": algo, "train": train}), tiny_policy())
    assert isinstance(est, GAEAdvantage)
    adv, metrics = est.estimate(rollout_2x3(), torch.tensor([1.0, 0.0]))
    hi, lo = 0.4 / math.sqrt(0.3 + 1e-8), -0.6 / math.sqrt(0.3 + 1e-8)
    close(adv, [[hi, hi, hi], [lo, lo, 0.0]])
    values, returns = est._targets
    close(values, torch.zeros(2, 3))
    close(returns, [[1, 1, 1], [0, 0, 0]])
    close(metrics["critic/returns_mean"], 3 / 5)
    close(metrics["critic/values_mean"], 0.0)


def test_gae_without_whitening_is_returns_minus_values():
    algo, train = configs(advantage="gae", whiten_advantages=False, gamma=0.5, lam=1.0)
    est = build_estimator(OmegaConf.create({"algo": algo, "train": train}), tiny_policy())
    adv, _ = est.estimate(rollout_2x3(), torch.tensor([1.0, 2.0]))
    # V = 0: A_t = G_t = gamma^(steps to the last token) * R: row 0: .25, .5, 1; row 1: 1, 2
    close(adv, [[0.25, 0.5, 1.0], [1.0, 2.0, 0.0]])


def test_critic_copies_the_backbone_trains_alone_and_round_trips():
    policy = tiny_policy()
    algo, train = configs(critic_lr=1e-2, value_clip=None)
    critic = Critic(policy, algo, train)
    for name, p in policy.model.named_parameters():
        torch.testing.assert_close(critic.model.backbone.get_parameter(name), p)
    policy_before = {k: v.clone() for k, v in policy.state_dict().items()}
    rollout = rollout_2x3()
    mask = rollout.response_mask
    returns = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0]])
    old = critic.values(rollout)
    close(old, torch.zeros(2, 3))  # the zero head
    losses = [critic.update(rollout, returns, old, mask, step)["critic/vf_loss"] for step in range(20)]
    assert losses[0] == pytest.approx(0.5 * 5 / 5)  # 0.5 * mean (0 - R)^2 over the 5 valid tokens
    assert losses[-1] < 0.1 * losses[0]
    after = critic.values(rollout)
    assert (after[0, :3] > 0.5).all() and (after[1, :2] < -0.5).all()
    for k, v in policy.state_dict().items():
        torch.testing.assert_close(v, policy_before[k])  # the policy is untouched
    clone = Critic(policy, algo, train)
    clone.load_state_dict(critic.state_dict())
    torch.testing.assert_close(clone.values(rollout), after)
    assert clone.optimizer.state_dict()["state"].keys() == critic.optimizer.state_dict()["state"].keys()


def test_clipped_critic_moves_at_most_the_clip_range_per_batch_on_the_clipped_branch():
    """value_clip = 0.1: once V passes old_V + 0.1 towards R, that token's gradient is 0 (clipfrac > 0)."""
    policy = tiny_policy()
    algo, train = configs(critic_lr=1e-2, value_clip=0.1)
    critic = Critic(policy, algo, train)
    rollout = rollout_2x3()
    old = critic.values(rollout)
    logs = [critic.update(rollout, torch.full((2, 3), 5.0), old, rollout.response_mask, s) for s in range(10)]
    assert logs[0]["critic/vf_clipfrac"] == 0.0 and logs[-1]["critic/vf_clipfrac"] > 0.0


def test_values_are_read_before_each_response_token():
    """V(s_t) is the head on the hidden state of the position before token t, as log-probs are."""
    policy = tiny_policy()
    algo, train = configs()
    critic = Critic(policy, algo, train)
    torch.nn.init.normal_(critic.model.head.weight)
    r = rollout_2x3()
    v = token_values(critic.model, r)
    ids = torch.cat([r.prompt_ids, r.response_ids], 1)
    attn = torch.cat([r.prompt_mask, torch.ones_like(r.response_mask)], 1).long()
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    full = critic.model(input_ids=ids, attention_mask=attn, position_ids=pos)
    close(v, full[:, 1:4], atol=1e-5)  # prompt width 2: positions 1, 2, 3 precede response tokens 0, 1, 2


# ------------------------------------------------------------------------------------------ configuration
@pytest.mark.parametrize("overrides, message", [
    (["algo.advantage=ppo"], "algo.advantage='ppo' is not valid; choose one of: gae, grpo"),
    (["algo.lam=1.5"], "algo.lam=1.5 is out of range; allowed: [0, 1]"),
    (["algo.value_clip=0"], "algo.value_clip=0 is out of range; allowed: (0, inf)"),
    (["algo.critic_lr=0"], "algo.critic_lr=0 is out of range; allowed: (0, 1]"),
    (["train.group_size=1", "train.batch_size=8"], "too small for algo.advantage=grpo"),
    (["algo.advantage=gae", "train.group_size=1", "train.batch_size=8", "algo.dynamic_sampling=true"],
     "algo.dynamic_sampling drops groups"),
    (["algo.overlong_penalty=true", "algo.overlong_buffer_len=64"], "must be <= task.max_new_tokens"),
    (["algo.dynamic_sampling_max_rounds=0"], "algo.dynamic_sampling_max_rounds=0 is out of range; allowed: [1, inf)"),
])
def test_bad_estimator_and_dapo_settings_fail_naming_the_key(tmp_path, overrides, message):
    from bench.launch.config import validate
    from tests.helpers import make_cfg

    with pytest.raises(ValueError, match=re.escape(message)):
        validate(make_cfg(tmp_path, *overrides))


def test_ppo_with_one_response_per_prompt_is_valid(tmp_path):
    from bench.launch.config import validate
    from tests.helpers import make_cfg

    validate(make_cfg(tmp_path, "algo.advantage=gae", "train.group_size=1", "train.batch_size=8"))


def test_a_separate_critic_model_from_a_directory(tmp_path):
    """algo.critic_path: the critic's backbone is that model's (here another random init), not the policy's."""
    other = tiny_policy()
    torch.nn.init.normal_(other.model.norm.weight)  # differs from the policy's
    other.save_pretrained(tmp_path / "critic")
    build_char_tokenizer(64).save_pretrained(tmp_path / "critic")
    algo, train = configs(critic_path=str(tmp_path / "critic"))
    critic = Critic(tiny_policy(), algo, train)
    torch.testing.assert_close(critic.model.backbone.norm.weight, other.model.norm.weight)
    close(critic.values(rollout_2x3()), torch.zeros(2, 3))  # the head still starts at zero


def test_a_critic_from_a_directory_is_put_where_the_policy_is(tmp_path):
    """load_pretrained gives a host model; on a GPU the critic stayed there and its first forward met CUDA token ids.
    The meta device stands in for a GPU (none here): the critic follows the policy to it."""
    from bench.critic import build_value_model

    tiny_policy().save_pretrained(tmp_path / "critic")
    build_char_tokenizer(64).save_pretrained(tmp_path / "critic")
    model = build_value_model(tiny_policy().to("meta"), str(tmp_path / "critic"))
    assert {p.device.type for p in model.parameters()} == {"meta"}


# ------------------------------------------------------------------- DAPO's loss-side knobs, as configuration
def test_clip_higher_as_config():
    """algo.clip_eps_high=0.28: a ratio of 1.25 with A > 0 is inside [0.8, 1.28] (loss -1.25, gradient -1.25);
    with the default 0.2 it is clipped at 1.2 (loss -1.2, gradient 0)."""
    lold = torch.zeros(1, 1, dtype=D)
    lt0 = torch.full((1, 1), math.log(1.25), dtype=D)
    for eps_high, want_loss, want_grad in ((0.28, -1.25, -1.25), (0.2, -1.2, 0.0)):
        m = make_method("bf16", clip_eps_high=eps_high)
        batch = Batch(lold, lold, torch.tensor([1.0], dtype=D), torch.ones(1, 1, dtype=torch.bool), 1.0)
        lt = lt0.clone().requires_grad_(True)
        loss, metrics = m.loss(lt, batch, m.prepare(batch))
        loss.backward()
        close(loss.item(), want_loss)
        close(lt.grad, [[want_grad]])
        assert metrics["clipfrac"] == (1.0 if eps_high == 0.2 else 0.0)


def test_token_level_loss_as_config():
    """Rows of 1 and 3 tokens, A = 2 and 1, ratio 1 (psi = -A): token-mean (DAPO Eq. 12) = -(2 + 3) / 4 = -1.25;
    the per-sequence mean = -(2 + 1) / 2 = -1.5."""
    lold = torch.zeros(2, 3, dtype=D)
    mask = torch.tensor([[True, False, False], [True, True, True]])
    batch = Batch(lold, lold, torch.tensor([2.0, 1.0], dtype=D), mask, 4.0)
    for agg, want in (("token-mean", -1.25), ("seq-mean-token-mean", -1.5)):
        m = make_method("bf16", loss_agg=agg)
        close(m.loss(lold.clone(), batch, m.prepare(batch))[0].item(), want)
