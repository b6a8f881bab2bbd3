"""Scoring cut samples with the training rewards: reward components, the courses' outcome category, one record each."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

CATEGORIES = ("format1_answer1", "format1_answer0", "format0")
# A reward given as a function: `(response, ground_truth) -> {"reward", "format_reward", "answer_reward"}`.
RewardComponentsFn = Callable[[str, Any], Mapping[str, float]]


def reward_name_for(task: str, prompt: str | None, reward: str | None = None) -> str:
    """The reward that scores `task` with `prompt`: Countdown's for Countdown; for GSM8K / MATH `r1_zero` (answer in
    `<answer>` tags) with the `r1_zero` prompt and `question_only` (last `\\boxed{}`) with the others."""
    if reward is not None:
        return reward
    if task == "countdown":
        return "countdown"
    return "r1_zero" if prompt in (None, "r1_zero") else "question_only"


def score_response(reward: str | RewardComponentsFn, response: str, ground_truth: Any) -> dict[str, float]:
    """Reward components `{"reward", "format_reward", "answer_reward"}` of one response.

    Args:
        reward: a name (`countdown`, `countdown_single_equation`, `countdown_binary`, `r1_zero`, `question_only`) or a
            function returning the components, e.g. `functools.partial(countdown_reward_components, require_all=True)`.
        response: the cut response text.
        ground_truth: what the reward compares with (see `ground_truth_of`).
    """
    from trl_ext import rewards

    if callable(reward):
        return dict(reward(response, ground_truth))
    if reward == "countdown":
        return dict(rewards.countdown_reward_components(response, ground_truth))
    if reward == "countdown_single_equation":
        return dict(rewards.countdown_reward_components(response, ground_truth, single_equation=True))
    if reward == "countdown_binary":  # the same components; the reward is the answer's 1 / 0
        components = dict(rewards.countdown_reward_components(response, ground_truth))
        return {**components, "reward": components["answer_reward"]}
    if reward == "r1_zero":
        return dict(rewards.r1_zero_reward_fn(response, ground_truth))
    return dict(rewards.question_only_reward_fn(response, ground_truth))


def category(components: dict[str, float]) -> str:
    """The courses' outcome category of one scored response."""
    if components["format_reward"] < 1:
        return "format0"
    return "format1_answer1" if components["answer_reward"] >= 1 else "format1_answer0"


def ground_truth_of(task: str, row: dict) -> Any:
    """The reward's ground truth for a task row: `{"numbers", "target"}` for Countdown, else the answer string."""
    if task == "countdown":
        return {"numbers": list(row["nums"]), "target": int(row["target"])}
    return row["ground_truth"]


def score_samples(
    prompts: list[str], ground_truths: list[Any], cuts: list[list[dict[int, dict]]], budget: int, reward
) -> list[dict]:
    """One scored record per sample at one budget, problem-major (`n` consecutive records per problem).

    Args:
        prompts: `(P,)` prompt strings as generated from.
        ground_truths: `(P,)` the reward's ground truth per problem.
        cuts: `(P, n)` samples cut to each budget (`trl_ext.evaluation.samples.cut_samples`).
        budget: the budget (a key of every cut) to score.
        reward: a reward name or components function (see `score_response`).

    Returns:
        Records with the prompt, response, ground truth, reward components, category, mean log-prob, token
        count and finish reason; `summarize` reads them.
    """
    records = []
    for p, (text, gt) in enumerate(zip(prompts, ground_truths, strict=True)):
        for j, cut in enumerate(cuts[p]):
            c = cut[budget]
            comps = score_response(reward, c["response"], gt)
            records.append(
                {
                    "problem_index": p,
                    "sample_index": j,
                    "max_tokens": budget,
                    "prompt": text,
                    "response": c["response"],
                    "ground_truth": gt,
                    "reward": comps["reward"],
                    "format_reward": comps["format_reward"],
                    "answer_reward": comps["answer_reward"],
                    "category": category(comps),
                    "mean_logprob": c["mean_logprob"],
                    "num_tokens": c["num_tokens"],
                    "finish_reason": c["finish_reason"],
                }
            )
    return records
