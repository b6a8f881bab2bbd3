"""Fixed completions for timing the training step alone: TRL's `rollout_func` hook returns a seeded batch of prompt
and completion token ids instead of generating, identically for every trainer (benchmarks/bench_trainer.py,
benchmarks/gpu_check.py), and a deterministic reward with spread inside groups."""

from __future__ import annotations

import math
import time

# Countdown's chat prompt is 100-150 tokens; completion lengths log-normal (median 250, sigma 0.75) clipped to
# [16, 1024]: about 3% reach 1024, as truncated Countdown / MATH rollouts do.
PF_PROMPT_TOKENS = (100, 150)
PF_COMPLETION = dict(median=250, sigma=0.75, low=16, high=1024)


def id_reward(completion_ids, **kwargs) -> list[float]:
    """Deterministic reward with spread inside groups, so both trainers do the same non-trivial work."""
    return [float(sum(ids) % 5) / 4 for ids in completion_ids]


def mean_completion_tokens(completion: dict = PF_COMPLETION) -> float:
    """Expected length of a `completion` draw, the mean of a log-normal clipped to `[low, high]`:
    `low P(X < low) + high P(X > high) + median e^(s^2/2) [Phi(b - s) - Phi(a - s)]`, `a = ln(low / median) / s`,
    `b = ln(high / median) / s` (rounding to whole tokens aside)."""
    m, s, low, high = completion["median"], completion["sigma"], completion["low"], completion["high"]
    if s == 0:
        return float(min(max(m, low), high))
    a, b = math.log(low / m) / s, math.log(high / m) / s
    return low * _phi(a) + high * (1 - _phi(b)) + m * math.exp(s * s / 2) * (_phi(b - s) - _phi(a - s))


def _phi(z: float) -> float:
    """The standard normal CDF."""
    return 0.5 * (1 + math.erf(z / math.sqrt(2)))


class FixedRollouts:
    """TRL's `rollout_func`: the `k`-th call returns the `k`-th of a seeded sequence of batches, whatever the trainer.

    Each group (consecutive prompts, TRL repeats every prompt `num_generations` times) gets one prompt of
    `prompt_tokens` (uniform, both ends included) tokens; each completion a length from `completion` (log-normal,
    clipped); token ids uniform over ordinary vocabulary entries, no EOS (so the reward `id_reward` has spread and TRL
    counts the completions as truncated, which changes no loss here). `calls` counts the calls and `seconds` holds
    the wall time of each, so a timed step can say how much of it was the (fixed) rollout.
    """

    def __init__(
        self, vocab_size: int, seed: int = 0, prompt_tokens: tuple[int, int] = PF_PROMPT_TOKENS, completion=None
    ):
        self.vocab_size, self.seed, self.calls = vocab_size, seed, 0
        self.prompt_tokens, self.completion = prompt_tokens, dict(completion or PF_COMPLETION)
        self.seconds: list[float] = []

    def lengths(self, n: int, gen) -> list[int]:
        import torch

        c = self.completion
        draws = torch.exp(torch.randn(n, generator=gen) * c["sigma"]) * c["median"]
        return draws.round().clamp(c["low"], c["high"]).long().tolist()

    def __call__(self, prompts, trainer) -> dict:
        import torch

        start = time.perf_counter()
        gen = torch.Generator().manual_seed(self.seed * 100_003 + self.calls)
        self.calls += 1
        low, high = 1000, min(self.vocab_size, 100_000)  # clear of the special tokens at either end
        prompt_ids, previous = [], None
        for prompt in prompts:
            if prompt != previous:
                length = int(torch.randint(self.prompt_tokens[0], self.prompt_tokens[1] + 1, (1,), generator=gen))
                ids = torch.randint(low, high, (length,), generator=gen).tolist()
            prompt_ids.append(ids)
            previous = prompt
        completion_ids = [
            torch.randint(low, high, (n,), generator=gen).tolist() for n in self.lengths(len(prompts), gen)
        ]
        self.seconds.append(time.perf_counter() - start)
        return {
            "prompt_ids": prompt_ids,
            "completion_ids": completion_ids,
            "logprobs": [[0.0] * len(c) for c in completion_ids],
        }
