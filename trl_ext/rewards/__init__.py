"""Verified rewards for Countdown, GSM8K and MATH, in plain form and in TRL's reward-function protocol.

Light to import (stdlib only; math-verify loads in a child process on the first symbolic comparison):

    from trl_ext.rewards import countdown_reward, r1_zero_reward
    trainer = trl.GRPOTrainer(model, reward_funcs=[countdown_reward], train_dataset=dataset, ...)

Recipes name rewards by registry name, with keyword arguments for parameterised ones
(`soft_overlong(max_length=1024, buffer_length=256)`, `trl_ext.rewards.shaping`), or by import path
(`my_pkg.rewards:my_reward`): `get_reward_funcs`.

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
from trl_ext.rewards.kissing import (
    KissingReward,
    run_points_program,
    score_kissing_completion,
    verify_kissing_configuration,
)
from trl_ext.rewards.math import (
    extract_boxed,
    extract_gsm8k_answer,
    grade,
    normalize_answer,
    question_only_reward_fn,
    r1_zero_reward_fn,
)
from trl_ext.rewards.resolve import resolve_reward_spec, split_reward_specs
from trl_ext.rewards.shaping import SoftOverlong, soft_overlong_penalty
from trl_ext.rewards.trl_rewards import CountdownReward, MathReward, completion_text

countdown_reward = CountdownReward()
r1_zero_reward = MathReward("r1_zero")
question_only_reward = MathReward("question_only")
kissing_reward = KissingReward()

REWARD_FUNCS = {
    "countdown": countdown_reward,
    "countdown_all_numbers": countdown_reward,  # the default rule; the name is kept for configs that use it
    "countdown_at_most_once": CountdownReward(require_all=False),
    # Assignment 2's verifier (one equation, unary signs, numbers at most once): the Assignment 2 recipes score with it
    "countdown_single_equation": CountdownReward(single_equation=True),
    # 1 / 0, the verified reward of NYU Assignment 3 (section 6.3): its Countdown recipes train on it
    "countdown_binary": CountdownReward(binary=True),
    "r1_zero": r1_zero_reward,
    "question_only": question_only_reward,
    "kissing": kissing_reward,
}


# Parameterised rewards: a recipe names them with their arguments, e.g. "soft_overlong(max_length=1024, ...)".
REWARD_CLASSES = {
    "soft_overlong": SoftOverlong,
}


def get_reward_funcs(names: str | list[str], config=None) -> list:
    """The TRL-protocol reward callables for recipe specs (a list, or one comma-separated string).

    A spec is a registry name (`REWARD_FUNCS`), a parameterised one with keyword arguments (`REWARD_CLASSES`:
    `"soft_overlong(max_length=1024, buffer_length=256)"`) or an import path `module.path:function` /
    `module.path:Class(key=value)` (see `trl_ext.rewards.resolve`).

    Args:
        names: the specs.
        config: the training config; a reward with a `check_config(config)` method checks itself against it
            (`soft_overlong`: its `max_length` against `max_completion_length`).

    Raises:
        ValueError: for an unknown name (listing the valid ones), a module that does not import or an attribute it
            lacks (naming them), bad arguments, or a reward that does not fit the config.
    """
    if isinstance(names, str):
        names = split_reward_specs(names)
    if not names:
        raise ValueError(f"no reward function given; valid: {sorted({*REWARD_FUNCS, *REWARD_CLASSES})}")
    funcs = [resolve_reward_spec(name, REWARD_FUNCS, REWARD_CLASSES) for name in names]
    if config is not None:
        for func in funcs:
            if hasattr(func, "check_config"):
                func.check_config(config)
    return funcs


__all__ = [
    "REWARD_CLASSES",
    "REWARD_FUNCS",
    "CountdownReward",
    "KissingReward",
    "MathReward",
    "SoftOverlong",
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
    "kissing_reward",
    "normalize_answer",
    "question_only_reward",
    "question_only_reward_fn",
    "r1_zero_reward",
    "r1_zero_reward_fn",
    "run_points_program",
    "score_kissing_completion",
    "soft_overlong_penalty",
    "validate_numbers",
    "verify_kissing_configuration",
]
