r"""Cheap checks that keep explosive LaTeX answers (power towers, huge factorials, deep nesting) away from sympy.

sympy computes integer powers, factorials, binomials and finite sums exactly, so `9^{9^{9}}`, `100000000!`,
`\binom{10^9}{10^8}` or `\prod_{k=1}^{10^9} k` never return, and a 90-deep `\frac` takes seconds to parse. These
answers are wrong for any MATH / GSM8K problem; `explosive(text)` finds them in microseconds, before any symbolic
work, so they score 0 at once instead of holding a grading worker for its whole time cap.

How: a lenient recursive-descent pass over the LaTeX tokens that bounds the size of every purely numeric
subexpression as `log10(1 + |value|)` (sums and products add these bounds, `a^b` multiplies by b, `n!` costs
n log10 n, `\binom{n}{k}` at most n log10 2) and rejects when a number sympy would compute exactly has more than
`MAX_DIGITS` digits, a non-numeric base is raised to a power above `MAX_EXPONENT`, a factorial, Gamma, sum or
product runs over more than `MAX_COUNT` terms, powers nest more than `MAX_POWER_NESTING` deep (`e^{e^{e^{e}}}`),
or brackets nest more than `MAX_NESTING` deep. Symbols are unknowns: `x^{x^{x}}` passes (sympy keeps it as is).
The limits sit far above every answer in MATH (12,500 answers: bracket depth at most 3, largest power `2^{4950}`,
no nested exponents); the per-answer time cap of the grading pool covers whatever this misses.
"""

from __future__ import annotations

import math
import re

__all__ = ["MAX_COUNT", "MAX_DIGITS", "MAX_EXPONENT", "MAX_NESTING", "MAX_POWER_NESTING", "explosive"]

MAX_NESTING = 8
MAX_DIGITS = 100_000
MAX_EXPONENT = 1_000
MAX_COUNT = 10_000
MAX_POWER_NESTING = 2

_TOKEN = re.compile(r"\\[a-zA-Z]+|\\.|[0-9]+(?:\.[0-9]*)?|\.[0-9]+|\s+|.", re.DOTALL)
_DIGITS = frozenset("0123456789")
_OPEN = {"{": "}", "(": ")", "[": "]"}
_CLOSERS = {"}", ")", "]", "\\right", "\\}"}
_PRODUCTS = {"*", "\\cdot", "\\times", "/", "\\div"}
_SEPARATORS = {"+", "-", "=", ",", ";", "<", ">", "&", "\\\\", "\\pm", "\\mp", "|", ":", "\\le", "\\ge", "\\leq"}
_SKIPPED = {"\\left", "\\right", "\\big", "\\Big", "\\bigl", "\\bigr", "\\,", "\\;", "\\!", "\\ ", "\\quad"}
_BINOMIALS = {"\\binom", "\\dbinom", "\\tbinom", "\\choose"}
_ITERATED = {"\\sum", "\\prod"}
_POSTFIX = {"^", "_", "!", "'"}
_TWO_ARGUMENTS = {"\\frac", "\\dfrac", "\\tfrac", "\\cfrac"}


class _Explosive(Exception):
    pass


def explosive(text: str) -> str | None:
    """Why `text` would make sympy compute something huge, or None when it looks harmless.

    Args:
        text: a LaTeX answer (at most a few thousand characters; the caller bounds the length).

    Returns:
        A short reason such as `"a number with about 370,000,000 digits"`, or None.
    """
    depth = deepest = 0
    for char in text:
        if char in "{([":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "})]":
            depth -= 1
    if deepest > MAX_NESTING:
        return f"brackets nested {deepest} deep (limit {MAX_NESTING})"
    tokens = [t for t in _TOKEN.findall(text) if not t.isspace() and t not in _SKIPPED]
    try:
        _Parser(tokens).parse_all()
    except _Explosive as reason:
        return str(reason)
    except RecursionError:
        return "too deeply nested"
    return None


def _ten_to(size: float) -> float:
    return 10.0**size if size < 300 else math.inf


def _digits(bound: float) -> str:
    return f"about {bound:,.0f}" if bound < 1e15 else f"about 10^{math.log10(bound):,.0f}"


class _Parser:
    """Size bounds (`log10(1 + |value|)`, None when symbolic) of the expressions in a token list."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens, self.position, self.power_depth = tokens, 0, 0

    def peek(self) -> str:
        return self.tokens[self.position] if self.position < len(self.tokens) else ""

    def take(self) -> str:
        token = self.peek()
        self.position += 1
        return token

    def parse_all(self) -> None:
        while self.position < len(self.tokens):
            start = self.position
            self.expression()
            if self.position == start:  # a stray closer or separator: skip it
                self.position += 1

    def expression(self) -> float | None:
        total: float | None = 0.0
        while True:
            while self.peek() in _SEPARATORS:
                self.take()
            if not self.peek() or self.peek() in _CLOSERS:
                return total
            start = self.position
            size = self.term()
            if self.position == start:
                return total
            total = None if total is None or size is None else total + size

    def term(self) -> float | None:
        total: float | None = 0.0
        while True:
            size = self.power()
            total = None if total is None or size is None else total + size
            if self.peek() in _PRODUCTS:
                self.take()
            elif not self.starts_atom(self.peek()):
                return total

    def starts_atom(self, token: str) -> bool:
        return bool(token) and token not in _CLOSERS and token not in _SEPARATORS and token not in _POSTFIX

    def power(self) -> float | None:
        base = self.postfix()
        while self.peek() in ("^", "_"):
            if self.take() == "_":  # a subscript: checked, not sized
                self.postfix()
                continue
            self.power_depth += 1
            if self.power_depth > MAX_POWER_NESTING:
                raise _Explosive(f"powers nested over {MAX_POWER_NESTING} deep")
            exponent = self.postfix()
            self.power_depth -= 1
            base = self.raise_to(base, exponent)
        return base

    def raise_to(self, base: float | None, exponent: float | None) -> float | None:
        if exponent is None:
            return None
        exponent_value = _ten_to(exponent)
        if base is None:
            if exponent_value > MAX_EXPONENT + 1:
                raise _Explosive(f"a power with exponent {_digits(exponent_value)} of a symbolic base")
            return None
        size = exponent_value * base
        if size > MAX_DIGITS:
            raise _Explosive(f"a number with {_digits(size)} digits")
        return size

    def postfix(self) -> float | None:
        size = self.atom()
        while self.peek() in ("!", "'"):
            if self.take() == "!":
                size = self.factorial(size)
        return size

    def factorial(self, size: float | None) -> float | None:
        if size is None:
            return None
        n = _ten_to(size)
        if n > MAX_COUNT + 1:
            raise _Explosive(f"the factorial of a number with {_digits(size)} digits")
        return n * max(math.log10(n), 1.0)

    def group(self) -> float | None:
        """`{...}`, `(...)` or `[...]` when one starts here (else one atom): the size of its content."""
        opener = self.peek()
        if opener not in _OPEN:
            return self.postfix()
        return self.bracketed(self.take())

    def bracketed(self, opener: str) -> float | None:
        """The content after `opener` (already taken) up to its closer, which is taken when present."""
        size = self.expression()
        if self.peek() == _OPEN[opener]:
            self.take()
        return size

    def atom(self) -> float | None:
        token = self.take()
        if not token:
            return None
        if token[0] in _DIGITS or (token[0] == "." and len(token) > 1):
            return math.log10(1.0 + float(token)) if len(token) < 300 else len(token)
        if token in _OPEN:
            return self.bracketed(token)
        if token in ("-", "+"):
            return self.postfix()
        if token in _TWO_ARGUMENTS:
            numerator = self.group()
            self.group()
            return numerator
        if token in _BINOMIALS:
            n = self.group()
            self.group()
            if n is None:
                return None
            bound = _ten_to(n) * math.log10(2)
            if bound > MAX_DIGITS:
                raise _Explosive(f"a binomial coefficient with up to {_digits(bound)} digits")
            return bound
        if token == "\\Gamma":
            return self.factorial(self.group())
        if token in _ITERATED:
            while self.peek() in ("_", "^"):
                if self.take() == "^":
                    upper = self.group()
                    if upper is not None and upper > math.log10(1 + MAX_COUNT):
                        raise _Explosive(f"a sum or product over {_digits(_ten_to(upper))} terms")
                else:
                    self.group()
            self.power()
            return None
        if token == "\\sqrt":
            if self.peek() == "[":
                self.group()
            return self.group()
        if token.startswith("\\") and self.peek() in ("{", "("):  # \text{..}, \sin(..): checked, not sized
            self.group()
        return None
