"""Verified rewards for Countdown, GSM8K and MATH, in plain form and in TRL's reward-function protocol.

Light to import (stdlib only; math-verify loads in a child process on the first symbolic comparison):

    from trl_ext.rewards import countdown_reward, r1_zero_reward
    trainer = trl.GRPOTrainer(model, reward_funcs=[countdown_reward], train_dataset=dataset, ...)

The plain functions (`countdown_reward_fn`, `r1_zero_reward_fn`, ...) score one `(text, ground_truth)` pair; the
TRL-protocol callables score a batch from the dataset's columns. Training reward and evaluation metric are the same
functions.
"""

from __future__ import annotations

from trl_ext.rewards.countdown import (
    countdown_reward_components,
    countdown_reward_fn,
    evaluate_equation,
    extract_answer,
    validate_numbers,
)
from trl_ext.rewards.math import (
    extract_boxed,
    extract_gsm8k_answer,
    grade,
    normalize_answer,
    question_only_reward_fn,
    r1_zero_reward_fn,
)
from trl_ext.rewards.trl_rewards import CountdownReward, MathReward, completion_text

countdown_reward = CountdownReward()
r1_zero_reward = MathReward("r1_zero")
question_only_reward = MathReward("question_only")

REWARD_FUNCS = {
    "countdown": countdown_reward,
    "countdown_all_numbers": CountdownReward(require_all=True),
    "r1_zero": r1_zero_reward,
    "question_only": question_only_reward,
}


def get_reward_funcs(names: str | list[str]) -> list:
    """The TRL-protocol reward callables for registry names (a comma-separated string or a list).

    Raises:
        ValueError: for an unknown name, listing the valid ones.
    """
    if isinstance(names, str):
        names = [name.strip() for name in names.split(",") if name.strip()]
    unknown = [name for name in names if name not in REWARD_FUNCS]
    if unknown or not names:
        raise ValueError(f"unknown reward function(s) {unknown or names!r}; valid: {sorted(REWARD_FUNCS)}")
    return [REWARD_FUNCS[name] for name in names]


__all__ = [
    "REWARD_FUNCS",
    "CountdownReward",
    "MathReward",
    "completion_text",
    "countdown_reward",
    "countdown_reward_components",
    "countdown_reward_fn",
    "evaluate_equation",
    "extract_answer",
    "extract_boxed",
    "extract_gsm8k_answer",
    "get_reward_funcs",
    "grade",
    "normalize_answer",
    "question_only_reward",
    "question_only_reward_fn",
    "r1_zero_reward",
    "r1_zero_reward_fn",
    "validate_numbers",
]
