"""MATH / GSM8K grading: normalisation, numeric and symbolic equivalence, the time limit, the two rewards."""

from __future__ import annotations

import random
import time
import warnings
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest

from trl_ext.rewards import r1_zero_reward
from trl_ext.rewards.grading_pool import get_grading_pool
from trl_ext.rewards.ground_truth import ground_truth_answers
from trl_ext.rewards.math import (
    MAX_ANSWER_CHARS,
    extract_boxed,
    extract_gsm8k_answer,
    grade,
    normalize_answer,
    question_only_reward_fn,
    r1_zero_reward_fn,
)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("so \\boxed{42}.", "42"),
        ("\\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # the last one
        ("\\boxed{\\sqrt{\\frac{a}{b}}}", "\\sqrt{\\frac{a}{b}}"),  # nested braces
        ("\\fbox{7}", "7"),
        ("$\\boxed 5$", "5"),
        ("\\boxed{\\frac{1}{2}", None),  # unbalanced
        ("\\boxed", None),
        ("no box", None),
        ("\\boxed{}", ""),
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


@pytest.mark.parametrize(
    "solution, expected",
    [
        ("Janet has 3.\n#### 18", "18"),
        ("...\n#### 1,200", "1200"),  # commas stripped
        ("#### -3", "-3"),
        ("a #### 1\n#### 2 ", "2"),  # the last marker
    ],
)
def test_extract_gsm8k_answer(solution, expected):
    assert extract_gsm8k_answer(solution) == expected


def test_extract_gsm8k_answer_without_marker_raises():
    with pytest.raises(ValueError, match="####"):
        extract_gsm8k_answer("The answer is 18.")


@pytest.mark.parametrize(
    "answer, expected",
    [
        ("\\left( 3, \\dfrac{1}{2} \\right)", "(3,\\frac{1}{2})"),
        ("\\tfrac{3}{4}", "\\frac{3}{4}"),
        ("\\frac12", "\\frac{1}{2}"),
        ("\\frac{1}2", "\\frac{1}{2}"),
        ("\\sqrt3", "\\sqrt{3}"),
        ("x = 5", "5"),
        ("k_1 = 5", "5"),
        ("10\\text{ inches}", "10"),
        ("5\\mbox{ cm}^2", "5"),
        ("12 feet", "12"),
        ("5m", "5m"),  # not a unit without the space: could be a product
        ("\\text{Devon}", "Devon"),
        ("\\$1,000.", "1000"),
        ("1{,}000", "1000"),
        ("1,2,3", "1,2,3"),  # a list, not a thousands separator
        ("90^\\circ", "90"),
        ("90^{\\circ}", "90"),
        ("50\\%", "50"),
        ("1/2", "\\frac{1}{2}"),
        (".5", "0.5"),
        ("\\boxed{7}", "7"),
        ("\\rightarrow", "\\rightarrow"),  # `\right` removal must not eat `\rightarrow`
        (12, "12"),
    ],
)
def test_normalize_answer(answer, expected):
    assert normalize_answer(answer) == expected


@pytest.mark.parametrize(
    "model_answer, gt_answer, expected",
    [
        ("\\frac{1}{2}", "0.5", True),  # numeric stage
        ("0.5", "\\frac12", True),
        ("\\dfrac{3}{4}", "0.75", True),
        ("1,000", "1000", True),
        ("$18.", "18", True),  # GSM8K: dollars, trailing period
        ("18.00", "18", True),
        ("x = 3", "3", True),
        ("3", "x=3", True),
        ("90^\\circ", "90", True),
        ("10\\text{ inches}", "10", True),
        ("0.33", "\\frac{1}{3}", False),  # exact: a rounded decimal is not the fraction
        ("17", "18", False),
        ("-3", "3", False),
        ("3\\sqrt{13}", "\\sqrt{117}", True),  # symbolic stage (math-verify)
        ("x^2+1", "1+x^2", True),
        ("\\{1,2\\}", "\\{2,1\\}", True),
        ("(1,2)", "(2,1)", False),
        ("\\sqrt{2}", "3", False),
        ("\\text{(C)}", "C", True),
        (None, "3", False),
        ("", "3", False),
        ("3" * (MAX_ANSWER_CHARS + 1), "3" * (MAX_ANSWER_CHARS + 1), False),  # over the length bound
    ],
)
def test_grade(model_answer, gt_answer, expected):
    assert grade(model_answer, gt_answer) is expected


def test_explosive_answers_are_wrong_without_symbolic_work():
    """`9^{9^{9^9}}` never returns in sympy: the pre-checks call it wrong at once (no worker time, no timeout)."""
    timeouts = get_grading_pool().stats["timeouts"]
    for bomb in ("9^{9^{9^9}}", "100000000!", "\\frac{1}{" * 90 + "2" + "}" * 90):
        start = time.perf_counter()
        assert grade(bomb, "1") is False
        assert time.perf_counter() - start < 0.5
    assert get_grading_pool().stats["timeouts"] == timeouts


@pytest.mark.parametrize(
    "response, ground_truth, expected",
    [
        # (format_reward, answer_reward, reward)
        ("r </think> <answer> 42 </answer>", "42", (1.0, 1.0, 1.0)),
        ("r </think> <answer> \\boxed{\\dfrac{1}{2}} </answer>", "0.5", (1.0, 1.0, 1.0)),  # boxed unwrapped
        ("r </think> <answer> 41 </answer>", "42", (1.0, 0.0, 0.0)),
        ("r </think> <answer> 42", "42", (0.0, 0.0, 0.0)),  # no closing tag
        ("r </think><answer> 42 </answer>", "42", (0.0, 0.0, 0.0)),  # needs `</think> <answer>` exactly
        ("r <answer> 42 </answer>", "42", (0.0, 0.0, 0.0)),
        ("r </think> <answer> 1 </answer> <answer> 42 </answer>", "42", (1.0, 1.0, 1.0)),  # the last tag
        ("r </think> <answer> 42 </answer> trailing 7", "42", (1.0, 1.0, 1.0)),  # text after the tag ignored
        ("r </think> <answer> \\boxed{42 </answer>", "42", (1.0, 0.0, 0.0)),  # unbalanced box
        ("r </think> <answer> 42 </answer>", 42, (1.0, 1.0, 1.0)),  # int ground truth
        ("r </think> <answer> 0.5 </answer>", 0.5, (1.0, 1.0, 1.0)),  # float ground truth
        ("r </think> <answer> 7 </answer>", ["6", "7"], (1.0, 1.0, 1.0)),  # any of several answers
        ("r </think> <answer> 8 </answer>", ["6", "7"], (1.0, 0.0, 0.0)),
    ],
)
def test_r1_zero_reward_fn(response, ground_truth, expected):
    result = r1_zero_reward_fn(response, ground_truth)
    assert (result["format_reward"], result["answer_reward"], result["reward"]) == expected
    assert all(type(value) is float for value in result.values())


@pytest.mark.parametrize(
    "response, ground_truth, expected",
    [
        ("so the answer is $\\boxed{42}$.", "42", (1.0, 1.0, 1.0)),
        ("\\boxed{41} no wait \\boxed{42}", "42", (1.0, 1.0, 1.0)),
        ("\\boxed{41}", "42", (1.0, 0.0, 0.0)),
        ("the answer is 42", "42", (0.0, 0.0, 0.0)),
        ("\\boxed{42", "42", (0.0, 0.0, 0.0)),
        ("\\boxed{\\$1,200}", "1200", (1.0, 1.0, 1.0)),
    ],
)
def test_question_only_reward_fn(response, ground_truth, expected):
    result = question_only_reward_fn(response, ground_truth)
    assert (result["format_reward"], result["answer_reward"], result["reward"]) == expected


def test_bad_ground_truth_type_raises():
    with pytest.raises(ValueError, match="ground_truth"):
        r1_zero_reward_fn("</think> <answer> 1 </answer>", {"answer": 1})


@pytest.mark.parametrize(
    "model_answer, gt_answer, expected",
    [
        ("2516_9", "2516_8", False),  # math-verify dropped the subscripts and said equal
        ("2516_{8}", "2516_8", True),
        ("2516_8", "2516_{8}", True),
        ("2516_{9}", "2516_{8}", False),
        ("1358", "2516_8", False),  # the decimal value is not the base-8 numeral (math-verify agreed)
        ("2516", "2516_8", True),  # the digits without the base, as math-verify had it
        ("10_2", "2_{10}", True),  # the same integer
        ("152a_{11}", "152A_{11}", True),  # digits above 9 in either case
        ("-221_3", "-221_{3}", True),
        ("221_3", "-221_3", False),
        ("0.0011_{2}", "0.0011_2", True),  # not an integer: digits and base compared
        ("0.0011_{3}", "0.0011_2", False),
        ("x_1", "x_{1}", True),
        ("x_2", "x_1", False),
    ],
)
def test_base_subscripts(model_answer, gt_answer, expected):
    assert grade(model_answer, gt_answer) is expected


@pytest.mark.parametrize(
    "ground_truth, message",
    [
        (None, "is None"),
        (float("nan"), "is nan"),
        (np.float64("nan"), "is np.float64\\(nan\\)|is nan"),
        (np.float32("nan"), "nan"),
        (float("inf"), "is inf"),
        ("", "empty string ''"),
        ("   ", "empty string '   '"),
        ([], "empty list"),
        ([None], r"\[0\] is None"),
        (["3", float("nan")], r"\[1\] is nan"),
        ([["3"]], r"\[0\] must be a str"),
        (True, "the bool True"),
        (np.bool_(True), "a bool"),
        (3 + 4j, "complex 3\\+4j|got complex"),
        (np.complex128(1), "a complex number"),
        (np.datetime64("2020-01-01"), "a date"),
        ({"answer": 1}, "got dict"),
    ],
)
def test_ground_truths_that_cannot_be_answers_raise_naming_the_value(ground_truth, message):
    """The bugs: `[None]` echoed as "None" and NaN echoed as "nan" scored 1.0; `np.int64(3)` raised."""
    with pytest.raises(ValueError, match=message):
        r1_zero_reward_fn("r </think> <answer> None </answer>", ground_truth)
    with pytest.raises(ValueError, match=message):
        grade("nan", ground_truth)


@pytest.mark.parametrize(
    "ground_truth, answers",
    [
        (np.int8(3), ["3"]),
        (np.int16(-3), ["-3"]),
        (np.int32(3), ["3"]),
        (np.int64(3), ["3"]),  # raised before
        (np.uint8(200), ["200"]),
        (np.uint64(2**63), [str(2**63)]),
        (np.float16(0.5), ["0.5"]),
        (np.float32(0.1), ["0.1"]),  # its own precision, not 0.10000000149011612
        (np.float64(18.0), ["18"]),
        (18.0, ["18"]),
        (1e-07, ["0.0000001"]),
        (Decimal("2.50"), ["2.50"]),
        (Fraction(3, 4), ["3/4"]),
        (np.str_("\\frac{1}{2}"), ["\\frac{1}{2}"]),
        (np.array(["1", "2"]), ["1", "2"]),
        (np.array([1, 2]), ["1", "2"]),
        ((4, "x=4"), ["4", "x=4"]),
    ],
)
def test_ground_truth_conversions(ground_truth, answers):
    assert ground_truth_answers(ground_truth) == answers
    assert r1_zero_reward_fn(f"r </think> <answer> {answers[-1]} </answer>", ground_truth)["reward"] == 1.0


@pytest.mark.parametrize("marker", ["None", "nan", "NaN", "null", "<NA>"])
def test_a_missing_value_written_as_text_matches_nothing(marker):
    """hiyouga/math12k has answer "None" twice: echoing it must not score, and training must not stop."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert r1_zero_reward_fn(f"r </think> <answer> {marker} </answer>", marker)["reward"] == 0.0
        assert r1_zero_reward_fn("r </think> <answer> 3 </answer>", [marker, "3"])["reward"] == 1.0


def test_trl_reward_names_the_bad_row_before_scoring():
    with pytest.raises(ValueError, match=r"r1_zero_reward: ground_truth\[1\] is nan"):
        r1_zero_reward(["r </think> <answer> 1 </answer>"] * 2, ground_truth=["1", float("nan")])
    with pytest.raises(ValueError, match=r"r1_zero_reward: ground_truth\[0\]\[0\] is None"):
        r1_zero_reward(["r </think> <answer> None </answer>"], ground_truth=[[None]])


def _random_ground_truth(rng):
    scalars = [
        lambda: None,
        lambda: float("nan"),
        lambda: np.float32("nan"),
        lambda: float(rng.choice(["inf", "-inf"])),
        lambda: "",
        lambda: " " * rng.randint(1, 3),
        lambda: rng.choice([True, False, np.bool_(True)]),
        lambda: rng.randint(-(10**6), 10**6),
        lambda: rng.choice([np.int8, np.int32, np.int64, np.uint16])(rng.randint(0, 100)),
        lambda: rng.choice([np.float16, np.float32, np.float64, float])(rng.randint(-50, 50) / 4),
        lambda: Fraction(rng.randint(-9, 9), rng.randint(1, 9)),
        lambda: rng.choice(["7", "\\frac{1}{2}", "x^2+1", "(1,2)", "None", "nan"]),
    ]
    if rng.random() < 0.3:
        return [rng.choice(scalars)() for _ in range(rng.randint(0, 3))]
    return rng.choice(scalars)()


def _missing(value) -> bool:
    if isinstance(value, list):
        return not value or any(_missing(v) for v in value)
    if value is None or isinstance(value, bool | np.bool_):
        return True
    if isinstance(value, str):
        return not value.strip()
    return isinstance(value, float | np.floating) and not np.isfinite(value)


def test_random_ground_truths_raise_or_convert_and_never_reward_an_echo():
    """Seeded fuzz over ground-truth values: a missing value (None, NaN, inf, bool, empty) anywhere raises a
    ValueError that shows it; anything else converts, and echoing the text of a missing value never scores."""
    rng = random.Random(0)
    outcomes = {"raised": 0, "converted": 0}
    for _ in range(3000):
        truth = _random_ground_truth(rng)
        echo = "None" if truth is None else str(truth[0] if isinstance(truth, list) and truth else truth)
        response = f"r </think> <answer> {echo} </answer>"
        if _missing(truth):
            with pytest.raises(ValueError):
                r1_zero_reward_fn(response, truth)
            outcomes["raised"] += 1
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            answers = ground_truth_answers(truth)
            reward = r1_zero_reward_fn(response, truth)["reward"]
        assert all(isinstance(a, str) and a.strip() for a in answers)
        if echo.strip().lower() in ("none", "nan") and len(answers) == 1:
            assert reward == 0.0, truth
        outcomes["converted"] += 1
    assert min(outcomes.values()) > 500
