r"""MATH and GSM8K answer grading and the R1-Zero / question-only rewards (NYU Assignment 3, NLPDL HW3 and CS336 A5).

This is the project's own grader, not CS336 A5's `drgrpo_grader` that the courses name: the rewards keep that file's
function names, format rules and reward dicts, and decide equality by the stages below. docs/rewards.md gives how
often the two agree on real answers (`benchmarks/bench_grader_agreement.py` measures it, given the course's file).

`grade(model_answer, gt_answer)` decides in stages, cheapest first:

1. string normalisation of the usual MATH answer forms (spaces, `\left` / `\right`, `\dfrac` / `\tfrac`,
   `\text{...}` and trailing units, dollars, percent and degree signs, `x = 3` -> `3`, `\frac12` -> `\frac{1}{2}`,
   `a/b` -> `\frac{a}{b}`, thousands separators, a trailing period); equal strings are equal answers;
2. exact rational comparison when both sides are plain numbers (integers, decimals, simple fractions), so
   `0.5` == `\frac12` and `1,000` == `1000.` without symbolic work, and unequal numbers are final;
3. answers written with a base subscript are compared with it (`2516_8` != `2516_9`, `2516_8` == `2516_{8}`;
   math-verify drops subscripts);
4. otherwise symbolic equivalence through math-verify, in a pool of worker processes
   (`trl_ext.rewards.grading_pool`) with a wall-clock cap per comparison (`timeout`, default `GRADE_TIMEOUT_S`
   = 1 s): past it the worker is killed and replaced and the answer scores 0, without holding up other answers.
   This works from any thread (math-verify's own timeout uses `signal` and fails outside the main thread).
   Before this stage, answers longer than `MAX_ANSWER_CHARS`, predictions with unbalanced braces and answers
   the cheap pre-checks of `trl_ext.rewards.math_prechecks` call explosive (`9^{9^{9^9}}`, `100000000!`,
   deeply nested brackets) are wrong without symbolic work. Verdicts are cached per (gold, prediction); a
   timeout is not a verdict: it is remembered for `TIMEOUT_MEMORY_S` (60 s) and then graded again.

Rewards (floats in a dict, as in the course's `drgrpo_grader`):

- `r1_zero_reward_fn`: format = the response contains `</think> <answer>` and `</answer>`; the answer is the
  text after the last `<answer>` up to its `</answer>` (a `\boxed{}` inside is unwrapped); reward = answer.
- `question_only_reward_fn`: format = the response has a `\boxed{}`; its last one is the answer.

Ground truth: a str, a number or a list of acceptable answers, checked by `ground_truth_answers`: None, NaN,
empty strings or lists and other non-answers raise a ValueError naming the value, so echoing a missing answer
never earns a reward.
"""

from __future__ import annotations

import functools
import re
import time
from fractions import Fraction

from trl_ext.rewards.grading_pool import get_grading_pool
from trl_ext.rewards.ground_truth import NEVER_MATCHES, ground_truth_answers
from trl_ext.rewards.math_prechecks import explosive

__all__ = [
    "GRADE_TIMEOUT_S",
    "MAX_ANSWER_CHARS",
    "TIMEOUT_MEMORY_S",
    "extract_boxed",
    "extract_gsm8k_answer",
    "grade",
    "grade_many",
    "normalize_answer",
    "question_only_answer",
    "question_only_reward_fn",
    "r1_zero_answer",
    "r1_zero_reward_fn",
]

GRADE_TIMEOUT_S = 1.0
# Longer extracted answers are wrong: no MATH / GSM8K answer is near this long, and the bound keeps megabyte
# completions away from the normaliser's regexes and the symbolic parser.
MAX_ANSWER_CHARS = 1000

_BRACES = re.compile(r"[{}]")


def extract_boxed(text: str) -> str | None:
    r"""Content of the last `\boxed{...}` (or `\fbox{...}`, or `\boxed 5`) in `text`, braces balanced; else None.

    Linear time; an unbalanced last `\boxed{` gives None.
    """
    if not isinstance(text, str):
        return None
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = start + (6 if text.startswith("\\boxed", start) else 5)
    if text.startswith(" ", i):  # `\boxed 5`: the argument runs to the next `$` or space
        rest = text[i + 1 :]
        return re.split(r"[\s$]", rest, maxsplit=1)[0] or None
    if not text.startswith("{", i):
        return None
    depth = 0
    for brace in _BRACES.finditer(text, i):  # jumps between braces at C speed: megabyte inputs stay cheap
        depth += 1 if brace.group() == "{" else -1
        if depth == 0:
            return text[i + 1 : brace.start()]
    return None


def extract_gsm8k_answer(solution: str) -> str:
    """The final value of a GSM8K solution: the text after `####`, commas stripped (`"#### 1,200"` -> `"1200"`).

    Raises:
        ValueError: when the solution has no `####` line.
    """
    if not isinstance(solution, str) or "####" not in solution:
        raise ValueError(f"GSM8K solution has no '#### <answer>' line: {str(solution)[-80:]!r}")
    return solution.rsplit("####", 1)[1].strip().replace(",", "")


_UNIT_WORDS = (
    "square units|square feet|square inches|square meters|units|degrees|centimeters|cm|meters|km|kilometers|"
    "inches|feet|ft|miles|mph|hours|minutes|seconds|days|dollars|cents|points|ways|students|people|pounds"
)
# A unit after a number: `10\text{ inches}`, `5\mbox{ cm}^2`, `3 feet` (a plain word needs the space: `5m` stays).
_TRAILING_UNIT = re.compile(
    rf"^(.*?[0-9}}])(?:\s*\\(?:text|textbf|mbox|mathrm)\{{\s*[a-zA-Z ]*\}}|\s+(?:{_UNIT_WORDS}))(?:\^\{{?[23]\}}?)?$"
)
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|textit|mbox|mathrm|mathbf|operatorname)\{([^{}]*)\}")
_LATEX_SPACES = re.compile(r"\\[,;:! ]|\\quad|\\qquad")
_LEFT_RIGHT = re.compile(r"\\(?:left|right)(?![a-zA-Z])|\\[bB]igg?[lr]?(?![a-zA-Z])")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°")
_ASSIGNMENT = re.compile(r"^\s*(?:[a-zA-Z]|\\[a-zA-Z]+)(?:_\{?[a-zA-Z0-9]\}?)?\s*=\s*(?=[^=])")
_THOUSANDS = re.compile(r"[-+]?[0-9]{1,3}(?:,[0-9]{3})+(?:\.[0-9]+)?")
_SHORT_FRAC = re.compile(r"\\frac\s*([0-9a-zA-Z])\s*([0-9a-zA-Z])")
_HALF_BRACED_FRAC = re.compile(r"\\frac(\{[^{}]*\})([0-9a-zA-Z])")
_SHORT_SQRT = re.compile(r"\\sqrt\s*([0-9a-zA-Z])")
_SLASH_FRAC = re.compile(r"^([-+]?[0-9]+)/([0-9]+)$")

_NUMBER = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)")
_LATEX_FRAC = re.compile(r"([-+]?)\\frac\{([-+]?[0-9]+)\}\{([-+]?[0-9]+)\}")


def normalize_answer(answer: str | int | float) -> str:
    r"""Canonical string of a MATH / GSM8K answer for exact comparison (Hendrycks' `_strip_string`, extended).

    Examples: `"\left( 3, \dfrac{1}{2} \right)"` -> `"(3,\frac{1}{2})"`; `"x = 5"` -> `"5"`;
    `"10\text{ inches}"` -> `"10"`; `"\$1,000."` -> `"1000"`; `"90^\circ"` -> `"90"`; `"1/2"` -> `"\frac{1}{2}"`.
    """
    s = str(answer).strip()
    boxed = extract_boxed(s) if s.startswith(("\\boxed", "\\fbox")) else None
    if boxed is not None:
        s = boxed
    s = s.replace("\n", " ").replace("\\\\", "\\")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _LEFT_RIGHT.sub("", s)
    s = _LATEX_SPACES.sub(" ", s)
    s = _DEGREES.sub("", s)
    s = s.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "")
    s = s.replace("{,}", ",").strip()
    s = s.rstrip(".").strip()
    unit = _TRAILING_UNIT.match(s)
    if unit:
        s = unit.group(1)
    for _ in range(3):  # nested wrappers such as \text{\textbf{A}}
        s = _TEXT_WRAPPER.sub(r"\1", s)
    assignment = _ASSIGNMENT.match(s)
    if assignment and "," not in s:
        s = s[assignment.end() :]
    s = s.replace(" ", "")
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    s = _SHORT_SQRT.sub(r"\\sqrt{\1}", s)
    s = _SHORT_FRAC.sub(r"\\frac{\1}{\2}", s)
    s = _HALF_BRACED_FRAC.sub(r"\\frac\1{\2}", s)
    slash = _SLASH_FRAC.match(s)
    if slash:
        s = f"\\frac{{{slash.group(1)}}}{{{slash.group(2)}}}"
    if s.startswith("."):
        s = "0" + s
    return s.rstrip(".")


def _as_number(normalized: str) -> Fraction | None:
    """Exact value of a normalised plain number (`12`, `-0.5`, `\\frac{3}{4}`, `-\\frac{3}{4}`), else None."""
    if _NUMBER.fullmatch(normalized):
        try:
            return Fraction(normalized)
        except ValueError:
            return None
    frac = _LATEX_FRAC.fullmatch(normalized)
    if frac and int(frac.group(3)) != 0:
        value = Fraction(int(frac.group(2)), int(frac.group(3)))
        return -value if frac.group(1) == "-" else value
    return None


_BASE_FORM = re.compile(r"(-?)([0-9A-Za-z.]+)_\{?([0-9]+)\}?")
_SIGNED_WORD = re.compile(r"-?[0-9A-Za-z.]+")


def _base_value(digits: str, base: str) -> int | None:
    try:
        return int(digits, int(base)) if 2 <= int(base) <= 36 else None
    except ValueError:
        return None


def _base_verdict(pred: str, gold: str) -> bool | None:
    """Verdict for answers written with a base subscript (`2516_8`, `2516_{8}`); None when neither is one.

    math-verify drops subscripts, so it took `2516_9` for `2516_8`. Two subscripted answers are equal when they
    denote the same integer (or, when a digit string is not valid in its base, when digits and base match); a
    subscripted answer and a plain word (`2516`) are equal when the digits match, as math-verify had it.
    """
    p, g = _BASE_FORM.fullmatch(pred), _BASE_FORM.fullmatch(gold)
    if p and g:
        p_value, g_value = _base_value(p.group(2), p.group(3)), _base_value(g.group(2), g.group(3))
        if p_value is not None and g_value is not None:
            return (-p_value if p.group(1) else p_value) == (-g_value if g.group(1) else g_value)
        return p.group(1) == g.group(1) and p.group(2).lower() == g.group(2).lower() and p.group(3) == g.group(3)
    form, other = (p, gold) if p else (g, pred)
    if form is None or not any(c.isdigit() for c in form.group(2)) or not _SIGNED_WORD.fullmatch(other):
        return None
    return (form.group(1) + form.group(2)).lower() == other.lower()


# A GRPO batch repeats each gold once per completion of its group (and every epoch brings it back): each distinct
# gold is normalised and pre-checked once. Both functions are pure, and a gold is at most MAX_ANSWER_CHARS long here.
_normalized_gold = functools.lru_cache(maxsize=4096)(normalize_answer)
_explosive_gold = functools.lru_cache(maxsize=4096)(explosive)


def _cheap_verdict(model_answer, gold: str) -> bool | None:
    """Stages 1-2 (and base subscripts, malformed LaTeX, length bounds); None when symbolic work must decide."""
    if model_answer is None or gold == NEVER_MATCHES:
        return False
    pred_text = str(model_answer).strip()
    if len(pred_text) > MAX_ANSWER_CHARS or len(gold) > MAX_ANSWER_CHARS:
        return False
    pred, gold_normalized = normalize_answer(pred_text), _normalized_gold(gold)
    if not pred or not gold_normalized:
        return False
    if pred == gold_normalized:
        return True
    pred_value, gold_value = _as_number(pred), _as_number(gold_normalized)
    if pred_value is not None and gold_value is not None:
        return pred_value == gold_value
    base = _base_verdict(pred, gold_normalized)
    if base is not None:
        return base
    if not _braces_balanced(pred_text):  # malformed LaTeX: nothing for the symbolic stage to parse
        return False
    return None


def _braces_balanced(text: str) -> bool:
    depth = 0
    for brace in _BRACES.finditer(text):
        depth += 1 if brace.group() == "{" else -1
        if depth < 0:
            return False
    return depth == 0


# Verdicts of the symbolic stage (a GRPO group repeats the same extracted answers). A timeout is not a verdict (the
# machine or the answer was slow, the answer may be right): it is remembered for `TIMEOUT_MEMORY_S` only, so the
# same answer in the next groups of a step does not cost another cap, and is graded again after that.
_VERDICTS: dict[tuple[str, str], bool] = {}
_TIMED_OUT: dict[tuple[str, str], float] = {}
_MAX_VERDICTS = 1 << 16
TIMEOUT_MEMORY_S = 60.0


def _remember(key: tuple[str, str], verdict: bool | None) -> None:
    table = _VERDICTS if verdict is not None else _TIMED_OUT
    if len(table) >= _MAX_VERDICTS:
        table.clear()
    if verdict is None:
        _TIMED_OUT[key] = time.monotonic() + TIMEOUT_MEMORY_S
    else:
        _VERDICTS[key] = verdict
        _TIMED_OUT.pop(key, None)


def grade_many(
    model_answers: list, golds: list[list[str]], timeout: float = GRADE_TIMEOUT_S
) -> tuple[list[bool], dict[str, int]]:
    """`grade` for a batch, its symbolic comparisons run concurrently on the grading pool.

    Args:
        model_answers: extracted answers (None is wrong), one per item.
        golds: acceptable answers per item, as `ground_truth_answers` returns them.
        timeout: per-comparison time cap of the symbolic stage, in seconds.

    Returns:
        Whether each item's answer equals one of its golds, and counts: `timeouts` (items that scored 0 because a
        comparison hit the cap) and `rejected` (items whose answer the cheap pre-checks called explosive).
    """
    verdicts: list[list[bool | tuple[str, str]]] = []
    pending: dict[tuple[str, str], bool | None] = {}
    rejected = [False] * len(model_answers)
    for i, (answer, item_golds) in enumerate(zip(model_answers, golds, strict=True)):
        row = []
        for gold in item_golds:
            verdict = _cheap_verdict(answer, gold)
            if verdict is None:
                key = (gold, str(answer).strip())
                cached = _VERDICTS.get(key)
                if cached is not None:
                    verdict = cached
                elif _TIMED_OUT.get(key, 0.0) > time.monotonic():
                    pending[key] = None  # still counts as a timeout, without another cap
                    verdict = key
                elif explosive(key[1]) or _explosive_gold(key[0]):
                    verdict, rejected[i] = False, True
                else:
                    pending[key] = None
                    verdict = key
            row.append(verdict)
        verdicts.append(row)
    keys = [key for key in pending if key not in _TIMED_OUT or _TIMED_OUT[key] <= time.monotonic()]
    if keys:
        for key, verdict in zip(keys, get_grading_pool().verify_many(keys, timeout), strict=True):
            pending[key] = verdict
            _remember(key, verdict)
    results, timeouts = [], 0
    for row in verdicts:
        values = [pending[v] if isinstance(v, tuple) else v for v in row]
        ok = any(value is True for value in values)
        timeouts += not ok and None in values
        results.append(ok)
    return results, {"timeouts": timeouts, "rejected": sum(rejected)}


def grade(model_answer: str | int | float | None, gt_answer, timeout: float = GRADE_TIMEOUT_S) -> bool:
    r"""Whether `model_answer` equals `gt_answer` (see the module docstring for the stages).

    Args:
        model_answer: the extracted answer (no surrounding reasoning); None is wrong.
        gt_answer: the reference answer (checked as in `ground_truth_answers`; a list means any of them).
        timeout: wall-clock cap in seconds for the symbolic stage; past it the answer counts as wrong.

    Returns:
        True when the answers are equal.

    Raises:
        ValueError: when `gt_answer` cannot be an answer (None, NaN, empty, ...), naming it.
    """
    golds = ground_truth_answers(gt_answer, "gt_answer")
    return grade_many([model_answer], [golds], timeout)[0][0]


_NO_FORMAT = {"format_reward": 0.0, "answer_reward": 0.0, "reward": 0.0}


def r1_zero_answer(response: str) -> tuple[bool, str | None]:
    r"""`(format_ok, answer)` of an R1-Zero response: the format needs `</think> <answer>` and `</answer>`; the
    answer is the text of the last `<answer>` up to its `</answer>`, a `oxed{}` inside unwrapped (None when that
    box is unbalanced or the format is missing)."""
    if not isinstance(response, str) or "</think> <answer>" not in response or "</answer>" not in response:
        return False, None
    answer = response[response.rfind("<answer>") + len("<answer>") :]
    answer = answer.split("</answer>", 1)[0]
    if "\\boxed" in answer or "\\fbox" in answer:
        return True, extract_boxed(answer)
    return True, answer


def question_only_answer(response: str) -> tuple[bool, str | None]:
    r"""`(format_ok, answer)` for the question-only prompt: the last `\boxed{}`, and whether there is one."""
    answer = extract_boxed(response)
    return answer is not None, answer


def reward_components(format_ok: bool, answer_ok: bool) -> dict[str, float]:
    """`{"format_reward", "answer_reward", "reward"}`: the answer counts only with the format."""
    if not format_ok:
        return dict(_NO_FORMAT)
    return {"format_reward": 1.0, "answer_reward": float(answer_ok), "reward": float(answer_ok)}


def _graded_reward(extract, response: str, ground_truth, timeout: float) -> dict[str, float]:
    golds = ground_truth_answers(ground_truth)
    format_ok, answer = extract(response)
    return reward_components(format_ok, format_ok and grade_many([answer], [golds], timeout)[0][0])


def r1_zero_reward_fn(response: str, ground_truth, timeout: float = GRADE_TIMEOUT_S) -> dict[str, float]:
    r"""R1-Zero reward: format (`</think> <answer>` ... `</answer>`) and answer correctness.

    reward = answer_reward (1 only with the format); `format_reward` = 1 when both tags are present.

    Args:
        response: the completion, which continues the prompt's `Assistant: <think>`.
        ground_truth: reference answer: str, number or a list of acceptable answers (`ground_truth_answers`).
        timeout: per-comparison time cap of the symbolic stage, in seconds.

    Returns:
        `{"format_reward", "answer_reward", "reward"}` floats.
    """
    return _graded_reward(r1_zero_answer, response, ground_truth, timeout)


def question_only_reward_fn(response: str, ground_truth, timeout: float = GRADE_TIMEOUT_S) -> dict[str, float]:
    r"""Question-only reward: the last `\boxed{}` is the answer; format = a `\boxed{}` is present.

    Args:
        response: the completion.
        ground_truth: reference answer: str, number or a list of acceptable answers (`ground_truth_answers`).
        timeout: per-comparison time cap of the symbolic stage, in seconds.

    Returns:
        `{"format_reward", "answer_reward", "reward"}` floats.
    """
    return _graded_reward(question_only_answer, response, ground_truth, timeout)
