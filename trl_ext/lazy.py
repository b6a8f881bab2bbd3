"""Imports a process does not pay for: `lazy_names`, a package's public names that load their modules on first use
(PEP 562 module `__getattr__`), and `hide_vllm`, for programs that never use vLLM.

The packages whose import must stay light (`trl_ext`, `trl_ext.grpo`, `trl_ext.launch`, `trl_ext.recipes`,
`trl_ext.evaluation`, `trl_ext.discover`) declare `__getattr__ = lazy_names(__name__, {name: module, ...})`:
`trl-ext --help` and a reward import then load none of TRL, transformers or torch (tests/test_cli_imports.py).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from importlib import import_module


def lazy_names(package: str, modules: dict[str, str]) -> Callable[[str], object]:
    """The `__getattr__` of `package`: `name` in `modules` is imported from `modules[name]` when first asked for."""

    def __getattr__(name: str) -> object:
        if name in modules:
            return getattr(import_module(modules[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


def hide_vllm() -> bool:
    """Make `import vllm` fail in this process, unless something already imported it: `sys.modules["vllm"] = None`
    makes `importlib.util.find_spec("vllm")` None, so TRL's `is_vllm_available()` is False and TRL's GRPO module,
    which imports vLLM whenever it is installed (about 10 CPU seconds of a process start on a 2-core CPU), loads none
    of it. Only a program's entry point calls this, for a run that never generates with vLLM (the demo and its arm
    processes; a recipe that does not use it, `trl_ext.recipes.vllm_import`). Returns whether vLLM was hidden."""
    if "vllm" in sys.modules:
        return False
    sys.modules["vllm"] = None  # type: ignore[assignment]
    return True
