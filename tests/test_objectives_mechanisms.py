"""The published effects of the objective axes, each where it must exist and absent where it must not, in toy
policies small enough to train in seconds; the losses are the project's own (`policy_objective`, `reduce_loss`, the
advantage registry), so the tests test what the trainer computes.

- Reduction (Dr.GRPO, https://arxiv.org/abs/2503.20783): the per-response masked mean gives a response's log-prob
  gradient the weight A / |o|, the constant normaliser A / C, so a long incorrect response is penalised less under
  the masked mean. In a policy whose length is a free choice and whose long responses are more often wrong, the
  incorrect responses end longer under the masked mean; with a reward that ignores length neither reduction moves
  them apart.
- Clip (PPO, https://arxiv.org/abs/1707.06347): with several optimizer steps on one rollout, the clipped surrogate
  stops pushing a sample once its ratio has left [1 - eps, 1 + eps] in its advantage's direction, the unclipped
  ratio never does, so the policy goes further from the one that sampled the rollout; with one step per rollout the
  ratio is 1 and the two objectives train the same parameters bit for bit.
- Std normalisation: dividing by the group's std weights a group with one correct answer in eight (std sqrt(1/8))
  4/sqrt(7) times as much, against a half-correct group (std sqrt(2/7)), as the mean-centred advantage does.

The trained toys use Adam (the recipes' optimizer, betas (0.9, 0.99)): its update does not scale with the gradient,
so the constant normaliser's factor |o| / C does not change the step size and the reductions compare at equal
steps. Every toy draws from seeded generators in float64; assertions are 95% Student-t intervals over 5 seeds
(scipy), paired by seed: the two arms of a seed share the generator's draws.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from outcomes import record_margin
from scipy import stats

from trl_ext.objectives import get_advantage_fn, policy_objective, reduce_loss

SEEDS = range(5)
BETAS = (0.9, 0.99)  # the CPU recipes' adam_beta2
CLIP = dict(epsilon=0.2, epsilon_high=0.2)


def paired_interval(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """Mean of `a - b` and its 95% Student-t interval over the pairs (the mean itself when every pair is equal)."""
    diffs = np.subtract(a, b)
    if np.ptp(diffs) == 0:
        return float(diffs[0]), float(diffs[0]), float(diffs[0])
    low, high = stats.t.interval(0.95, len(diffs) - 1, loc=diffs.mean(), scale=stats.sem(diffs))
    return float(diffs.mean()), float(low), float(high)


# --- reduction: a policy that chooses its length -------------------------------------------------------------------

MAX_LEN = 32  # the budget C of the constant normaliser, four times the start's typical length
START_STOP_LOGIT = -math.log(7)  # stop probability 1/8 at each position: mean length 7.9 tokens
POSITIONS = torch.arange(1, MAX_LEN + 1, dtype=torch.float64)


def falling_accuracy(lengths: torch.Tensor) -> torch.Tensor:
    """P(correct | length): 0.875 at one token, 0.1 at 31, falling by 0.025 a token (long answers more often wrong)."""
    return (0.9 - 0.025 * lengths).clamp(min=0.0)


def flat_accuracy(lengths: torch.Tensor) -> torch.Tensor:
    """P(correct) = 0.5 whatever the length: the control."""
    return torch.full_like(lengths, 0.5)


def length_distribution(stop_logits: torch.Tensor) -> torch.Tensor:
    """`(T,)` P(length = l), l = 1..T: continue at 1..l-1, stop at l (at T the response ends either way)."""
    log_stop, log_go = torch.nn.functional.logsigmoid(stop_logits), torch.nn.functional.logsigmoid(-stop_logits)
    reach = torch.cat([torch.zeros(1, dtype=stop_logits.dtype), torch.cumsum(log_go, 0)[:-1]])  # log P(len >= l)
    return torch.cat([torch.exp(reach[:-1] + log_stop[:-1]), torch.exp(reach[-1:])])


def incorrect_length(stop_logits: torch.Tensor, accuracy) -> float:
    """E[length | incorrect] under the policy, exactly (no sampling)."""
    wrong = length_distribution(stop_logits) * (1 - accuracy(POSITIONS))
    return float((wrong * POSITIONS).sum() / wrong.sum())


def train_length_policy(reduction: str, accuracy, seed: int, steps: int = 200, lr: float = 0.02) -> torch.Tensor:
    """GRPO on a policy that is one stop logit per position: 16 prompts x 8 responses a step, reward 1 when correct
    (drawn with `accuracy(length)`), A = r - mean (Dr.GRPO's advantage, so only the reduction differs), the clipped
    surrogate on-policy, the reduction `reduction` (C = MAX_LEN), Adam. Returns the trained `(T,)` stop logits."""
    generator = torch.Generator().manual_seed(seed)
    stop_logits = torch.full((MAX_LEN,), START_STOP_LOGIT, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.Adam([stop_logits], lr=lr, betas=BETAS)
    advantage = get_advantage_fn("group_mean")
    for _ in range(steps):
        with torch.no_grad():
            stops = torch.rand(128, MAX_LEN, generator=generator, dtype=torch.float64) < torch.sigmoid(stop_logits)
            stops[:, -1] = True
            lengths = stops.double().argmax(1) + 1.0  # (B,), float
            rewards = (torch.rand(128, generator=generator, dtype=torch.float64) < accuracy(lengths)).double()
        mask = (POSITIONS <= lengths[:, None]).double()  # (B, T)
        log_stop = torch.nn.functional.logsigmoid(stop_logits).expand_as(mask)
        log_go = torch.nn.functional.logsigmoid(-stop_logits).expand_as(mask)
        log_probs = torch.where(POSITIONS == lengths[:, None], log_stop, log_go)  # (B, T)
        advantages = advantage(rewards, 8).unsqueeze(-1)  # (B, 1)
        per_token, _ = policy_objective("grpo_clip", log_probs, log_probs.detach(), advantages, mask, **CLIP)
        loss = reduce_loss(per_token, mask, reduction, normalize_constant=float(MAX_LEN))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return stop_logits.detach()


def incorrect_lengths(accuracy) -> dict[str, list[float]]:
    return {
        reduction: [incorrect_length(train_length_policy(reduction, accuracy, seed), accuracy) for seed in SEEDS]
        for reduction in ("masked_mean", "masked_normalize")
    }


def length_ranges(lengths: dict[str, list[float]]) -> dict[str, float]:
    """The lowest and highest seed of each reduction, for `record_margin`."""
    return {f"{name}_{end}": f(values) for name, values in lengths.items() for end, f in (("min", min), ("max", max))}


def test_masked_mean_leaves_incorrect_responses_longer_than_the_constant_normaliser():
    """Correctness falls with length, so training shortens every response (incorrect ones start at 12.0 tokens);
    the masked mean, weighting a long wrong answer's tokens by 1 / |o| instead of 1 / C, shortens the incorrect ones
    less. Measured: 2.70-3.07 tokens against 1.73-2.01, the difference 1.05 [0.97, 1.13]."""
    start = incorrect_length(torch.full((MAX_LEN,), START_STOP_LOGIT, dtype=torch.float64), falling_accuracy)
    geometric = [(1 / 8) * (7 / 8) ** (n - 1) for n in range(1, MAX_LEN)] + [(7 / 8) ** (MAX_LEN - 1)]
    wrong = [p * (1 - max(0.9 - 0.025 * n, 0.0)) for n, p in enumerate(geometric, start=1)]
    assert start == pytest.approx(sum(n * w for n, w in enumerate(wrong, start=1)) / sum(wrong), rel=1e-12)
    lengths = incorrect_lengths(falling_accuracy)
    mean, low, high = paired_interval(lengths["masked_mean"], lengths["masked_normalize"])
    record_margin("masked_mean_incorrect_longer", diff=mean, low=low, high=high, **length_ranges(lengths))
    assert low > 0.5, (lengths, mean, low, high)
    assert max(lengths["masked_normalize"]) < 4 and max(lengths["masked_mean"]) < start / 2  # both did shorten


def test_length_independent_reward_moves_neither_reduction():
    """The control: with P(correct) = 0.5 at every length, E[A | response] = 0, so neither reduction has a direction
    to push the length in; the two stay within noise of each other and of the start (7.9 tokens). Measured:
    difference -0.05 [-0.28, 0.18] tokens, every seed's length within 6.9-8.3."""
    lengths = incorrect_lengths(flat_accuracy)
    mean, low, high = paired_interval(lengths["masked_mean"], lengths["masked_normalize"])
    record_margin("flat_reward_no_length_drift", diff=mean, low=low, high=high, **length_ranges(lengths))
    assert low < 0 < high and high - low < 1.0, (lengths, mean, low, high)
    start = incorrect_length(torch.full((MAX_LEN,), START_STOP_LOGIT, dtype=torch.float64), flat_accuracy)
    for reduction, values in lengths.items():
        assert abs(np.mean(values) - start) < 1.0, (reduction, values, start)


# --- clip: several optimizer steps on one rollout ------------------------------------------------------------------

PROMPTS, ACTIONS, GROUP = 16, 6, 8
ROWS = torch.arange(PROMPTS).repeat_interleave(GROUP)  # the prompt of each sample, groups contiguous


def train_bandit(pg_loss_type: str, seed: int, rollouts: int, steps_per_rollout: int, lr: float = 0.02):
    """GRPO on a softmax policy over 6 answers for each of 16 prompts (one answer correct, seeded start logits):
    each rollout 8 answers per prompt from the current policy, reward 1 when correct, group mean / std advantages
    (eps 1e-6), `steps_per_rollout` full-batch Adam steps of `pg_loss_type` on it (epsilon 0.2), masked mean.

    Returns:
        (final `(P, K)` logits, KL(sampling policy || final policy) of the last rollout's prompts (mean over
        prompts), the largest |log ratio| of that rollout's samples with a nonzero advantage).
    """
    generator = torch.Generator().manual_seed(seed)
    logits = (0.5 * torch.randn(PROMPTS, ACTIONS, generator=generator, dtype=torch.float64)).requires_grad_()
    correct = torch.randint(ACTIONS, (PROMPTS,), generator=generator)
    optimizer = torch.optim.Adam([logits], lr=lr, betas=BETAS)
    advantage = get_advantage_fn("group_mean_std")
    kwargs = CLIP if pg_loss_type == "grpo_clip" else {}
    for _ in range(rollouts):
        sampling = torch.log_softmax(logits, -1).detach()  # (P, K)
        answers = torch.multinomial(sampling.exp(), GROUP, replacement=True, generator=generator).reshape(-1)
        rewards = (answers == correct[ROWS]).double()  # (B,)
        old_log_probs = sampling[ROWS, answers].unsqueeze(-1)  # (B, 1): one token per answer
        advantages = advantage(rewards, GROUP, advantage_eps=1e-6).unsqueeze(-1)  # (B, 1)
        mask = torch.ones_like(old_log_probs)
        for _ in range(steps_per_rollout):
            log_probs = torch.log_softmax(logits, -1)[ROWS, answers].unsqueeze(-1)
            per_token, _ = policy_objective(pg_loss_type, log_probs, old_log_probs, advantages, mask, **kwargs)
            loss = reduce_loss(per_token, mask, "masked_mean")
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        final = torch.log_softmax(logits, -1)
        kl = float((sampling.exp() * (sampling - final)).sum(-1).mean())
        log_ratio = (final - sampling)[ROWS, answers][advantages.squeeze(-1) != 0]
    return logits.detach(), kl, float(log_ratio.abs().max())


def test_without_the_clip_off_policy_steps_leave_the_trust_region_the_clip_holds():
    """32 Adam steps on one rollout: the clipped surrogate stops pushing a sample once its ratio has left
    [0.8, 1.2] in its advantage's direction (it still moves through the softmax's coupling and Adam's momentum);
    the unclipped ratio's push grows with the ratio. Measured: KL 0.034-0.045 with the clip, 0.077-0.117 without
    (2.3x to 2.9x); largest |log ratio| 0.53-0.65 against 1.07-1.22, the difference 0.56 [0.43, 0.69]."""
    clipped = [train_bandit("grpo_clip", seed, rollouts=1, steps_per_rollout=32)[1:] for seed in SEEDS]
    unclipped = [train_bandit("grpo_no_clip", seed, rollouts=1, steps_per_rollout=32)[1:] for seed in SEEDS]
    kl_ratio = [u[0] / c[0] for u, c in zip(unclipped, clipped, strict=True)]
    mean, low, high = paired_interval([u[1] for u in unclipped], [c[1] for c in clipped])
    record_margin("clip_trust_region", log_ratio_diff=mean, low=low, high=high, min_kl_ratio=min(kl_ratio))
    assert low > 0.3, (clipped, unclipped)
    assert min(kl_ratio) > 1.5, (clipped, unclipped)


def test_on_policy_the_clip_changes_nothing():
    """The control: one optimizer step per rollout, so the ratio is exactly 1 where the loss is evaluated and the
    clip never acts; 40 rollouts of each objective end in the same parameters bit for bit."""
    clipped = train_bandit("grpo_clip", 0, rollouts=40, steps_per_rollout=1)[0]
    unclipped = train_bandit("grpo_no_clip", 0, rollouts=40, steps_per_rollout=1)[0]
    start = 0.5 * torch.randn(PROMPTS, ACTIONS, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert (clipped - start).abs().max() > 0.3  # it trained
    assert torch.equal(clipped, unclipped)


# --- std normalisation: constructed groups -------------------------------------------------------------------------


def test_std_normalisation_up_weights_a_group_with_one_correct_answer_in_many():
    """Three groups of 8 with 1, 4 and 7 correct answers, every response 5 tokens. A group's weight in the gradient
    is the sum over its responses of |d loss / d log-prob| (clipped surrogate on-policy, masked mean), i.e.
    sum |A| / B. Mean-centred: 1.75, 4, 1.75 (over B = 24). Divided by the std (sqrt(1/8), sqrt(2/7), sqrt(1/8)):
    1.75 sqrt(8) = 4.950, 4 sqrt(7/2) = 7.483, 4.950. So the lone-correct (and lone-wrong) group gains 4/sqrt(7) =
    1.512 against the balanced one."""
    rewards = torch.tensor([1.0] + [0.0] * 7 + [1.0] * 4 + [0.0] * 4 + [1.0] * 7 + [0.0], dtype=torch.float64)
    mask = torch.ones(24, 5, dtype=torch.float64)

    def group_weights(advantage_type: str, **params) -> torch.Tensor:
        advantages = get_advantage_fn(advantage_type)(rewards, 8, **params).unsqueeze(-1)
        log_probs = torch.full((24, 5), -1.0, dtype=torch.float64, requires_grad=True)
        per_token, _ = policy_objective("grpo_clip", log_probs, log_probs.detach(), advantages, mask, **CLIP)
        reduce_loss(per_token, mask, "masked_mean").backward()
        return log_probs.grad.sum(-1).abs().view(3, 8).sum(-1) * 24  # (3,) sum over a group of |A|

    plain = group_weights("group_mean")
    scaled = group_weights("group_mean_std", advantage_eps=1e-6)
    assert plain.tolist() == pytest.approx([1.75, 4.0, 1.75], rel=1e-12)
    root8, root72 = math.sqrt(8), math.sqrt(7 / 2)
    expected = [1.75 / (1 / root8 + 1e-6), 4 / (1 / root72 + 1e-6), 1.75 / (1 / root8 + 1e-6)]
    assert scaled.tolist() == pytest.approx(expected, rel=1e-12)
    assert expected[0] == pytest.approx(4.9497, abs=1e-4) and expected[1] == pytest.approx(7.4833, abs=1e-4)
    gain = (scaled[0] / scaled[1]) / (plain[0] / plain[1])
    assert float(gain) == pytest.approx(4 / math.sqrt(7), rel=1e-5)  # 1.512; eps shifts it by 1e-6
