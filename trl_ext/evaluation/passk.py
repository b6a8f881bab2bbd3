"""pass@N and Best@N from n samples per problem (NLPDL HW3, section 3.3).

pass@N: the probability that at least one of N samples is correct. With n >= N samples of which c are correct,
the unbiased estimator (Chen et al. 2021, https://arxiv.org/abs/2107.03374) is the exact expectation over the
C(n, N) subsets of size N of the samples:

    pass@N = 1 - C(n - c, N) / C(n, N)

Best@N: draw N samples, keep the one with the highest mean token log-probability, score it. With n >= N samples we
report the exact expectation over all C(n, N) subsets, computed by sorting instead of enumerating: rank the samples
by score (highest first; ties keep the earlier sample first, i.e. a stable sort), then the sample at rank i
(0-based) is the pick of a subset exactly when the subset contains it and N - 1 of the n - 1 - i samples ranked
below it:

    Best@N = sum_i correct[rank i] * C(n - 1 - i, N - 1) / C(n, N)

Best@1 is the mean correctness, i.e. pass@1, on the same samples; Best@n is the correctness of the top-ranked
sample. Only N <= n is defined; callers skip larger N.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import comb

DEFAULT_NS = (1, 4, 8, 16)


def _check(n: int, k: int) -> None:
    if k < 1:
        raise ValueError(f"N must be >= 1, got {k}")
    if k > n:
        raise ValueError(f"N={k} exceeds the number of samples n={n}; pass@N / Best@N need N <= n")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem: `1 - C(n - c, k) / C(n, k)`.

    Args:
        n: samples drawn for the problem.
        c: how many of them are correct (0 <= c <= n).
        k: the N of pass@N (1 <= k <= n).

    Returns:
        The probability that a uniformly random k-subset of the n samples holds a correct one.
    """
    _check(n, k)
    if not 0 <= c <= n:
        raise ValueError(f"correct count c={c} must be in [0, n={n}]")
    # Exact integers: C(n, k) overflows floats only for n in the thousands, and the ratio stays exact here.
    return 1.0 - comb(n - c, k) / comb(n, k)


def best_at_k(scores: Sequence[float], correct: Sequence[float], k: int) -> float:
    """Best@k for one problem: expected correctness of the highest-scoring sample of a random k-subset.

    Args:
        scores: `(n,)` the selection score of each sample (mean token log-probability).
        correct: `(n,)` 1.0 / 0.0 correctness (any float score works: the result is its expectation).
        k: the N of Best@N (1 <= k <= n).

    Returns:
        `sum_i correct[rank i] * C(n - 1 - i, k - 1) / C(n, k)` with ranks by descending score, ties broken by the
        earlier sample.
    """
    n = len(scores)
    if len(correct) != n:
        raise ValueError(f"scores has {n} entries but correct has {len(correct)}")
    _check(n, k)
    order = sorted(range(n), key=lambda i: -float(scores[i]))  # stable: equal scores keep sample order
    total = comb(n, k)
    return sum(float(correct[j]) * comb(n - 1 - rank, k - 1) for rank, j in enumerate(order)) / total


def pass_at_n_curve(correct: Sequence[Sequence[float]], ns: Sequence[int] = DEFAULT_NS) -> dict[int, float]:
    """Mean pass@N over problems for each N in `ns` with N <= n.

    Args:
        correct: `(P, n)` per problem, per sample correctness (1.0 / 0.0); every problem needs the same n.
        ns: the N values.

    Returns:
        `{N: mean over problems of pass@N}`.
    """
    n = _common_n(correct)
    counts = [int(round(sum(row))) for row in correct]
    return {k: sum(pass_at_k(n, c, k) for c in counts) / len(counts) for k in ns if k <= n}


def best_at_n_curve(
    scores: Sequence[Sequence[float]], correct: Sequence[Sequence[float]], ns: Sequence[int] = DEFAULT_NS
) -> dict[int, float]:
    """Mean Best@N over problems for each N in `ns` with N <= n (`scores`, `correct`: `(P, n)`)."""
    n = _common_n(correct)
    if len(scores) != len(correct):
        raise ValueError(f"scores has {len(scores)} problems but correct has {len(correct)}")
    pairs = list(zip(scores, correct, strict=True))
    return {k: sum(best_at_k(s, c, k) for s, c in pairs) / len(pairs) for k in ns if k <= n}


def _common_n(correct: Sequence[Sequence[float]]) -> int:
    if not correct:
        raise ValueError("no problems to score")
    sizes = {len(row) for row in correct}
    if len(sizes) != 1:
        raise ValueError(f"every problem needs the same number of samples, got sizes {sorted(sizes)}")
    return sizes.pop()
