r"""Can pathological answers stall GRPO's reward step? A batch with 5% bombs vs the same batch without them.

Batch: 512 r1_zero completions over MATH500 answers (each answer as written, with spaces, boxed, as `\dfrac`, as a
decimal, or another problem's answer), graded by the TRL callable `r1_zero_reward` with its default time cap.
The bomb arm replaces 26 of them (5%) by pathological answers: power towers, huge factorials, binomials, sums and
deep nesting that the pre-checks reject, and expansions such as `(x+1)^{999}` that pass them and run into the cap.
Arms alternate, each pass on a fresh pool (template start-up outside the timing) with the verdict cache empty.
Reported: wall time per batch (median over rounds), the ratio, and per-answer latency: each math-verify
comparison's own time, waiting for a worker included (answers settled before math-verify, in microseconds, count
as 0). Goal: bomb batch <= 2 x clean batch + one time cap. Writes benchmarks/results/grading_stall.json.

    python benchmarks/bench_grading_stall.py            # about a minute
    python benchmarks/bench_grading_stall.py --rounds 5 --workers 4
"""

from __future__ import annotations

import argparse
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
RESULTS = ROOT / "benchmarks" / "results" / "grading_stall.json"
BATCH = 512
BOMB_FRACTION = 0.05

BOMBS = [
    "x^{9^{9^{9^{9}}}}",
    "100000000!",
    "10^{10^{10}}",
    "\\binom{10^{9}}{10^{8}}",
    "\\prod_{k=1}^{10^{9}} k",
    "\\Gamma(10^{9})",
    "\\frac{1}{" * 90 + "2" + "}" * 90,
    "(" * 60 + "1" + ")" * 60,
    "e^{e^{e^{e^{e}}}}",
    "(10^{10})!",
    # pass the pre-checks (symbolic bases, exponents under the limit): each holds a worker until the cap
    "(x+1)^{999}",
    "(1+y)^{998}",
    "(x-2)^{997}",
]


def _batch(rng: random.Random) -> tuple[list[str], list[str]]:
    with open(DATA / "math" / "math500_test.jsonl") as handle:
        answers = [json.loads(line)["answer"] for line in handle]
    completions, golds = [], []
    for _ in range(BATCH):
        i = rng.randrange(len(answers))
        gold = answers[i]
        kind = rng.choice(["verbatim", "spaces", "boxed", "dfrac", "neighbour", "neighbour"])
        prediction = {
            "verbatim": gold,
            "spaces": re.sub(r"([,+=-])", r" \1 ", f" {gold} "),
            "boxed": f"\\boxed{{{gold}}}",
            "dfrac": gold.replace("\\frac", "\\dfrac"),
            "neighbour": answers[(i + 1) % len(answers)],
        }[kind]
        completions.append(f"Let me think step by step ... </think> <answer> {prediction} </answer>")
        golds.append(gold)
    return completions, golds


def _with_bombs(completions: list[str], rng: random.Random) -> tuple[list[str], list[int]]:
    n_bombs = round(BOMB_FRACTION * len(completions))
    positions = sorted(rng.sample(range(len(completions)), n_bombs))
    out = list(completions)
    for k, position in enumerate(positions):
        out[position] = f"Let me think ... </think> <answer> {BOMBS[k % len(BOMBS)]} </answer>"
    return out, positions


def _run(completions: list[str], golds: list[str], workers: int | None) -> dict:
    """One pass on a fresh pool: wall time, per-comparison times, outcome counts."""
    from trl_ext.rewards import grading_pool, r1_zero_reward
    from trl_ext.rewards import math as rmath

    pool = grading_pool.configure_grading_pool(workers)
    pool.verify("1", "1", 120.0)  # template start-up, outside the timing
    rmath._VERDICTS.clear()
    rmath._TIMED_OUT.clear()
    times: list[float] = []
    original = pool._verify_or_none

    def timed(pair, timeout):
        start = time.perf_counter()
        try:
            return original(pair, timeout)
        finally:
            times.append(time.perf_counter() - start)

    pool._verify_or_none = timed  # instance attribute: this pool only, this benchmark only
    metrics: dict[str, float] = {}
    start = time.perf_counter()
    rewards = r1_zero_reward(completions, ground_truth=golds, log_metric=metrics.__setitem__)
    wall = time.perf_counter() - start
    stats = dict(pool.stats)
    pool.close()
    return {"wall_s": wall, "comparison_s": times, "rewards": rewards, "metrics": metrics, "pool": stats}


def _latency(run: dict, n: int) -> dict:
    """Per-answer latency: comparisons' own times, the other answers at ~0 (settled without math-verify)."""
    per_answer = sorted(run["comparison_s"] + [0.0] * max(0, n - len(run["comparison_s"])))
    comparisons = sorted(run["comparison_s"]) or [0.0]
    q = lambda values, p: values[min(len(values) - 1, int(p * len(values)))]  # noqa: E731
    return {
        "answers_p50_s": round(q(per_answer, 0.5), 4),
        "answers_p99_s": round(q(per_answer, 0.99), 4),
        "comparisons": len(run["comparison_s"]),
        "comparisons_p50_s": round(q(comparisons, 0.5), 4),
        "comparisons_p99_s": round(q(comparisons, 0.99), 4),
        "comparisons_max_s": round(comparisons[-1], 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="alternating passes per arm")
    parser.add_argument("--workers", type=int, default=None, help="pool size (default: from the CPU count)")
    args = parser.parse_args()
    print(describe())
    sys.path.insert(0, str(ROOT))
    from trl_ext.rewards.grading_pool import DEFAULT_WORKERS
    from trl_ext.rewards.math import GRADE_TIMEOUT_S
    from trl_ext.rewards.math_prechecks import explosive

    rng = random.Random(0)
    clean, golds = _batch(rng)
    bombed, positions = _with_bombs(clean, rng)
    runs: dict[str, list[dict]] = {"clean": [], "bombs": []}
    for round_index in range(args.rounds):
        order = ["clean", "bombs"] if round_index % 2 == 0 else ["bombs", "clean"]
        for arm in order:
            run = _run(clean if arm == "clean" else bombed, golds, args.workers)
            runs[arm].append(run)
            print(f"round {round_index + 1} {arm}: {run['wall_s']:.2f} s, {run['metrics']}", flush=True)
    clean_wall = statistics.median(r["wall_s"] for r in runs["clean"])
    bomb_wall = statistics.median(r["wall_s"] for r in runs["bombs"])
    budget = 2 * clean_wall + GRADE_TIMEOUT_S
    same_outside_bombs = all(
        [r for i, r in enumerate(run["rewards"]) if i not in positions]
        == [r for i, r in enumerate(runs["clean"][0]["rewards"]) if i not in positions]
        for run in runs["clean"] + runs["bombs"]
    )
    out = {
        "batch": BATCH,
        "bombs": len(positions),
        "bombs_rejected_by_prechecks": sum(bool(explosive(b)) for b in BOMBS) * len(positions) // len(BOMBS),
        "time_cap_s": GRADE_TIMEOUT_S,
        "workers": args.workers or DEFAULT_WORKERS,
        "rounds": args.rounds,
        "clean_wall_s": [round(r["wall_s"], 3) for r in runs["clean"]],
        "bombs_wall_s": [round(r["wall_s"], 3) for r in runs["bombs"]],
        "clean_wall_median_s": round(clean_wall, 3),
        "bombs_wall_median_s": round(bomb_wall, 3),
        "ratio_bombs_to_clean": round(bomb_wall / clean_wall, 3),
        "goal_s": round(budget, 3),
        "meets_goal": bomb_wall <= budget,
        "clean_latency": _latency(runs["clean"][-1], BATCH),
        "bombs_latency": _latency(runs["bombs"][-1], BATCH),
        "bombs_metrics": runs["bombs"][-1]["metrics"],
        "bombs_pool_stats": runs["bombs"][-1]["pool"],
        "rewards_equal_outside_the_bombs": same_outside_bombs,
        "bomb_rewards": sorted({runs["bombs"][-1]["rewards"][i] for i in positions}),
        "machine": {"python": platform.python_version(), "cpu_count": os.cpu_count(), "load_avg": os.getloadavg()},
    }
    clean_latency, bomb_latency = out["clean_latency"], out["bombs_latency"]
    print(
        f"clean batch {clean_wall:.2f} s, with {len(positions)} bombs {bomb_wall:.2f} s "
        f"({out['ratio_bombs_to_clean']}x; goal <= 2 x clean + {GRADE_TIMEOUT_S} s cap = {budget:.2f} s: "
        f"{'met' if out['meets_goal'] else 'NOT met'}); per-answer p99 clean {clean_latency['answers_p99_s']} s, "
        f"with bombs {bomb_latency['answers_p99_s']} s; comparisons p99 {clean_latency['comparisons_p99_s']} / "
        f"{bomb_latency['comparisons_p99_s']} s, max {bomb_latency['comparisons_max_s']} s"
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
