"""Countdown reward: extraction, number rules, exact evaluation, "Step X:" answers, reward values."""

from __future__ import annotations

import itertools
import random
from fractions import Fraction

import numpy as np
import pytest

from trl_ext.rewards.countdown import (
    MAX_EQUATION_CHARS,
    MAX_NESTING,
    countdown_reward_components,
    countdown_reward_fn,
    evaluate_equation,
    extract_answer,
    parse_countdown_ground_truth,
    validate_numbers,
)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<answer>1 + 2</answer>", "1 + 2"),
        ("think <answer>\n(1 + 2) / 3\n</answer> done", "(1 + 2) / 3"),  # multi-line, stripped
        ("<answer>1</answer> then <answer>2</answer>", "2"),  # the last pair wins
        ("<answer> a <answer> b </answer>", "b"),  # nearest opening tag before the last closing one
        ("<answer>1</answer> <answer>2", "1"),  # an unclosed trailing tag is not an answer
        ("<answer>\nStep 1: 1 + 2 = 3\nStep 2: 3 / 3 = 1\n</answer>", "Step 1: 1 + 2 = 3\nStep 2: 3 / 3 = 1"),
        ("no tags here", None),
        ("</answer> <answer>", None),  # closing before opening
        ("<answer></answer>", ""),
        (None, None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    "equation, numbers, require_all, expected",
    [
        ("(64 + 14) - 16", [64, 14, 16, 7], False, True),  # Assignment 2: a subset of the numbers is fine
        ("(7 + 7) + 7", [7, 7, 65], False, False),  # Assignment 2: 7 used three times, given twice
        ("10 + 9", [10, 8, 2], False, False),  # Assignment 2: 9 is not given
        ("(64 + 14) - 16", [64, 14, 16, 7], True, False),  # TinyZero: 7 unused
        ("(64 + 14) - 16 + 7", [64, 14, 16, 7], True, True),
        ("7 + 7", [7, 7, 65], False, True),  # duplicates count as two
        ("", [1, 2], False, True),  # the empty multiset is a sub-multiset (evaluation rejects it later)
        ("1 + ٣", [1, 3], True, False),  # a non-ASCII digit is not the number 3
        ("10 + 8", np.array([10, 8, 2]), False, True),  # parquet rows give numpy arrays
    ],
)
def test_validate_numbers(equation, numbers, require_all, expected):
    assert validate_numbers(equation, numbers, require_all=require_all) is expected


@pytest.mark.parametrize(
    "equation, expected",
    [
        ("(65 - 7) - 7", 51.0),  # Assignment 2
        ("6/(1-3/4)", 24.0),  # exact rationals: floats would give 23.999999999999996
        ("1/3*3", 1.0),
        ("  2 *\n(3 + 4) ", 14.0),  # whitespace and newlines are fine
        ("7/2", 3.5),
        ("1/0", None),  # division by zero
        ("4/(2-2)", None),
        ("2(3)", None),  # implicit multiplication parses as a call
        ("2 3", None),
        ("2**3", None),
        ("9**9**9**9", None),  # never evaluated: `**` is not whitelisted
        ("-3 + 5", None),  # no unary minus
        ("+3", None),
        ("3 // 2", None),
        ("3 % 2", None),
        ("1.5 + 1", None),  # no decimals in a single equation
        ("1e309", None),
        ("3 × 4", None),  # unicode operator
        ("٣ + 1", None),  # unicode digit
        ("__import__('os').system('x')", None),
        ("07 + 1", None),  # a leading zero is not a Python int literal
        ("()", None),
        ("(1 + 2", None),
        ("1 + 2)", None),
        ("", None),
        ("(" * (MAX_NESTING + 1) + "1" + ")" * (MAX_NESTING + 1), None),
        ("(" * MAX_NESTING + "1" + ")" * MAX_NESTING, 1.0),
        ("1+" * (MAX_EQUATION_CHARS // 2) + "1", None),  # over the length bound
        ("(" * 10_000 + "1" + ")" * 10_000, None),
    ],
)
def test_evaluate_equation(equation, expected):
    assert evaluate_equation(equation) == expected


def _random_tree(rng: random.Random, numbers: list[int]) -> tuple[str, Fraction | None]:
    """A random binary expression over `numbers` and its value computed while building it (None on x/0)."""
    items: list[tuple[str, Fraction | None]] = [(str(n), Fraction(n)) for n in numbers]
    while len(items) > 1:
        i, j = rng.sample(range(len(items)), 2)
        (a_text, a), (b_text, b) = items[i], items[j]
        op = rng.choice("+-*/")
        if a is None or b is None:
            value = None
        elif op == "+":
            value = a + b
        elif op == "-":
            value = a - b
        elif op == "*":
            value = a * b
        else:
            value = a / b if b != 0 else None
        items = [item for k, item in enumerate(items) if k not in (i, j)] + [(f"({a_text} {op} {b_text})", value)]
    return items[0]


def test_evaluate_equation_matches_independent_construction():
    rng = random.Random(0)
    for _ in range(2000):
        numbers = [rng.randint(0, 100) for _ in range(rng.randint(1, 5))]
        text, value = _random_tree(rng, numbers)
        expected = None if value is None else float(value)
        assert evaluate_equation(text) == expected, text


@pytest.mark.parametrize(
    "answer, numbers, target, require_all, expected",
    [
        # NYU Assignment 3's prompt example
        ("Step 1: 1 + 2 = 3\nStep 2: 3 / 3 = 1", [1, 2, 3], 1, False, 1.0),
        ("Step 1: 1 + 2 = 3\nStep 2: 3 / 3 = 1", [1, 2, 3], 1, True, 1.0),
        ("step 1) 1 + 2 = 3\n\nstep 2. 3 / 3 = 1", [1, 2, 3], 1, False, 1.0),  # label variants, blank line
        ("1 + 2 = 3\n3 / 3 = 1", [1, 2, 3], 1, False, 1.0),  # steps without labels
        ("Step 1: 1 + 2 = 4\nStep 2: 4 - 3 = 1", [1, 2, 3], 1, False, 0.1),  # wrong arithmetic in step 1
        ("Step 1: 1 + 2 = 3\nStep 2: 3 / 3 = 1\nStep 3: 1 / 1 = 1", [1, 2, 3], 1, False, 0.1),  # 1 reused
        ("Step 1: 5 + 5 = 10", [5, 6], 10, False, 0.1),  # 5 given once
        ("Step 1: 2 * 3 = 6", [2, 3, 9], 6, False, 1.0),  # sub-multiset: 9 unused
        ("Step 1: 2 * 3 = 6", [2, 3, 9], 6, True, 0.1),  # TinyZero: 9 must be used
        ("Step 1: 1 + 2 = 3\nStep 2: 3 + 3 = 6", [1, 2, 3, 7], 6, True, 0.1),  # 7 unused
        ("Step 1: 1 + 2 = 3\nStep 2: 4 + 5 = 9", [1, 2, 4, 5], 9, True, 0.1),  # result 3 left unused
        ("Step 1: 3 / 4 = 0.75\nStep 2: 1 - 0.75 = 0.25\nStep 3: 6 / 0.25 = 24", [6, 1, 3, 4], 24, True, 1.0),
        ("Step 1: 1 / 3 = 0.33\nStep 2: 0.33 * 3 = 1", [1, 3, 3], 1, False, 0.1),  # 1/3 is not 0.33
        ("Step 1: 1 + 0.5 = 1.5", [1, 2], 1, False, 0.1),  # 0.5 is neither given nor a result
        ("Step 1: 1 + 2", [1, 2], 3, False, 0.1),  # no result
        ("Step 1: 1 + 2 = 3 = 3", [1, 2], 3, False, 0.1),
        ("Step 1: 3 - 5 = -2\nStep 2: -2 + 9 = 7", [3, 5, 9], 7, False, 0.1),  # negative results: no unary minus
        ("Step 1: 2 ** 3 = 8", [2, 3], 8, False, 0.1),
        ("(1 + 2) / 3 = 1", [1, 2, 3], 1, False, 1.0),  # one equation with its value
        ("(1 + 2) / 3 = 2", [1, 2, 3], 1, False, 0.1),  # ... and a wrong stated value
        ("(1 + 2)\n/ 3", [1, 2, 3], 1, False, 1.0),  # one equation over two lines
        ("\n".join(["Step 1: 1 + 1 = 2"] * 20), [1, 1], 2, False, 0.1),  # more than MAX_STEPS lines
        ("The answer is (1 + 2) / 3", [1, 2, 3], 1, False, 0.1),  # prose inside the tag
    ],
)
def test_step_answers(answer, numbers, target, require_all, expected):
    text = f"<think>...</think>\n<answer>\n{answer}\n</answer>"
    assert countdown_reward_fn(text, {"numbers": numbers, "target": target}, require_all=require_all) == expected


@pytest.mark.parametrize(
    "text, ground_truth, require_all, expected",
    [
        # Assignment 2's three outcomes; its example leaves 7 unused, which only the at-most-once rule accepts
        ("<answer>(64 + 14) - 16</answer>", {"numbers": [64, 14, 16, 7], "target": 62}, False, 1.0),
        ("<answer>(64 + 14) - 16</answer>", {"numbers": [64, 14, 16, 7], "target": 62}, True, 0.1),
        ("<answer>(64 + 14) + 16</answer>", {"numbers": [64, 14, 16, 7], "target": 62}, False, 0.1),
        ("(64 + 14) - 16", {"numbers": [64, 14, 16, 7], "target": 62}, False, 0.0),
        ("<answer>(65 - 7) - 7</answer>", {"nums": [7, 7, 65], "target": 51}, True, 1.0),  # `nums` key
        ("<answer>6/(1-3/4)</answer>", {"nums": np.array([6, 1, 3, 4]), "target": np.int64(24)}, True, 1.0),
        ("<answer>(7 + 7) + 7</answer>", {"numbers": [7, 7, 65], "target": 21}, False, 0.1),  # 7 three times
        ("<answer>1/0</answer>", {"numbers": [1, 0], "target": 0}, True, 0.1),
        ("<answer></answer>", {"numbers": [1], "target": 1}, True, 0.1),  # tag present, empty answer
        ("<answer>1+2</answer><answer>2+1</answer>", {"numbers": [1, 2], "target": 3}, True, 1.0),  # last tag
        ("<answer>2+1</answer><answer>2-1</answer>", {"numbers": [1, 2], "target": 3}, True, 0.1),
        ("<answer>7/2</answer>", {"numbers": [7, 2], "target": 3}, True, 0.1),  # 3.5 is not 3
        # the free reward of the at-most-once rule: a bare given number that equals the target
        ("<answer> 33 </answer>", {"numbers": [33, 5, 12], "target": 33}, False, 1.0),
        ("<answer> 33 </answer>", {"numbers": [33, 5, 12], "target": 33}, True, 0.1),
        ("<answer> 33 </answer>", {"numbers": [33], "target": 33}, True, 1.0),  # one number: it is the answer
        ("<answer>07 + 1</answer>", {"numbers": [7, 1], "target": 8}, True, 0.1),  # not a Python int literal
        ("<answer>00 + 8</answer>", {"numbers": [0, 8], "target": 8}, True, 1.0),  # `00` is one (zero)
    ],
)
def test_countdown_reward_fn(text, ground_truth, require_all, expected):
    assert countdown_reward_fn(text, ground_truth, require_all=require_all) == expected


def test_default_rule_is_each_number_exactly_once():
    """The bug: the default let `<answer> 33 </answer>` score 1.0 when 33 was one of the given numbers."""
    gt = {"numbers": [33, 5, 12], "target": 33}
    assert countdown_reward_fn("<answer>33</answer>", gt) == 0.1
    assert countdown_reward_components("<answer>33</answer>", gt)["answer_reward"] == 0.0
    assert validate_numbers("33", [33, 5, 12]) is False
    assert countdown_reward_fn("<answer>33 + 5 - 12 + 7</answer>", {"numbers": [33, 5, 12, 7], "target": 33}) == 1.0


def test_components():
    gt = {"numbers": [1, 2, 3], "target": 6}
    assert countdown_reward_components("<answer>1+2+3</answer>", gt) == {
        "reward": 1.0,
        "format_reward": 1.0,
        "answer_reward": 1.0,
    }
    assert countdown_reward_components("<answer>1+2</answer>", gt) == {
        "reward": 0.1,
        "format_reward": 1.0,
        "answer_reward": 0.0,
    }
    assert countdown_reward_components("1+2+3", gt) == {"reward": 0.0, "format_reward": 0.0, "answer_reward": 0.0}


def _all_trees(numbers: tuple[int, ...]):
    """Every fully parenthesised binary expression over `numbers` in this order, with its value (None on x/0)."""
    if len(numbers) == 1:
        yield str(numbers[0]), Fraction(numbers[0])
        return
    for k in range(1, len(numbers)):
        for a_text, a in _all_trees(numbers[:k]):
            for b_text, b in _all_trees(numbers[k:]):
                for op in "+-*/":
                    if a is None or b is None or (op == "/" and b == 0):
                        value = None
                    else:
                        value = {"+": a + b, "-": a - b, "*": a * b}[op] if op != "/" else a / b
                    yield f"({a_text} {op} {b_text})", value


def test_require_all_matches_tinyzero_rule_exhaustively():
    """Every expression over every ordered subset of [2, 3, 4, 6] (8,500 of them), both number rules."""
    numbers, target = [2, 3, 4, 6], 12
    gt = {"numbers": numbers, "target": target}
    counts = {"full": 0, "partial": 0, "wrong": 0}
    for size in range(1, 5):
        for subset in itertools.permutations(numbers, size):
            for text, value in _all_trees(subset):
                correct = value == target
                text = f"<answer>{text}</answer>"
                assert countdown_reward_fn(text, gt, require_all=False) == (1.0 if correct else 0.1), text
                full = correct and size == 4
                assert countdown_reward_fn(text, gt, require_all=True) == (1.0 if full else 0.1), text
                counts["full" if full else "partial" if correct else "wrong"] += 1
    # 4 singles + 12 pairs x 4 ops + 24 triples x 2 shapes x 16 + 24 quadruples x 5 shapes x 64
    assert counts["full"] > 0 and counts["partial"] > 0 and sum(counts.values()) == 4 + 48 + 768 + 7680


@pytest.mark.parametrize(
    "ground_truth, message",
    [
        ({"target": 3}, "'numbers' or 'nums'"),
        ({"numbers": [1, 2]}, "'target'"),
        ({"numbers": [1, 2.5], "target": 3}, "'numbers'"),
        ({"numbers": [1, 2], "target": "x"}, "'target'"),
        ({"numbers": [1, 2], "target": float("nan")}, "'target' must hold integers, got nan"),
        ({"numbers": [1, None], "target": 3}, "'numbers' must hold integers, got None"),
        ({"numbers": [True, 2], "target": 3}, "'numbers' must hold integers, got the bool True"),
        ({"numbers": [], "target": 3}, "'numbers' is empty"),
        ({"numbers": [1, 2], "target": None}, "no 'target'"),
        ([1, 2, 3], "mapping"),
    ],
)
def test_bad_ground_truth_names_the_field(ground_truth, message):
    with pytest.raises(ValueError, match=message):
        countdown_reward_fn("<answer>1+2</answer>", ground_truth)


def test_parse_ground_truth_accepts_numpy_and_integral_floats():
    assert parse_countdown_ground_truth({"nums": np.array([3, 4]), "target": 7.0}) == ([3, 4], 7)
