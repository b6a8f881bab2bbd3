"""The Countdown scorer's shape parser against an independent oracle: Python's own parser (`ast`) on the same text.

The oracle is the scorer this project shipped before the shape parser: the text goes through `compile(...,
ast.PyCF_ONLY_AST)` and a whitelist of nodes (integer constants and the four binary operators) is evaluated in
exact rationals; steps are checked in one pass (arithmetic, then numbers) with a Counter. The scorer must give the
same value on every input: every shape up to 6 characters exhaustively, random strings over a hostile alphabet,
random expression trees, random "Step X:" answers, and whole completions under both number rules.
"""

from __future__ import annotations

import ast
import itertools
import random
import re
from collections import Counter
from fractions import Fraction

import pytest

from trl_ext.rewards import countdown as cd
from trl_ext.rewards.countdown import MAX_EQUATION_CHARS, MAX_NESTING, MAX_STEPS, evaluate_equation, score_code
from trl_ext.rewards.exact_arithmetic import evaluate_exact

_CHARS = re.compile(r"[0-9+\-*/()\s]+")
_STEP_CHARS = re.compile(r"[0-9.+\-*/()\s]+")
_DECIMAL = re.compile(r"([0-9]+)\.([0-9]+)")
_PREFIX = re.compile(r"\s*step\s*[0-9]+\s*[:.)]\s*", re.IGNORECASE)
_RESULT = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*")
_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?")


def _node_value(node):
    if type(node) is ast.BinOp:
        left, right = _node_value(node.left), _node_value(node.right)
        op = type(node.op)
        if op is ast.Add:
            return left + right
        if op is ast.Sub:
            return left - right
        if op is ast.Mult:
            return left * right
        if op is ast.Div:
            return Fraction(left) / right  # ZeroDivisionError on 0
        raise ValueError
    if type(node) is ast.Constant and type(node.value) is int:
        return node.value
    raise ValueError


def oracle_equation(equation: str, allow_decimals: bool = False):
    """Exact value by Python's parser and a node whitelist, or None (the previous implementation)."""
    if len(" ".join(equation.split())) > MAX_EQUATION_CHARS:
        return None
    if not (_STEP_CHARS if allow_decimals else _CHARS).fullmatch(equation):
        return None
    depth = 0
    for char in equation:
        depth += (char == "(") - (char == ")")
        if depth > MAX_NESTING:
            return None
    if allow_decimals and "." in equation:
        equation = _DECIMAL.sub(lambda m: f"({int(m.group(1) + m.group(2))}/{10 ** len(m.group(2))})", equation)
    try:
        return _node_value(compile(" ".join(equation.split()), "<answer>", "eval", ast.PyCF_ONLY_AST).body)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError, MemoryError):
        return None


def _literal(token: str):
    return Fraction(token) if "." in token else int(token)


def oracle_answer(answer: str, numbers: list[int], require_all: bool):
    """Value of an answer (equation or "Step X:" lines) under the number rule, or None (previous implementation)."""
    if len(answer) > MAX_EQUATION_CHARS * MAX_STEPS:
        return None
    if "=" not in answer:
        equation = " ".join(answer.split())
        used = Counter(int(t) for t in re.findall(r"[0-9]+", equation))
        given = Counter(numbers)
        if (used != given) if require_all else any(used[n] > given[n] for n in used):
            return None
        return oracle_equation(equation)
    lines = [line for line in answer.splitlines() if line.strip()]
    if not lines or len(lines) > MAX_STEPS:
        return None
    pool, result = Counter(numbers), None
    for line in lines:
        prefix = _PREFIX.match(line)
        left, sep, right = line[prefix.end() if prefix else 0 :].rpartition("=")
        claimed = _RESULT.fullmatch(right)
        if not sep or claimed is None:
            return None
        value = oracle_equation(left, allow_decimals=True)
        if value is None or value != _literal(claimed.group(1)):
            return None
        for token in _NUMBER.findall(left):
            if pool[_literal(token)] <= 0:
                return None
            pool[_literal(token)] -= 1
        result = value
        pool[result] += 1
    if require_all:
        pool[result] -= 1
        if any(pool.values()):
            return None
    return result


def test_every_shape_up_to_six_characters():
    """All 137,256 strings over `0 + - * / ( )` of length 1-6, the `0`s replaced by numbers (some of them 0)."""
    rng = random.Random(0)
    checked = valid = 0
    for length in range(1, 7):
        for chars in itertools.product("0+-*/()", repeat=length):
            text = "".join(str(rng.choice([0, 1, 2, 3, 7, 12])) if c == "0" else c for c in chars)
            expected = oracle_equation(text)
            assert evaluate_exact(text) == expected, text
            checked += 1
            valid += expected is not None
    assert checked == sum(7**n for n in range(1, 7)) and valid == 130  # the valid ones, counted once by hand


def _random_tree(rng: random.Random, depth: int = 0) -> str:
    if depth > 4 or rng.random() < 0.3:
        return str(rng.choice([0, 1, 2, 5, 9, 10, 25, 100, 999, rng.randint(0, 10**6)]))
    left, right = _random_tree(rng, depth + 1), _random_tree(rng, depth + 1)
    space = rng.choice(["", " ", "\n", "  "])
    text = f"{left}{space}{rng.choice('+-*/')} {right}"
    return f"({text})" if rng.random() < 0.6 else text


def test_random_trees_and_hostile_strings():
    rng = random.Random(1)
    alphabet = list("0123456789+-*/() \n\t.") + ["**", "//", "٣", "x", "07", "00", "\u00a0", "(" * 40, ")" * 40, "e9"]
    for _ in range(10_000):
        if rng.random() < 0.5:
            text = _random_tree(rng)
            if rng.random() < 0.3:  # a local corruption
                i = rng.randrange(len(text) + 1)
                text = text[:i] + rng.choice(alphabet) + text[i:]
        else:
            text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        assert evaluate_exact(text) == oracle_equation(text), text
        assert evaluate_exact(text, allow_decimals=True) == oracle_equation(text, allow_decimals=True), text
    deep = "(" * MAX_NESTING + "1" + ")" * MAX_NESTING
    assert evaluate_exact(deep) == oracle_equation(deep) == 1
    assert evaluate_exact("(" + deep + ")") is None is oracle_equation("(" + deep + ")")


def _random_steps(rng: random.Random, numbers: list[int]) -> str:
    pool, lines = list(numbers), []
    for i in range(rng.randint(1, 4)):
        a, b = (rng.choice(pool) if pool and rng.random() < 0.9 else rng.randint(0, 20) for _ in range(2))
        op = rng.choice("+-*/")
        value = {"+": a + b, "-": a - b, "*": a * b}.get(op, Fraction(a) / b if b else Fraction(0))
        if rng.random() < 0.2:
            value += rng.choice([1, -1])
        claimed = str(value) if Fraction(value).denominator == 1 else f"{float(value):.2f}"
        label = rng.choice([f"Step {i + 1}: ", f"step {i + 1}) ", "", "  STEP 1. "])
        lines.append(f"{label}{a} {op} {b} = {claimed}")
        pool.append(value)
    if rng.random() < 0.2:
        lines.insert(rng.randrange(len(lines) + 1), rng.choice(["", "   ", "so", "x = 3", "1 = 1 = 1"]))
    return rng.choice(["\n", "\r\n", "\n\n"]).join(lines)


@pytest.mark.parametrize("require_all", [True, False])
def test_whole_answers_agree_with_the_oracle(require_all):
    """Equations over the given numbers and "Step X:" answers, valid and broken, under both number rules."""
    rng = random.Random(2)
    outcomes = Counter()
    for _ in range(10_000):
        numbers = [rng.randint(1, 12) for _ in range(rng.randint(2, 4))]
        if rng.random() < 0.5:
            items = [str(n) for n in rng.sample(numbers, rng.randint(1, len(numbers)))]
            while len(items) > 1:
                b, a = items.pop(), items.pop(rng.randrange(len(items)))
                op = rng.choice("+-*/")
                items.append(f"({a} {op} {b})" if rng.random() < 0.7 else f"{a}{op}{b}")
            answer = items[0] + (rng.choice(["", " = 7", "\n"]) if rng.random() < 0.2 else "")
        else:
            answer = _random_steps(rng, numbers)
        expected = oracle_answer(answer, numbers, require_all)
        assert cd._answer_value(answer, numbers, require_all) == expected, (answer, numbers)
        target = expected if expected is not None and rng.random() < 0.8 else rng.randint(1, 30)
        code = score_code(f"<think>...</think>\n<answer>\n{answer}\n</answer>", numbers, target, require_all)
        assert code == (cd.CORRECT if expected == target else cd.WRONG), (answer, numbers, target)
        outcomes["valid" if expected is not None else "invalid"] += 1
    assert outcomes["valid"] > 1000 and outcomes["invalid"] > 1000  # both branches exercised


def test_public_evaluate_equation_uses_the_same_path():
    assert evaluate_equation("6/(1-3/4)") == 24.0
    assert evaluate_equation("1" + " " * 300 + "+ 1") == 2.0  # whitespace runs count as one character
    assert evaluate_equation("1+" * (MAX_EQUATION_CHARS // 2) + "1") is None
