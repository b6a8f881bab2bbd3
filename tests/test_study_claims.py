"""`trl_ext.study.claims`: the claim fields a study file may state, the verdicts on hand-computed intervals, and the
power calculation against published sample sizes and a simulation."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from trl_ext.study.claims import Claim, judge, parse_claims, seeds_to_decide

T_975_2 = 4.302652730  # Student t, 97.5% quantile, 2 degrees of freedom (tables)
ARMS, METRICS = ["grpo", "drgrpo"], ["heldout/greedy_accuracy", "heldout/incorrect_length"]
GOOD = dict(claim="c", metric="heldout/incorrect_length", arm="grpo", baseline="drgrpo", direction="greater")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"arm": "ppo"}, "claims[0].arm: 'ppo' is not an arm"),
        ({"baseline": "grpo"}, "arm and baseline are both 'grpo'"),
        ({"metric": "reward"}, "claims[0].metric: 'reward' is not one of the study's metrics"),
        ({"direction": "up"}, "claims[0].direction: 'up'; choose one of greater, less, equivalent"),
        ({"direction": "equivalent"}, "claims[0].margin: an equivalent claim needs the band"),
        ({"margin": -1}, "claims[0].margin: a number >= 0"),
        ({"value": "best"}, "claims[0].value: 'best'; choose one of last, mean"),
        ({"seeds": 5}, "claims[0]: unknown field(s) seeds"),
        ({"claim": ""}, "claims[0].claim: required"),
    ],
)
def test_a_bad_claim_names_its_field(change, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_claims([{**GOOD, **change}], "s.yaml", ARMS, METRICS)


def test_claims_parse_with_their_defaults():
    (claim,) = parse_claims([GOOD], "s.yaml", ARMS, METRICS)
    assert claim == Claim("c", "heldout/incorrect_length", "grpo", "drgrpo", "greater", 0.0, "last")
    assert parse_claims(None, "s.yaml", ARMS, METRICS) == ()


def _claim(direction: str, margin: float = 0.0) -> Claim:
    return Claim("c", "m", "a", "b", direction, margin)


@pytest.mark.parametrize(
    "direction, margin, diffs, verdict",
    [
        # mean 1, sd 0.1: 1 +- 4.3027 * 0.1 / sqrt(3) = [0.752, 1.248]
        ("greater", 0.0, [1.0, 1.1, 0.9], "shown"),
        ("less", 0.0, [1.0, 1.1, 0.9], "refuted"),
        ("greater", 0.95, [1.0, 1.1, 0.9], "cannot tell"),  # it straddles the smallest effect that counts
        ("greater", 0.0, [-1.0, -1.1, -0.9], "refuted"),
        # mean 2, sd 1: [-0.484, 4.484]
        ("greater", 0.0, [1.0, 2.0, 3.0], "cannot tell"),
        # mean 0, sd 0.1: [-0.248, 0.248]
        ("equivalent", 0.5, [0.1, -0.1, 0.0], "shown"),
        ("equivalent", 0.2, [0.1, -0.1, 0.0], "cannot tell"),
        ("equivalent", 0.5, [1.0, 1.1, 0.9], "refuted"),
        ("greater", 0.0, [0.5], "no data"),
    ],
)
def test_verdicts_on_hand_computed_intervals(direction, margin, diffs, verdict):
    out = judge(_claim(direction, margin), diffs)
    assert out["verdict"] == verdict
    if len(diffs) == 3:
        mean, sd = float(np.mean(diffs)), float(np.std(diffs, ddof=1))
        half = T_975_2 * sd / math.sqrt(3)
        assert (out["low"], out["high"]) == pytest.approx((mean - half, mean + half), rel=1e-6)
    assert (out["seeds_to_decide"] is not None) == (verdict == "cannot tell")


@pytest.mark.parametrize("effect, seeds", [(0.5, 34), (0.8, 15), (1.0, 10)])
def test_seeds_to_decide_match_the_published_paired_t_test_sample_sizes(effect, seeds):
    """Paired t-test, two-sided 5%, power 0.8, effect size d = mean / sd: n = 34, 15, 10 (Cohen's tables; G*Power)."""
    assert seeds_to_decide(_claim("greater"), effect, 1.0) == seeds
    assert seeds_to_decide(_claim("greater"), -effect, 1.0) == seeds  # deciding the other way: refuting
    assert seeds_to_decide(_claim("less", 0.5), -(effect + 0.5), 1.0) == seeds  # measured from the margin


def test_equivalence_seeds_agree_with_a_simulation():
    """Inside the band: the n at which both bounds of the 95% interval fall inside +-margin with probability 0.8,
    against 20,000 simulated studies at n - 1 and n (normal differences, mean 0.1, sd 1, margin 0.8)."""
    n = seeds_to_decide(_claim("equivalent", 0.8), 0.1, 1.0)
    rng = np.random.default_rng(0)
    from scipy import stats

    def simulated_power(k: int) -> float:
        d = rng.normal(0.1, 1.0, size=(20000, k))
        half = stats.t.ppf(0.975, k - 1) * d.std(axis=1, ddof=1) / math.sqrt(k)
        return float(np.mean((d.mean(1) - half > -0.8) & (d.mean(1) + half < 0.8)))

    assert 10 < n < 40
    assert simulated_power(n) >= 0.79 and simulated_power(n - 1) < 0.81
