"""pass@k and avg@k: the sampled-evaluation metrics the RL-for-math papers report on AIME, AMC and MATH-500.

pass@k is the probability that at least one of k samples is correct. Estimating it as "did any of the
first k samples pass" has high variance and, averaged over problems, is biased; Chen et al. 2021
("Evaluating Large Language Models Trained on Code", arXiv 2107.03374, section 2.1) draw n >= k samples,
count the c correct ones and use the unbiased estimator

    pass@k = 1 - C(n - c, k) / C(n, k)

written as a product so that no huge binomial coefficient is formed (their Figure 3):

    C(n - c, k) / C(n, k) = prod_{i = n - c + 1}^{n} (1 - k / i).

avg@k (also written mean@k) is the mean accuracy over k samples per problem, averaged over problems: the
metric DAPO, DeepScaleR and others give as "avg@32" on AIME. It is pass@1 estimated from k samples.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem from n samples of which c are correct (Chen et al. 2021).

    Examples: pass_at_k(5, 2, 1) = 0.4, pass_at_k(5, 2, 2) = 0.7, pass_at_k(n, 0, k) = 0, and 1.0 whenever
    n - c < k (every k-subset then holds a correct sample).
    """
    n, c, k = _as_int(n, "n"), _as_int(c, "c"), _as_int(k, "k")
    if k < 1:
        raise ValueError(f"pass@k needs k >= 1, got k={k}")
    if n < k:
        raise ValueError(f"pass@{k} needs at least k={k} samples per problem, got n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"the number of correct samples must be in [0, n={n}], got c={c}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_pass_at_k(counts: Iterable[tuple[int, int]], k: int) -> float:
    """pass@k of a benchmark: the mean over problems of pass_at_k(n, c, k), one (n, c) pair per problem."""
    values = [pass_at_k(n, c, k) for n, c in counts]
    if not values:
        raise ValueError("pass@k of an empty benchmark is undefined: no (n, c) pairs given")
    return sum(values) / len(values)


def avg_at_k(correct: Sequence[float | bool]) -> float:
    """avg@k of one problem: the mean correctness of its k samples (each 0/1, or a reward in [0, 1])."""
    if len(correct) == 0:
        raise ValueError("avg@k needs at least one sample, got none")
    return sum(float(x) for x in correct) / len(correct)


def mean_avg_at_k(per_problem: Iterable[Sequence[float | bool]]) -> float:
    """avg@k of a benchmark: the mean over problems of avg_at_k (problems weigh equally)."""
    values = [avg_at_k(samples) for samples in per_problem]
    if not values:
        raise ValueError("avg@k of an empty benchmark is undefined: no problems given")
    return sum(values) / len(values)


def _as_int(value: int, name: str) -> int:
    if isinstance(value, bool) or int(value) != value:
        raise ValueError(f"{name} must be an integer, got {value!r}")
    return int(value)
