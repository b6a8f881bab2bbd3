"""Rewards the random tiny models of the tests can earn, in TRL's protocol: for the expert-iteration runs on the CPU,
and for the two-node study runs (`digit_share`).

`digit_reward(where="any")` is 1.0 when the completion text contains a digit (about half of the tiny engine model's
8-token completions do at the start), `where="first"` when it starts with one (about one in ten). Like trl_ext's
task rewards it reports `rewards/<name>/format_reward` (1.0: any text) and `rewards/<name>/answer_reward` (the
reward) through TRL's `log_metric`, so the validation panels of `trl-ext plot` have them.
"""

from __future__ import annotations


class DigitReward:
    """1.0 for a completion with a digit anywhere (`where="any"`) or first (`where="first"`), else 0.0."""

    def __init__(self, where: str = "any") -> None:
        if where not in ("any", "first"):
            raise ValueError(f"where must be 'any' or 'first', got {where!r}")
        self.where = where
        self.__name__ = f"digit_{where}"

    def score(self, text: str) -> float:
        if self.where == "first":
            return float(text[:1].isdigit())
        return float(any(ch.isdigit() for ch in text))

    def __call__(self, completions, log_metric=None, **kwargs) -> list[float]:
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
        rewards = [self.score(t) for t in texts]
        if log_metric is not None and rewards:
            log_metric(f"rewards/{self.__name__}/format_reward", sum(bool(t) for t in texts) / len(texts))
            log_metric(f"rewards/{self.__name__}/answer_reward", sum(rewards) / len(rewards))
        return rewards


def digit_share(completions, **kwargs) -> list[float]:
    """The share of a completion's characters that are digits: a reward in [0, 1] that differs between most
    completions of a group from the first step on, so GRPO's advantages (and the gradients) are not zero."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [sum(ch.isdigit() for ch in text) / max(len(text), 1) for text in texts]
