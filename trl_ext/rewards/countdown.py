"""Countdown reward: is the equation in the last `<answer>` tag built from the given numbers and equal to the target?

Reward (Assignment 2 / TinyZero values): 1.0 when the answer is correct, 0.1 when an `<answer>...</answer>` tag is
present but its content is wrong or invalid, 0.0 when there is no tag.

Two answer forms are accepted (NYU Assignment 3's Countdown prompt allows both):

- one equation, e.g. `(1 + 2) / 3`, optionally followed by `= <its value>`;
- "Step X:" lines, e.g. `Step 1: 1 + 2 = 3` / `Step 2: 3 / 3 = 1`: each step's arithmetic must be exactly right and
  each step may use the available numbers and the results of earlier steps, each at most once; the last step's
  result is the answer's value.

Rules, chosen and fixed here:

- Every given number is used exactly once by default (`require_all=True`: the rule the prompts state and the
  problems are generated with; TinyZero's). `require_all=False` is Assignment 2's `validate_numbers` reading: the
  numbers used are a sub-multiset of the given ones (not every number has to be used, none more often than given);
  it lets a bare `<answer> 33 </answer>` score 1.0 whenever 33 is one of the given numbers.
- Only ASCII digits, whitespace, `+ - * /` and parentheses; no unary minus (the game has only the four binary
  operations), no `**`, no implicit multiplication, no names or calls, no leading zeros (`07`); Python's grammar
  for these tokens. Nothing is ever `eval`-ed: `trl_ext.rewards.exact_arithmetic` parses the equation's shape
  and evaluates it in exact rational arithmetic, so `6/(1-3/4)` is exactly 24.
- Bounded work on any input: an equation longer than `MAX_EQUATION_CHARS` or nested deeper than `MAX_NESTING`
  parentheses is invalid before it is parsed, and at most `MAX_STEPS` step lines are read.

Assignment 2's own rule (`single_equation=True`, registry name `countdown_single_equation`, used by the Assignment 2
recipes so their numbers compare with the assignment's): one equation of the characters its `_evaluate_equation`
admits (ASCII digits, spaces, `+ - * /`, parentheses; no other whitespace: a line break or tab inside the answer makes
it invalid), read as `eval` reads them, so a unary sign is allowed (`-2+8` is 6, as `eval` gives it); no "Step X:"
lines and no `= value` after the equation (`=` is not among those characters); `**` and `//` stay invalid (not
among the assignment's four operations); every number at most once (its `_validate_numbers`: `(64 + 14) - 16` is
valid for [64, 14, 16, 7]). Still never `eval`-ed: the same exact parser with prefix signs switched on.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Iterable, Mapping
from fractions import Fraction

from trl_ext.rewards.exact_arithmetic import (
    MAX_EQUATION_CHARS,
    MAX_NESTING,
    NUMBERS_AND_GAPS,
    Number,
    evaluate_equation,
    evaluate_exact,
    evaluate_split,
)

__all__ = [
    "MAX_EQUATION_CHARS",
    "MAX_NESTING",
    "MAX_STEPS",
    "countdown_numbers_and_target",
    "countdown_reward_components",
    "countdown_reward_fn",
    "evaluate_equation",
    "extract_answer",
    "parse_countdown_ground_truth",
    "resolve_number_rule",
    "score_countdown",
    "single_equation_answer_value",
    "validate_numbers",
]

MAX_STEPS = 16

CORRECT_REWARD = 1.0
FORMAT_REWARD = 0.1

# Outcome codes of `score_code`: index into the reward and its components.
NO_TAG, WRONG, CORRECT = 0, 1, 2
REWARDS = (0.0, FORMAT_REWARD, CORRECT_REWARD)

_OPEN, _CLOSE = "<answer>", "</answer>"
# ASCII only: `\d` would also accept other scripts' digits, which `int()` silently converts.
_INTEGER = re.compile(r"[0-9]+")
_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?")


def extract_answer(text: str) -> str | None:
    """Content of the last `<answer>...</answer>` pair, stripped; None when there is none.

    The last closing tag is paired with the nearest opening tag before it, so text such as
    `<answer> a <answer> b </answer>` gives `"b"`. Multi-line content is kept whole. Linear time.

    Args:
        text: a completion.

    Returns:
        The stripped answer text, or None.
    """
    if not isinstance(text, str):
        return None
    end = text.rfind(_CLOSE)
    if end < 0:
        return None
    start = text.rfind(_OPEN, 0, end)
    if start < 0:
        return None
    return text[start + len(_OPEN) : end].strip()


def _numbers_allowed(used: list[int], numbers: list[int], require_all: bool) -> bool:
    if require_all:
        return len(used) == len(numbers) and sorted(used) == sorted(numbers)
    pool = list(numbers)  # a list beats a Counter for the 3-6 numbers of a problem
    for number in used:
        try:
            pool.remove(number)
        except ValueError:
            return False
    return True


def validate_numbers(equation: str, available_numbers: Iterable[int], require_all: bool = True) -> bool:
    """Whether the integers written in `equation` may be used, given `available_numbers`.

    Rule: with `require_all=True` (the default) the multiset of integers in the equation equals the available
    multiset (each number exactly once); with `require_all=False` it is a sub-multiset (each at most as often as
    given, Assignment 2's reading).

    Args:
        equation: an arithmetic expression such as `"(64 + 14) - 16 + 7"`.
        available_numbers: the problem's numbers (ints, numpy ints or integral floats).
        require_all: every available number must be used exactly once.

    Returns:
        True when the numbers are allowed.
    """
    if not isinstance(equation, str):
        return False
    used = [int(token) for token in _INTEGER.findall(equation)]
    return _numbers_allowed(used, [int(n) for n in available_numbers], require_all)


# One "Step X:" line: an optional label, the expression, `=` and the claimed result. The same decisions as
# matching the label, `rpartition("=")` and a number after it: only the text after the last `=` can be the result.
_STEP_LINE = re.compile(r"(?:\s*step\s*[0-9]+\s*[:.)]\s*)?(.*)=\s*([0-9]+(?:\.[0-9]+)?)\s*", re.IGNORECASE | re.DOTALL)


def _evaluate_steps(answer: str, numbers: list[int], require_all: bool) -> Number | None:
    """Value of a "Step X: expr = result" answer, or None when a step is wrong or uses a number it may not.

    Blank lines are skipped; more than `MAX_STEPS` other lines make the answer invalid. `pool` holds what the next
    step may use: the unused given numbers and the unused earlier results. The bookkeeping runs on the claimed
    results first and the arithmetic is checked after: an answer is valid only when every claim is right, so the
    order changes the cost, never the decision.
    """
    pool: list[Number] = list(numbers)
    steps = []
    result = None
    for line in answer.splitlines():
        if not line or line.isspace():
            continue
        step = _STEP_LINE.fullmatch(line)
        if step is None or len(steps) == MAX_STEPS:
            return None
        left, claimed = step.groups()
        try:
            for token in _NUMBER.findall(left):
                pool.remove(int(token) if "." not in token else Fraction(token))
        except ValueError:  # not available (any more)
            return None
        result = int(claimed) if "." not in claimed else Fraction(claimed)
        pool.append(result)
        steps.append((left, result))
    if result is None or (require_all and pool != [result]):
        return None
    for left, claimed_result in steps:
        value = evaluate_exact(left, allow_decimals=True)
        if value is None or value != claimed_result:
            return None
    return result


def _answer_value(answer: str, numbers: list[int], require_all: bool) -> Number | None:
    """Exact value of an answer (one equation or "Step X:" lines) that uses only allowed numbers, else None."""
    if len(answer) > MAX_EQUATION_CHARS * MAX_STEPS:
        return None
    if "=" in answer:
        return _evaluate_steps(answer, numbers, require_all)
    # `evaluate_exact`'s bound (whitespace runs count as one character), repeated because this path splits the
    # answer itself: the numbers are checked between the split and the evaluation.
    if len(answer) > MAX_EQUATION_CHARS and len(" ".join(answer.split())) > MAX_EQUATION_CHARS:
        return None
    parts = NUMBERS_AND_GAPS.split(answer)
    used = list(map(int, parts[1::2]))
    # The default rule is `_numbers_allowed` inlined, and so is `extract_answer` in `score_code`: the two calls per
    # completion cost about 1.5% of Countdown scoring throughput (measured alternately, bench_countdown's corpus).
    if require_all:
        if len(used) != len(numbers) or sorted(used) != sorted(numbers):
            return None
    elif not _numbers_allowed(used, numbers, False):
        return None
    return evaluate_split(parts[::2], used)


# Assignment 2's `_evaluate_equation` admits these characters ("digits, spaces, +, -, *, /, (, )") and evaluates what
# `eval` makes of them. The space is the only whitespace: a line break or tab is not in the assignment's list (and
# `eval` refuses a line break outside parentheses), so an answer with one inside is invalid.
_SINGLE_EQUATION_CHARACTERS = frozenset("0123456789 +-*/()")


def single_equation_answer_value(answer: str, numbers: list[int]) -> Number | None:
    """Exact value of an answer under Assignment 2's rule (module docstring), or None when it is invalid there.

    Args:
        answer: the stripped content of the `<answer>` tag.
        numbers: the problem's numbers as ints.
    """
    if len(answer) > MAX_EQUATION_CHARS and len(" ".join(answer.split())) > MAX_EQUATION_CHARS:
        return None
    if not _SINGLE_EQUATION_CHARACTERS.issuperset(answer):
        return None
    parts = NUMBERS_AND_GAPS.split(answer)
    used = list(map(int, parts[1::2]))
    if not _numbers_allowed(used, numbers, False):
        return None
    return evaluate_split(parts[::2], used, unary=True)


def resolve_number_rule(require_all: bool | None, single_equation: bool) -> bool:
    """`require_all` resolved: True by default; under Assignment 2's rule (its own: at most once) True is an error."""
    if single_equation:
        if require_all:
            raise ValueError(
                "single_equation=True scores with Assignment 2's number rule (each number at most once); "
                "drop require_all"
            )
        return False
    return True if require_all is None else require_all


def parse_countdown_ground_truth(ground_truth: Mapping) -> tuple[list[int], int]:
    """`(numbers, target)` from `{"numbers" | "nums": [...], "target": int}` (numpy arrays and ints accepted).

    Raises:
        ValueError: naming the missing or malformed field.
    """
    if not isinstance(ground_truth, Mapping):
        raise ValueError(
            f"countdown ground_truth must be a mapping with 'numbers' (or 'nums') and 'target', "
            f"got {type(ground_truth).__name__}"
        )
    raw_numbers = ground_truth.get("numbers", ground_truth.get("nums"))
    if raw_numbers is None:
        raise ValueError(f"countdown ground_truth has no 'numbers' or 'nums' field (keys: {sorted(ground_truth)})")
    if "target" not in ground_truth or ground_truth["target"] is None:
        raise ValueError(f"countdown ground_truth has no 'target' field (keys: {sorted(ground_truth)})")
    return countdown_numbers_and_target(raw_numbers, ground_truth["target"])


def countdown_numbers_and_target(numbers, target) -> tuple[list[int], int]:
    """`(numbers, target)` as plain ints from list / tuple / numpy values.

    Integral floats (`7.0`, as pandas gives an int column with a missing value) become ints; anything else that
    is not an integer (bools, NaN, `2.5`, strings, None) is a ValueError naming the field and value, and so is an
    empty list of numbers.
    """
    if type(numbers) is not list:
        if hasattr(numbers, "tolist"):  # numpy arrays from parquet: plain ints are faster to compare
            numbers = numbers.tolist()
        if not isinstance(numbers, list | tuple):
            raise ValueError(f"countdown ground_truth field 'numbers' must be a list of integers, got {numbers!r}")
        numbers = list(numbers)
    for number in numbers:
        if type(number) is not int:
            numbers = [_as_int(n, "numbers") for n in numbers]
            break
    if not numbers:
        raise ValueError("countdown ground_truth field 'numbers' is empty")
    return numbers, target if type(target) is int else _as_int(target, "target")


def _as_int(value, field: str) -> int:
    if type(value) is int:
        return value
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        raise ValueError(f"countdown ground_truth field {field!r} must hold integers, got the bool {value!r}")
    try:
        return operator.index(value)  # ints and numpy integers, exactly
    except TypeError:
        pass
    try:
        number = int(value)
        if number != value:
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"countdown ground_truth field {field!r} must hold integers, got {value!r}") from None
    return number


def score_code(
    text: str, numbers: list[int], target: int, require_all: bool = True, single_equation: bool = False
) -> int:
    """Outcome of one completion for a parsed ground truth: `NO_TAG`, `WRONG` or `CORRECT` (the batch path).

    `single_equation` scores with Assignment 2's rule (module docstring); `require_all` does not apply then.
    """
    if not isinstance(text, str):  # `extract_answer` inlined (see `_answer_value`)
        return NO_TAG
    end = text.rfind(_CLOSE)
    if end < 0:
        return NO_TAG
    start = text.rfind(_OPEN, 0, end)
    if start < 0:
        return NO_TAG
    answer = text[start + len(_OPEN) : end].strip()
    value = (
        single_equation_answer_value(answer, numbers)
        if single_equation
        else _answer_value(answer, numbers, require_all)
    )
    return CORRECT if value == target else WRONG


def _components(code: int) -> dict[str, float]:
    return {"reward": REWARDS[code], "format_reward": float(code > NO_TAG), "answer_reward": float(code == CORRECT)}


def score_countdown(
    text: str, numbers: list[int], target: int, require_all: bool | None = None, single_equation: bool = False
) -> dict[str, float]:
    """`countdown_reward_components` for an already parsed ground truth."""
    return _components(
        score_code(text, numbers, target, resolve_number_rule(require_all, single_equation), single_equation)
    )


def countdown_reward_components(
    text: str, ground_truth: Mapping, require_all: bool | None = None, single_equation: bool = False
) -> dict[str, float]:
    """Reward and its two parts for one completion.

    `format_reward` = 1 when an `<answer>...</answer>` tag is present; `answer_reward` = 1 when its content is a
    valid answer (see the module docstring) whose exact value equals the target;
    `reward` = 1.0 if answer_reward else 0.1 if format_reward else 0.0.

    Args:
        text: the completion.
        ground_truth: `{"numbers" | "nums": [...], "target": int}`.
        require_all: every given number must be used exactly once (default); False: at most once.
        single_equation: Assignment 2's whole rule (module docstring), with its own number rule (at most once).

    Returns:
        `{"reward", "format_reward", "answer_reward"}` floats.
    """
    numbers, target = parse_countdown_ground_truth(ground_truth)
    return score_countdown(text, numbers, target, require_all, single_equation)


def countdown_reward_fn(
    text: str, ground_truth: Mapping, require_all: bool | None = None, single_equation: bool = False
) -> float:
    """1.0 for a correct answer, 0.1 for an answer tag with a wrong or invalid answer, 0.0 without a tag.

    Args:
        text: the completion.
        ground_truth: `{"numbers" | "nums": [...], "target": int}`.
        require_all: every given number must be used exactly once (default); False: at most once.
        single_equation: Assignment 2's whole rule (module docstring), with its own number rule (at most once).
    """
    numbers, target = parse_countdown_ground_truth(ground_truth)
    return REWARDS[
        score_code(text, numbers, target, resolve_number_rule(require_all, single_equation), single_equation)
    ]
