"""What a failed preflight reports: a `Problem` per field at fault, with a fix that works, in one `PreflightError`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One reason a plan cannot run.

    Attributes:
        field: the recipe / accelerate / launcher field at fault (`train_batch_size`, `num_processes`, ...).
        message: what is wrong, with the numbers.
        fix: a change that makes this check pass (checked by re-running it where the check is arithmetic).
    """

    field: str
    message: str
    fix: str = ""

    def render(self) -> str:
        text = f"{self.field}: {self.message}"
        return f"{text}\n    fix: {self.fix}" if self.fix else text


class PreflightError(ValueError):
    """The plan fails one or more checks; raised before any model loads, server starts or process spawns."""

    def __init__(self, problems: Iterable[Problem], context: str = ""):
        self.problems = list(problems)
        self.context = context
        head = f"preflight{f' ({context})' if context else ''}: {len(self.problems)} problem(s)"
        super().__init__("\n".join([head, *(f"  - {p.render()}" for p in self.problems)]))
