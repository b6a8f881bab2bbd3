"""The rewards on the real reference sets: MATH500 and GSM8K answers, Countdown dev problems (numpy columns).

The real sets in tests/data (tests/data/README.md: provenance, licenses), read through conftest.shared_path.
"""

from __future__ import annotations

import itertools
import json
import random
import re
from decimal import Decimal
from fractions import Fraction

import pytest
from conftest import shared_path
from test_rewards_countdown import _all_trees, _random_tree

from trl_ext.rewards import (
    CountdownReward,
    countdown_reward,
    extract_gsm8k_answer,
    grade,
    normalize_answer,
    question_only_reward_fn,
    r1_zero_reward_fn,
)
from trl_ext.rewards.math import _as_number

# Problems i whose MATH500 answer equals that of problem i + shift, reviewed by hand: shift 1: `5` / `x=5`,
# `7` / `7`, `3` / `3`; shift 250: `2` / `2` twice.
MATH500_EQUAL_PAIRS = {1: {22, 186, 403}, 250: {213, 463}}


def _jsonl(*parts: str) -> list[dict]:
    with open(shared_path(*parts)) as handle:
        return [json.loads(line) for line in handle]


@pytest.fixture(scope="module")
def math500_answers() -> list[str]:
    answers = [row["answer"] for row in _jsonl("math", "math500_test.jsonl")]
    assert len(answers) == 500
    return answers


def _r1(answer: str) -> str:
    return f"reasoning ... </think> <answer> {answer} </answer>"


def _decimal_form(answer: str) -> str | None:
    """`\\frac{3}{8}` -> `0.375` for a simple fraction with a terminating decimal, else None."""
    value = _as_number(normalize_answer(answer))
    if value is None or value.denominator == 1:
        return None
    decimal = Decimal(value.numerator) / Decimal(value.denominator)
    return format(decimal, "f") if Fraction(decimal) == value else None


def test_math500_answers_and_rewrites_get_reward_one(math500_answers):
    rewrites = {
        "verbatim": [(a, a) for a in math500_answers],
        "dfrac": [(a, a.replace("\\frac", "\\dfrac")) for a in math500_answers if "\\frac" in a],
        "spaces": [(a, re.sub(r"([,+=-])", r" \1 ", f" {a} ")) for a in math500_answers],
        "boxed": [(a, f"\\boxed{{{a}}}") for a in math500_answers],
        "decimal": [(a, d) for a in math500_answers if (d := _decimal_form(a)) is not None],
    }
    counts = {name: len(pairs) for name, pairs in rewrites.items()}
    assert counts == {"verbatim": 500, "dfrac": 68, "spaces": 500, "boxed": 500, "decimal": 41}
    failures = {
        name: [(gt, answer) for gt, answer in pairs if r1_zero_reward_fn(_r1(answer), gt)["reward"] != 1.0]
        for name, pairs in rewrites.items()
    }
    assert failures == {name: [] for name in rewrites}
    assert all(question_only_reward_fn(f"so $\\boxed{{{a}}}$.", a)["reward"] == 1.0 for a in math500_answers)


@pytest.mark.parametrize("shift", sorted(MATH500_EQUAL_PAIRS))
def test_math500_other_problems_answers_get_reward_zero(math500_answers, shift):
    """Answer i+shift graded against answer i: the confusion counts."""
    graded_equal = {
        i
        for i, gt in enumerate(math500_answers)
        if r1_zero_reward_fn(_r1(math500_answers[(i + shift) % 500]), gt)["reward"] == 1.0
    }
    assert graded_equal == MATH500_EQUAL_PAIRS[shift]
    for i in graded_equal:  # genuinely equal: same canonical string
        assert normalize_answer(math500_answers[i]) == normalize_answer(math500_answers[(i + shift) % 500])


def test_gsm8k_answers_parse_and_grade():
    rows = _jsonl("gsm8k", "test.jsonl")
    answers = [extract_gsm8k_answer(row["answer"]) for row in rows]
    assert len(answers) == 1319
    assert all(re.fullmatch(r"-?[0-9]+(\.[0-9]+)?", a) for a in answers)
    assert answers[:3] == ["18", "3", "70000"]  # Janet's ducks, the robe, the house flip
    assert all(grade(a, a) for a in answers)
    # A model writing `$70,000.` is right; the neighbour's value is right only when it is the same number.
    assert all(grade(f"${int(Decimal(a)):,}." if "." not in a else f"${a}", a) for a in answers)
    for i, a in enumerate(answers):
        neighbour = answers[(i + 1) % len(answers)]
        assert grade(neighbour, a) is (Fraction(neighbour) == Fraction(a)), (a, neighbour)
    assert sum(Fraction(answers[(i + 1) % 1319]) == Fraction(a) for i, a in enumerate(answers)) == 15


def _countdown_rows():
    import pyarrow.parquet as pq

    table = pq.read_table(shared_path("countdown", "dev.parquet"), columns=["nums", "target", "reward_model"])
    return table.to_pandas()  # numpy arrays in the cells, as a parquet-backed dataset gives them


def test_countdown_dev_rewards_match_independent_arithmetic():
    """Every expression tree over the first 200 dev problems' 3 numbers, and random ones over all 1024."""
    frame = _countdown_rows()
    assert len(frame) == 1024
    rng = random.Random(0)
    texts, nums, targets, expected = [], [], [], []
    exhaustive = 0
    for row in frame.itertuples():
        numbers = [int(n) for n in row.nums]
        trees = [_random_tree(rng, rng.sample(numbers, rng.randint(1, len(numbers)))) for _ in range(4)]
        if len(numbers) == 3 and exhaustive < 200:
            exhaustive += 1
            trees += [t for subset in itertools.permutations(numbers) for t in _all_trees(subset)]
        for text, value in trees:
            texts.append(f"<think>...</think> <answer>{text}</answer>")
            nums.append(row.nums)
            targets.append(row.target)
            used_all = sorted(int(n) for n in re.findall(r"[0-9]+", text)) == sorted(numbers)
            expected.append(1.0 if value == row.target and used_all else 0.1)
    rewards = countdown_reward(texts, nums=nums, target=targets)
    assert rewards == expected
    hits = sum(r == 1.0 for r in rewards)
    assert 100 < hits < len(rewards) // 2  # both outcomes are well represented
    # TinyZero's layout: the same rewards from `reward_model.ground_truth`.
    models = [frame.reward_model[0]] * 3
    assert countdown_reward(texts[:3], reward_model=models) == countdown_reward(
        texts[:3], nums=[frame.nums[0]] * 3, target=[frame.target[0]] * 3
    )


def test_a_bare_given_number_solves_no_test_or_dev_problem():
    """The free reward: `<answer> N </answer>` with N a given number equal to the target solved 81 of the 2,048
    test + dev problems under the at-most-once rule; the default (each number exactly once) solves none."""
    import pyarrow.parquet as pq

    problems = []
    for split in ("test", "dev"):
        table = pq.read_table(shared_path("countdown", f"{split}.parquet"), columns=["nums", "target"])
        problems += [(list(row["nums"]), row["target"]) for row in table.to_pylist()]
    assert len(problems) == 2048
    texts = [f"<answer> {n} </answer>" for numbers, _ in problems for n in numbers]
    nums = [numbers for numbers, _ in problems for _ in numbers]
    targets = [target for numbers, target in problems for _ in numbers]
    problem_of = [p for p, (numbers, _) in enumerate(problems) for _ in numbers]
    solved = {
        rule: {problem_of[i] for i, r in enumerate(reward_fn(texts, nums=nums, target=targets)) if r == 1.0}
        for rule, reward_fn in (("exactly_once", countdown_reward), ("at_most_once", CountdownReward(False)))
    }
    assert len(solved["exactly_once"]) == 0
    assert len(solved["at_most_once"]) == 81


def test_math_answers_with_a_base_subscript():
    """MATH answers written in a base (`2516_8`, `4210_{5}`; 6 in tests/data, 66 in all of MATH500 + math12k, which
    pass too): the same numeral with or without braces is right, the same digits in the next base are wrong unless
    they denote the same integer (`1_7` = `1_8`; math-verify dropped the subscript and took every such pair as
    equal)."""
    parts = ("math500_test.jsonl", "math12k_train_subset.jsonl")
    answers = [row["answer"] for part in parts for row in _jsonl("math", part)]
    based = [(a, m) for a in answers if (m := re.fullmatch(r"(-?[0-9A-Z.]+)_\{?([0-9]+)\}?", a.strip().rstrip(".")))]
    assert len(based) == 6
    for answer, match in based:
        digits, base = match.groups()
        assert grade(f"{digits}_{{{base}}}", answer, timeout=30) is True, answer
        same_value = "." not in digits and int(digits.lstrip("-"), int(base)) == int(digits.lstrip("-"), int(base) + 1)
        assert grade(f"{digits}_{int(base) + 1}", answer, timeout=30) is same_value, answer
        assert grade(digits, answer, timeout=30) is True, answer
