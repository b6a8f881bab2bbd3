"""Advantage axis: every registered estimator and both aggregations against a plain-Python loop and hand numbers.

Each loop reference is written from the estimator's published formula (verl's `core_algos.py` for rloo, opo,
reinforce_pp, passk; TRL 1.16's `_generate_and_score_completions` for group_mean_std, batch_std and GDPO), with
`statistics` for means and Bessel-corrected stds, never with the functions under test.
"""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from trl_ext.objectives import ADVANTAGE_TYPES, ADVANTAGES, compute_advantages

NAN = math.nan
EPS = 1e-6


def _groups(rewards, group_size):
    return [rewards[i : i + group_size] for i in range(0, len(rewards), group_size)]


def loop_advantages(name, rewards, group_size, eps, lengths):
    """Reference advantages from Python floats; NaN rewards are unscorable (left out, advantage 0)."""
    scored_all = [r for r in rewards if not math.isnan(r)]
    out = []
    centred_all, weights_all = [], []
    for g, group in enumerate(_groups(rewards, group_size)):
        idx = [i for i, r in enumerate(group) if not math.isnan(r)]
        vals = [group[i] for i in idx]
        n = len(vals)
        mean = statistics.fmean(vals) if vals else 0.0
        std = statistics.stdev(vals) if n > 1 else math.nan
        tied = n > 0 and max(vals) == min(vals)
        lens = [lengths[g * group_size + i] for i in idx]
        adv = [0.0] * group_size
        for j, i in enumerate(idx):
            r = group[i]
            centred = 0.0 if tied else r - mean
            if name == "raw":
                a = r
            elif name == "group_mean":
                a = centred
            elif name == "group_mean_std":
                a = centred / (std + eps) if n > 1 else 0.0
            elif name == "batch_std":
                a = centred / (statistics.stdev(scored_all) + eps)
            elif name == "rloo":  # r_i minus the mean of the other members
                a = 0.0 if tied or n < 2 else r - sum(v for k, v in enumerate(vals) if k != j) / (n - 1)
            elif name == "opo":
                baseline = sum(ln * v for ln, v in zip(lens, vals, strict=True)) / sum(lens)
                a = 0.0 if tied else r - baseline
            elif name == "passk":
                order = sorted(range(n), key=lambda k: -vals[k])
                best, second = vals[order[0]], vals[order[1]]
                a = (best - second) / (std + eps) if j == order[0] and best > second else 0.0
            elif name == "reinforce_pp":
                a = None
                centred_all.append(centred)
                weights_all.append(lens[j])
            adv[i] = a
        out.extend(adv)
    if name == "reinforce_pp":  # token-weighted whitening over the batch (verl masked_whiten, Bessel over tokens)
        total = sum(weights_all)
        m = sum(w * c for w, c in zip(weights_all, centred_all, strict=True)) / total
        var = sum(w * (c - m) ** 2 for w, c in zip(weights_all, centred_all, strict=True)) / (total - 1)
        it = iter(centred_all)
        out = [0.0 if a is None and math.isnan(r) else (next(it) - m) / math.sqrt(var + eps) if a is None else a
               for a, r in zip(out, rewards, strict=True)]  # fmt: skip
    return [0.0 if math.isnan(r) else a for a, r in zip(out, rewards, strict=True)]


def random_case(seed, groups=5, group_size=4):
    gen = torch.Generator().manual_seed(seed)
    rewards = (torch.randint(0, 5, (groups * group_size,), generator=gen) / 4).double()  # ties within groups occur
    rewards[:group_size] = 0.5  # one all-equal group
    rewards[group_size + 1] = NAN  # one unscorable completion
    lengths = torch.randint(1, 9, (groups * group_size,), generator=gen)
    return rewards, lengths


@pytest.mark.parametrize("name", ADVANTAGE_TYPES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_estimator_matches_loop(name, seed):
    rewards, lengths = random_case(seed)
    got = ADVANTAGES.call(name, rewards=rewards, group_size=4, advantage_eps=EPS, lengths=lengths)
    want = loop_advantages(name, rewards.tolist(), 4, EPS, lengths.tolist())
    assert got.shape == rewards.shape and torch.isfinite(got).all()
    assert torch.allclose(got, torch.tensor(want, dtype=torch.float64), rtol=1e-10, atol=1e-12)
    assert got[5] == 0.0  # the unscorable completion


def test_estimators_by_hand():
    # One group (1, 0, 0, 1), lengths (1, 1, 1, 3): mean 0.5, unbiased std sqrt(1/3).
    r = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    lengths = torch.tensor([1, 1, 1, 3])
    s = math.sqrt(1 / 3)

    def adv(name):
        return ADVANTAGES.call(name, rewards=r, group_size=4, advantage_eps=0.0, lengths=lengths).tolist()

    assert adv("raw") == [1.0, 0.0, 0.0, 1.0]
    assert adv("group_mean") == [0.5, -0.5, -0.5, 0.5]
    assert adv("group_mean_std") == pytest.approx([0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s])
    assert adv("rloo") == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])  # 1 - 1/3, 0 - 2/3
    # OPO baseline: (1*1 + 3*1) / (1+1+1+3) = 2/3
    assert adv("opo") == pytest.approx([1 / 3, -2 / 3, -2 / 3, 1 / 3])
    # pass@k: the best (a tie 1 vs 1) has no margin over the runner-up
    assert adv("passk") == [0.0, 0.0, 0.0, 0.0]
    r2 = torch.tensor([1.0, 0.5, 0.0, 0.0], dtype=torch.float64)
    top = ADVANTAGES.call("passk", rewards=r2, group_size=4, advantage_eps=0.0).tolist()
    assert top == pytest.approx([0.5 / statistics.stdev([1, 0.5, 0, 0]), 0.0, 0.0, 0.0])
    # batch_std on two groups: the scale is the std of all four rewards, not of each group
    r3 = torch.tensor([1.0, 0.0, 3.0, 1.0], dtype=torch.float64)
    got = ADVANTAGES.call("batch_std", rewards=r3, group_size=2, advantage_eps=0.0).tolist()
    assert got == pytest.approx([x / statistics.stdev([1, 0, 3, 1]) for x in (0.5, -0.5, 1.0, -1.0)])


def test_reinforce_pp_whitens_over_tokens():
    # Centred rewards (0.5, -0.5, -0.5, 0.5) weighted by lengths (1, 1, 1, 3): token mean 1/6, token var over 6
    # tokens with Bessel's correction; verl gets the same by whitening the (B, T) broadcast tensor.
    r = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    tokens = [0.5, -0.5, -0.5, 0.5, 0.5, 0.5]
    m, var = statistics.fmean(tokens), statistics.variance(tokens)
    got = ADVANTAGES.call(
        "reinforce_pp", rewards=r, group_size=4, advantage_eps=0.0, lengths=torch.tensor([1, 1, 1, 3])
    )
    want = [(c - m) / math.sqrt(var) for c in (0.5, -0.5, -0.5, 0.5)]
    assert got.tolist() == pytest.approx(want)
    assert got.tolist() != pytest.approx([1.0, -1.0, -1.0, 1.0])  # not the unweighted whitening


@pytest.mark.parametrize("name", ["group_mean", "group_mean_std", "batch_std", "rloo", "opo"])
def test_all_equal_group_gives_exactly_zero(name):
    # Eight float32 0.1s average to 0.1 - 7.5e-9; with eps 1e-6 a missing tie check would give -0.0074 each.
    rewards = torch.full((16,), 0.1)
    rewards[8:] = torch.linspace(0, 1, 8)
    got = ADVANTAGES.call(name, rewards=rewards, group_size=8, advantage_eps=EPS, lengths=torch.arange(1, 17))
    assert torch.equal(got[:8], torch.zeros(8))
    assert got[8:].abs().max() > 0.1


def test_single_scored_member_and_group_of_one_give_zero():
    rewards = torch.tensor([NAN, 0.7, NAN, NAN, 0.2, 0.9, 0.1, 0.4])
    for name in ADVANTAGE_TYPES:
        got = ADVANTAGES.call(name, rewards=rewards, group_size=4, advantage_eps=EPS, lengths=torch.ones(8))
        assert torch.isfinite(got).all(), name
        if name not in ("raw", "reinforce_pp"):  # reinforce_pp shifts by the batch mean; raw is r itself
            assert got[:4].tolist() == [0.0] * 4, name
    one = ADVANTAGES.call("group_mean_std", rewards=torch.tensor([0.3, 0.8]), group_size=1, advantage_eps=EPS)
    assert one.tolist() == [0.0, 0.0]  # eval with num_generations_eval=1: no std, no signal


def test_registry_names_declared_inputs_and_errors():
    assert ADVANTAGE_TYPES == (
        "raw", "group_mean", "group_mean_std", "batch_std", "rloo", "opo", "reinforce_pp", "passk",
    )  # fmt: skip
    uses_eps = {name for name in ADVANTAGE_TYPES if "advantage_eps" in ADVANTAGES.parameters(name)}
    assert uses_eps == {"group_mean_std", "batch_std", "reinforce_pp", "passk"}  # the config rejects eps elsewhere
    assert {name for name in ADVANTAGE_TYPES if "lengths" in ADVANTAGES.parameters(name)} == {"opo", "reinforce_pp"}
    with pytest.raises(ValueError, match="unknown advantage_type 'std_only'; valid names: raw, group_mean"):
        ADVANTAGES.lookup("std_only")
    with pytest.raises(ValueError, match=r"\(6\) is not divisible by group_size \(4\)"):
        ADVANTAGES.call("rloo", rewards=torch.zeros(6), group_size=4)


def test_sum_then_normalize_weights_and_ignores_none():
    # Two functions; weights (1, 2); row 1 has one None (NaN), row 3 has both (unscorable -> advantage 0).
    per_func = torch.tensor([[1.0, 0.0], [NAN, 1.0], [0.0, 0.0], [NAN, NAN]], dtype=torch.float64)
    got = compute_advantages(per_func, torch.tensor([1.0, 2.0]), 4, "group_mean")
    summed = [1.0, 2.0, 0.0]  # rows 0-2; row 3 leaves the group
    mean = statistics.fmean(summed)
    assert got.tolist() == pytest.approx([s - mean for s in summed] + [0.0])


def loop_gdpo(per_func, weights, group_size, eps):
    """TRL 1.16's normalize_then_sum, from Python floats (NaN-free input)."""
    k = len(weights)
    z = [[0.0] * k for _ in per_func]
    for start in range(0, len(per_func), group_size):
        rows = range(start, start + group_size)
        for f in range(k):
            vals = [per_func[i][f] for i in rows]
            m, s = statistics.fmean(vals), statistics.stdev(vals)
            for i in rows:
                z[i][f] = (per_func[i][f] - m) / (s + eps)
    summed = [sum(w * v for w, v in zip(weights, row, strict=True)) for row in z]
    m, s = statistics.fmean(summed), statistics.stdev(summed)
    return [(v - m) / (s + eps) for v in summed]


def test_normalize_then_sum_matches_loop():
    gen = torch.Generator().manual_seed(3)
    per_func = torch.rand(12, 3, generator=gen, dtype=torch.float64)
    weights = torch.tensor([1.0, 0.5, 2.0], dtype=torch.float64)
    got = compute_advantages(per_func, weights, 4, None, "normalize_then_sum", advantage_eps=1e-4)
    want = loop_gdpo(per_func.tolist(), weights.tolist(), 4, 1e-4)
    assert torch.allclose(got, torch.tensor(want, dtype=torch.float64), rtol=1e-10, atol=1e-12)
