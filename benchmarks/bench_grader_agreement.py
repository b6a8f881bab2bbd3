"""How often `trl_ext.rewards.math` agrees with the course's `drgrpo_grader` (CS336 A5), on real answers.

trl_ext's MATH / GSM8K grader is its own (normalisation, exact rationals, then math-verify in a worker pool); the
courses say to grade with the course's `r1_zero_reward_fn` / `question_only_reward_fn`. The course's file is not part
of this project: pass its path, it is imported from there (it needs `sympy`, `pylatexenc`, `latex2sympy2_extended`
and `math-verify`).

Both graders score the same responses, built from the reference sets (`_data.data_dir()`):

- `math500/answer`: `</think> <answer>{answer}</answer>` for each MATH500 problem, graded against its own `answer`
  (r1_zero; both should say 1);
- `math500/solution`: the whole written solution (it ends in a `\\boxed{}`), graded against `answer`
  (question_only; both should say 1);
- `math500/wrong`: the next problem's answer in the r1_zero format (both should say 0 unless the two answers are
  the same value);
- `math12k/answer`, `math12k/wrong`: the same two on the MATH train rows the SFT recipes validate on;
- `gsm8k/answer`, `gsm8k/wrong`: the number after `####` in the r1_zero format, and the next problem's;
- `gsm8k/solution`: the whole GSM8K solution with its `#### N` line written as `\\boxed{N}` (question_only);
- `intellect/solution`: the assistant's reasoning trace of the INTELLECT-MATH SFT rows (it ends in a boxed
  answer), graded against the row's `ground_truth` (question_only).

Prints per set: rows, how many both graders pass, how many they agree on, and every disagreeing row (limited by
`--show`). Nothing is written to disk.

    python benchmarks/bench_grader_agreement.py --course-grader path/to/drgrpo_grader.py
    python benchmarks/bench_grader_agreement.py --course-grader path/to/drgrpo_grader.py --slow  # fast=False
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
import time
from pathlib import Path

from _data import data_dir, describe

from trl_ext.rewards.math import extract_gsm8k_answer, question_only_reward_fn, r1_zero_reward_fn


def load_course_grader(path: Path):
    """The course's module, imported from its file; a clear error when the file or one of its imports is missing."""
    if not path.is_file():
        raise SystemExit(f"--course-grader: no file at {path}")
    spec = importlib.util.spec_from_file_location("course_drgrpo_grader", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError as error:
        raise SystemExit(f"--course-grader {path}: it imports {error.name!r}, which is not installed") from error
    for name in ("r1_zero_reward_fn", "question_only_reward_fn"):
        if not callable(getattr(module, name, None)):
            raise SystemExit(f"--course-grader {path}: no function {name}")
    return module


def _jsonl(path: Path) -> list[dict]:
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]


def _first(folder: Path, *names: str) -> Path | None:
    return next((folder / name for name in names if (folder / name).is_file()), None)


def _r1(answer: str) -> str:
    return f"</think> <answer>{answer}</answer>"


def build_sets(root: Path) -> dict[str, list[tuple[str, str, str]]]:
    """Set name -> rows of (style, response, ground truth); style is `r1_zero` or `question_only`."""
    sets: dict[str, list[tuple[str, str, str]]] = {}
    math500 = [row for row in _jsonl(root / "math" / "math500_test.jsonl") if row["answer"].strip()]
    answers = [row["answer"] for row in math500]
    sets["math500/answer"] = [("r1_zero", _r1(a), a) for a in answers]
    sets["math500/solution"] = [("question_only", row["solution"], row["answer"]) for row in math500]
    sets["math500/wrong"] = [("r1_zero", _r1(answers[(i + 1) % len(answers)]), a) for i, a in enumerate(answers)]
    train = _first(root / "math", "math12k_train.jsonl", "math12k_train_last500.jsonl")
    if train is not None:
        rows = _jsonl(train)[-500:]
        answers = [row["answer"] for row in rows if row["answer"].strip() and row["answer"] != "None"]
        sets["math12k/answer"] = [("r1_zero", _r1(a), a) for a in answers]
        sets["math12k/wrong"] = [("r1_zero", _r1(answers[(i + 1) % len(answers)]), a) for i, a in enumerate(answers)]
    gsm8k = _jsonl(root / "gsm8k" / "test.jsonl")
    numbers = [extract_gsm8k_answer(row["answer"]) for row in gsm8k]
    sets["gsm8k/answer"] = [("r1_zero", _r1(n), n) for n in numbers]
    sets["gsm8k/wrong"] = [("r1_zero", _r1(numbers[(i + 1) % len(numbers)]), n) for i, n in enumerate(numbers)]
    boxed = [re.sub(r"####\s*(.*)$", lambda m: f"The answer is \\boxed{{{m.group(1)}}}.", r["answer"]) for r in gsm8k]
    sets["gsm8k/solution"] = [("question_only", text, n) for text, n in zip(boxed, numbers, strict=True)]
    folder = root / "intellect_math"
    names = (
        ("dev.jsonl", "test.jsonl") if (folder / "dev.jsonl").is_file() else ("dev_head5.jsonl", "test_subset.jsonl")
    )
    intellect = [row for name in names for row in _jsonl(folder / name)]
    sets["intellect/solution"] = [
        ("question_only", row["messages"][-1]["content"], row["ground_truth"])
        for row in intellect
        if str(row.get("ground_truth", "")).strip()
    ]
    return sets


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--course-grader", type=Path, required=True, help="path of the course's drgrpo_grader.py")
    parser.add_argument("--slow", action="store_true", help="the course's fast=False (adds its math-verify pass)")
    parser.add_argument("--show", type=int, default=40, help="disagreeing rows printed per set (default 40)")
    parser.add_argument(
        "--data",
        type=Path,
        default=None,
        help="data folder laid out as tests/data (default: $TRL_EXT_DATA, else tests/data)",
    )
    args = parser.parse_args(argv)
    course = load_course_grader(args.course_grader)
    ours = {"r1_zero": r1_zero_reward_fn, "question_only": question_only_reward_fn}
    theirs = {"r1_zero": course.r1_zero_reward_fn, "question_only": course.question_only_reward_fn}
    root = args.data or data_dir()
    print(f"data: {root} (--data)" if args.data else describe())
    print(f"course grader fast={not args.slow}")
    total = total_agree = 0
    for name, rows in build_sets(root).items():
        start = time.perf_counter()
        agree = both_pass = ours_only = theirs_only = 0
        shown = []
        for i, (style, response, truth) in enumerate(rows):
            a = ours[style](response, truth)["reward"]
            b = theirs[style](response, truth, fast=not args.slow)["reward"]
            agree += a == b
            both_pass += a == b == 1.0
            ours_only += a > b
            theirs_only += b > a
            if a != b and len(shown) < args.show:
                answer = response if style == "r1_zero" else response[-120:]
                shown.append(f"    row {i}: ours {a:.0f} course {b:.0f}  truth {truth!r}  response ...{answer!r}")
        total += len(rows)
        total_agree += agree
        seconds = time.perf_counter() - start
        print(
            f"{name:20s} rows {len(rows):5d}  agree {agree:5d} ({agree / max(len(rows), 1):.1%})  both 1: "
            f"{both_pass:5d}  only ours 1: {ours_only:3d}  only the course's 1: {theirs_only:3d}  ({seconds:.0f} s)"
        )
        print("\n".join(shown), end="\n" if shown else "")
    print(f"all: {total_agree} of {total} agree ({total_agree / max(total, 1):.2%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
