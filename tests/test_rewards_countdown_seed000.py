"""Seed 000's own Countdown verifier (`seed000=True`, registry name `countdown_seed000`), and seed 001's 1 / 0
Countdown reward (`binary=True`, `countdown_binary`).

The seed's asserts are checked as the seed writes them; the rule's grammar is checked against an independent oracle:
Python's own parser (`ast`) on the seed's character set, with the node whitelist extended by unary `+` / `-` (what
the seed's `eval`-based `_evaluate_equation` accepts) and `Counter` for "each number at most once".
"""

from __future__ import annotations

import ast
import itertools
import operator
import pickle
import random
import re
from collections import Counter
from fractions import Fraction

import pytest

from trl_ext.rewards import REWARD_FUNCS, CountdownReward, countdown_reward_fn, get_reward_funcs
from trl_ext.rewards.countdown import MAX_EQUATION_CHARS, seed000_answer_value, validate_numbers
from trl_ext.rewards.exact_arithmetic import evaluate_exact

_SEED_CHARS = re.compile(r"[0-9+\-*/()\s]+")


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


def oracle(answer: str, numbers: list[int]):
    """The seed's rule by Python's parser: its characters, `eval`'s grammar minus `**` / `//`, numbers at most once."""
    if len(" ".join(answer.split())) > MAX_EQUATION_CHARS or not _SEED_CHARS.fullmatch(answer):
        return None
    used, given = Counter(int(t) for t in re.findall(r"[0-9]+", answer)), Counter(numbers)
    if any(used[n] > given[n] for n in used):
        return None
    try:
        return _node_value(compile(" ".join(answer.split()), "<answer>", "eval", ast.PyCF_ONLY_AST).body)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
        return None


def test_the_seeds_own_asserts():
    """Seed 000 section 1.2-1.3, as written (numbers at most once; 1.0 / 0.1 / 0.0)."""
    assert validate_numbers("(64 + 14) - 16", [64, 14, 16, 7], require_all=False) is True  # a subset is valid
    assert seed000_answer_value("(64 + 14) - 16", [64, 14, 16, 7]) == 62
    assert seed000_answer_value("(7 + 7) + 7", [7, 7, 65]) is None  # 7 used three times, given twice
    assert seed000_answer_value("10 + 9", [10, 8, 2]) is None  # 9 is not available
    assert seed000_answer_value("(65 - 7) - 7", [65, 7, 7]) == 51
    truth = {"numbers": [79, 17, 60], "target": 36}
    assert countdown_reward_fn("...thinking... <answer>(79 - (60 - 17))</answer>", truth, seed000=True) == 1.0
    assert countdown_reward_fn("...thinking...<answer>(79 + 60) + 17</answer>", truth, seed000=True) == 0.1
    assert countdown_reward_fn("...thinking...The final answer is 62.", truth, seed000=True) == 0.0


@pytest.mark.parametrize(
    ("answer", "numbers", "target", "seed000", "default"),
    [
        ("-2+8", [2, 8], 6, 1.0, 0.1),  # unary minus: eval gives 6; the game's default grammar has no unary signs
        ("8 - 2", [2, 8, 5], 6, 1.0, 0.1),  # 5 left unused: valid for the seed, not under exactly-once
        ("+8-2", [2, 8], 6, 1.0, 0.1),  # unary plus: also what eval accepts
        ("2*-3+12", [2, 3, 12], 6, 1.0, 0.1),
        ("(2 + 4) = 6", [2, 4], 6, 0.1, 1.0),  # `=` is not among the seed's characters; the default reads the claim
        ("Step 1: 2 + 4 = 6", [2, 4], 6, 0.1, 1.0),  # no step lines in the seed's grammar
        ("2**3-2", [2, 3, 2], 6, 0.1, 0.1),  # ** is not one of the four operations (a bare eval would give 6)
        ("12//2", [12, 2], 6, 0.1, 0.1),  # nor //
        ("2(3)", [2, 3], 6, 0.1, 0.1),  # implicit multiplication
        ("6.0", [6], 6, 0.1, 0.1),  # `.` is not among the seed's characters
    ],
)
def test_seed000_rule_against_the_default(answer, numbers, target, seed000, default):
    text = f"<think>...</think> <answer>{answer}</answer>"
    truth = {"numbers": numbers, "target": target}
    assert countdown_reward_fn(text, truth, seed000=True) == seed000
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
            assert seed000_answer_value(text, numbers) == expected, text
            valid += expected is not None
            valid_default += evaluate_exact(text) is not None
    assert (valid, valid_default) == (138, 52)  # pinned: the shapes unary signs add (`-0`, `0*-0`, `-(0)`, ...)


def test_random_answers_against_pythons_parser():
    rng = random.Random(1)
    alphabet = list("0123456789+-*/() \n") + ["**", "//", "=", ".", "x", "07", "--", "-(", "\u00a0"]
    for _ in range(5_000):
        numbers = [rng.randint(1, 20) for _ in range(rng.choice([3, 4]))]
        pieces = [str(rng.choice(numbers)) if rng.random() < 0.4 else rng.choice(alphabet) for _ in range(12)]
        text = "".join(pieces).strip()
        assert seed000_answer_value(text, numbers) == oracle(text, numbers), (text, numbers)


def test_registry_name_pickle_and_argument_checks():
    reward = REWARD_FUNCS["countdown_seed000"]
    assert get_reward_funcs(["countdown_seed000"]) == [reward]
    assert reward.__name__ == "countdown_reward_seed000" and reward.require_all is False and reward.seed000 is True
    texts = ["<answer>-2+8</answer>", "<answer>2+8</answer>", "no tag"]
    columns = {"nums": [[2, 8]] * 3, "target": [6] * 3}
    assert reward(texts, **columns) == [1.0, 0.1, 0.0]
    clone = pickle.loads(pickle.dumps(reward))
    assert clone.__name__ == reward.__name__ and clone(texts, **columns) == [1.0, 0.1, 0.0]
    with pytest.raises(ValueError, match="drop require_all"):
        CountdownReward(require_all=True, seed000=True)
    with pytest.raises(ValueError, match="drop require_all"):
        countdown_reward_fn("<answer>8-2</answer>", {"numbers": [2, 8], "target": 6}, require_all=True, seed000=True)


def test_binary_reward_pays_only_correct_answers_and_keeps_the_components():
    """Seed 001 section 6.3: reward 1 for a verified answer, 0 otherwise (no 0.1 for a tagged wrong answer)."""
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
