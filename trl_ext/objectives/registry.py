"""A tiny name -> function registry, one per axis (advantage, per-token loss, reduction).

The idea is verl's `register_policy_loss`: a decorator fills the table and the getter lists the valid names on a
typo, so a config value is validated against the same table the code runs from.
"""

from __future__ import annotations

from collections.abc import Callable


class Registry(dict):
    """A `dict` from config value to function, with a `register(name)` decorator and a `lookup` that explains errors.

    Args:
        axis: what the keys choose, used in error messages (e.g. "pg_loss_type").
    """

    def __init__(self, axis: str):
        super().__init__()
        self.axis = axis

    def register(self, name: str) -> Callable[[Callable], Callable]:
        """Decorator adding the function under `name`; a duplicate name is a programming error."""

        def decorator(fn: Callable) -> Callable:
            if name in self:
                raise ValueError(f"{self.axis} {name!r} is already registered (by {self[name].__qualname__})")
            self[name] = fn
            return fn

        return decorator

    def lookup(self, name: str) -> Callable:
        """The function registered under `name`; `ValueError` listing the valid names otherwise."""
        try:
            return self[name]
        except (KeyError, TypeError):
            raise ValueError(f"unknown {self.axis} {name!r}; valid names: {', '.join(self)}") from None

    def names(self) -> tuple[str, ...]:
        return tuple(self)
