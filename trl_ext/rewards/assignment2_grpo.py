"""Assignment 2's verifier and reward (Tasks 1-2) under its own names: `_extract_answer`,
`_validate_numbers`, `_evaluate_equation`, `reward_fn`.

The rule is Assignment 2's, as `trl_ext.rewards.countdown` implements it with `single_equation=True` (its module
docstring): the last `<answer>...</answer>` (its content stripped) holds one equation of the course's characters only:
ASCII digits, spaces, `+ - * /` and parentheses. Any other character is invalid, other whitespace included: a line
break or a tab inside the equation gives None: neither is in the course's list (and `eval` itself raises SyntaxError on
`"1 +\\n2"`). On those characters the equation is read as `eval` reads them (so `-2+8` is 6, and leading spaces are
ignored as `eval` ignores them), except `**` and `//`, which are not among the course's four operations. Each given
number is used at most once (a subset is valid: the course's own `_validate_numbers("(64 + 14) - 16", [64, 14, 16, 7])`
is True); reward 1.0 correct, 0.1 tagged but wrong or invalid, 0.0 without a tag. Nothing is ever `eval`-ed: an exact
parser computes the value in rational arithmetic (then a float), so where `eval`'s float arithmetic rounds (`1/49*49`
is 0.9999999999999999 there) the value here is the exact one (1.0). The registry name of the same reward is
`countdown_single_equation`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from trl_ext.rewards.countdown import (
    countdown_reward_fn,
    extract_answer,
    single_equation_answer_value,
    validate_numbers,
)
from trl_ext.rewards.exact_arithmetic import NUMBERS_AND_GAPS

__all__ = ["_evaluate_equation", "_extract_answer", "_validate_numbers", "reward_fn"]


def _extract_answer(generated_text: str) -> str | None:
    """Content of the last `<answer>...</answer>` of a generation, stripped; None without one (Assignment 2 Task 1)."""
    return extract_answer(generated_text)


def _validate_numbers(equation_str: str, available_numbers: Iterable[int]) -> bool:
    """Whether the numbers in the equation are a sub-multiset of the available ones, each at most once (Task 1).

    A non-string equation is False (the course's second assert passes `(7 + 7) + 7` unquoted, i.e. the int 21).
    """
    return validate_numbers(equation_str, available_numbers, require_all=False)


def _evaluate_equation(equation_str: str) -> float | None:
    """Value of an equation of digits, spaces, `+ - * /` and parentheses, as a float; None when invalid (Task 1).

    Invalid: any other character (line breaks, tabs and other whitespace, names, unicode operators or digits, `=`),
    `**` and `//`, implicit multiplication such as `2(3)`, leading zeros, division by zero, over 256 characters.
    Unary signs are read as `eval` reads them.
    """
    if not isinstance(equation_str, str):
        return None
    numbers = [int(n) for n in NUMBERS_AND_GAPS.split(equation_str)[1::2]]
    value = single_equation_answer_value(equation_str, numbers)
    return None if value is None else float(value)


def reward_fn(generated_text: str, ground_truth: Mapping) -> float:
    """1.0 correct, 0.1 an `<answer>` tag with a wrong, invalid or badly-numbered equation, 0.0 no tag (Task 2).

    Args:
        generated_text: the model's rollout.
        ground_truth: `{"numbers": [...], "target": int}` (`nums` is read for `numbers` too).
    """
    return countdown_reward_fn(generated_text, ground_truth, single_equation=True)
