"""The rewards in TRL's reward-function protocol: `f(completions, **dataset_columns) -> list[float]`.

Usable as `trl.GRPOTrainer(reward_funcs=[countdown_reward])` in any TRL project. Each is a picklable class instance
with a fixed `__name__` (TRL names its `rewards/<name>/mean` metric after it; closures would not pickle for TRL's
async rollout worker). Completions may be plain strings or chat messages (`[{"role": "assistant", "content": ...}]`).

When TRL passes `log_metric` (TRL >= 1.16 does), each call also reports the batch means of its two components as
`rewards/<name>/format_reward` and `rewards/<name>/answer_reward`; with `log_extra` they become per-sample columns
of the completions table.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from trl_ext.rewards.countdown import (
    CORRECT,
    NO_TAG,
    REWARDS,
    countdown_numbers_and_target,
    parse_countdown_ground_truth,
    resolve_number_rule,
    score_code,
)
from trl_ext.rewards.ground_truth import ground_truth_answers
from trl_ext.rewards.math import (
    GRADE_TIMEOUT_S,
    extract_gsm8k_answer,
    grade_many,
    question_only_answer,
    r1_zero_answer,
    reward_components,
)

__all__ = ["CountdownReward", "MathReward", "completion_text"]

# What TRL passes besides the dataset's columns (left out of "the batch has ..." in error messages).
_TRL_KWARGS = {"prompts", "completion_ids", "trainer_state", "log_metric", "log_extra", "environments"}


def completion_text(completion) -> str:
    """The text of one completion: a string as is; for chat messages, the assistant contents joined."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Mapping):
        completion = [completion]
    if not isinstance(completion, list | tuple):
        return ""
    parts = []
    for message in completion:
        if not isinstance(message, Mapping) or message.get("role", "assistant") != "assistant":
            continue
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, Sequence):  # content blocks: [{"type": "text", "text": ...}]
            parts.extend(block.get("text", "") for block in content if isinstance(block, Mapping))
    return "".join(part for part in parts if isinstance(part, str))


def _column(columns: Mapping, names: tuple[str, ...], n: int, reward_name: str) -> list:
    for name in names:
        if columns.get(name) is not None:
            values = list(columns[name])
            if len(values) != n:
                raise ValueError(f"{reward_name}: column {name!r} has {len(values)} values for {n} completions")
            return values
    present = sorted(key for key in columns if key not in _TRL_KWARGS)
    raise ValueError(f"{reward_name} needs a dataset column named one of {list(names)}; the batch has {present}")


def _report(name: str, components: list[dict], log_metric: Callable | None, log_extra: Callable | None) -> None:
    if log_metric is None and log_extra is None:
        return
    for key in ("format_reward", "answer_reward"):
        values = [c[key] for c in components]
        if log_metric is not None and values:
            log_metric(f"rewards/{name}/{key}", sum(values) / len(values))
        if log_extra is not None:
            log_extra(f"{name}/{key}", values)


class CountdownReward:
    """Countdown reward (1.0 / 0.1 / 0.0) for TRL; see `trl_ext.rewards.countdown`.

    Reads the dataset columns `target` and `nums` (or `numbers`), or a `ground_truth` column of
    `{"numbers" | "nums", "target"}` dicts (or TinyZero's `reward_model` column holding one under `ground_truth`).

    Args:
        require_all: every given number must be used exactly once (default: the rule the prompts state);
            False: each at most once (Assignment 2's `validate_numbers`), named `countdown_reward_at_most_once`.
        single_equation: Assignment 2's whole rule (`trl_ext.rewards.countdown`: one equation, unary signs allowed,
            numbers at most once), named `countdown_reward_single_equation`; `require_all` does not apply.
        binary: 1.0 for a correct answer, else 0.0 (no 0.1 for a tagged wrong answer: the verified 1 / 0 reward of
            NYU Assignment 3's section 6.3); `_binary` is appended to the name. The components are the same.
    """

    __name__ = "countdown_reward"

    def __init__(self, require_all: bool | None = None, single_equation: bool = False, binary: bool = False) -> None:
        for name, value in (("require_all", require_all), ("single_equation", single_equation), ("binary", binary)):
            if value is not None and not isinstance(value, bool):
                raise ValueError(f"{name} must be True or False, got {value!r}")
        self.require_all = resolve_number_rule(require_all, single_equation)
        self.single_equation = single_equation
        self.binary = binary
        if single_equation:
            self.__name__ = "countdown_reward_single_equation"
        elif not self.require_all:
            self.__name__ = "countdown_reward_at_most_once"
        if binary:
            self.__name__ += "_binary"

    def ground_truths(self, n: int, columns: Mapping) -> list[tuple[list[int], int]]:
        """`(numbers, target)` per completion from the batch's columns; ValueError naming a missing column."""
        if columns.get("target") is not None:
            targets = _column(columns, ("target",), n, self.__name__)
            numbers = _column(columns, ("nums", "numbers"), n, self.__name__)
            return [countdown_numbers_and_target(ns, t) for ns, t in zip(numbers, targets, strict=True)]
        if columns.get("reward_model") is not None:
            models = _column(columns, ("reward_model",), n, self.__name__)
            return [parse_countdown_ground_truth(model["ground_truth"]) for model in models]
        return [parse_countdown_ground_truth(t) for t in _column(columns, ("ground_truth",), n, self.__name__)]

    def __call__(self, completions: list, log_metric=None, log_extra=None, **columns) -> list[float]:
        truths = self.ground_truths(len(completions), columns)  # bad data fails before any scoring
        require_all, single_equation = self.require_all, self.single_equation
        codes = [
            score_code(c if type(c) is str else completion_text(c), numbers, target, require_all, single_equation)
            for c, (numbers, target) in zip(completions, truths, strict=True)
        ]
        if log_metric is not None or log_extra is not None:
            components = [{"format_reward": float(c > NO_TAG), "answer_reward": float(c == CORRECT)} for c in codes]
            _report(self.__name__, components, log_metric, log_extra)
        return [float(c == CORRECT) for c in codes] if self.binary else [REWARDS[c] for c in codes]

    def __repr__(self) -> str:
        rule = "single_equation=True" if self.single_equation else f"require_all={self.require_all}"
        return f"CountdownReward({rule}{', binary=True' if self.binary else ''})"


class MathReward:
    """A MATH / GSM8K reward for TRL: `r1_zero` (answer in `<answer>` tags) or `question_only` (`\\boxed{}`).

    Reads the dataset column `ground_truth` (or `answer`): a str / number or a list of acceptable answers, checked
    by `trl_ext.rewards.ground_truth.ground_truth_answers` (None, NaN, empty: a ValueError naming the row before
    any scoring). A GSM8K solution with a `#### N` line (the raw `answer` column of `openai/gsm8k`) is reduced to
    `N`. The batch's symbolic comparisons run concurrently on the grading pool; with TRL's `log_metric` each call
    also logs `rewards/<name>/grading_timeouts` (completions scored 0 because their comparison hit the time cap)
    and `rewards/<name>/grading_rejected` (answers the pre-checks called explosive).

    Args:
        style: `"r1_zero"` or `"question_only"`.
        timeout: per-comparison time cap in seconds of the symbolic stage of `grade`.
    """

    _STYLES = {"r1_zero": r1_zero_answer, "question_only": question_only_answer}

    def __init__(self, style: str = "r1_zero", timeout: float = GRADE_TIMEOUT_S) -> None:
        if style not in self._STYLES:
            raise ValueError(f"unknown math reward style {style!r}; valid: {sorted(self._STYLES)}")
        if not (isinstance(timeout, int | float) and timeout > 0):
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self.style = style
        self.timeout = timeout
        self.__name__ = f"{style}_reward"

    def __call__(self, completions: list, log_metric=None, log_extra=None, **columns) -> list[float]:
        truths = _column(columns, ("ground_truth", "answer"), len(completions), self.__name__)
        truths = [extract_gsm8k_answer(t) if isinstance(t, str) and "####" in t else t for t in truths]
        golds = [ground_truth_answers(t, f"{self.__name__}: ground_truth[{i}]") for i, t in enumerate(truths)]
        extract = self._STYLES[self.style]
        formats, answers = (
            zip(*(extract(completion_text(c)) for c in completions), strict=True) if completions else ((), ())
        )
        correct, counts = grade_many(
            [a if f else None for f, a in zip(formats, answers, strict=True)], golds, self.timeout
        )
        components = [reward_components(f, ok) for f, ok in zip(formats, correct, strict=True)]
        _report(self.__name__, components, log_metric, log_extra)
        if log_metric is not None:
            log_metric(f"rewards/{self.__name__}/grading_timeouts", counts["timeouts"])
            log_metric(f"rewards/{self.__name__}/grading_rejected", counts["rejected"])
        return [c["reward"] for c in components]

    def __repr__(self) -> str:
        return f"MathReward(style={self.style!r}, timeout={self.timeout})"
