"""Recipe YAML files: a file's `base:` chain resolved into one flat mapping, with the file that set each key."""

from __future__ import annotations

import copy
import functools
import os
from pathlib import Path
from typing import Any

BASE_KEY = "base"


class RecipeError(ValueError):
    """A recipe that cannot be used; the message names the YAML file (and the key) at fault."""


def load_recipe_yaml(path: str | os.PathLike) -> dict[str, Any]:
    """Load a recipe YAML with its `base:` chain resolved into one flat mapping.

    `base:` is a path relative to the file that names it. A child's top-level key replaces the base's value
    (mappings too, so a child's `generation_kwargs` is complete on its own); only `env` mappings are merged.

    Args:
        path: the recipe YAML.

    Returns:
        The merged mapping, without the `base` key.

    Raises:
        RecipeError: missing file (naming the file whose `base:` points to it), a `base:` cycle (listing the
            chain), invalid YAML or a file that is not a mapping.
    """
    return load_recipe_yaml_with_sources(path)[0]


def load_recipe_yaml_with_sources(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, Path]]:
    """`load_recipe_yaml` plus, for each key, the file of the chain that set it (for error messages)."""
    return _resolve_recipe(Path(path), ())


def _resolve_recipe(path: Path, chain: tuple[Path, ...]) -> tuple[dict[str, Any], dict[str, Path]]:
    import yaml

    path = path.resolve()
    if path in chain:
        cycle = " -> ".join(str(p) for p in (*chain[chain.index(path) :], path))
        raise RecipeError(f"{chain[-1]}: `base:` cycle: {cycle}")
    if not path.is_file():
        if chain:
            raise RecipeError(f"{chain[-1]}: `base:` file not found: {path}")
        raise RecipeError(f"recipe file not found: {path}")
    try:
        data = copy.deepcopy(_parse_yaml(path.read_text()))  # a copy: the caller's mapping is its own to change
    except yaml.YAMLError as err:
        raise RecipeError(f"{path}: invalid YAML: {err}") from err
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a recipe must be a YAML mapping of `field: value`, got {type(data).__name__}")

    base = data.pop(BASE_KEY, None)
    merged: dict[str, Any] = {}
    sources: dict[str, Path] = {}
    if base is not None:
        if not isinstance(base, str) or not base:
            raise RecipeError(f"{path}: `base:` must be a path to another recipe YAML, got {base!r}")
        merged, sources = _resolve_recipe(path.parent / base, (*chain, path))
    for key, value in data.items():
        if key == "env" and isinstance(value, dict) and isinstance(merged.get("env"), dict):
            value = {**merged["env"], **value}
        merged[key] = value
        sources[key] = path
    return merged, sources


@functools.lru_cache(maxsize=512)
def _parse_yaml(text: str) -> Any:
    """A YAML text parsed, once per process and text: a launch plan reads each recipe chain three times, the planning
    table hundreds of chains that share their base files. libyaml's safe loader when PyYAML was built with it: the
    same YAML, about 10x faster to parse."""
    import yaml

    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
