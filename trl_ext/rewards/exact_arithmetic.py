"""Exact arithmetic on Countdown equations without `eval`: a cached shape parser and a register machine.

The integers are cut out of the equation; what is left (the "shape", e.g. `(0+0)-0*0`) is parsed once by
shunting-yard into a list of binary operations (cached: a training run sees few shapes), and the operations run
on the integers in exact arithmetic (ints while divisions are exact, `Fraction` after), so `6/(1-3/4)` is exactly
24. The grammar is Python's for these tokens (`+ - * /`, parentheses, integers without leading zeros; no `**`, `//`,
implicit multiplication, names); unary signs only with `unary=True` (Assignment 2's rule, where `-2+8` is 6 as Python's
`eval` gives it). `tests/test_rewards_countdown_property.py` and `tests/test_rewards_countdown_single_equation.py`
check it against Python's own parser on every shape up to 6 characters and on random text.
"""

from __future__ import annotations

import operator
import re
from fractions import Fraction

__all__ = ["MAX_EQUATION_CHARS", "MAX_NESTING", "Number", "evaluate_equation", "evaluate_exact", "evaluate_split"]

MAX_EQUATION_CHARS = 256
MAX_NESTING = 32

Number = int | Fraction

# Splits an equation into [gap, number, gap, ...]. `07` is not a Python int literal (`0` and `00` are): zeros before
# a nonzero digit split off as a number of their own, so `07` reads as two operands in a row, which is invalid.
NUMBERS_AND_GAPS = re.compile(r"(0+(?=[1-9])|[0-9]+)")
_DECIMAL = re.compile(r"([0-9]+)\.([0-9]+)")


def _too_deep(text: str) -> bool:
    if text.count("(") <= MAX_NESTING:  # balance itself is the parser's job
        return False
    depth = 0
    for char in text:
        depth += (char == "(") - (char == ")")
        if depth > MAX_NESTING:
            return True
    return False


def _divide(left: Number, right: Number) -> Number:
    if type(left) is int and type(right) is int and not left % right:  # ZeroDivisionError on 0, as wanted
        return left // right  # plain ints while the division is exact: Fraction is ~10x slower than int
    return Fraction(left) / right


def _negate(value: Number, _same: Number) -> Number:
    return -value


_NEGATE = "u-"  # unary minus on the operator stack; binds tighter than `* /`, as in Python
_OPERATIONS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": _divide}
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2, _NEGATE: 3}
# Compiled shapes (see `_compile_shape`), one cache per grammar; a plain dict: a lookup is ~4x cheaper than through
# `lru_cache`.
_SHAPES: dict[str, tuple | None] = {}
_UNARY_SHAPES: dict[str, tuple | None] = {}
_MAX_SHAPES = 1 << 14


def _compile_shape(shape: str, unary: bool = False) -> tuple[tuple, ...] | None:
    """Operations of an expression shape, or None when it is not one.

    `shape` is an equation with every integer replaced by `0` and whitespace removed; the grammar is Python's for
    these tokens: `expr := term (("+" | "-") term)*`, `term := atom (("*" | "/") atom)*`, `atom := 0 | "(" expr ")"`
    (left-associative); with `unary`, also `atom := ("+" | "-") atom` (a prefix sign binds tighter than `* /`:
    `-2*3` is `(-2)*3`). Parsed by shunting-yard, checking that operands and operators alternate. Operands are
    registers 0..k-1 in reading order; operation i `(function, left, right)` writes register k + i (a negation
    reads its one operand twice); the value is the last register.
    """
    if not shape or _too_deep(shape):
        return None
    code: list[tuple] = []
    registers: list[int] = []  # the registers of the values not consumed yet
    pending: list[str] = []  # operators and open parentheses
    n_operands = shape.count("0")
    operand = 0
    expect_operand = True

    def emit() -> None:
        op = pending.pop()
        if op == _NEGATE:
            value = registers.pop()
            code.append((_negate, value, value))
        else:
            right, left = registers.pop(), registers.pop()
            code.append((_OPERATIONS[op], left, right))
        registers.append(n_operands + len(code) - 1)

    for char in shape:
        if expect_operand:
            if char == "0":
                registers.append(operand)
                operand += 1
                expect_operand = False
            elif char == "(":
                pending.append(char)
            elif unary and char == "-":
                pending.append(_NEGATE)  # a prefix operator: nothing to pop before it
            elif not (unary and char == "+"):  # a unary plus is the identity
                return None
        elif char in _PRECEDENCE:
            while pending and pending[-1] != "(" and _PRECEDENCE[pending[-1]] >= _PRECEDENCE[char]:
                emit()
            pending.append(char)
            expect_operand = True
        elif char == ")":
            while pending and pending[-1] != "(":
                emit()
            if not pending:
                return None
            pending.pop()
        else:
            return None
    if expect_operand:
        return None
    while pending:
        if pending[-1] == "(":
            return None
        emit()
    return tuple(code)


def evaluate_split(gaps: list[str], operands: list[Number], unary: bool = False) -> Number | None:
    """Value of an equation given as the text between its integers (`gaps`) and the integers' values.

    `unary` admits prefix signs (`-2+8`), which the default grammar refuses.
    """
    shape = "0".join(gaps).replace(" ", "")
    if not shape.isprintable():  # other whitespace (newlines, tabs, unicode spaces)
        shape = "".join(shape.split())
    shapes = _UNARY_SHAPES if unary else _SHAPES
    code = shapes.get(shape, False)
    if code is False:
        if len(shapes) >= _MAX_SHAPES:
            shapes.clear()
        code = shapes[shape] = _compile_shape(shape, unary)
    if code is None:
        return None
    registers = operands
    append = registers.append
    try:
        for function, i, j in code:
            append(function(registers[i], registers[j]))
    except ZeroDivisionError:
        return None
    return registers[-1]


def evaluate_exact(equation: str, allow_decimals: bool = False) -> Number | None:
    """Exact value of an arithmetic expression, or None when it is invalid.

    `allow_decimals` admits literals such as `0.75` (a step may reuse an earlier step's decimal result); they are
    rewritten as exact fractions first.
    """
    if not isinstance(equation, str):
        return None
    if len(equation) > MAX_EQUATION_CHARS and len(" ".join(equation.split())) > MAX_EQUATION_CHARS:
        return None
    if allow_decimals and "." in equation:
        equation = _DECIMAL.sub(lambda m: f"({int(m.group(1) + m.group(2))}/{10 ** len(m.group(2))})", equation)
    parts = NUMBERS_AND_GAPS.split(equation)
    return evaluate_split(parts[::2], list(map(int, parts[1::2])))


def evaluate_equation(equation: str) -> float | None:
    """Value of an arithmetic expression over `+ - * /`, integers and parentheses; None when invalid.

    Evaluated exactly (rationals), then converted to float: `"6/(1-3/4)"` -> 24.0, `"(65 - 7) - 7"` -> 51.0.
    Invalid (None): other characters (`**`, names, calls, `.`, unicode digits or operators), implicit
    multiplication such as `2(3)`, unary signs, leading zeros, division by zero, more than `MAX_EQUATION_CHARS`
    characters (whitespace runs count as one) or `MAX_NESTING` nested parentheses.

    Args:
        equation: the expression text.

    Returns:
        The value as a float, or None.
    """
    value = evaluate_exact(equation)
    if value is None:
        return None
    try:
        return float(value)
    except OverflowError:
        return None
