"""Layers point one way (docs/gpu.md, the preflight): `trl_ext.preflight` checks a parsed plan and imports neither
`trl_ext.recipes` nor `trl_ext.launch`; `trl_ext.recipes` (parse, and the entry points that parse, check and start)
does not import `trl_ext.launch`; and none of the three imports another of them inside a function to dodge an import
loop (issue #23: preflight.entry and preflight.plan imported the recipes, which imported the preflight back)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "trl_ext"
LAYERS = ("preflight", "recipes", "launch")  # lowest first
# package -> the packages it must not import
FORBIDDEN = {"preflight": ("trl_ext.recipes", "trl_ext.launch"), "recipes": ("trl_ext.launch",), "launch": ()}


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(imported module, inside a function) for every import of a module file."""
    found = []

    def visit(node, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.ImportFrom) and child.module:
                found.append((child.module, inside))
            elif isinstance(child, ast.Import):
                found.extend((alias.name, inside) for alias in child.names)
            visit(child, inside)

    visit(ast.parse(path.read_text()), False)
    return found


@pytest.mark.parametrize("layer", LAYERS)
def test_layers_point_one_way_without_function_local_dodges(layer):
    for path in sorted((PACKAGE / layer).glob("*.py")):
        for module, in_function in _imports(path):
            assert not module.startswith(FORBIDDEN[layer]), f"{path.name} imports {module}, a layer above"
            others = tuple(f"trl_ext.{name}" for name in LAYERS if name != layer)
            assert not (in_function and module.startswith(others)), f"{path.name}: function-local import of {module}"
