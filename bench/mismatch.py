"""Rollout/trainer mismatch metrics (docs/arms.md §7), shared by every method and logged every step.

One function, `mismatch_metrics(logp_old, logp_mu, mask)`, so that "kl_k3" or "is_ess" means the same number
for every arm. For bypass arms (naive_ppo_is, ess) the trainer passes log pi_theta in place of log pi_old
(docs/arms.md §7). Everything is computed in fp64 under no_grad and returned as Python floats.

Empty-mask conventions (no valid token / sequence): KLs, chi2, log-prob gaps, log-PPL differences, fractions,
max_prob_diff and prob_diff_mean are 0 (no mismatch observed); ratio mean/max/min and token_mult_prob_error are 1
and ratio_std 0 (the on-policy ratio);
ppl_train, ppl_rollout and ppl_ratio are 1 (exp of an empty mean of log-probs, taken as 0); is_ess is 1 (the
P3O convention for an all-masked batch, docs/arms.md §4.7). Per-sequence perplexities saturate at e^LOG_PPL_CAP.
"""

from __future__ import annotations

import torch

from bench.grpo import safe_log_ratio

#: per-sequence log-perplexity is capped here before exp, so ppl_* stay finite (e^50 ~ 5e21) for any log-probs
LOG_PPL_CAP = 50.0

MISMATCH_KEYS = (
    "mismatch/kl_k1",
    "mismatch/kl_k3",
    "mismatch/kl_k2",
    "mismatch/ppl_train",
    "mismatch/ppl_rollout",
    "mismatch/log_ppl_diff",
    "mismatch/log_ppl_abs_diff",
    "mismatch/log_ppl_diff_max",
    "mismatch/log_ppl_diff_min",
    "mismatch/ppl_ratio",
    "mismatch/chi2_token",
    "mismatch/chi2_seq",
    "mismatch/is_ess",
    "mismatch/ratio_mean",
    "mismatch/ratio_max",
    "mismatch/ratio_min",
    "mismatch/ratio_std",
    "mismatch/ratio_frac_high",
    "mismatch/ratio_frac_low",
    "mismatch/logp_diff_mean",
    "mismatch/logp_diff_max",
    "mismatch/max_prob_diff",
    "mismatch/prob_diff_mean",
    "mismatch/token_mult_prob_error",
    "mismatch/kl_k3_clamped",
    "mismatch/kl_k3_masked",
    "mismatch/kl_k3_unmasked",
)


def sanitize(
    logp: torch.Tensor | None, logp_mu: torch.Tensor, mask: torch.Tensor, *others: torch.Tensor | None
) -> tuple[torch.Tensor, float]:
    """Drop tokens whose log-probs are non-finite from the mask (docs/arms.md §1; FeynRL sanitize_logprobs).

    Returns (clean bool mask, fraction of the originally valid tokens removed), the latter logged by the trainer
    as mismatch/frac_nonfinite_logprob. `logp` (log pi_theta or log pi_old) may be None (bypass arms before the
    trainer forward); extra tensors (e.g. log pi_ref) are checked too.
    """
    mask = mask.bool()
    clean = mask & torch.isfinite(logp_mu)
    for t in (logp, *others):
        if t is not None:
            clean = clean & torch.isfinite(t.detach())
    n_valid = int(mask.sum())
    frac = float((mask & ~clean).sum()) / n_valid if n_valid else 0.0
    return clean, frac


def _seq_means(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-sequence masked means of x [B, T] (0 for empty rows)."""
    return torch.where(mask, x, torch.zeros_like(x)).sum(-1) / mask.sum(-1).clamp(min=1)


@torch.no_grad()
def mismatch_metrics(
    logp_old: torch.Tensor, logp_mu: torch.Tensor, mask: torch.Tensor, cap_C: float = 2.0,  # noqa: N803
    kept: torch.Tensor | None = None,
) -> dict[str, float]:
    """The docs/arms.md §7 table for delta = lold - lmu on valid tokens, rho = exp(LR(delta)).

    The field's other mismatch metrics, each as its framework defines it (docs/arms.md §7):
    token_mult_prob_error = mean exp(|LR(delta)|) (NeMo-RL; >= 1, 1 = no mismatch; NeMo-RL plots a sample above
    1.05); kl_k3_clamped = mean clamp(exp(LR(delta)) - 1 - LR(delta), -10, 10) (miles' train_rollout_kl, the
    "outlier-robust" k3: one token contributes at most 10); prob_diff_mean = mean over responses of
    mean_t (p_old - p_mu) (ROLL's signed train_infer_diff_token_mean; its max is max_prob_diff);
    kl_k3_masked / kl_k3_unmasked = kl_k3's per-token terms averaged over the valid tokens the arm dropped / kept
    (`kept`, the arm's Method.kept_tokens at theta_old: prime-rl's masked/unmasked_mismatch_kl), 0 over an empty
    set; an arm that drops nothing (kept None) has kl_k3_masked 0 and kl_k3_unmasked = kl_k3.

    k1/k2/log-prob gaps and the chi2_seq sequence sum use the raw delta; rho and chi2_token use the
    +-20-clamped delta.

    chi2_token = mean rho^2 - 1 and chi2_seq = mean_i rho_seq,i^2 - 1 are the plain (verl) estimators of
    E_mu[rho^2] - 1 = chi2(pi_old || mu). mean rho^2 is unbiased for E_mu[rho^2], so a finite batch can give a
    negative value (rho = [0.5, 1] gives -0.375): the true chi2 is below that batch's sampling noise, or
    E_mu[rho] < 1. It is logged as is, never clamped at 0 (a clamp would bias step averages upward); the
    self-normalised form N sum rho^2 / (sum rho)^2 - 1 is >= 0 but biased and blind to a uniform shift of rho.

    kl_k3 = mean(rho - delta - 1) with the clamp on rho only (docs/arms.md §7 as written; verl's k3_kl
    clamps nothing): for delta < -20 it is the exact k3 up to e^-20 (1 - delta - 1 + e^delta ~ -delta), for
    delta > 20 it is e^20 - delta - 1, finite and still >= 0 for any delta below e^20 - 1 (~4.9e8). Clamping
    delta in both terms instead would report 19 for every token with delta <= -20, hiding how far mu is off.

    is_ess = (sum w)^2 / (N sum w^2) with w = clamp(rho, 1/C, C), the two-sided clamp of verl before 0.8.0
    (rollout_is_eff_sample_size). verl >= 0.8.0 computes its ESS from min(rho, C) without the lower clamp:
    tokens with rho < 1/C then count with their small weight and its ESS comes out lower than ours when mu
    overshoots pi_old; compare the two only where ratio_frac_low is 0. ratio_std is the population std
    (verl). frac_high: rho > C; frac_low: rho < 1/C. Sequence-level quantities average over sequences with
    at least one valid token. Non-finite log-probs are masked out first (sanitize).
    """
    lold = logp_old.detach().to(torch.float64)
    lmu = logp_mu.detach().to(torch.float64)
    m, _ = sanitize(lold, lmu, mask)
    r = _Masked(m)
    delta = safe_log_ratio(lold, lmu, m, clamp=float("inf"))  # raw delta, 0 off-mask
    kept_m = m if kept is None else m & kept.bool()
    out = _token_metrics(r, lold, lmu, delta, kept_m, cap_C) | _sequence_metrics(r, lold, lmu, delta)
    return {k: out[k] for k in MISMATCH_KEYS}


class _Masked:
    """Reductions over the valid tokens `m` [B, T] (and over the sequences with at least one), in fp64, with the
    empty-mask values of the module docstring."""

    def __init__(self, m: torch.Tensor) -> None:
        self.m = m
        self.n = int(m.sum())
        self.seq = m.sum(-1) > 0
        self.n_seq = int(self.seq.sum())
        self.zero = torch.zeros((), dtype=torch.float64, device=m.device)

    def mean(self, x: torch.Tensor) -> float:
        return float(torch.where(self.m, x, self.zero).sum() / max(self.n, 1))

    def max(self, x: torch.Tensor, empty: float) -> float:
        return float(torch.where(self.m, x, torch.full_like(x, -torch.inf)).max()) if self.n else empty

    def min(self, x: torch.Tensor, empty: float) -> float:
        return float(torch.where(self.m, x, torch.full_like(x, torch.inf)).min()) if self.n else empty

    def mean_seq(self, x: torch.Tensor, empty: float) -> float:
        return float(torch.where(self.seq, x, self.zero).sum() / self.n_seq) if self.n_seq else empty

    def mean_over(self, x: torch.Tensor, where: torch.Tensor) -> float:
        k = int(where.sum())
        return float(torch.where(where, x, self.zero).sum() / k) if k else 0.0


def _token_metrics(r: _Masked, lold: torch.Tensor, lmu: torch.Tensor, delta: torch.Tensor, kept_m: torch.Tensor,
                   cap_C: float) -> dict[str, float]:  # noqa: N803
    """The per-token metrics of `mismatch_metrics`: KLs, chi2_token, ESS, the ratio's statistics, log-prob gaps."""
    n, zero = r.n, r.zero
    delta_c = delta.clamp(-20.0, 20.0)
    rho = torch.exp(delta_c)
    k3_tok = rho - delta - 1.0
    dropped_m = r.m & ~kept_m
    delta_c_k3 = torch.exp(delta_c) - 1.0 - delta_c  # miles: delta clamped in both terms, then the term at +-10
    w = rho.clamp(1.0 / cap_C, cap_C)
    sw = float(torch.where(r.m, w, zero).sum())
    sw2 = float(torch.where(r.m, w * w, zero).sum())
    ratio_mean = r.mean(rho) if n else 1.0
    ratio_var = r.mean((rho - ratio_mean) ** 2)
    return {
        "mismatch/kl_k1": r.mean(-delta),
        "mismatch/kl_k3": r.mean(rho - delta - 1.0),
        "mismatch/kl_k2": r.mean(0.5 * delta * delta),
        "mismatch/chi2_token": r.mean(rho * rho) - 1.0 if n else 0.0,
        "mismatch/is_ess": sw * sw / (n * sw2) if n and sw2 > 0 else 1.0,
        "mismatch/ratio_mean": ratio_mean,
        "mismatch/ratio_max": r.max(rho, 1.0),
        "mismatch/ratio_min": r.min(rho, 1.0),
        "mismatch/ratio_std": ratio_var**0.5,
        "mismatch/ratio_frac_high": r.mean((rho > cap_C).to(torch.float64)),
        "mismatch/ratio_frac_low": r.mean((rho < 1.0 / cap_C).to(torch.float64)),
        "mismatch/logp_diff_mean": r.mean(delta.abs()),
        "mismatch/logp_diff_max": r.max(delta.abs(), 0.0),
        "mismatch/max_prob_diff": r.max((torch.exp(lold) - torch.exp(lmu)).abs(), 0.0),
        "mismatch/token_mult_prob_error": r.mean(torch.exp(delta_c.abs())) if n else 1.0,
        "mismatch/kl_k3_clamped": r.mean(delta_c_k3.clamp(-10.0, 10.0)),
        "mismatch/kl_k3_masked": r.mean_over(k3_tok, dropped_m),
        "mismatch/kl_k3_unmasked": r.mean_over(k3_tok, kept_m),
    }


def _sequence_metrics(r: _Masked, lold: torch.Tensor, lmu: torch.Tensor, delta: torch.Tensor) -> dict[str, float]:
    """The per-sequence metrics of `mismatch_metrics`: perplexities, their log differences, chi2_seq, prob_diff_mean."""
    seq, zero = r.seq, r.zero
    mean_lold = _seq_means(lold, r.m)
    mean_lmu = _seq_means(lmu, r.m)
    lpd = mean_lmu - mean_lold  # per-sequence log-PPL difference log PPL_train - log PPL_rollout
    seq_log_rho = delta.sum(-1).clamp(-20.0, 20.0)  # LR of the raw sequence sum (verl chi2_seq)
    p_diff = torch.exp(torch.where(r.m, lold, zero)) - torch.exp(torch.where(r.m, lmu, zero))
    return {
        "mismatch/ppl_train": r.mean_seq(torch.exp((-mean_lold).clamp(max=LOG_PPL_CAP)), 1.0),
        "mismatch/ppl_rollout": r.mean_seq(torch.exp((-mean_lmu).clamp(max=LOG_PPL_CAP)), 1.0),
        "mismatch/log_ppl_diff": r.mean_seq(lpd, 0.0),
        "mismatch/log_ppl_abs_diff": r.mean_seq(lpd.abs(), 0.0),
        "mismatch/log_ppl_diff_max": float(torch.where(seq, lpd, -torch.inf).max()) if r.n_seq else 0.0,
        "mismatch/log_ppl_diff_min": float(torch.where(seq, lpd, torch.inf).min()) if r.n_seq else 0.0,
        "mismatch/ppl_ratio": r.mean_seq(torch.exp(lpd.clamp(-20.0, 20.0)), 1.0),
        "mismatch/chi2_seq": r.mean_seq(torch.exp(2.0 * seq_log_rho), 1.0) - 1.0,
        "mismatch/prob_diff_mean": r.mean_seq(_seq_means(p_diff, r.m), 0.0),
    }


__all__ = ["MISMATCH_KEYS", "mismatch_metrics", "sanitize"]
