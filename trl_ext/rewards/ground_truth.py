"""MATH / GSM8K ground truths checked and turned into answer strings: a missing answer never earns a reward.

Accepted, with these conversions:

- `str` (and numpy `str_`): as is; the strings a missing value turns into when written out (`"None"`, `"nan"`,
  `"NaN"`, `"null"`, `"<NA>"`, any case) are kept but match nothing, so every completion scores 0 on that row (a
  warning names the value once). hiyouga/math12k has two: train rows 4012 and 10891 have the answer `"None"`.
- integers (`int`, every numpy integer kind): their decimal digits, `np.int64(3)` -> `"3"`;
- finite floats (`float`, every numpy float kind) and `Decimal`: integral ones as integers (`18.0` -> `"18"`),
  others in positional notation at their own precision (`np.float32(0.1)` -> `"0.1"`, `1e-07` -> `"0.0000001"`);
- `Fraction` (any `numbers.Rational`): `"p/q"`;
- a list, tuple or 1-d numpy array of the above: several acceptable answers (at least one).

Errors (`ValueError` naming the value): None, NaN and infinities (pandas writes a missing answer as NaN), empty
or blank strings, bools, complex numbers, empty lists, nested lists, and any other type.
"""

from __future__ import annotations

import math
import numbers
import warnings
from decimal import Decimal
from fractions import Fraction

__all__ = ["MISSING_MARKERS", "ground_truth_answers"]

MISSING_MARKERS = frozenset({"none", "nan", "null", "<na>"})
# Matches nothing: no normalised answer contains a NUL character.
NEVER_MATCHES = "\x00missing ground truth"
_warned: set[str] = set()


def ground_truth_answers(ground_truth, where: str = "ground_truth") -> list[str]:
    """The acceptable answers of one ground truth as strings (see the module docstring).

    Args:
        ground_truth: a str / number or a list of them.
        where: how error messages name the value, e.g. `"ground_truth[3]"`.

    Returns:
        One string per acceptable answer; a missing-value marker becomes `NEVER_MATCHES`.

    Raises:
        ValueError: naming the value when it cannot be an answer.
    """
    if isinstance(ground_truth, list | tuple) or _is_numpy_array(ground_truth):
        values = list(ground_truth)
        if not values:
            raise ValueError(f"{where} is an empty list: no acceptable answer")
        return [_answer_text(value, f"{where}[{i}]") for i, value in enumerate(values)]
    return [_answer_text(ground_truth, where)]


def _is_numpy_array(value) -> bool:
    return type(value).__name__ == "ndarray" and getattr(value, "ndim", 0) == 1


def _answer_text(value, where: str) -> str:
    if isinstance(value, str):
        text = value.strip()
        if not text:
            raise ValueError(f"{where} is an empty string {value!r}: no answer to compare with")
        if text.lower() in MISSING_MARKERS:
            if text not in _warned:
                _warned.add(text)
                warnings.warn(
                    f"{where} is {value!r}, a missing value written as text: no completion can match it (reward 0)",
                    stacklevel=4,
                )
            return NEVER_MATCHES
        return text
    if value is None:
        raise ValueError(f"{where} is None: a missing answer, not one to compare with")
    dtype = getattr(value, "dtype", None)
    if dtype is not None and getattr(value, "shape", None) == ():  # a numpy scalar or 0-d array
        return _numpy_text(value, dtype.kind, where)
    if isinstance(value, bool):
        raise ValueError(f"{where} is the bool {value!r}, not an answer")
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, float | Decimal):
        return _float_text(value, where)
    if isinstance(value, numbers.Rational):
        return str(Fraction(value.numerator, value.denominator))
    raise ValueError(f"{where} must be a str, a real number or a list of them, got {type(value).__name__} {value!r}")


def _numpy_text(value, kind: str, where: str) -> str:
    if kind in "iu":
        return str(int(value))
    if kind == "f":
        return _float_text(value, where)
    if kind in "US":
        return _answer_text(str(value.item() if kind == "U" else value.item().decode()), where)
    if kind == "O":
        return _answer_text(value.item(), where)
    what = {"b": "a bool", "c": "a complex number", "M": "a date", "m": "a time span"}.get(kind, f"dtype {kind!r}")
    raise ValueError(f"{where} is {what} ({value!r}), not an answer")


def _float_text(value, where: str) -> str:
    if not math.isfinite(value):
        raise ValueError(f"{where} is {value!r}: a missing or infinite value, not an answer")
    if float(value).is_integer():
        return str(int(value))
    # str() is the shortest text that reads back as this value at its own precision (numpy's float32 included).
    return format(Decimal(str(value)), "f")
