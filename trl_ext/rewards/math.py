r"""MATH and GSM8K answer grading and the R1-Zero / question-only rewards (seeds 001-003, CS336 A5's grader).

`grade(model_answer, gt_answer)` decides in three stages, cheapest first:

1. string normalisation of the usual MATH answer forms (spaces, `\left` / `\right`, `\dfrac` / `\tfrac`,
   `\text{...}` and trailing units, dollars, percent and degree signs, `x = 3` -> `3`, `\frac12` -> `\frac{1}{2}`,
   `a/b` -> `\frac{a}{b}`, thousands separators, a trailing period); equal strings are equal answers;
2. exact rational comparison when both sides are plain numbers (integers, decimals, simple fractions), so
   `0.5` == `\frac12` and `1,000` == `1000.` without symbolic work, and unequal numbers are final;
3. otherwise symbolic equivalence through math-verify, run in a persistent child process that is killed and
   restarted when one comparison exceeds its wall-clock limit. This works from any thread (math-verify's own
   timeout uses `signal` and fails outside the main thread) and bounds pathological inputs like `9^{9^{9^9}}`.
   Results are cached per (gold, prediction). Answers longer than `MAX_ANSWER_CHARS` and predictions with
   unbalanced braces are wrong without reaching this stage.

Rewards (floats in a dict, as in CS336's `drgrpo_grader`):

- `r1_zero_reward_fn`: format = the response contains `</think> <answer>` and `</answer>`; the answer is the
  text after the last `<answer>` up to its `</answer>` (a `\boxed{}` inside is unwrapped); reward = answer.
- `question_only_reward_fn`: format = the response has a `\boxed{}`; its last one is the answer.

Ground truth may be a str, an int, a float or a list of acceptable answers.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import select
import subprocess
import sys
import threading
import time
from fractions import Fraction
from functools import lru_cache
from pathlib import Path

__all__ = [
    "GRADE_TIMEOUT_S",
    "MAX_ANSWER_CHARS",
    "extract_boxed",
    "extract_gsm8k_answer",
    "grade",
    "normalize_answer",
    "question_only_reward_fn",
    "r1_zero_reward_fn",
]

GRADE_TIMEOUT_S = 5.0
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


class _MathVerifyWorker:
    """A persistent `_grader_worker.py` child; killed and restarted when a comparison runs past its limit.

    One per process (re-created after a fork); a lock serialises callers from different threads.
    """

    # `-P`: the script's folder must not lead sys.path, or this package's `math.py` would shadow the stdlib `math`.
    _SCRIPT = str(Path(__file__).with_name("_grader_worker.py"))
    _START_TIMEOUT_S = 120.0  # importing sympy on a busy machine; not counted against a comparison's limit

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._pid = os.getpid()
        self._buffer = b""
        self.restarts = 0

    def _start(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-P", "-u", self._SCRIPT, str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        self._buffer = b""
        try:
            ready = self._read_line(self._START_TIMEOUT_S) == b"ready"
        except EOFError:
            ready = False
        if not ready:
            self._kill()
            raise RuntimeError("the math-verify worker did not start (is math-verify installed?)")

    def _read_line(self, timeout: float) -> bytes | None:
        deadline = time.monotonic() + timeout
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                raise EOFError("the math-verify worker died")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.strip()

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            for stream in (self._proc.stdin, self._proc.stdout):
                stream.close()
            self._proc = None

    def verify(self, gold: str, prediction: str, timeout: float) -> bool:
        """math-verify's `verify(parse(gold), parse(prediction))`; False when it errs or exceeds `timeout` s."""
        request = (json.dumps([gold, prediction]) + "\n").encode()
        with self._lock:
            if self._pid != os.getpid():  # forked: the pipes belong to the parent's worker
                self._proc, self._pid = None, os.getpid()
            # A worker that died under us (killed from outside, or with the thread that started it) gets one retry.
            for _ in range(2):
                if self._proc is None or self._proc.poll() is not None:
                    self._start()
                try:
                    self._proc.stdin.write(request)
                    self._proc.stdin.flush()
                    line = self._read_line(timeout)
                except (OSError, EOFError):  # it died before reading (BrokenPipeError) or before answering
                    self._kill()
                    self.restarts += 1
                    continue
                if line is None:  # over the time limit: the answer is wrong
                    self._kill()
                    self.restarts += 1
                return line == b"1"
            return False

    def close(self) -> None:
        with self._lock:
            if self._pid == os.getpid():
                self._kill()


_WORKER = _MathVerifyWorker()
atexit.register(_WORKER.close)


def grade(
    model_answer: str | int | float | None, gt_answer: str | int | float, timeout: float = GRADE_TIMEOUT_S
) -> bool:
    r"""Whether `model_answer` equals `gt_answer` (see the module docstring for the three stages).

    Args:
        model_answer: the extracted answer (no surrounding reasoning); None is wrong.
        gt_answer: the reference answer.
        timeout: wall-clock limit in seconds for the symbolic stage; past it the answer counts as wrong.

    Returns:
        True when the answers are equal.
    """
    if model_answer is None or gt_answer is None:
        return False
    pred_text, gold_text = str(model_answer).strip(), str(gt_answer).strip()
    if len(pred_text) > MAX_ANSWER_CHARS or len(gold_text) > MAX_ANSWER_CHARS:
        return False
    pred, gold = normalize_answer(model_answer), normalize_answer(gt_answer)
    if not pred or not gold:
        return False
    if pred == gold:
        return True
    pred_value, gold_value = _as_number(pred), _as_number(gold)
    if pred_value is not None and gold_value is not None:
        return pred_value == gold_value
    if not _braces_balanced(pred_text):  # malformed LaTeX: nothing for the symbolic stage to parse
        return False
    return _symbolic_equal(gold_text, pred_text, timeout)


def _braces_balanced(text: str) -> bool:
    depth = 0
    for brace in _BRACES.finditer(text):
        depth += 1 if brace.group() == "{" else -1
        if depth < 0:
            return False
    return depth == 0


@lru_cache(maxsize=1 << 16)
def _symbolic_equal(gold: str, prediction: str, timeout: float) -> bool:
    # Cached: a GRPO group repeats the same extracted answers, and an answer that timed out once would again.
    return _WORKER.verify(gold, prediction, timeout)


def _ground_truths(ground_truth) -> list[str]:
    if isinstance(ground_truth, str | int | float):
        return [str(ground_truth)]
    if isinstance(ground_truth, list | tuple):
        return [str(answer) for answer in ground_truth]
    raise ValueError(f"ground_truth must be a str, int, float or list of them, got {type(ground_truth).__name__}")


def _graded(model_answer: str | None, ground_truth, timeout: float) -> dict[str, float]:
    answer_ok = any(grade(model_answer, gt, timeout) for gt in _ground_truths(ground_truth))
    return {"format_reward": 1.0, "answer_reward": float(answer_ok), "reward": float(answer_ok)}


_NO_FORMAT = {"format_reward": 0.0, "answer_reward": 0.0, "reward": 0.0}


def r1_zero_reward_fn(response: str, ground_truth, timeout: float = GRADE_TIMEOUT_S) -> dict[str, float]:
    r"""R1-Zero reward: format (`</think> <answer>` ... `</answer>`) and answer correctness.

    reward = answer_reward (1 only with the format); `format_reward` = 1 when both tags are present.

    Args:
        response: the completion, which continues the prompt's `Assistant: <think>`.
        ground_truth: reference answer: str, int, float or a list of acceptable answers.
        timeout: per-comparison limit of the symbolic stage, in seconds.

    Returns:
        `{"format_reward", "answer_reward", "reward"}` floats.
    """
    _ground_truths(ground_truth)
    if not isinstance(response, str) or "</think> <answer>" not in response or "</answer>" not in response:
        return dict(_NO_FORMAT)
    answer = response[response.rfind("<answer>") + len("<answer>") :]
    answer = answer.split("</answer>", 1)[0]
    if "\\boxed" in answer or "\\fbox" in answer:
        answer = extract_boxed(answer)
        if answer is None:
            return {"format_reward": 1.0, "answer_reward": 0.0, "reward": 0.0}
    return _graded(answer, ground_truth, timeout)


def question_only_reward_fn(response: str, ground_truth, timeout: float = GRADE_TIMEOUT_S) -> dict[str, float]:
    r"""Question-only reward: the last `\boxed{}` is the answer; format = a `\boxed{}` is present.

    Args:
        response: the completion.
        ground_truth: reference answer: str, int, float or a list of acceptable answers.
        timeout: per-comparison limit of the symbolic stage, in seconds.

    Returns:
        `{"format_reward", "answer_reward", "reward"}` floats.
    """
    _ground_truths(ground_truth)
    answer = extract_boxed(response)
    if answer is None:
        return dict(_NO_FORMAT)
    return _graded(answer, ground_truth, timeout)
