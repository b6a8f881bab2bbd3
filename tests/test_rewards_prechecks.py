"""Pre-checks for explosive LaTeX: every known bomb is caught in microseconds, no real MATH / GSM8K answer is."""

from __future__ import annotations

import json
import random
import time

import pytest
from conftest import shared_path

from trl_ext.rewards.math_prechecks import MAX_NESTING, explosive

BOMBS = {
    "x^{9^{9^{9^{9}}}}": "powers nested",  # sympy never returns on it
    "9^{9^{9}}": "digits",  # 9^387420489
    "10^{10^{10}}": "digits",
    "\\lfloor 10^{10^{8}} \\rfloor": "digits",
    "\\sin(10^{10^{10}})": "digits",
    "2^{1000000}": "digits",
    "100000000!": "factorial",  # nor on this
    "(10^{10})!": "factorial",
    "{10^{10}}!!": "factorial",
    "(5!)!!": "factorial",  # 120! is fine, (120!)! is not
    "\\Gamma(10^{9})": "factorial",
    "\\binom{10^{9}}{10^{8}}": "binomial",
    "\\dbinom{1000000}{3}": "binomial",
    "\\prod_{k=1}^{10^{9}} k": "terms",
    "\\sum_{k=1}^{10^{9}} k^{2}": "terms",
    "(x+1)^{100000}": "symbolic base",
    "x^{10^{10}}": "symbolic base",
    "e^{e^{e^{e^{e}}}}": "powers nested",
    "2^{2^{2^{2^{2}}}}": "powers nested",
    "\\frac{1}{" * 90 + "2" + "}" * 90: "brackets nested 90",  # 1.7 s to parse without this check
    "(" * 90 + "1" + ")" * 90: "brackets nested 90",
    "\\sqrt{" * 9 + "2" + "}" * 9: "brackets nested 9",
}

HARMLESS = [
    "2^{4950}",  # the largest power among the MATH answers
    "2^{2^{10}}",  # two levels, 309 digits
    "x^{x^{x}}",  # symbolic: sympy keeps it as is
    "7z^{96}(4z+1)",
    "10000!",
    "\\binom{2008}{4}",
    "\\sum_{k=1}^{100} k",
    "\\frac{\\sqrt{3}}{2}",
    "(3, \\frac{1}{2})",
    "\\left( \\frac{\\pi}{2}, 1 \\right]",
    "1,\\!000,\\!000",  # `\!` is a LaTeX space, not a factorial
    "10^{-10}",
    "\\text{(C)}",
    "9**9**9",  # not LaTeX: math-verify reads `**` as nothing explosive
    "",
]


@pytest.mark.parametrize("bomb", sorted(BOMBS))
def test_bombs_are_caught_quickly(bomb):
    start = time.perf_counter()
    reason = explosive(bomb)
    assert time.perf_counter() - start < 0.05
    assert reason is not None and BOMBS[bomb] in reason, reason


@pytest.mark.parametrize("answer", HARMLESS)
def test_harmless_answers_pass(answer):
    assert explosive(answer) is None


def test_nesting_limit_is_exact():
    assert explosive("{" * MAX_NESTING + "1" + "}" * MAX_NESTING) is None
    assert "nested" in explosive("{" * (MAX_NESTING + 1) + "1" + "}" * (MAX_NESTING + 1))


def test_no_reference_answer_is_explosive():
    """The MATH and GSM8K answers in tests/data pass (all 21,292 of MATH500, math12k train and GSM8K did when the
    limits were set: bracket depth at most 3, largest power 2^{4950}, no nested exponents)."""
    answers = []
    for part in (("math", "math500_test.jsonl"), ("math", "math12k_train_subset.jsonl")):
        with open(shared_path(*part)) as handle:
            answers += [json.loads(line)["answer"] for line in handle]
    for part in (("gsm8k", "test.jsonl"), ("gsm8k", "train_head16.jsonl")):
        with open(shared_path(*part)) as handle:
            answers += [json.loads(line)["answer"].rsplit("####", 1)[1].strip() for line in handle]
    assert len(answers) == 500 + 20 + 1319 + 16
    assert [(answer, explosive(answer)) for answer in answers if explosive(answer)] == []


def test_random_latex_never_raises():
    """Any string: a reason or None, never an exception (the parser is lenient by design)."""
    rng = random.Random(0)
    alphabet = list("0123456789+-*/^_!{}()[],.= x") + ["\\frac", "\\sqrt", "\\binom", "\\sum", "\\prod", "\\Gamma"]
    alphabet += ["\\left(", "\\right)", "\\cdot", "\\!", "\\text{", "\\\\", "\\", "'", "9" * 400]
    for _ in range(5000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        assert explosive(text) is None or isinstance(explosive(text), str)
