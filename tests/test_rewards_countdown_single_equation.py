"""Assignment 2's own Countdown verifier (`single_equation=True`, registry name `countdown_single_equation`), and NYU
Assignment 3's 1 / 0 Countdown reward (`binary=True`, `countdown_binary`).

The course's asserts are checked as the course writes them; the rule's grammar is checked against an independent
oracle: the course's character set ("digits, spaces, +, -, *, /, (, )": the space is its only whitespace) on the raw
string, then Python's own parser (`ast`) reading the raw string as `eval` reads it, with the node whitelist extended by
unary `+` / `-` (what the course's `eval`-based `_evaluate_equation` accepts) and `Counter` for "each number at most
once". The oracle itself is checked against a real `eval` on test strings of that character set (our own input).
"""

from __future__ import annotations

import ast
import itertools
import operator
import pickle
import random
import re
import warnings
from collections import Counter
from fractions import Fraction

import pytest

from trl_ext.rewards import REWARD_FUNCS, CountdownReward, countdown_reward_fn, get_reward_funcs
from trl_ext.rewards.assignment2_grpo import _evaluate_equation
from trl_ext.rewards.countdown import MAX_EQUATION_CHARS, single_equation_answer_value, validate_numbers
from trl_ext.rewards.exact_arithmetic import evaluate_exact

_SEED_CHARS = re.compile(r"[0-9+\-*/() ]+")  # the course's list: the literal space, no other whitespace


_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: lambda a, b: Fraction(a) / b}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}


def _node_value(node):
    """Exact value of a whitelisted node: integer constants, the four binary operators, unary + and -."""
    if type(node) is ast.UnaryOp and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_node_value(node.operand))
    if type(node) is ast.BinOp and type(node.op) in _BINARY:
        return _BINARY[type(node.op)](_node_value(node.left), _node_value(node.right))  # ZeroDivisionError on 0
    if type(node) is ast.Constant and type(node.value) is int:
        return node.value
    raise ValueError


def parse_as_eval(text: str) -> ast.expr:
    """The tree `eval(text)` runs: `eval` skips leading spaces and tabs of a string first (`compile` alone raises
    IndentationError on `" 1+2"`; `test_the_oracle_reads_as_eval_does` pins both)."""
    return compile(text.lstrip(" \t"), "<answer>", "eval", ast.PyCF_ONLY_AST).body


def oracle(answer: str, numbers: list[int] | None = None):
    """The course's rule by Python's parser on the raw string: its characters, `eval`'s grammar minus `**` / `//`,
    numbers at most once (not checked when `numbers` is None)."""
    if len(" ".join(answer.split())) > MAX_EQUATION_CHARS or not _SEED_CHARS.fullmatch(answer):
        return None
    if numbers is not None:
        used, given = Counter(int(t) for t in re.findall(r"[0-9]+", answer)), Counter(numbers)
        if any(used[n] > given[n] for n in used):
            return None
    try:
        return _node_value(parse_as_eval(answer))
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
        return None


def eval_or_none(text: str):
    """A real `eval` on a test string (never on model output), None where it raises."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)  # `2(3)`: "'int' object is not callable; perhaps you missed..."
        try:
            return eval(text, {"__builtins__": {}})  # noqa: S307 (our own strings of digits, operators and spaces)
        except (SyntaxError, TypeError, ZeroDivisionError):
            return None


def test_the_seeds_own_asserts():
    """Assignment 2 section 1.2-1.3, as written (numbers at most once; 1.0 / 0.1 / 0.0)."""
    assert validate_numbers("(64 + 14) - 16", [64, 14, 16, 7], require_all=False) is True  # a subset is valid
    assert single_equation_answer_value("(64 + 14) - 16", [64, 14, 16, 7]) == 62
    assert single_equation_answer_value("(7 + 7) + 7", [7, 7, 65]) is None  # 7 used three times, given twice
    assert single_equation_answer_value("10 + 9", [10, 8, 2]) is None  # 9 is not available
    assert single_equation_answer_value("(65 - 7) - 7", [65, 7, 7]) == 51
    truth = {"numbers": [79, 17, 60], "target": 36}
    assert countdown_reward_fn("...thinking... <answer>(79 - (60 - 17))</answer>", truth, single_equation=True) == 1.0
    assert countdown_reward_fn("...thinking...<answer>(79 + 60) + 17</answer>", truth, single_equation=True) == 0.1
    assert countdown_reward_fn("...thinking...The final answer is 62.", truth, single_equation=True) == 0.0


@pytest.mark.parametrize(
    ("answer", "numbers", "target", "single_equation", "default"),
    [
        ("-2+8", [2, 8], 6, 1.0, 0.1),  # unary minus: eval gives 6; the game's default grammar has no unary signs
        ("8 - 2", [2, 8, 5], 6, 1.0, 0.1),  # 5 left unused: valid for the course, not under exactly-once
        ("+8-2", [2, 8], 6, 1.0, 0.1),  # unary plus: also what eval accepts
        ("2*-3+12", [2, 3, 12], 6, 1.0, 0.1),
        ("(2 + 4) = 6", [2, 4], 6, 0.1, 1.0),  # `=` is not among the course's characters; the default reads the claim
        ("Step 1: 2 + 4 = 6", [2, 4], 6, 0.1, 1.0),  # no step lines in the course's grammar
        ("2**3-2", [2, 3, 2], 6, 0.1, 0.1),  # ** is not one of the four operations (a bare eval would give 6)
        ("12//2", [12, 2], 6, 0.1, 0.1),  # nor //
        ("2(3)", [2, 3], 6, 0.1, 0.1),  # implicit multiplication
        ("6.0", [6], 6, 0.1, 0.1),  # `.` is not among the course's characters
    ],
)
def test_single_equation_rule_against_the_default(answer, numbers, target, single_equation, default):
    text = f"<think>...</think> <answer>{answer}</answer>"
    truth = {"numbers": numbers, "target": target}
    assert countdown_reward_fn(text, truth, single_equation=True) == single_equation
    assert countdown_reward_fn(text, truth) == default


def test_every_shape_up_to_five_characters_against_pythons_parser():
    """All 19,607 strings over `0 + - * / ( )` of length 1-5 with numbers substituted, numbers free to repeat."""
    rng = random.Random(0)
    valid = valid_default = 0
    for length in range(1, 6):
        for chars in itertools.product("0+-*/()", repeat=length):
            text = "".join(str(rng.choice([0, 1, 2, 3, 7])) if c == "0" else c for c in chars)
            numbers = [0, 0, 1, 1, 2, 2, 3, 3, 7, 7]
            expected = oracle(text, numbers)
            assert single_equation_answer_value(text, numbers) == expected, text
            valid += expected is not None
            valid_default += evaluate_exact(text) is not None
    assert (valid, valid_default) == (138, 52)  # pinned: the shapes unary signs add (`-0`, `0*-0`, `-(0)`, ...)


_WHITESPACE = [" ", "  ", "\n", "\t", "\r", "\x0b", "\x0c", "\u00a0", "\u2003"]


def test_random_answers_against_pythons_parser():
    """Raw strings, whitespace of every kind anywhere (leading and trailing too): nothing is collapsed or stripped."""
    rng = random.Random(1)
    alphabet = list("0123456789+-*/() ") + ["**", "//", "=", ".", "x", "07", "--", "-(", *_WHITESPACE]
    invalid_by_whitespace = 0
    for _ in range(5_000):
        numbers = [rng.randint(1, 20) for _ in range(rng.choice([3, 4]))]
        if rng.random() < 0.5:  # random pieces
            pieces = [str(rng.choice(numbers)) if rng.random() < 0.4 else rng.choice(alphabet) for _ in range(12)]
        else:  # a well-formed equation with whitespace of any kind between (or before, after) its tokens
            pieces = [rng.choice(["", "(", "-"]), str(rng.choice(numbers))]
            for _ in range(rng.randint(1, 3)):
                pieces += [rng.choice("+-*/"), str(rng.choice(numbers))]
            pieces.append(")" if pieces[0] == "(" else "")
            pieces = [p + rng.choice(_WHITESPACE) if rng.random() < 0.3 else p for p in pieces]
        text = "".join(pieces)
        expected = oracle(text, numbers)
        assert single_equation_answer_value(text, numbers) == expected, (text, numbers)
        free = oracle(text)  # `_evaluate_equation` has no number rule
        assert _evaluate_equation(text) == (None if free is None else float(free)), text
        spaces_only = "".join(" " if c.isspace() else c for c in text)
        invalid_by_whitespace += expected is None and oracle(spaces_only, numbers) is not None
    assert invalid_by_whitespace > 500  # the whitespace cases are really exercised, not all invalid for other reasons


def test_the_oracle_reads_as_eval_does():
    """On strings of the course's characters (leading spaces included), the oracle's parse is `eval`'s verdict."""
    assert eval_or_none(" 1+2") == 3 and eval_or_none("  (1+2) ") == 3  # eval skips leading spaces
    with pytest.raises(IndentationError):
        compile(" 1+2", "<answer>", "eval")  # compile does not: hence `parse_as_eval`
    rng = random.Random(2)
    alphabet = list("0123456789+-*/() ") + ["  ", "-(", "07"]
    agree = valid = 0
    for _ in range(3_000):
        text = "".join(str(rng.randint(0, 20)) if rng.random() < 0.4 else rng.choice(alphabet) for _ in range(10))
        if "**" in text or "//" in text:  # outside the course's rule (and a power could run for ever)
            continue
        want, got = eval_or_none(text), oracle(text)
        assert (want is None) == (got is None), text
        assert got is None or float(got) == pytest.approx(want, rel=1e-12, abs=1e-12), text
        agree += 1
        valid += got is not None
    assert agree > 2_500 and valid > 200


@pytest.mark.parametrize(
    ("equation", "value", "eval_value"),
    [
        # (the equation, the Assignment 2 rule's value, what a bare `eval` gives)
        ("1 +\n2", None, None),  # a line break inside the expression: eval raises SyntaxError
        ("79 -\n(60 - 17)", None, None),  # the same in an answer for target 36
        ("(1 +\n2)", None, 3),  # eval joins lines inside parentheses, but a line break is not in the course's list
        ("1\t+ 2", None, 3),  # nor a tab
        ("\t1+2", None, 3),  # eval skips a leading tab; still not a character the course admits
        ("1 +\u00a02", None, None),  # a no-break space: eval raises SyntaxError, and it is not a space either
        (" 1 + 2", 3.0, 3),  # leading spaces: eval skips them (compile alone would raise IndentationError)
        ("1 + 2  ", 3.0, 3),
        ("1 2", None, None),  # a space between two numbers: SyntaxError
        ("2 * -3 + 12", 6.0, 6),
        ("2* *3", None, None),  # `* *` is not `**`
    ],
)
def test_whitespace_as_the_seed_and_eval_read_it(equation, value, eval_value):
    assert eval_or_none(equation) == eval_value  # what eval does, checked here rather than assumed
    assert _evaluate_equation(equation) == value
    numbers = [int(t) for t in re.findall(r"[0-9]+", equation)]
    assert single_equation_answer_value(equation, numbers) == value == oracle(equation, numbers)


def test_a_line_break_inside_the_answer_earns_the_format_reward():
    truth = {"numbers": [79, 60, 17], "target": 36}
    assert countdown_reward_fn("<answer>79 -\n(60 - 17)</answer>", truth, single_equation=True) == 0.1
    # stripped ends
    assert countdown_reward_fn("<answer>\n79 - (60 - 17)\n</answer>", truth, single_equation=True) == 1.0
    assert countdown_reward_fn("<answer>79 - (60 - 17)</answer>", truth, single_equation=True) == 1.0
    # not Assignment 2's
    assert countdown_reward_fn("<answer>79 -\n(60 - 17)</answer>", truth, require_all=False) == 1.0


def test_registry_name_pickle_and_argument_checks():
    reward = REWARD_FUNCS["countdown_single_equation"]
    assert get_reward_funcs(["countdown_single_equation"]) == [reward]
    assert (
        reward.__name__ == "countdown_reward_single_equation"
        and reward.require_all is False
        and reward.single_equation is True
    )
    texts = ["<answer>-2+8</answer>", "<answer>2+8</answer>", "no tag"]
    columns = {"nums": [[2, 8]] * 3, "target": [6] * 3}
    assert reward(texts, **columns) == [1.0, 0.1, 0.0]
    clone = pickle.loads(pickle.dumps(reward))
    assert clone.__name__ == reward.__name__ and clone(texts, **columns) == [1.0, 0.1, 0.0]
    with pytest.raises(ValueError, match="drop require_all"):
        CountdownReward(require_all=True, single_equation=True)
    with pytest.raises(ValueError, match="drop require_all"):
        countdown_reward_fn(
            "<answer>8-2</answer>", {"numbers": [2, 8], "target": 6}, require_all=True, single_equation=True
        )


def test_binary_reward_pays_only_correct_answers_and_keeps_the_components():
    """NYU Assignment 3 section 6.3: reward 1 for a verified answer, 0 otherwise (no 0.1 for a tagged wrong answer)."""
    binary = REWARD_FUNCS["countdown_binary"]
    texts = ["<answer>(1 + 2) * 3</answer>", "<answer>1 + 2 + 3</answer>", "no tag"]
    columns = {"nums": [[1, 2, 3]] * 3, "target": [9] * 3}
    assert binary(texts, **columns) == [1.0, 0.0, 0.0] and binary.__name__ == "countdown_reward_binary"
    assert REWARD_FUNCS["countdown"](texts, **columns) == [1.0, 0.1, 0.0]
    logged = {}
    binary(texts, log_metric=lambda key, value: logged.__setitem__(key, value), **columns)
    assert logged == {
        "rewards/countdown_reward_binary/format_reward": pytest.approx(2 / 3),
        "rewards/countdown_reward_binary/answer_reward": pytest.approx(1 / 3),
    }
    assert pickle.loads(pickle.dumps(binary))(texts, **columns) == [1.0, 0.0, 0.0]
