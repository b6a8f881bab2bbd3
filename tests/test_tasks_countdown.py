"""Countdown solver, generator and demo splits, checked by an independent exact evaluator and on real problems."""

from __future__ import annotations

import ast
import itertools
import random
from collections import Counter
from fractions import Fraction

import pytest
from conftest import shared_path

from trl_ext.tasks import (
    compact_completion,
    compact_prompt,
    countdown_key,
    countdown_solutions,
    countdown_working,
    make_countdown_demo_splits,
    make_countdown_problems,
    solve_countdown,
)

_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


def exact_value(expression: str) -> tuple[Fraction, list[int]]:
    """Value of `expression` in exact Fractions and the numbers it uses; only + - * /, parentheses and integers."""
    used: list[int] = []

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            used.append(node.value)
            return Fraction(node.value)
        assert isinstance(node, ast.BinOp) and type(node.op) in _OPS, f"unexpected node in {expression!r}"
        left, right = walk(node.left), walk(node.right)
        op = _OPS[type(node.op)]
        if op == "+":
            return left + right
        if op == "-":
            return left - right
        if op == "*":
            return left * right
        assert right != 0, f"division by zero in {expression!r}"
        return left / right

    value = walk(ast.parse(expression, mode="eval").body)
    return value, used


def uses_at_most_once(used: list[int], nums: list[int]) -> bool:
    return not (Counter(used) - Counter(nums))


@pytest.mark.parametrize(
    "nums, target, uses_all",
    [
        ([6, 1, 3, 4], 24, True),  # only 6/(1-3/4): needs exact fractional intermediates
        ([3, 3, 8, 8], 24, True),  # only 8/(3-8/3)
        ([1, 5, 5, 5], 24, True),  # only 5*(5-1/5)
        ([64, 14, 16, 7], 62, True),  # Assignment 2's (64+14)-16 leaves 7 out; 14+16*7-64 uses all four
        ([7, 7, 65], 51, True),  # duplicates are separate numbers: 65-7-7
        ([10, 8, 2], 18, False),  # no expression with all three makes 18; 10+8 does
        ([5, 3, 100], 5, False),  # a single number equal to the target is a subset solution
        ([0, 5], 0, True),  # 0*5
    ],
)
def test_solver_hand_cases(nums, target, uses_all):
    solution = solve_countdown(nums, target)
    assert solution is not None
    value, used = exact_value(solution)
    assert value == target
    assert uses_at_most_once(used, nums)
    assert (sorted(used) == sorted(nums)) is uses_all


def test_solver_prefers_all_numbers_and_returns_none_when_impossible():
    # 2+3 = 5 with a subset, and 2*3-1 = 5 with all: the all-numbers answer must win.
    value, used = exact_value(solve_countdown([1, 2, 3], 5))
    assert value == 5 and sorted(used) == [1, 2, 3]
    assert solve_countdown([10, 8, 2], 19) is None  # checked by hand: no subset of {10, 8, 2} reaches 19
    assert solve_countdown([1, 1], 3) is None
    assert solve_countdown([], 3) is None


def _reachable_by_plain_recursion(values: list[Fraction]) -> set[Fraction]:
    """Every value of an expression that uses all `values`: combine any two, recurse (the textbook search)."""
    if len(values) == 1:
        return {values[0]}
    out: set[Fraction] = set()
    for i, j in itertools.combinations(range(len(values)), 2):
        a, b = values[i], values[j]
        rest = [v for k, v in enumerate(values) if k not in (i, j)]
        results = {a + b, a - b, b - a, a * b} | ({a / b} if b else set()) | ({b / a} if a else set())
        for value in results:
            out |= _reachable_by_plain_recursion([*rest, value])
    return out


def test_solver_matches_plain_recursion_on_random_small_problems():
    # Reference: the largest k such that some k numbers reach the target (None if no subset does).
    rng = random.Random(0)
    for _ in range(150):
        nums = [rng.randint(0, 12) for _ in range(rng.choice([1, 2, 3, 4]))]
        target = rng.randint(-10, 60)
        expected = None
        for k in range(len(nums), 0, -1):
            subsets = itertools.combinations([Fraction(x) for x in nums], k)
            if any(target in _reachable_by_plain_recursion(list(sub)) for sub in subsets):
                expected = k
                break
        solution = solve_countdown(nums, target)
        if expected is None:
            assert solution is None, (nums, target, solution)
            continue
        value, used = exact_value(solution)
        assert value == target and uses_at_most_once(used, nums), (nums, target, solution)
        assert len(used) == expected, (nums, target, solution)


def test_solver_minimal_parentheses_are_still_correct():
    # a-(b-c), a/(b*c), (a+b)*c: the renderer may drop only parentheses that do not change the value.
    for nums, target in [([14, 1, 10], 5), ([100, 5, 4], 5), ([2, 3, 4], 20), ([9, 3, 2], 3), ([20, 4, 5], 1)]:
        solution = solve_countdown(nums, target)
        value, used = exact_value(solution)
        assert value == target, solution
        assert sorted(used) == sorted(nums), solution


def _perturbed(solution: str, target: int) -> str:
    """The solution with one operator changed so its value is wrong but its numbers stay valid."""
    swaps = {"+": "-", "-": "+", "*": "+", "/": "*"}
    for i, char in enumerate(solution):
        if char in swaps:
            candidate = solution[:i] + swaps[char] + solution[i + 1 :]
            try:
                if exact_value(candidate)[0] != target:
                    return candidate
            except AssertionError:  # a swap that divides by zero
                continue
    raise AssertionError(f"no wrong-valued perturbation of {solution!r}")


def test_solver_solves_every_dev_problem_and_the_reward_accepts_its_answers(shared_data):
    """One test (not two sharing a fixture) so pytest-xdist does not solve the 1024 problems twice."""
    import pyarrow.parquet as pq

    from trl_ext.rewards.countdown import countdown_reward_fn

    rows = pq.read_table(shared_path("countdown", "dev.parquet"), columns=["nums", "target"]).to_pylist()
    assert len(rows) == 1024
    with_all, subset_only = 0, 0
    for row in rows:
        solution = solve_countdown(row["nums"], row["target"])
        assert solution is not None, row
        value, used = exact_value(solution)
        assert value == row["target"], (row, solution)
        assert uses_at_most_once(used, row["nums"]), (row, solution)
        if sorted(used) == sorted(row["nums"]):
            with_all += 1
        else:
            subset_only += 1
        ground_truth = {"numbers": row["nums"], "target": row["target"]}
        assert countdown_reward_fn(f"<answer>{solution}</answer>", ground_truth) == 1.0, (row, solution)
        wrong = _perturbed(solution, row["target"])
        assert countdown_reward_fn(f"<answer>{wrong}</answer>", ground_truth) == pytest.approx(0.1), (row, wrong)
        assert countdown_reward_fn(solution, ground_truth) == 0.0, (row, solution)  # no answer tags
    # Measured: every dev problem has a solution with all of its numbers (TinyZero generated them that way).
    assert (with_all, subset_only) == (1024, 0)


def test_generator_is_deterministic_and_seed_dependent():
    first = make_countdown_problems(50, seed=3)
    assert first == make_countdown_problems(50, seed=3)
    other = make_countdown_problems(50, seed=4)
    assert [(p["nums"], p["target"]) for p in first] != [(p["nums"], p["target"]) for p in other]


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(num_count=(3,), max_number=20, max_target=100),
        dict(num_count=(3, 4), max_number=50, min_target=10, max_target=200),
        dict(num_count=(4,), min_number=5, max_number=9, max_target=60, integer_intermediates=False),
    ],
)
def test_generated_problems_are_solvable_distinct_and_in_range(kwargs):
    problems = make_countdown_problems(200, seed=0, **kwargs)
    assert len(problems) == 200
    keys = {countdown_key(p["nums"], p["target"]) for p in problems}
    assert len(keys) == 200
    sizes = Counter(len(p["nums"]) for p in problems)
    assert set(sizes) == set(kwargs["num_count"])
    for p in problems:
        assert all(kwargs.get("min_number", 1) <= x <= kwargs["max_number"] for x in p["nums"])
        assert kwargs.get("min_target", 1) <= p["target"] <= kwargs["max_target"]
        value, used = exact_value(p["solution"])
        assert value == p["target"], p
        assert sorted(used) == sorted(p["nums"]), p  # recorded solutions use every number exactly once


def test_generator_exclude_and_impossible_request():
    base = make_countdown_problems(100, seed=1)
    excluded = {countdown_key(p["nums"], p["target"]) for p in base}
    again = make_countdown_problems(100, seed=1, exclude=excluded)
    assert excluded.isdisjoint(countdown_key(p["nums"], p["target"]) for p in again)
    # Two numbers in {1, 2} reach at most a handful of targets: 50 distinct problems cannot exist.
    with pytest.raises(ValueError, match="distinct problems"):
        make_countdown_problems(50, seed=0, num_count=(2,), max_number=2, max_target=10)


def test_compact_format_and_demo_splits():
    assert compact_prompt([14, 1, 10], 5) == "[14, 1, 10] -> 5 :"
    assert compact_completion("14-(10-1)") == "<answer>14-(10-1)</answer>"
    train, held_out = make_countdown_demo_splits(300, 100, seed=0)
    assert (len(train), len(held_out)) == (300, 100)
    assert train.column_names == ["prompt", "completion", "nums", "target"]
    train_keys = {countdown_key(n, t) for n, t in zip(train["nums"], train["target"], strict=True)}
    held_keys = {countdown_key(n, t) for n, t in zip(held_out["nums"], held_out["target"], strict=True)}
    assert train_keys.isdisjoint(held_keys)
    for row in list(train) + list(held_out):
        assert row["prompt"] == f"[{', '.join(map(str, row['nums']))}] -> {row['target']} :"
        assert row["completion"].startswith("<answer>") and row["completion"].endswith("</answer>")
        value, used = exact_value(row["completion"][len("<answer>") : -len("</answer>")])
        assert value == row["target"] and sorted(used) == sorted(row["nums"])
    # The held-out set is fixed by the seed, whatever the training size.
    _, held_out_again = make_countdown_demo_splits(10, 100, seed=0)
    assert held_out_again["prompt"] == held_out["prompt"]


@pytest.mark.parametrize(
    "nums, target, expected",
    [
        ([2, 3], 6, ["2*3", "3*2"]),
        ([4, 2], 2, ["4-2", "4/2"]),
        ([3, 4], 1, ["4-3"]),  # 3/4 and 4/3 are not integers; 3-4 is -1
        ([14, 1, 10], 5, ["1+14-10", "1-(10-14)", "1-10+14", "14+1-10", "14-(10-1)", "14-10+1"]),
        ([2, 3], 7, []),
    ],
)
def test_countdown_solutions_hand_cases(nums, target, expected):
    assert countdown_solutions(nums, target) == expected


def _integer_values_by_plain_recursion(nums: tuple[int, ...]) -> set[int]:
    """Values reachable with all of `nums`, every intermediate an integer: combine any ordered pair, recurse."""
    if len(nums) == 1:
        return {nums[0]}
    out = set()
    for i, j in itertools.permutations(range(len(nums)), 2):
        a, b = nums[i], nums[j]
        rest = tuple(x for k, x in enumerate(nums) if k not in (i, j))
        for value in [a + b, a - b, a * b] + ([a // b] if b and a % b == 0 else []):
            out |= _integer_values_by_plain_recursion((*rest, value))
    return out


def test_countdown_solutions_are_exact_complete_and_include_the_generators_solution():
    rng = random.Random(3)
    for _ in range(60):
        nums = [rng.randint(1, 20) for _ in range(3)]
        reachable = _integer_values_by_plain_recursion(tuple(nums))
        for target in range(-5, 120):
            solutions = countdown_solutions(nums, target)
            assert bool(solutions) == (target in reachable), (nums, target)
            assert len(set(solutions)) == len(solutions)
            for solution in solutions:
                value, used = exact_value(solution)
                assert value == target and sorted(used) == sorted(nums), (nums, target, solution)
    for problem in make_countdown_problems(300, seed=5):
        assert problem["solution"] in countdown_solutions(problem["nums"], problem["target"]), problem


def test_countdown_solutions_rejects_sizes_it_cannot_enumerate():
    with pytest.raises(ValueError, match="1 to 5 numbers, got 6"):
        countdown_solutions([1, 2, 3, 4, 5, 6], 10)


def _reaches_by_brute_force(values: list[int], target: int) -> bool:
    """Whether some order of pairwise steps with non-negative integer results turns `values` into `target`."""
    if len(values) == 1:
        return values[0] == target
    for i, j in itertools.permutations(range(len(values)), 2):
        a, b = values[i], values[j]
        rest = [x for k, x in enumerate(values) if k not in (i, j)]
        results = [a + b, a * b] + ([a - b] if a >= b else []) + ([a // b] if b and a % b == 0 else [])
        if any(_reaches_by_brute_force(rest + [v], target) for v in results):
            return True
    return False


def test_countdown_working_writes_true_steps_dead_ends_first_then_a_solution():
    """Every step's arithmetic is right and uses the numbers at hand; the first `k` steps are dead ends (from what
    is left no step sequence reaches the target, by brute force); the rest solve it; the expression uses every
    number once and equals the target; the completion renders the steps before the answer."""
    problems = make_countdown_problems(60, seed=3, num_count=(3, 4), max_number=12, max_target=60)
    counts = Counter()
    for i, p in enumerate(problems):
        dead_ends = i % 4
        steps, expression = countdown_working(p["nums"], p["target"], random.Random(i), dead_ends)
        assert steps == countdown_working(p["nums"], p["target"], random.Random(i), dead_ends)[0]  # seeded
        value, used = exact_value(expression)
        assert value == p["target"] and sorted(used) == sorted(p["nums"])
        solving = len(p["nums"]) - 1  # each step combines two numbers into one
        written_dead_ends = len(steps) - solving
        assert 0 <= written_dead_ends <= dead_ends
        counts[written_dead_ends == dead_ends] += 1
        pool = list(p["nums"])
        for k, step in enumerate(steps):
            left, result = step.split("=")
            a, op, b = next((left[:n], left[n], left[n + 1 :]) for n in range(1, len(left)) if left[n] in "+-*/")
            a, b, result = int(a), int(b), int(result)
            assert exact_value(left)[0] == result >= 0, step
            current = list(p["nums"]) if k < written_dead_ends else pool
            assert Counter([a, b]) <= Counter(current), (step, current)
            rest = list((Counter(current) - Counter([a, b])).elements()) + [result]
            if k < written_dead_ends:
                assert not _reaches_by_brute_force(rest, p["target"]), (p, step)
            else:
                pool = rest
        assert pool == [p["target"]]
        text = compact_completion(expression, steps)
        assert text == ",".join(steps) + f"<answer>{expression}</answer>"
    assert counts[True] > 40  # most problems have enough dead ends to write all that were asked for
    assert countdown_working([1, 1], 7, random.Random(0)) is None  # 1+1, 1*1, 1-1, 1/1: none is 7
