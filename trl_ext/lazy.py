"""`lazy_names`: a package's public names that load their modules on first use (PEP 562 module `__getattr__`).

The packages whose import must stay light (`trl_ext`, `trl_ext.grpo`, `trl_ext.launch`, `trl_ext.recipes`,
`trl_ext.evaluation`, `trl_ext.discover`) declare `__getattr__ = lazy_names(__name__, {name: module, ...})`:
`trl-ext --help` and a reward import then load none of TRL, transformers or torch (tests/test_cli_imports.py).
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module


def lazy_names(package: str, modules: dict[str, str]) -> Callable[[str], object]:
    """The `__getattr__` of `package`: `name` in `modules` is imported from `modules[name]` when first asked for."""

    def __getattr__(name: str) -> object:
        if name in modules:
            return getattr(import_module(modules[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
