"""A tiny name -> function registry, one per axis (advantage, per-token loss, reduction).

The idea is verl's `register_policy_loss`: a decorator fills the table and the getter lists the valid names on a
typo, so a config value is validated against the same table the code runs from. A registered function declares the
inputs it uses as keyword parameters; `call` hands it exactly those, and `parameters` lets the config tell which
fields a chosen function ignores (so the docs, the config checks and the code cannot drift apart).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any


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

    def parameters(self, name: str) -> frozenset[str]:
        """The names of the inputs the function registered as `name` declares (its parameters)."""
        return _parameter_names(self.lookup(name))

    def call(self, name: str, **available: Any) -> Any:
        """Call the function registered as `name` with the entries of `available` it declares.

        A declared parameter missing from `available` keeps the function's default (or raises `TypeError` when it
        has none), so a caller can offer every input it has and let each function take what it uses.
        """
        wanted = self.parameters(name)
        return self.lookup(name)(**{key: value for key, value in available.items() if key in wanted})


@functools.cache
def _parameter_names(func: Callable) -> frozenset[str]:
    """A function's parameter names, read once (`Registry.call` asks for them on every micro-batch)."""
    return frozenset(inspect.signature(func).parameters)
