"""Reward shaping terms added to a task reward: DAPO's soft overlong punishment (registry name `soft_overlong`).

DAPO (https://arxiv.org/abs/2503.14476, Eq. 13) penalises length only inside a buffer before the generation cap,
so a truncated answer costs more than a long finished one without rewarding brevity elsewhere:

    r(L) = 0                                    L <= L_max - L_buffer
         = -penalty * (L - (L_max - L_buffer)) / L_buffer      L_max - L_buffer < L <= L_max
         = -penalty                             L > L_max

with `L` the completion's token count (TRL passes `completion_ids` to reward functions). TRL's
`trl.rewards.get_soft_overlong_punishment(L_max, L_buffer)` and verl's `reward_model.overlong_buffer`
(`len`, `penalty_factor`) compute the same function. In a recipe:

    reward_funcs: [countdown, "soft_overlong(max_length=1024, buffer_length=256)"]

A shaping reward carries `shaping = True`: dynamic sampling judges a group by the other rewards only (DAPO filters
on accuracy), see `trl_ext.grpo.rollouts.dynamic_sampling`.
"""

from __future__ import annotations

__all__ = ["SoftOverlong", "soft_overlong_penalty"]


def soft_overlong_penalty(length: int, max_length: int, buffer_length: int, penalty: float = 1.0) -> float:
    """DAPO's soft overlong punishment of a completion of `length` tokens (module docstring: the formula)."""
    start = max_length - buffer_length
    if length <= start:
        return 0.0
    if length > max_length:
        return -penalty
    return -penalty * (length - start) / buffer_length


class SoftOverlong:
    """Soft overlong punishment as a TRL reward function: `f(completion_ids, **columns) -> list[float]`.

    Picklable, with a fixed `__name__` (TRL logs it as `rewards/soft_overlong/mean`).

    Args:
        max_length: `L_max`, normally the recipe's `max_completion_length` (it may not exceed it: the ramp would be
            cut short; `check_config` says so at recipe parse time).
        buffer_length: `L_buffer` (DAPO: 4096 of 20480), 1 <= buffer_length <= max_length.
        penalty: the reward at and beyond `L_max` is `-penalty` (verl's `penalty_factor`).
    """

    __name__ = "soft_overlong"
    shaping = True

    def __init__(self, max_length: int, buffer_length: int, penalty: float = 1.0) -> None:
        for name, value in (("max_length", max_length), ("buffer_length", buffer_length)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"soft_overlong: {name}={value!r} must be a positive integer (tokens)")
        if buffer_length > max_length:
            raise ValueError(f"soft_overlong: buffer_length={buffer_length} must be <= max_length={max_length}")
        if isinstance(penalty, bool) or not isinstance(penalty, int | float) or not penalty >= 0:
            raise ValueError(f"soft_overlong: penalty={penalty!r} must be a number >= 0")
        self.max_length, self.buffer_length, self.penalty = max_length, buffer_length, float(penalty)

    def __call__(self, completions=None, completion_ids=None, **columns) -> list[float]:
        if completion_ids is None:
            raise ValueError("soft_overlong needs `completion_ids` (the completions' token ids; TRL passes them)")
        return [
            soft_overlong_penalty(len(ids), self.max_length, self.buffer_length, self.penalty)
            for ids in completion_ids
        ]

    def check_config(self, config) -> None:
        """Refuse a `max_length` beyond the config's `max_completion_length` (the penalty could not reach -penalty)."""
        limit = getattr(config, "max_completion_length", None)
        if limit is not None and self.max_length > limit:
            raise ValueError(
                f"soft_overlong: max_length={self.max_length} exceeds max_completion_length={limit}, so completions "
                f"never reach the full penalty; set max_length={limit} (DAPO's L_max is the generation cap)"
            )

    def __repr__(self) -> str:
        return (
            f"SoftOverlong(max_length={self.max_length}, buffer_length={self.buffer_length}, penalty={self.penalty})"
        )
