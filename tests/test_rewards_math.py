"""MATH / GSM8K grading: normalisation, numeric and symbolic equivalence, the time limit, the two rewards."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from trl_ext.rewards import math as rmath
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
        ("3", "", False),
        ("3" * (MAX_ANSWER_CHARS + 1), "3" * (MAX_ANSWER_CHARS + 1), False),  # over the length bound
    ],
)
def test_grade(model_answer, gt_answer, expected):
    assert grade(model_answer, gt_answer) is expected


def test_grade_time_limit_holds_in_a_thread():
    """`9^{9^{9^9}}` never finishes in sympy; the worker is killed at the limit, even off the main thread."""
    rmath._symbolic_equal.cache_clear()
    grade("1", "2")  # start the worker outside the timed part
    restarts = rmath._WORKER.restarts
    results = {}

    def run():
        start = time.perf_counter()
        results["value"] = grade("9^{9^{9^9}}", "1", timeout=1.0)
        results["seconds"] = time.perf_counter() - start

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert results["value"] is False
    assert 1.0 <= results["seconds"] < 5.0
    assert rmath._WORKER.restarts == restarts + 1
    assert grade("3\\sqrt{13}", "\\sqrt{117}") is True  # a fresh worker answers the next call


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


def test_worker_exits_when_its_parent_is_killed():
    """A parent killed with SIGKILL cannot clean up; the worker, busy on `9^{9^{9^9}}`, still exits."""
    script = (
        "from trl_ext.rewards import math as rmath\n"
        "rmath.grade('3\\\\sqrt{13}', '\\\\sqrt{117}')\n"
        "print(rmath._WORKER._proc.pid, flush=True)\n"
        "rmath.grade('9^{9^{9^9}}', '1', timeout=60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        worker_pid = int(parent.stdout.readline())
        time.sleep(1.0)  # the power tower is in the worker now
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(worker_pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.kill(worker_pid, signal.SIGKILL)
    raise AssertionError("the worker outlived its killed parent by 10 s")


def test_a_worker_killed_from_outside_is_replaced_without_a_wrong_grade():
    assert grade("2\\sqrt{2}", "\\sqrt{8}") is True  # the worker is up
    # Not reaped here: the next call finds it dead either before sending (poll) or while reading (EOF, retried).
    os.kill(rmath._WORKER._proc.pid, signal.SIGKILL)
    assert grade("3\\sqrt{3}", "\\sqrt{27}") is True  # not a false "wrong": answered by a fresh worker
