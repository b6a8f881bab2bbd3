"""pass@N / Best@N against brute-force enumeration of every N-subset of the samples."""

from __future__ import annotations

import itertools
import random

import pytest

from trl_ext.evaluation.passk import best_at_k, best_at_n_curve, pass_at_k, pass_at_n_curve


def brute_pass(correct: list[int], k: int) -> float:
    subsets = list(itertools.combinations(range(len(correct)), k))
    return sum(any(correct[i] for i in s) for s in subsets) / len(subsets)


def brute_best(scores: list[float], correct: list[int], k: int) -> float:
    subsets = list(itertools.combinations(range(len(correct)), k))
    # highest score wins; among equal scores the earlier sample (what best_at_k documents)
    picks = [max(s, key=lambda i: (scores[i], -i)) for s in subsets]
    return sum(correct[i] for i in picks) / len(subsets)


@pytest.mark.parametrize(
    "n,c,k,expected",
    [
        (4, 0, 1, 0.0),  # nothing correct
        (4, 4, 4, 1.0),  # everything correct
        (4, 1, 1, 0.25),  # pass@1 = c / n
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (5, 2, 3, 0.9),  # 1 - C(3,3)/C(5,3) = 1 - 1/10
        (16, 1, 16, 1.0),  # N = n: any correct sample -> 1
        (16, 3, 4, 1 - 715 / 1820),  # 1 - C(13,4)/C(16,4)
    ],
)
def test_pass_at_k_hand_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_matches_enumeration():
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 10)
        correct = [int(rng.random() < rng.random()) for _ in range(n)]
        k = rng.randint(1, n)
        assert pass_at_k(n, sum(correct), k) == pytest.approx(brute_pass(correct, k), abs=1e-12)


def test_best_at_k_matches_enumeration_with_ties():
    rng = random.Random(1)
    for _ in range(300):
        n = rng.randint(1, 9)
        # few distinct values so ties occur often: the tie rule must match the enumeration's
        scores = [float(rng.randint(-3, 0)) for _ in range(n)]
        correct = [rng.randint(0, 1) for _ in range(n)]
        k = rng.randint(1, n)
        assert best_at_k(scores, correct, k) == pytest.approx(brute_best(scores, correct, k), abs=1e-12)


def test_best_at_k_hand_example():
    # scores rank the samples 2 > 0 > 3 > 1; only sample 3 is correct.
    scores, correct = [-0.5, -2.0, -0.1, -1.0], [0, 0, 0, 1]
    # N=2: sample 3 is picked only in the subset {1, 3} -> 1 of C(4,2) = 6 subsets
    assert best_at_k(scores, correct, 2) == pytest.approx(1 / 6)
    assert best_at_k(scores, correct, 4) == 0.0  # the top-ranked sample (2) is wrong
    assert best_at_k(scores, correct, 1) == pytest.approx(0.25)  # Best@1 = pass@1 = c/n


def test_best_at_1_equals_pass_at_1_and_curves():
    rng = random.Random(2)
    correct = [[rng.randint(0, 1) for _ in range(8)] for _ in range(20)]
    scores = [[rng.gauss(0, 1) for _ in range(8)] for _ in range(20)]
    passes = pass_at_n_curve(correct)
    bests = best_at_n_curve(scores, correct)
    assert set(passes) == set(bests) == {1, 4, 8}  # N = 16 > n = 8 is skipped
    assert bests[1] == pytest.approx(passes[1])
    assert passes[1] == pytest.approx(sum(map(sum, correct)) / 160)
    for k in (1, 4, 8):
        assert passes[k] == pytest.approx(sum(brute_pass(c, k) for c in correct) / 20)
        assert bests[k] == pytest.approx(sum(brute_best(s, c, k) for s, c in zip(scores, correct, strict=True)) / 20)
    assert passes[1] <= passes[4] <= passes[8]


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="exceeds the number of samples"):
        pass_at_k(4, 1, 8)
    with pytest.raises(ValueError, match="same number of samples"):
        pass_at_n_curve([[1, 0], [1]])
    with pytest.raises(ValueError, match="correct has"):
        best_at_k([0.0, 1.0], [1], 1)
