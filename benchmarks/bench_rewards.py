"""Reward throughput and grading latency on the real reference sets, on one CPU core.

Countdown: completions per second of the TRL-protocol `countdown_reward` on completions built from the
`countdown/dev.parquet` problems (numpy columns, as a parquet dataset gives them): a ~300-character reasoning
preamble and an answer that is the solver's correct equation, its "Step X:" form, a wrong equation, or no tag.
Throughput is completions per CPU-second of the benchmark process, pinned to one core (the wall-clock rate of one
cold pass is recorded too; on a shared machine it also counts other processes' turns). Measured with the shape
cache cleared before each pass (every answer shape new) and, secondly, warm (shapes seen before). Baselines in
the same run: the tag search alone (`re.search` for `<answer>...</answer>`, what any reward pays) and Python's
parser alone on the extracted answers. Goal: >= 50,000 completions/s.

MATH: `grade` latency per pair over MATH500 pairs (each answer against itself, its `\\dfrac` / spaced / boxed /
decimal rewrites, and the next problem's answer), one at a time on a fresh grading pool with empty caches; the
pool's start-up (template process and first worker) is timed apart. See bench_grading_stall.py for batches.
Writes benchmarks/results/rewards.json.

    python benchmarks/bench_rewards.py             # about 30 s
    python benchmarks/bench_rewards.py --repeats 5
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import random
import re
import statistics
import sys
import time
from pathlib import Path

from _data import data_dir, describe

ROOT = Path(__file__).resolve().parents[1]
DATA = data_dir()
RESULTS = ROOT / "benchmarks" / "results" / "rewards.json"
GOAL_PER_S = 50_000
PREAMBLE = (
    "<think>Let me try combining the numbers. First I add the two largest, which overshoots the target, so I "
    "subtract the smallest instead and check whether the remaining number divides the difference evenly. That "
    "works, and every number is used once.</think>\n"
)


def _countdown_completions(rng: random.Random, limit: int | None) -> tuple[list[str], list, list]:
    import pyarrow.parquet as pq

    from trl_ext.tasks.countdown import solve_countdown

    frame = pq.read_table(DATA / "countdown" / "dev.parquet", columns=["nums", "target"]).to_pandas()
    if limit:
        frame = frame.head(limit)
    texts, nums, targets = [], [], []
    for row in frame.itertuples():
        solution = solve_countdown([int(n) for n in row.nums], int(row.target))
        numbers = [int(n) for n in row.nums]
        wrong = " + ".join(map(str, numbers))
        steps = "\n".join(f"Step {i}: {a} + {b} = {a + b}" for i, (a, b) in enumerate(itertools.pairwise(numbers), 1))
        for answer in (solution, wrong, steps, None):
            body = "I give up." if answer is None else f"<answer>\n{answer}\n</answer>"
            texts.append(PREAMBLE + body)
            nums.append(row.nums)
            targets.append(row.target)
    order = list(range(len(texts)))
    rng.shuffle(order)
    return [texts[i] for i in order], [nums[i] for i in order], [targets[i] for i in order]


def _per_s(n: int, run) -> float:
    # CPU time of this process: on a shared machine the wall clock would also count other processes' turns.
    start = time.process_time()
    run()
    return n / (time.process_time() - start)


def bench_countdown(repeats: int, limit: int | None) -> dict:
    import ast

    from trl_ext.rewards import countdown_reward
    from trl_ext.rewards.countdown import extract_answer
    from trl_ext.rewards.exact_arithmetic import _SHAPES

    texts, nums, targets = _countdown_completions(random.Random(0), limit)
    n = len(texts)
    tag = re.compile(r"<answer>(.*?)</answer>", re.S)
    answers = [a for a in map(extract_answer, texts) if a is not None]
    rewards = countdown_reward(texts, nums=nums, target=targets)  # warm-up, and the outcome mix below

    def cold():
        _SHAPES.clear()  # every answer shape new to the reward, as in a first epoch
        countdown_reward(texts, nums=nums, target=targets)

    def parse_only():
        for answer in answers:
            try:
                compile(" ".join(answer.split()), "<answer>", "eval", ast.PyCF_ONLY_AST)
            except SyntaxError:
                pass

    start = time.perf_counter()
    cold()
    wall_per_s = n / (time.perf_counter() - start)
    runs = {"cold": [], "warm": [], "tag": [], "parse": []}
    for _ in range(repeats):
        runs["cold"].append(_per_s(n, cold))
        runs["warm"].append(_per_s(n, lambda: countdown_reward(texts, nums=nums, target=targets)))
        runs["tag"].append(_per_s(n, lambda: [tag.search(t) for t in texts]))
        runs["parse"].append(_per_s(n, parse_only))
    cold_per_s, warm_per_s, tag_per_s, parse_per_s = (round(statistics.median(runs[k])) for k in runs)
    return {
        "completions": n,
        "problems": n // 4,
        "outcomes": {str(v): rewards.count(v) for v in sorted(set(rewards))},
        "completions_per_s": cold_per_s,
        "completions_per_s_repeated_answers": warm_per_s,
        "completions_per_s_wall_clock_cold": round(wall_per_s),
        "baseline_tag_search_per_s": tag_per_s,
        "baseline_python_parser_only_per_s": parse_per_s,
        "cost_vs_tag_search": round(tag_per_s / cold_per_s, 2),
        "cost_vs_python_parser_only": round(parse_per_s / cold_per_s, 2),
        "goal_per_s": GOAL_PER_S,
        "meets_goal": cold_per_s >= GOAL_PER_S,
    }


def _math_pairs() -> list[tuple[str, str, bool]]:
    """(gold, prediction, expected) over MATH500: rewrites that must grade equal, neighbours that must not."""
    from decimal import Decimal
    from fractions import Fraction

    from trl_ext.rewards.math import _as_number, normalize_answer

    with open(DATA / "math" / "math500_test.jsonl") as handle:
        answers = [json.loads(line)["answer"] for line in handle]
    pairs = []
    for i, gold in enumerate(answers):
        pairs.append((gold, gold, True))
        pairs.append((gold, re.sub(r"([,+=-])", r" \1 ", f" {gold} "), True))
        pairs.append((gold, f"\\boxed{{{gold}}}", True))
        if "\\frac" in gold:
            pairs.append((gold, gold.replace("\\frac", "\\dfrac"), True))
        value = _as_number(normalize_answer(gold))
        if value is not None and value.denominator != 1:
            decimal = Decimal(value.numerator) / Decimal(value.denominator)
            if Fraction(decimal) == value:
                pairs.append((gold, format(decimal, "f"), True))
        neighbour = answers[(i + 1) % len(answers)]
        pairs.append((gold, neighbour, normalize_answer(neighbour) == normalize_answer(gold)))
    return pairs


def bench_math() -> dict:
    from trl_ext.rewards import math as rmath
    from trl_ext.rewards.grading_pool import configure_grading_pool

    pairs = _math_pairs()
    pool = configure_grading_pool()
    rmath._VERDICTS.clear()
    rmath._TIMED_OUT.clear()
    start = time.perf_counter()
    pool.verify("1", "1", 120.0)  # starts the template process and one worker
    startup_s = time.perf_counter() - start
    latencies, symbolic, errors = [], [], 0
    for gold, prediction, expected in pairs:
        comparisons = pool.stats["comparisons"] + pool.stats["timeouts"]
        start = time.perf_counter()
        result = rmath.grade(prediction, gold)
        seconds = time.perf_counter() - start
        latencies.append(seconds)
        if pool.stats["comparisons"] + pool.stats["timeouts"] > comparisons:
            symbolic.append(seconds)
        errors += result != expected
    latencies.sort()
    ms = lambda s: round(1000 * s, 3)  # noqa: E731
    return {
        "pairs": len(pairs),
        "disagreements_with_expected": errors,
        "worker_startup_s": round(startup_s, 2),
        "median_ms": ms(statistics.median(latencies)),
        "p99_ms": ms(latencies[int(0.99 * (len(latencies) - 1))]),
        "max_ms": ms(latencies[-1]),
        "mean_ms": ms(statistics.mean(latencies)),
        "symbolic_stage_calls": len(symbolic),
        "symbolic_median_ms": ms(statistics.median(symbolic)) if symbolic else None,
        "symbolic_max_ms": ms(max(symbolic)) if symbolic else None,
        "timeouts": pool.stats["timeouts"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="timed passes over the Countdown completions")
    parser.add_argument("--limit", type=int, default=None, help="use only the first N Countdown dev problems")
    args = parser.parse_args()
    print(describe())
    if hasattr(os, "sched_setaffinity"):  # one core, as the goal is stated
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    sys.path.insert(0, str(ROOT))

    countdown = bench_countdown(args.repeats, args.limit)
    print(
        f"countdown_reward: {countdown['completions_per_s']:,} completions/s on one core with every answer new "
        f"(goal {GOAL_PER_S:,}: {'met' if countdown['meets_goal'] else 'NOT met'}), "
        f"{countdown['completions_per_s_repeated_answers']:,}/s for answers seen before; "
        f"cost {countdown['cost_vs_tag_search']}x the tag search alone, "
        f"{countdown['cost_vs_python_parser_only']}x Python's parser alone on the same answers; "
        f"outcomes {countdown['outcomes']}"
    )
    math = bench_math()
    print(
        f"grade on {math['pairs']} MATH500 pairs: median {math['median_ms']} ms, p99 {math['p99_ms']} ms, "
        f"max {math['max_ms']} ms; {math['symbolic_stage_calls']} reached math-verify "
        f"(median {math['symbolic_median_ms']} ms, {math['timeouts']} timeouts); "
        f"pool start {math['worker_startup_s']} s; "
        f"{math['disagreements_with_expected']} disagreements with the expected labels"
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    machine = {"python": platform.python_version(), "cpu_count": os.cpu_count(), "load_avg": os.getloadavg()}
    RESULTS.write_text(json.dumps({"countdown": countdown, "math_grade": math, "machine": machine}, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
