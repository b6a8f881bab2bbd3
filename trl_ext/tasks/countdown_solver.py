"""Countdown's exact solver (all solutions, or one preferring all numbers) and the seeded problem generator.

A problem is a list of numbers and an integer target; an answer is an arithmetic expression with `+ - * /` and
parentheses that uses each number at most once and equals the target.

Solver (`solve_countdown`): dynamic programming over subsets of the numbers. For every subset (bitmask) it keeps the
distinct values its expressions reach, each with one way to build it (the most natural: integer, then non-negative,
intermediates); a subset's values are all `a op b` with `a` and `b` from the two halves of a split. Arithmetic is
exact (`int`, `Fraction` after an inexact division), so `6/(1-3/4) = 24` counts and float round-off never fakes a
solution. Solutions that use ALL numbers come first (TinyZero's rule); only when none exists does it return one over
the largest subset that reaches the target (the courses' sub-multiset rule), else None. For the full set it never
enumerates the last combination: for each value `a` of one half it looks the needed partner (`t - a`, `a - t`,
`t + a`, `t / a`, `a / t`, `t * a`) up in the other half's table. Up to 4 numbers this takes about 1 ms a problem.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Iterable, Sequence
from fractions import Fraction
from functools import lru_cache
from typing import Any

from trl_ext.tasks._io import as_int

Number = int | Fraction
_ADD, _MUL, _ATOM = 1, 2, 3  # precedence of an expression's top operator, for minimal parentheses


def _div(a: Number, b: Number) -> Number:
    if type(a) is int and type(b) is int:
        return a // b if a % b == 0 else Fraction(a, b)
    value = Fraction(a) / b
    return value.numerator if value.denominator == 1 else value


def _combine(a: Number, b: Number, integer_only: bool = False) -> list[tuple[Number, str, bool]]:
    """Values of `a op b` and `b op a` as (value, op, swapped); integral results are ints (cheaper to hash)."""
    out = [(a + b, "+", False), (a * b, "*", False), (a - b, "-", False), (b - a, "-", True)]
    if type(a) is not int or type(b) is not int:
        out = [(v.numerator if v.denominator == 1 else v, op, swapped) for v, op, swapped in out]
    if b != 0 and (not integer_only or a % b == 0):
        out.append((_div(a, b), "/", False))
    if a != 0 and (not integer_only or b % a == 0):
        out.append((_div(b, a), "/", True))
    return out


def _masks_by_size(n: int) -> list[int]:
    return sorted(range(1, 1 << n), key=lambda m: (m.bit_count(), m))


def _own_score(value: Number) -> int:
    """0: a non-negative integer, 1: a negative integer, 2: a fraction (ranks how natural an intermediate is)."""
    if type(value) is int:
        return 0 if value >= 0 else 1
    return 2


def _subset_tables(nums: Sequence[int], with_full: bool, integer_only: bool = False) -> list[dict | None]:
    """table[mask] = {value: (score, recipe)} for the subset of `nums` in `mask`.

    recipe is None for a single number, else (op, mask_a, value_a, mask_b, value_b) meaning `value_a op value_b`;
    score is the worst `_own_score` of the expression's intermediates, and the lowest-score recipe per value is kept
    so recorded solutions prefer integer (then non-negative) intermediates. The full mask is filled only when
    `with_full` (the solver checks it by lookup instead); `integer_only` drops inexact divisions.
    """
    n = len(nums)
    full = (1 << n) - 1
    table: list[dict | None] = [None] * (1 << n)
    for mask in _masks_by_size(n):
        if mask == full and not with_full and n > 1:
            break
        if mask.bit_count() == 1:
            x = nums[mask.bit_length() - 1]
            table[mask] = {x: (_own_score(x), None)}
            continue
        values: dict = {}
        sub = (mask - 1) & mask
        while sub:
            other = mask ^ sub
            if sub < other:  # each unordered split once; _combine covers both orders
                for a, (score_a, _) in table[sub].items():
                    for b, (score_b, _) in table[other].items():
                        operands_score = max(score_a, score_b)
                        for value, op, swapped in _combine(a, b, integer_only):
                            score = max(operands_score, _own_score(value))
                            known = values.get(value)
                            if known is None or score < known[0]:
                                recipe = (op, other, b, sub, a) if swapped else (op, sub, a, other, b)
                                values[value] = (score, recipe)
            sub = (sub - 1) & mask
        table[mask] = values
    return table


def _render(table: list[dict | None], nums: Sequence[int], mask: int, value: Number) -> tuple[str, int]:
    recipe = table[mask][value][1]
    if recipe is None:
        return _leaf(nums[mask.bit_length() - 1])
    op, mask_a, a, mask_b, b = recipe
    return _join(_render(table, nums, mask_a, a), op, _render(table, nums, mask_b, b))


def _leaf(x: int) -> tuple[str, int]:
    """A number as (text, precedence); a negative one in parentheses."""
    return (str(x) if x >= 0 else f"({x})"), _ATOM


def _join(left: tuple[str, int], op: str, right: tuple[str, int]) -> tuple[str, int]:
    """`left op right` with minimal parentheses, from (text, precedence) pairs."""
    (left_text, left_prec), (right_text, right_prec) = left, right
    # a+(b-c) == a+b-c, but a-(b+c), a*(b+c), a/(b*c) need their parentheses.
    if left_prec < (_ADD if op in "+-" else _MUL):
        left_text = f"({left_text})"
    if right_prec < {"+": _ADD, "-": _MUL, "*": _MUL, "/": _ATOM}[op]:
        right_text = f"({right_text})"
    return f"{left_text}{op}{right_text}", (_ADD if op in "+-" else _MUL)


def _partners(a: Number, target: int) -> list[tuple[Number | None, str, bool]]:
    """Values `b` with `a op b == target` or `b op a == target`; None means any `b` (0*b == 0)."""
    out: list[tuple[Number | None, str, bool]] = [(target - a, "+", False), (a - target, "-", False)]
    out.append((target + a, "-", True))
    if a != 0:
        out.append((_div(target, a), "*", False))
        out.append((target * a, "/", True))  # b / a == target
        if target != 0:
            out.append((_div(a, target), "/", False))  # a / b == target
    elif target == 0:
        out.append((None, "*", False))
    return out


def _solve_full(table: list[dict | None], nums: Sequence[int], target: int) -> str | None:
    """An all-numbers expression for `target`, the one with the most natural intermediates; None if none exists."""
    n = len(nums)
    full = (1 << n) - 1
    if n == 1:
        return str(nums[0]) if nums[0] == target else None
    floor = _own_score(target)  # no expression for the target scores better than the target itself
    best = None
    for sub in range(1, full):
        other = full ^ sub
        if sub > other:
            continue
        small, large = (sub, other) if len(table[sub]) <= len(table[other]) else (other, sub)
        for a, (score_a, _) in table[small].items():
            for b, op, swapped in _partners(a, target):
                if b is None:
                    b = next(iter(table[large]))
                elif b not in table[large]:
                    continue
                score = max(score_a, table[large][b][0], floor)
                if best is None or score < best[0]:
                    best = (score, (op, large, b, small, a) if swapped else (op, small, a, large, b))
                    if score == floor:
                        table[full] = {target: best}
                        return _render(table, nums, full, target)[0]
    if best is None:
        return None
    table[full] = {target: best}
    return _render(table, nums, full, target)[0]


def solve_countdown(nums: Sequence[int], target: int) -> str | None:
    """One expression over `nums` that equals `target`, preferring one that uses every number.

    Args:
        nums: the available numbers (each may be used at most once; duplicates are separate numbers).
        target: the integer to reach.

    Returns:
        An expression such as `"14-(10-1)"` (minimal parentheses, no spaces) that uses all numbers when any such
        expression exists; otherwise one over the largest subset that works (a single number equal to the target
        counts); None when no subset reaches the target.
    """
    nums = [as_int(x, "nums") for x in nums]
    target = as_int(target, "target")
    if not nums:
        return None
    table = _subset_tables(nums, with_full=False)
    solution = _solve_full(table, nums, target)
    if solution is not None:
        return solution
    full = (1 << len(nums)) - 1
    for mask in reversed(_masks_by_size(len(nums))):
        if mask != full and target in table[mask]:
            return _render(table, nums, mask, target)[0]
    return None


def countdown_solutions(nums: Sequence[int], target: int) -> list[str]:
    """Every distinct expression that uses ALL of `nums` once each, keeps every intermediate an integer (exact
    division, no division by zero) and equals `target`, sorted; [] when there is none.

    Operand order counts (`2+3` and `3+2` are both listed) and parentheses are minimal, as in `solve_countdown`.
    Enumeration is exhaustive over expression trees: 192 for 3 numbers, 9,216 for 4; meant for small problems (the
    CPU demo draws its SFT targets from these, so the warm-started policy has more than one way to answer).
    """
    nums = tuple(sorted(as_int(x, "nums") for x in nums))
    target = as_int(target, "target")
    if not 1 <= len(nums) <= 5:
        raise ValueError(f"countdown_solutions enumerates 1 to 5 numbers, got {len(nums)}")
    return sorted(_all_expressions(nums).get(target, ()))


@lru_cache(maxsize=4096)
def _all_expressions(nums: tuple[int, ...]) -> dict[int, frozenset[str]]:
    """value -> expressions over all of `nums` (integer intermediates only), by combining two items at a time."""
    found: dict[int, set[str]] = {}

    def combine(items: tuple[tuple[int, str, int], ...]) -> None:
        if len(items) == 1:
            value, text, _ = items[0]
            found.setdefault(value, set()).add(text)
            return
        for i, (a, a_text, a_prec) in enumerate(items):
            for j, (b, b_text, b_prec) in enumerate(items):
                if i == j:
                    continue
                rest = tuple(item for k, item in enumerate(items) if k not in (i, j))
                exact_division = (("/", a // b),) if b and a % b == 0 else ()
                for op, value in (("+", a + b), ("-", a - b), ("*", a * b), *exact_division):
                    text, prec = _join((a_text, a_prec), op, (b_text, b_prec))
                    combine(rest + ((value, text, prec),))

    combine(tuple((x, *_leaf(x)) for x in nums))
    return {value: frozenset(texts) for value, texts in found.items()}


def _moves(values: Sequence[int]) -> list[tuple[int, int, str, int]]:
    """Every step `values[i] op values[j] = v` with `v` a non-negative integer (exact division, no division by zero),
    as (i, j, op, v); both operand orders of `+` and `*`."""
    out = []
    for i, a in enumerate(values):
        for j, b in enumerate(values):
            if i == j:
                continue
            out += [(i, j, "+", a + b), (i, j, "*", a * b)]
            if a >= b:
                out.append((i, j, "-", a - b))
            if b and a % b == 0:
                out.append((i, j, "/", a // b))
    return out


@lru_cache(maxsize=65536)
def _reaches(values: tuple[int, ...], target: int) -> bool:
    """Whether steps with non-negative integer results combine all of `values` (sorted) into `target`."""
    if len(values) == 1:
        return values[0] == target
    for i, j, _, v in _moves(values):
        rest = tuple(sorted([x for k, x in enumerate(values) if k not in (i, j)] + [v]))
        if _reaches(rest, target):
            return True
    return False


def countdown_working(
    nums: Sequence[int], target: int, rng: random.Random, dead_ends: int = 0
) -> tuple[list[str], str] | None:
    """A worked search for `target` over all of `nums`: steps that each combine two of the current numbers into a
    non-negative integer, written `a op b=v` (the numbers, not their expressions), and the expression they build.

    The search the steps record: a first step after which the numbers left cannot reach the target is a dead end;
    `dead_ends` of them (fewer when the problem has fewer), drawn by `rng`, come first, then every step of one
    solution (its first step drawn by `rng` among those that lead on, each later step likewise). So the same
    problem is worked in more or fewer steps, and the expression is one of `countdown_solutions`' (non-negative
    intermediates only).

    Args:
        nums: the numbers (each used once).
        target: the integer to reach.
        rng: the draws (which dead ends, which solution).
        dead_ends: dead-end first steps to write before the solution.

    Returns:
        (steps, expression), e.g. `(["14*1=14", "14-10=4", "4+1=5"], "14-10+1")` for `[14, 1, 10] -> 5` with one
        dead end; None when no solution with non-negative integer intermediates exists.
    """
    target = as_int(target, "target")
    items = [(as_int(x, "nums"), *_leaf(as_int(x, "nums"))) for x in nums]
    if dead_ends < 0:
        raise ValueError(f"dead_ends must be >= 0, got {dead_ends}")
    if not _reaches(tuple(sorted(x for x, _, _ in items)), target):
        return None
    steps: list[str] = []
    first = True
    while len(items) > 1:
        values = [x for x, _, _ in items]
        leads, dead = [], []
        for i, j, op, v in _moves(values):
            rest = tuple(sorted([x for k, x in enumerate(values) if k not in (i, j)] + [v]))
            (leads if _reaches(rest, target) else dead).append((i, j, op, v))
        if first:
            for i, j, op, v in rng.sample(dead, min(dead_ends, len(dead))):
                steps.append(f"{values[i]}{op}{values[j]}={v}")
            first = False
        i, j, op, v = rng.choice(leads)
        steps.append(f"{values[i]}{op}{values[j]}={v}")
        joined = _join(items[i][1:], op, items[j][1:])
        items = [item for k, item in enumerate(items) if k not in (i, j)] + [(v, *joined)]
    return steps, items[0][1]


@lru_cache(maxsize=8192)
def _full_table(sorted_nums: tuple[int, ...], integer_only: bool) -> tuple[list[dict | None], tuple[int, ...]]:
    """Subset tables of `sorted_nums` and the sorted integer values reachable with all of them."""
    table = _subset_tables(list(sorted_nums), with_full=True, integer_only=integer_only)
    full = (1 << len(sorted_nums)) - 1
    return table, tuple(sorted(v for v in table[full] if type(v) is int))


def make_countdown_problems(
    n: int,
    seed: int,
    num_count: Sequence[int] = (3,),
    max_number: int = 20,
    max_target: int = 100,
    exclude: Iterable[tuple[tuple[int, ...], int]] | None = None,
    min_number: int = 1,
    min_target: int = 1,
    integer_intermediates: bool = True,
) -> list[dict[str, Any]]:
    """`n` distinct solvable problems, deterministic in `seed`.

    Each problem draws its size from `num_count`, its numbers uniformly from [min_number, max_number], then its
    target uniformly among the integers in [min_target, max_target] that an expression using ALL the numbers reaches
    (numbers that reach none are redrawn). With `integer_intermediates` (default, as the nano prototype) only targets
    reachable with integer intermediate results count, so `6/(1-3/4)`-only targets are not drawn. No two problems
    share a `countdown_key`, and none has a key in `exclude`.

    Returns:
        Dicts `{"nums": list[int], "target": int, "solution": str}`; `solution` uses every number exactly once.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    counts = sorted({int(c) for c in num_count})
    if not counts or counts[0] < 1:
        raise ValueError(f"num_count must be positive integers, got {num_count!r}")
    if min_number > max_number or min_target > max_target:
        raise ValueError(f"empty range: numbers [{min_number}, {max_number}], targets [{min_target}, {max_target}]")
    rng = random.Random(seed)
    excluded = set(exclude or ())
    seen: set[tuple[tuple[int, ...], int]] = set()
    problems: list[dict[str, Any]] = []
    attempts, max_attempts = 0, 1000 + 200 * n
    while len(problems) < n:
        attempts += 1
        if attempts > max_attempts:
            raise ValueError(
                f"found only {len(problems)} of {n} distinct problems after {max_attempts} draws; widen the number "
                "or target range, or exclude fewer problems"
            )
        nums = [rng.randint(min_number, max_number) for _ in range(rng.choice(counts))]
        sorted_nums = tuple(sorted(nums))
        table, reachable = _full_table(sorted_nums, integer_intermediates)
        targets = reachable[bisect.bisect_left(reachable, min_target) : bisect.bisect_right(reachable, max_target)]
        if not targets:
            continue
        target = rng.choice(targets)
        key = (sorted_nums, target)
        if key in excluded or key in seen:
            continue
        seen.add(key)
        solution = _render(table, sorted_nums, (1 << len(nums)) - 1, target)[0]
        problems.append({"nums": nums, "target": target, "solution": solution})
    return problems
