"""Seeded fuzz: 10,000 adversarial completions through every registered reward.

No exception escapes, nothing executes (code-injection payloads would create a sentinel file), every call
returns a value from the reward's range within a bound, and the slowest call is printed (`pytest -s`).
"""

from __future__ import annotations

import random
import string
import time

from trl_ext.rewards import REWARD_FUNCS, MathReward

N_COMPLETIONS = 10_000
# The math rewards run with a 1 s symbolic-stage limit instead of the default 5 s: the few power towers in the
# payloads (`9^{9^{9^9}}`) hit it once each (results are cached), and the bound is what is under test.
FUZZ_TIMEOUT_S = 1.0
MEGABYTE = 1 << 20


def _payloads(sentinel: str) -> list[str]:
    return [
        f"__import__('os').system('touch {sentinel}')",
        f"open('{sentinel}', 'w').write('x')",
        f"exec(\"open('{sentinel}', 'w')\")",
        f"(lambda: __import__('pathlib').Path('{sentinel}').touch())()",
        "eval('1+1')",
        "().__class__.__base__.__subclasses__()",
        "9**9**9**9",
        "9^{9^{9^9}}",
        "2**1000000",
        "10^{10^{10}}",
        "1e309",
        "-1e309",
        "float('inf')",
        "float('nan')",
        "1/0",
        "0/0",
        "\\frac{1}{0}",
        "\\sqrt{-1}",
        "(" * 10_000 + "1" + ")" * 10_000,
        "(" * 10_000,
        ")" * 10_000,
        "((1+2)",
        "1+" * (MEGABYTE // 2) + "1",
        "a" * MEGABYTE,
        "<answer>" * (MEGABYTE // 8),
        "\\boxed{" * 10_000,
        "\\boxed{" * 500 + "1" + "}" * 500,
        "\\boxed{\\boxed{\\boxed{42}}}",
        "}" * 1000 + "\\boxed{",
        "<answer>1</answer>" * 10_000,
        "</think> <answer>" * 1000,
        "٣ + ٤",  # Arabic-Indic digits
        "３＋４",  # fullwidth
        "𝟑 × 𝟒",  # mathematical digits, unicode operator
        "3²",
        "\x00\x01\x02",
        "\ud800",  # a lone surrogate
        "Step 1: " + "1 + " * 1000 + "1 = 1001",
        "\n".join(f"Step {i}: 1 + 1 = 2" for i in range(1000)),
        "x = " * 1000,
        "\\left(" * 1000,
        "\\text{" * 1000,
        "{}}}{{{" * 1000,
        "$" * 1000,
        "\\frac{\\frac{\\frac{1}{2}}{3}}{4}",
        "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
        "\\int_0^\\infty e^{-x^2} dx",
        "\\sum_{n=1}^{\\infty} n^{n^{n}}",
        "x^{x^{x^{x^{x^{x}}}}} = 1",
        "1,000,000,000,000,000,000,000",
        "0." + "9" * 900,
        # controls that are right, so every outcome of every reward is reached
        "6/(1-3/4)",
        "0.5",
        "\\dfrac{1}{2}",
    ]


def _wrap(rng: random.Random, payload: str) -> str:
    templates = [
        "{p}",
        "<answer>{p}</answer>",
        "<think>hmm</think>\n<answer>\n{p}\n</answer>",
        "reasoning </think> <answer> {p} </answer>",
        "reasoning </think> <answer> \\boxed{{{p}}} </answer>",
        "the answer is $\\boxed{{{p}}}$.",
        "<answer>{p}",
        "{p}</answer>",
        "</think> <answer> {p}",
        "<answer>Step 1: {p} = 3\nStep 2: 3 / 3 = 1</answer>",
    ]
    return rng.choice(templates).format(p=payload)


def _random_text(rng: random.Random) -> str:
    alphabet = string.printable + "<>/\\{}()^_=+-*×÷٣３𝟑²\u200b"
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))


def test_fuzz_every_reward(tmp_path):
    sentinel = tmp_path / "executed"
    payloads = _payloads(str(sentinel))
    rng = random.Random(20240601)
    columns = {
        "target": [24],
        "nums": [[6, 1, 3, 4]],
        "ground_truth": ["\\frac{1}{2}"],
    }
    allowed = {
        "countdown": {0.0, 0.1, 1.0},
        "countdown_all_numbers": {0.0, 0.1, 1.0},
        "countdown_at_most_once": {0.0, 0.1, 1.0},
        "countdown_single_equation": {0.0, 0.1, 1.0},
        "countdown_binary": {0.0, 1.0},
        "r1_zero": {0.0, 1.0},
        "question_only": {0.0, 1.0},
        "kissing": {0.0},  # no payload holds a fenced program; tests/test_kissing_sandbox.py runs hostile ones
    }
    assert set(allowed) == set(REWARD_FUNCS)
    rewards = {
        name: MathReward(reward.style, timeout=FUZZ_TIMEOUT_S) if isinstance(reward, MathReward) else reward
        for name, reward in REWARD_FUNCS.items()
    }
    slowest = {name: (0.0, "") for name in REWARD_FUNCS}
    seen = {name: set() for name in REWARD_FUNCS}
    for i in range(N_COMPLETIONS):
        kind = rng.random()
        if kind < 0.6:
            text = _wrap(rng, rng.choice(payloads))
        elif kind < 0.8:
            text = _wrap(rng, _random_text(rng)) + _wrap(rng, rng.choice(payloads))
        else:
            text = _wrap(rng, _random_text(rng))
        completion = [{"role": "assistant", "content": text}] if i % 2 else text
        for name, reward in rewards.items():
            start = time.perf_counter()
            (value,) = reward([completion], **columns)
            seconds = time.perf_counter() - start
            assert value in allowed[name], (name, text[:200])
            seen[name].add(value)
            if seconds > slowest[name][0]:
                slowest[name] = (seconds, text[:80])
    assert not sentinel.exists()
    print("slowest call per reward (s, completion head):", {k: (round(s, 4), t) for k, (s, t) in slowest.items()})
    # Countdown never leaves Python's bounded arithmetic; the math rewards are bounded by the grading limit
    # plus one worker restart.
    assert slowest["countdown"][0] < 1.0 and slowest["countdown_all_numbers"][0] < 1.0
    assert max(slowest["r1_zero"][0], slowest["question_only"][0]) < FUZZ_TIMEOUT_S + 30
    # the fuzz reached every outcome, not only the no-format branch
    assert seen["countdown"] == {0.0, 0.1, 1.0} and seen["r1_zero"] == {0.0, 1.0}
