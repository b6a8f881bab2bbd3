"""Countdown scorer vs TinyZero's rule: throughput side by side, decisions compared, the bare-number exploit counted.

Reference: TinyZero's published Countdown rule, written here from its description (benchmark only; trl_ext never
evals): the last `<answer>...</answer>` by regex, the integers in it must equal the given numbers as a multiset,
a character whitelist `[0-9+-*/(). whitespace]`, then `eval` with no builtins and a 1e-5 tolerance; 1.0 / 0.1 / 0.0.
(TinyZero also keeps only the text after "Assistant:" and its last line; that step is left out, so the reference
reads multi-line answers and does all its work on every completion here.)

Corpus: the 2,048 test + dev problems, each with four completions (a ~300-character reasoning preamble, then the
solver's correct equation, a wrong one, a "Step X:" answer, or no tag; the layout of bench_rewards.py). Arms:
`trl_ext.rewards.countdown_reward` (the TRL callable, default rule: each number exactly once) on the batch, and
the reference on each completion, both fed the same columns: Python lists (what an HF dataset hands TRL) and,
secondly, numpy values (a pandas / parquet frame). The arms alternate, the process pinned to one core, CPU time
of this process, garbage collection paused as timeit does; ours starts every pass with its shape cache empty.
Ratio = reference CPU time / ours, median over rounds. Goal: >= 1.5x.

Decisions are compared on the corpus and on a generated set of adversarial answers; each disagreement is put in
the class of rule difference that explains it (steps and `= value` answers, which the reference's whitelist
rejects; signs, `**`, `//` and decimals, which it admits; its float tolerance; its tag pairing); an unexplained
disagreement is a bug. Also counted: problems a bare `<answer> N </answer>` (N a given number) solves.

    python benchmarks/bench_countdown.py            # about a minute
"""

from __future__ import annotations

import argparse
import gc
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
RESULTS = ROOT / "benchmarks" / "results" / "countdown_vs_tinyzero.json"
GOAL_RATIO = 1.5
PREAMBLE = (
    "<think>Let me try combining the numbers. First I add the two largest, which overshoots the target, so I "
    "subtract the smallest instead and check whether the remaining number divides the difference evenly. That "
    "works, and every number is used once.</think>\n"
)

_TZ_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_TZ_INTEGERS = re.compile(r"\d+")
_TZ_ALLOWED = re.compile(r"^[\d+\-*/().\s]+$")


def tinyzero_score(text: str, numbers, target, format_score: float = 0.1, score: float = 1.0) -> float:
    """TinyZero's Countdown rule (see the module docstring); evals the answer, so only ever run on this corpus."""
    matches = _TZ_ANSWER.findall(text)
    if not matches:
        return 0.0
    equation = matches[-1].strip()
    if sorted(int(n) for n in _TZ_INTEGERS.findall(equation)) != sorted(numbers):
        return format_score
    if not _TZ_ALLOWED.match(equation):
        return format_score
    try:
        value = eval(equation, {"__builtins__": None}, {})  # noqa: S307 - the reference rule, benchmark only
        return score if abs(value - target) < 1e-5 else format_score
    except Exception:
        return format_score


def _problems() -> list[tuple[list[int], int]]:
    import pyarrow.parquet as pq

    problems = []
    for split in ("test", "dev"):
        frame = pq.read_table(DATA / "countdown" / f"{split}.parquet", columns=["nums", "target"]).to_pandas()
        problems += [([int(n) for n in row.nums], int(row.target)) for row in frame.itertuples()]
    return problems


def corpus(problems, rng: random.Random) -> list[tuple[str, list[int], int]]:
    """Four completions per problem (bench_rewards.py's layout), shuffled."""
    import itertools

    from trl_ext.tasks.countdown import solve_countdown

    rows = []
    for numbers, target in problems:
        solution = solve_countdown(numbers, target)
        wrong = " + ".join(map(str, numbers))
        steps = "\n".join(f"Step {i}: {a} + {b} = {a + b}" for i, (a, b) in enumerate(itertools.pairwise(numbers), 1))
        for answer in (solution, wrong, steps, None):
            body = "I give up." if answer is None else f"<answer>\n{answer}\n</answer>"
            rows.append((PREAMBLE + body, numbers, target))
    rng.shuffle(rows)
    return rows


def _random_expression(rng: random.Random, numbers: list[int]) -> str:
    items = [str(n) for n in numbers]
    while len(items) > 1:
        i, j = sorted(rng.sample(range(len(items)), 2))
        b, a = items.pop(j), items.pop(i)
        op = rng.choice(["+", "-", "*", "/"])
        space = rng.choice(["", " ", "  ", "\n"])
        items.append(f"({a}{space}{op}{space}{b})" if rng.random() < 0.7 else f"{a}{space}{op}{space}{b}")
    return items[0]


def adversarial_answers(problems, rng: random.Random, n: int) -> list[tuple[str, list[int], int]]:
    """Answers built to probe both rules: right and wrong trees, misuse of numbers, syntax either rule may reject."""
    mutations = [
        lambda e, ns: e,
        lambda e, ns: e.replace("(", "", 1),
        lambda e, ns: "-" + e,
        lambda e, ns: e.replace("*", "**", 1),
        lambda e, ns: e.replace("/", "//", 1),
        lambda e, ns: e.replace(str(ns[0]), f"{ns[0]}.0", 1),
        lambda e, ns: e.replace(str(ns[0]), f"0{ns[0]}", 1),
        lambda e, ns: e + f" = {ns[0]}",
        lambda e, ns: f"{e} + 0",
        lambda e, ns: f"{e} * 1",
        lambda e, ns: e.replace(str(ns[-1]), "٣", 1),
        lambda e, ns: f"{e}/({ns[0]}-{ns[0]})",
        lambda e, ns: f"({e})({ns[0]})",
        lambda e, ns: str(ns[0]),
        lambda e, ns: " ".join(map(str, ns)),
        lambda e, ns: f"{e} <answer> {ns[0]}",
        lambda e, ns: e.replace(" ", "\t"),
        lambda e, ns: f"x{e}",
        lambda e, ns: "",
    ]
    rows = []
    for _ in range(n):
        numbers, target = rng.choice(problems)
        size = rng.randint(1, len(numbers)) if rng.random() < 0.3 else len(numbers)
        used = rng.sample(numbers, size)
        answer = rng.choice(mutations)(_random_expression(rng, used), used)
        rows.append((f"<think>...</think>\n<answer>{answer}</answer>", numbers, target))
    # Exact solutions (hits for both rules) and a tolerance probe: 1 +- 1e-8 is 1 to the reference only.
    for numbers, target in problems[:200]:
        from trl_ext.tasks.countdown import solve_countdown

        rows.append((f"<answer>{solve_countdown(numbers, target)}</answer>", numbers, target))
    rows.append(("<answer>100000001 / 100000000</answer>", [100000001, 100000000], 1))
    return rows


def _explain(text: str, numbers, target, ours: float, reference: float) -> str:
    """The rule difference behind a disagreement, or "unexplained"."""
    answers = _TZ_ANSWER.findall(text)
    answer = answers[-1].strip() if answers else ""
    if "\n" in answer and tinyzero_score(f"<answer>{' '.join(answer.split())}</answer>", numbers, target) == ours:
        return "line break outside parentheses (a syntax error for the reference's eval)"
    if "<answer>" in answer:
        return "tag pairing"
    if "=" in answer or answer.lower().startswith("step"):
        return "steps or '= value' (reference whitelist rejects '=' and letters)"
    if re.search(r"\*\*|//|\.|(?:^|[-+*/(]\s*)[-+]", answer):
        return "sign, '**', '//' or decimal (our grammar rejects)"
    if reference == 1.0 and ours == 0.1:
        return "float tolerance 1e-5 (ours exact)"
    return "unexplained"


def compare_decisions(rows) -> dict:
    from trl_ext.rewards import countdown_reward

    ours = countdown_reward([t for t, _, _ in rows], nums=[n for _, n, _ in rows], target=[g for _, _, g in rows])
    classes: dict[str, int] = {}
    examples: dict[str, str] = {}
    for (text, numbers, target), mine in zip(rows, ours, strict=True):
        theirs = tinyzero_score(text, numbers, target)
        if mine != theirs:
            why = _explain(text, numbers, target, mine, theirs)
            classes[why] = classes.get(why, 0) + 1
            examples.setdefault(why, f"{text[-80:]!r} nums={numbers} target={target}: ours {mine}, ref {theirs}")
    return {
        "cases": len(rows),
        "agree": len(rows) - sum(classes.values()),
        "disagreements_by_rule_difference": classes,
        "unexplained": classes.get("unexplained", 0),
        "examples": examples,
        "ours_outcomes": {str(v): ours.count(v) for v in sorted(set(ours))},
    }


def throughput(rows, rounds: int, numpy_columns: bool) -> dict:
    import numpy as np

    from trl_ext.rewards import countdown_reward, exact_arithmetic

    texts = [t for t, _, _ in rows]
    nums = [np.array(n) if numpy_columns else list(n) for _, n, _ in rows]
    targets = [np.int64(g) if numpy_columns else g for _, _, g in rows]

    def ours():
        exact_arithmetic._SHAPES.clear()  # every shape new at the start of a pass
        countdown_reward(texts, nums=nums, target=targets)

    def reference():
        for text, numbers, target in zip(texts, nums, targets, strict=True):
            tinyzero_score(text, numbers, target)

    ours(), reference()  # warm-up
    seconds = {"ours": [], "reference": []}
    arms = [("ours", ours), ("reference", reference)]
    for round_index in range(rounds):
        for name, run in arms if round_index % 2 == 0 else arms[::-1]:
            gc.collect()
            gc.disable()  # as timeit does: a collection landing in one arm's pass is noise
            start = time.process_time()
            run()
            seconds[name].append(time.process_time() - start)
            gc.enable()
    ratios = [r / o for r, o in zip(seconds["reference"], seconds["ours"], strict=True)]
    n = len(rows)
    return {
        "columns": "numpy" if numpy_columns else "python lists",
        "completions": n,
        "ours_per_s": round(n / statistics.median(seconds["ours"])),
        "reference_per_s": round(n / statistics.median(seconds["reference"])),
        "ratio_median": round(statistics.median(ratios), 3),
        "ratio_min": round(min(ratios), 3),
        "ratio_max": round(max(ratios), 3),
        "rounds": rounds,
    }


def bare_number_solves(problems) -> dict:
    """Problems where `<answer> N </answer>` for some given number N scores 1.0, per number rule."""
    from trl_ext.rewards import countdown_reward_fn

    counts = {}
    for require_all in (True, False):
        counts["exactly_once" if require_all else "at_most_once"] = sum(
            any(
                countdown_reward_fn(f"<answer> {n} </answer>", {"numbers": ns, "target": t}, require_all) == 1.0
                for n in set(ns)
            )
            for ns, t in problems
        )
    return {"problems": len(problems), **counts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=11, help="alternating timed passes per arm")
    args = parser.parse_args()
    print(describe())
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    sys.path.insert(0, str(ROOT))

    problems = _problems()
    rows = corpus(problems, random.Random(0))
    speed = [throughput(rows, args.rounds, numpy_columns=False), throughput(rows, args.rounds, numpy_columns=True)]
    for s in speed:
        print(
            f"countdown ({s['columns']}): ours {s['ours_per_s']:,}/s, TinyZero rule {s['reference_per_s']:,}/s, "
            f"ratio {s['ratio_median']}x (min {s['ratio_min']}, max {s['ratio_max']}; goal {GOAL_RATIO}x)"
        )
    decisions = {
        "corpus": compare_decisions(rows),
        "adversarial": compare_decisions(adversarial_answers(problems, random.Random(1), 20_000)),
    }
    for name, d in decisions.items():
        print(f"decisions on the {name} set: {d['agree']}/{d['cases']} agree; {d['disagreements_by_rule_difference']}")
    bare = bare_number_solves(problems)
    print(
        f"bare <answer> N </answer> solves {bare['exactly_once']} of {bare['problems']} problems with the default "
        f"rule (each number exactly once); {bare['at_most_once']} with require_all=False"
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    machine = {"python": platform.python_version(), "cpu_count": os.cpu_count(), "load_avg": os.getloadavg()}
    out = {
        "throughput": speed,
        "goal_ratio": GOAL_RATIO,
        "meets_goal": all(s["ratio_median"] >= GOAL_RATIO for s in speed),
        "decisions": decisions,
        "bare_number": bare,
        "machine": machine,
    }
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
