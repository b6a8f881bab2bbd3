"""Kissing configurations (NLPDL HW3, section 7): exact verifier, sandboxed program runner, and a reward for TRL.

The task: a set C of nonzero integer vectors in Z^d with `min_{x != y} |x - y| >= max_x |x|`. Then the unit spheres
centred at `2x/|x|` touch the central unit sphere and overlap none of each other, so the kissing number tau_d is at
least |C|. Score = |C| when valid, else 0. In dimension 11 NLPDL HW3 quotes 595 <= tau_11 <= 870.

Pipeline of the reward: completion -> last fenced Python block -> sandbox (`run_points_program`, the program's global
`points` comes back as JSON data) -> `verify_kissing_configuration` (integer arithmetic only) -> `|C| / 595` when
valid, plus a small format reward for a program that ran and defined `points` as a list.

numpy loads on the first verification, not at import: `trl_ext.rewards` stays standard-library-only to import.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from trl_ext.rewards.sandbox import SandboxLimits, run_python

__all__ = [
    "KISSING_BOUNDS",
    "KissingReward",
    "extract_program",
    "kissing_score",
    "run_points_program",
    "score_kissing_completion",
    "verify_kissing_configuration",
]

# (best known lower bound, upper bound) on tau_11, as quoted by NLPDL HW3.
KISSING_BOUNDS = {11: (595, 870)}
MAX_POINTS = 10_000  # beyond this the O(n^2) check is refused (tau_11 <= 870 anyway)
_BLOCK_ENTRIES = 1 << 22  # pairwise entries per chunk: 32 MiB of int64
_CODE_BLOCK = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def _invalid(message: str, num_points: int, dimension: int, **extra) -> dict:
    return {"validity": 0.0, "num_points": num_points, "dimension": dimension, "message": message, **extra}


def _is_int(value) -> bool:
    import numpy as np

    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _describe(value) -> str:
    text = repr(value)
    return f"{text[:40]}... ({type(value).__name__})" if len(text) > 40 else f"{text} ({type(value).__name__})"


def _as_matrix(points, dimension: int):
    """Points as an (n, d) integer array (int64, or Python ints when int64 could overflow), or an error message."""
    import numpy as np

    if isinstance(points, np.ndarray):
        if points.ndim != 2 or points.shape[1] != dimension:
            return None, f"points has shape {points.shape}; expected (n, {dimension})"
        if points.dtype.kind not in "iu" and not (points.dtype == object and all(map(_is_int, points.flat))):
            return None, f"points has dtype {points.dtype}; coordinates must be integers"
        rows = points.tolist()
    else:
        rows = points
        for i, row in enumerate(rows):
            if isinstance(row, np.ndarray):
                row = row.tolist()
            if not isinstance(row, list | tuple):
                return None, f"point {i} is {_describe(row)}, not a vector (a list of {dimension} integers)"
            if len(row) != dimension:
                return None, f"point {i} has {len(row)} coordinates; expected {dimension} (dimension {dimension})"
            if not all(type(c) is int for c in row):
                for j, c in enumerate(row):
                    if not _is_int(c):
                        return None, f"point {i}, coordinate {j} is {_describe(c)}, not an integer"
    # |x - y|^2 <= 4 d m^2 for coordinates bounded by m: int64 holds it while m <= sqrt((2^63 - 1) / (4 d)).
    bound = math.isqrt((2**63 - 1) // (4 * dimension))
    largest = max(max(abs(int(c)) for c in row) for row in rows)
    if largest <= bound:
        return np.array(rows, dtype=np.int64).reshape(len(rows), dimension), None
    matrix = np.empty((len(rows), dimension), dtype=object)
    matrix[:] = [[int(c) for c in row] for row in rows]
    return matrix, None


def _closest_pair(x, norms) -> tuple[int, int, int]:
    """`(i, j, |x_i - x_j|^2)` of a closest pair, i < j, exactly: `|x_i|^2 + |x_j|^2 - 2 <x_i, x_j>` in row chunks.

    Args:
        x: (n, d) int64 or object (Python int) coordinates, n >= 2.
        norms: (n,) squared norms of the rows of x.
    """
    import numpy as np

    n = len(x)
    above = np.iinfo(np.int64).max if x.dtype != object else math.inf  # marks the pairs j <= i
    rows = max(1, _BLOCK_ENTRIES // n)
    best = (-1, -1, above)
    for start in range(0, n - 1, rows):
        stop = min(n - 1, start + rows)
        d2 = norms[start:stop, None] + norms[None, :] - 2 * (x[start:stop] @ x.T)  # (rows, n)
        d2[np.arange(n)[None, :] <= np.arange(start, stop)[:, None]] = above
        i, j = divmod(int(np.argmin(d2)), n)
        if d2[i, j] < best[2]:
            best = (start + i, j, int(d2[i, j]))
    return best


def verify_kissing_configuration(points, dimension: int = 11, max_points: int = MAX_POINTS) -> dict:
    """Check that `points` is a valid kissing configuration, with exact integer arithmetic.

    Valid means: every point is a nonzero vector of `dimension` integers, no two are equal, and
    `min_{i != j} |x_i - x_j|^2 >= max_i |x_i|^2` (squared lengths, so no square roots and no floats).

    Args:
        points: a list (or tuple) of vectors, each a list / tuple / 1-D array of ints, or an (n, d) integer array.
        dimension: the dimension d of the vectors.
        max_points: larger inputs are refused (the pairwise check is O(n^2 d)).

    Returns:
        `{"validity": 1.0 or 0.0, "num_points": n, "dimension": d, "message": str, "min_squared_distance": int or
        None, "max_squared_norm": int or None}`; the message names the first problem found (type, dimension,
        non-integer coordinate, zero vector, duplicate, or the closest pair against the longest vector).
    """
    import numpy as np

    if not isinstance(dimension, int) or isinstance(dimension, bool) or dimension < 1:
        raise ValueError(f"dimension must be a positive int, got {dimension!r}")
    if not isinstance(points, list | tuple | np.ndarray):
        return _invalid(f"points must be a list of vectors, got {_describe(points)}", 0, dimension)
    n = len(points)
    if n == 0:
        return _invalid("points is empty: no vectors", 0, dimension)
    if n > max_points:
        return _invalid(f"{n} points: more than the {max_points} this verifier checks", n, dimension)
    x, error = _as_matrix(points, dimension)
    if error is not None:
        return _invalid(error, n, dimension)
    norms = (x * x).sum(axis=1)  # (n,) squared norms
    zero = np.flatnonzero(norms == 0)
    if len(zero):
        return _invalid(f"point {int(zero[0])} is the zero vector", n, dimension)
    k = int(np.argmax(norms))
    max_norm = int(norms[k])
    if n == 1:
        return {**_valid(1, dimension, None, max_norm), "message": f"Valid: 1 point in dimension {dimension}"}
    i, j, min_dist = _closest_pair(x, norms)
    extra = {"min_squared_distance": min_dist, "max_squared_norm": max_norm}
    if min_dist == 0:
        vector = tuple(int(c) for c in x[i])
        return _invalid(f"points {i} and {j} are the same vector {vector}", n, dimension, **extra)
    if min_dist < max_norm:
        message = (
            f"Minimum squared distance {min_dist} < maximum squared norm {max_norm}: points {i} and {j} are at "
            f"squared distance {min_dist}, point {k} has squared norm {max_norm}"
        )
        return _invalid(message, n, dimension, **extra)
    return _valid(n, dimension, min_dist, max_norm)


def _valid(n: int, dimension: int, min_dist: int | None, max_norm: int) -> dict:
    message = (
        f"Valid: {n} points in dimension {dimension}, minimum squared distance {min_dist} >= maximum squared "
        f"norm {max_norm}"
    )
    return {
        "validity": 1.0,
        "num_points": n,
        "dimension": dimension,
        "message": message,
        "min_squared_distance": min_dist,
        "max_squared_norm": max_norm,
    }


def kissing_score(result: dict) -> int:
    """The course's score: |C| for a valid configuration, else 0."""
    return int(result["num_points"]) if result.get("validity") == 1.0 else 0


def run_points_program(source: str, time_limit_s: float | None = None, limits: SandboxLimits | None = None) -> dict:
    """Run a program that defines a global `points` in the sandbox (`trl_ext.rewards.sandbox`) and return it as data.

    Args:
        source: the program's Python source; it runs only in a separate, contained process.
        time_limit_s: wall-clock limit, start-up included; overrides `limits.time_limit_s` when given (default:
            that of `limits`, 10 s without them).
        limits: the run's limits (memory, processes, file size, output size, ...; default `SandboxLimits()`).

    Returns:
        `{"points": list or None, "error": None or the verdict, "seconds": float, "output": the last 4 KiB the
        program printed, "isolation": what contained it}`.
    """
    limits = limits or SandboxLimits()
    if time_limit_s is not None:
        limits = dataclasses.replace(limits, time_limit_s=time_limit_s)
    result = run_python(source, "points", limits)
    result["points"] = result.pop("value")
    return result


def extract_program(text: str) -> str | None:
    """The last fenced Python block of a completion (after any `</think>`), or None when there is none."""
    if not isinstance(text, str):
        return None
    if "<think>" in text:
        if "</think>" not in text:
            return None  # still thinking: no answer yet
        text = text.rsplit("</think>", 1)[1]
    blocks = _CODE_BLOCK.findall(text)
    return blocks[-1] if blocks and blocks[-1].strip() else None


def _no_program_message(text) -> str:
    """Why `extract_program` found nothing, in words the model can act on."""
    if not isinstance(text, str):
        return "no ```python code block found in the answer"
    if "<think>" in text and "</think>" not in text:
        return "the reply ends inside <think>: no answer after </think> (cut at the token limit?)"
    answer = text.rsplit("</think>", 1)[-1]
    if answer.count("```") % 2 == 1:
        return "the ```python code block is never closed (cut at the token limit?)"
    return "no ```python code block found in the answer"


def _failed(message: str, program: str | None) -> dict:
    """The result of a completion whose program is missing or produced no `points`: everything zero."""
    return {
        "reward": 0.0,
        "format_reward": 0.0,
        "answer_reward": 0.0,
        "validity": 0.0,
        "num_points": 0,
        "message": message,
        "program": program,
    }


def score_kissing_completion(
    text: str,
    dimension: int = 11,
    scale: float = 595.0,
    format_weight: float = 0.1,
    limits: SandboxLimits | None = None,
) -> dict:
    """Score one completion: code block -> sandbox -> verifier.

    Returns:
        `{"reward", "format_reward", "answer_reward", "validity", "num_points", "message", "program"}` where
        `format_reward` is `format_weight` when a code block ran and defined `points` as a list, `answer_reward =
        |C| / scale` when the configuration is valid, `reward = format_reward + answer_reward`; `message` is the
        verifier's message or the sandbox's verdict (what the discovery loop feeds back); `program` is the code
        block that ran (`extract_program`), None when there is none.
    """
    program = extract_program(text)
    if program is None:
        return _failed(_no_program_message(text), None)
    run = run_points_program(program, limits=limits)
    if run["error"] is not None:
        return _failed(run["error"], program)
    check = verify_kissing_configuration(run["points"], dimension)
    answer = check["num_points"] / scale if check["validity"] == 1.0 else 0.0
    return {
        "reward": format_weight + answer,
        "format_reward": format_weight,
        "answer_reward": answer,
        "validity": check["validity"],
        "num_points": check["num_points"],
        "message": check["message"],
        "program": program,
    }


class KissingReward:
    """Kissing-configuration reward for TRL: `|C| / scale` for a valid configuration plus a format reward.

    Completions hold a Python program in a fenced block that defines `points`; each runs in the sandbox (several
    at once on threads: each run is a separate process). An optional dataset column `dimension` sets the dimension
    per row (default `dimension`). With TRL's `log_metric` it logs `rewards/kissing_reward/{validity, num_points,
    best_num_points, format_reward}`; with `log_extra`, per-sample `validity`, `num_points` and `message` columns.

    Args:
        dimension: vector dimension when the batch has no `dimension` column.
        scale: |C| that earns reward 1 (595: the best known tau_11 NLPDL HW3 quotes).
        format_weight: reward for a program that ran and defined `points` as a list.
        time_limit_s: wall-clock limit per program.
        workers: programs run at once.
    """

    __name__ = "kissing_reward"

    def __init__(
        self,
        dimension: int = 11,
        scale: float = 595.0,
        format_weight: float = 0.1,
        time_limit_s: float = 10.0,
        workers: int = 4,
    ) -> None:
        if workers < 1 or time_limit_s <= 0 or scale <= 0 or dimension < 1:
            raise ValueError("KissingReward: dimension, scale, time_limit_s and workers must be positive")
        self.dimension, self.scale, self.format_weight = dimension, scale, format_weight
        self.time_limit_s, self.workers = time_limit_s, workers

    def score(self, completions: Sequence, dimensions: Sequence[int] | None = None) -> list[dict]:
        """`score_kissing_completion` for each completion (strings or chat messages)."""
        from trl_ext.rewards.trl_rewards import completion_text

        dimensions = dimensions or [self.dimension] * len(completions)
        limits = SandboxLimits(time_limit_s=self.time_limit_s)

        texts = [completion_text(c) for c in completions]

        def one(pair) -> dict:
            text, dimension = pair
            return score_kissing_completion(text, int(dimension), self.scale, self.format_weight, limits)

        pairs = list(zip(texts, dimensions, strict=True))
        if sum("```" in text for text in texts) < 2:  # at most one sandbox run: no threads needed
            return [one(pair) for pair in pairs]
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            return list(pool.map(one, pairs))

    def __call__(self, completions: list, log_metric=None, log_extra=None, **columns) -> list[float]:
        dimensions = columns.get("dimension")
        if dimensions is not None and len(dimensions) != len(completions):
            raise ValueError(
                f"{self.__name__}: column 'dimension' has {len(dimensions)} values for {len(completions)} completions"
            )
        results = self.score(completions, dimensions)
        valid = [kissing_score(r) for r in results]
        if log_metric is not None and results:
            name = self.__name__
            log_metric(f"rewards/{name}/validity", sum(r["validity"] for r in results) / len(results))
            log_metric(f"rewards/{name}/num_points", sum(valid) / len(results))
            log_metric(f"rewards/{name}/best_num_points", float(max(valid)))
            log_metric(f"rewards/{name}/format_reward", sum(r["format_reward"] for r in results) / len(results))
        if log_extra is not None:
            log_extra(f"{self.__name__}/validity", [r["validity"] for r in results])
            log_extra(f"{self.__name__}/num_points", valid)
            log_extra(f"{self.__name__}/message", [r["message"][:300] for r in results])
        return [r["reward"] for r in results]

    def __repr__(self) -> str:
        return (
            f"KissingReward(dimension={self.dimension}, scale={self.scale}, format_weight={self.format_weight}, "
            f"time_limit_s={self.time_limit_s}, workers={self.workers})"
        )
