"""Layers point one way (docs/architecture.md): every module and package directly under `trl_ext` has a layer, and a
module imports only from layers below its own, at the top of the file or inside a function alike (a function-local
import is no way around an import loop: the preflight once imported the recipes, which imported it back, and
`trl_ext.evaluation` imported `trl_ext.recipes`, which imported the evaluation back).

Top to bottom: `cli` -> `study` -> `launch` -> `recipes`, `discover` -> `demo` -> `expert_iteration`, `testbed` ->
`evaluation` -> `grpo` -> `preflight`, `tasks`, `reporting` -> `objectives`, `rewards`, `tiny`, `assets`, `host`,
`lazy`, `run_status`, `static_cache`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "trl_ext"
LAYERS = (
    ("objectives", "rewards", "tiny", "assets", "host", "lazy", "run_status", "static_cache"),
    ("preflight", "tasks", "reporting"),
    ("grpo",),
    ("evaluation",),
    ("expert_iteration", "testbed"),
    ("demo",),
    ("recipes", "discover"),
    ("launch",),
    ("study",),
    ("cli",),
)
RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}


def _unit(module: str) -> str | None:
    """The unit under `trl_ext` a dotted module belongs to (`trl_ext.grpo.trainer` -> "grpo"); None for others."""
    parts = module.split(".")
    return parts[1] if parts[0] == "trl_ext" and len(parts) > 1 else None


def _imports(path: Path) -> list[tuple[str, int]]:
    """(imported module, line) for every absolute import of a module file, function-local ones included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, node.lineno))
        elif isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
    return found


def _modules() -> list[tuple[str, Path]]:
    """(unit, file) for every module of the package but its root `__init__`."""
    return [
        (path.relative_to(PACKAGE).parts[0].removesuffix(".py"), path)
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.parent != PACKAGE or path.name != "__init__.py"
    ]


def _upward_imports(units: set[str] | None = None) -> list[str]:
    problems = []
    for unit, path in _modules():
        if units is not None and unit not in units:
            continue
        for module, line in _imports(path):
            target = _unit(module)
            if target is None or target == unit or target not in RANK:
                continue
            if RANK[target] >= RANK[unit]:
                problems.append(f"{path.relative_to(PACKAGE.parent)}:{line} ({unit}) imports {module} ({target})")
    return problems


def test_every_unit_has_a_layer():
    units = {unit for unit, _ in _modules()} - {"__main__"}
    assert units - set(RANK) == set(), "place new modules / packages in LAYERS (and in docs/architecture.md)"
    assert set(RANK) - units == set(), "LAYERS names a unit that no longer exists"


@pytest.mark.parametrize("rank", range(len(LAYERS)), ids=["/".join(units) for units in LAYERS])
def test_layers_point_one_way_without_function_local_dodges(rank):
    assert _upward_imports(set(LAYERS[rank])) == []


def test_evaluation_never_imports_recipes():
    """The evaluation is a library (sampling, scoring, summaries): turning a recipe into an `EvalConfig` lives with
    the recipes (`trl_ext.recipes.evaluation`), and `trl-ext eval` is registered by `trl_ext.cli`."""
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}"
        for unit, path in _modules()
        if unit == "evaluation"
        for module, line in _imports(path)
        if _unit(module) in ("recipes", "launch", "cli")
    ]
    assert offenders == []


def test_recipes_never_import_the_demo():
    """The `demo_warm_start` recipes train on the CPU testbed (`trl_ext.testbed`: problems, model, warm start,
    held-out scoring), which the demo shares; the demo (`make run`) is an entry point of its own, reached through
    `recipes/countdown.py --demo`, never through the recipe layer."""
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}"
        for unit, path in _modules()
        if unit != "demo"
        for module, line in _imports(path)
        if _unit(module) == "demo"
    ]
    assert offenders == []


def test_package_inits_register_no_commands():
    """`trl_ext.cli` registers every command from the module that defines it; no package `__init__` re-exports a
    command's `register`."""
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        for node in ast.walk(ast.parse(init.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = {alias.name for alias in node.names}
                assert "register" not in names, f"{init.relative_to(PACKAGE.parent)}:{node.lineno}"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_two_modules_import_each_other_in_a_loop():
    """Within a unit too, imports point one way: no module imports, directly or through others, a module that imports
    it back (a package's `__init__`, which only hands names on, aside)."""
    files = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in files.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets.add(node.module)
                targets.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
        graph[name] = sorted(t for t in targets if t in files and t != name and files[t].name != "__init__.py")
    loops, done, trail = [], set(), []

    def visit(module: str) -> None:  # depth-first; an edge back into the current trail closes a loop
        trail.append(module)
        for target in graph[module]:
            if target in trail:
                loops.append(" -> ".join([*trail[trail.index(target) :], target]))
            elif target not in done:
                visit(target)
        trail.pop()
        done.add(module)

    for module in sorted(graph):
        if module not in done:
            visit(module)
    assert loops == []


def test_no_function_is_over_100_lines():
    """A reader holds each function of `trl_ext` in view; a Typer `cli.py`, which registers each command's options in
    one function, is the exception."""
    long = [
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "cli.py"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno + 1 > 100
    ]
    assert long == []
