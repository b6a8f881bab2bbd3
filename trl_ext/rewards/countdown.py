"""Countdown reward: is the equation in the last `<answer>` tag built from the given numbers and equal to the target?

Reward (seed 000 / TinyZero values): 1.0 when the answer is correct, 0.1 when an `<answer>...</answer>` tag is
present but its content is wrong or invalid, 0.0 when there is no tag.

Two answer forms are accepted (seed 001's Countdown prompt allows both):

- one equation, e.g. `(1 + 2) / 3`, optionally followed by `= <its value>`;
- "Step X:" lines, e.g. `Step 1: 1 + 2 = 3` / `Step 2: 3 / 3 = 1`: each step's arithmetic must be exactly right and
  each step may use the available numbers and the results of earlier steps, each at most once; the last step's
  result is the answer's value.

Rules, chosen and fixed here:

- Numbers are a sub-multiset of the given ones by default (seed 000's `validate_numbers` asserts: not every number
  has to be used, none may be used more often than given). `require_all=True` is TinyZero's rule: every number
  exactly once.
- Only ASCII digits, whitespace, `+ - * /` and parentheses; no unary minus (the game has only the four binary
  operations, and a negation never reaches a positive target that the binary operations cannot), no `**`, no
  implicit multiplication, no names or calls. The text is parsed with `ast` and a whitelist of nodes is evaluated
  in exact rational arithmetic (`Fraction`), so `6/(1-3/4)` is exactly 24; nothing is ever `eval`-ed.
- Bounded work on any input: an equation longer than `MAX_EQUATION_CHARS` or nested deeper than `MAX_NESTING`
  parentheses is invalid before it reaches the parser, and at most `MAX_STEPS` step lines are read.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from fractions import Fraction
from functools import lru_cache

__all__ = [
    "MAX_EQUATION_CHARS",
    "MAX_NESTING",
    "MAX_STEPS",
    "countdown_reward_components",
    "countdown_reward_fn",
    "evaluate_equation",
    "extract_answer",
    "countdown_numbers_and_target",
    "parse_countdown_ground_truth",
    "score_countdown",
    "validate_numbers",
]

MAX_EQUATION_CHARS = 256
MAX_NESTING = 32
MAX_STEPS = 16

CORRECT_REWARD = 1.0
FORMAT_REWARD = 0.1

_OPEN, _CLOSE = "<answer>", "</answer>"
# ASCII only: `\d` would also accept other scripts' digits, which `int()` silently converts.
_EQUATION_CHARS = re.compile(r"[0-9+\-*/()\s]+")
_INTEGER = re.compile(r"[0-9]+")
_STEP_PREFIX = re.compile(r"\s*step\s*[0-9]+\s*[:.)]\s*", re.IGNORECASE)
_RESULT = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*")
_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?")
_DECIMAL = re.compile(r"([0-9]+)\.([0-9]+)")
_STEP_CHARS = re.compile(r"[0-9.+\-*/()\s]+")

Number = int | Fraction


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
        return sorted(used) == sorted(numbers)
    pool = list(numbers)  # a list beats a Counter for the 3-6 numbers of a problem
    for number in used:
        try:
            pool.remove(number)
        except ValueError:
            return False
    return True


def validate_numbers(equation: str, available_numbers: Iterable[int], require_all: bool = False) -> bool:
    """Whether the integers written in `equation` may be used, given `available_numbers`.

    Rule: the multiset of integers in the equation is a sub-multiset of the available numbers (each number at most
    as often as given); with `require_all=True` it must equal the available multiset (each number exactly once).

    Args:
        equation: an arithmetic expression such as `"(64 + 14) - 16"`.
        available_numbers: the problem's numbers (ints, numpy ints or integral floats).
        require_all: demand that every available number is used exactly once (TinyZero's rule).

    Returns:
        True when the numbers are allowed.
    """
    if not isinstance(equation, str):
        return False
    used = [int(token) for token in _INTEGER.findall(equation)]
    return _numbers_allowed(used, [int(n) for n in available_numbers], require_all)


def _too_deep(text: str) -> bool:
    if text.count("(") <= MAX_NESTING:  # balance itself is the parser's job
        return False
    depth = 0
    for char in text:
        depth += (char == "(") - (char == ")")
        if depth > MAX_NESTING:
            return True
    return False


def _evaluate_node(node: ast.AST) -> Number:
    """Exact value of a whitelisted node; raises ValueError / ZeroDivisionError otherwise."""
    node_type = type(node)
    if node_type is ast.BinOp:
        left = _evaluate_node(node.left)
        right = _evaluate_node(node.right)
        op = type(node.op)
        if op is ast.Add:
            return left + right
        if op is ast.Sub:
            return left - right
        if op is ast.Mult:
            return left * right
        if op is ast.Div:
            if right == 0:
                raise ZeroDivisionError
            # Stay in plain ints while the division is exact: Fraction is ~10x slower than int.
            if type(left) is int and type(right) is int and left % right == 0:
                return left // right
            return Fraction(left) / right
        raise ValueError(f"operator {op.__name__} is not allowed")
    if node_type is ast.Constant and type(node.value) is int:
        return node.value
    raise ValueError(f"{type(node).__name__} is not allowed")


def _evaluate_exact(equation: str, allow_decimals: bool = False) -> Number | None:
    """Exact value of a whitelisted arithmetic expression, or None when it is invalid.

    `allow_decimals` admits literals such as `0.75` (a step may reuse an earlier step's decimal result); they are
    rewritten as exact fractions before parsing.
    """
    if not isinstance(equation, str) or len(equation) > MAX_EQUATION_CHARS:
        return None
    chars = _STEP_CHARS if allow_decimals else _EQUATION_CHARS
    if not chars.fullmatch(equation) or _too_deep(equation):
        return None
    if allow_decimals and "." in equation:
        equation = _DECIMAL.sub(lambda m: f"({int(m.group(1) + m.group(2))}/{10 ** len(m.group(2))})", equation)
    # Joined onto one line: a newline outside parentheses would end the expression for Python's parser.
    return _parse_and_evaluate(" ".join(equation.split()))


@lru_cache(maxsize=1 << 14)
def _parse_and_evaluate(equation: str) -> Number | None:
    # Cached: Python's parser is most of the cost (~10-30 us), and a GRPO group often repeats an answer.
    try:
        return _evaluate_node(compile(equation, "<answer>", "eval", ast.PyCF_ONLY_AST).body)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError, MemoryError):
        return None


def evaluate_equation(equation: str) -> float | None:
    """Value of an arithmetic expression over `+ - * /`, integers and parentheses; None when invalid.

    Evaluated exactly (rationals), then converted to float: `"6/(1-3/4)"` -> 24.0, `"(65 - 7) - 7"` -> 51.0.
    Invalid (None): other characters (`**`, names, calls, `.`, unicode digits or operators), implicit
    multiplication such as `2(3)`, unary signs, leading zeros, division by zero, more than `MAX_EQUATION_CHARS`
    characters or `MAX_NESTING` nested parentheses.

    Args:
        equation: the expression text.

    Returns:
        The value as a float, or None.
    """
    value = _evaluate_exact(equation)
    if value is None:
        return None
    try:
        return float(value)
    except OverflowError:
        return None


def _literal(token: str) -> Number:
    return Fraction(token) if "." in token else int(token)  # Fraction("12") is ~20x slower than int("12")


def _evaluate_steps(lines: list[str], numbers: list[int], require_all: bool) -> Number | None:
    """Value of a "Step X: expr = result" answer, or None when a step is wrong or uses a number it may not.

    `pool` holds what the next step may use: the unused given numbers and the unused earlier results.
    """
    if len(lines) > MAX_STEPS:
        return None
    pool = Counter(numbers)
    result: Number | None = None
    for line in lines:
        prefix = _STEP_PREFIX.match(line)
        left, sep, right = line[prefix.end() if prefix else 0 :].rpartition("=")
        claimed = _RESULT.fullmatch(right)
        if not sep or claimed is None:
            return None
        value = _evaluate_exact(left, allow_decimals=True)
        if value is None or value != _literal(claimed.group(1)):
            return None
        for token in _NUMBER.findall(left):
            operand = _literal(token)
            if pool[operand] <= 0:
                return None
            pool[operand] -= 1
        result = value
        pool[result] += 1
    if require_all:
        pool[result] -= 1
        if any(pool.values()):
            return None
    return result


def _answer_value(answer: str, numbers: list[int], require_all: bool) -> Number | None:
    """Exact value of an answer (one equation or "Step X:" lines) that uses only allowed numbers, else None."""
    if len(answer) > MAX_EQUATION_CHARS * MAX_STEPS:
        return None
    if "=" not in answer:
        equation = " ".join(answer.split())
        if not _numbers_allowed([int(t) for t in _INTEGER.findall(equation)], numbers, require_all):
            return None
        return _evaluate_exact(equation)
    lines = [line for line in answer.splitlines() if line.strip()]
    return _evaluate_steps(lines, numbers, require_all) if lines else None


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
    """`(numbers, target)` as plain ints from list / numpy values; ValueError naming a non-integer field."""
    if hasattr(numbers, "tolist"):  # numpy arrays from parquet: plain ints are faster to compare
        numbers = numbers.tolist()
    if not isinstance(numbers, list | tuple):
        raise ValueError(f"countdown ground_truth field 'numbers' must be a list of integers, got {numbers!r}")
    if not all(type(n) is int for n in numbers):
        numbers = [_as_int(n, "numbers") for n in numbers]
    return numbers, _as_int(target, "target")


def _as_int(value, field: str) -> int:
    if type(value) is int:
        return value
    try:
        number = int(value)
        if number != value:
            raise ValueError
    except (TypeError, ValueError):
        raise ValueError(f"countdown ground_truth field {field!r} must hold integers, got {value!r}") from None
    return number


def score_countdown(text: str, numbers: list[int], target: int, require_all: bool = False) -> dict[str, float]:
    """`countdown_reward_components` for an already parsed ground truth (the batch path parses each row once)."""
    answer = extract_answer(text)
    if answer is None:
        return {"reward": 0.0, "format_reward": 0.0, "answer_reward": 0.0}
    if _answer_value(answer, numbers, require_all) == target:
        return {"reward": CORRECT_REWARD, "format_reward": 1.0, "answer_reward": 1.0}
    return {"reward": FORMAT_REWARD, "format_reward": 1.0, "answer_reward": 0.0}


def countdown_reward_components(text: str, ground_truth: Mapping, require_all: bool = False) -> dict[str, float]:
    """Reward and its two parts for one completion.

    `format_reward` = 1 when an `<answer>...</answer>` tag is present; `answer_reward` = 1 when its content is a
    valid answer (see the module docstring) whose exact value equals the target;
    `reward` = 1.0 if answer_reward else 0.1 if format_reward else 0.0.

    Args:
        text: the completion.
        ground_truth: `{"numbers" | "nums": [...], "target": int}`.
        require_all: every given number must be used exactly once (TinyZero) instead of at most once (seed 000).

    Returns:
        `{"reward", "format_reward", "answer_reward"}` floats.
    """
    numbers, target = parse_countdown_ground_truth(ground_truth)
    return score_countdown(text, numbers, target, require_all)


def countdown_reward_fn(text: str, ground_truth: Mapping, require_all: bool = False) -> float:
    """1.0 for a correct answer, 0.1 for an answer tag with a wrong or invalid answer, 0.0 without a tag.

    Args:
        text: the completion.
        ground_truth: `{"numbers" | "nums": [...], "target": int}`.
        require_all: every given number must be used exactly once (TinyZero) instead of at most once (seed 000).
    """
    return countdown_reward_components(text, ground_truth, require_all)["reward"]
