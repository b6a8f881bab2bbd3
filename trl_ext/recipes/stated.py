"""The fields a recipe states: its YAML chain (`base:` resolved) and the flags after it, before any parsing.

The preflight checks the batch arithmetic on these before TRL's parser sees them (a contradiction gets a fix, not a
parser traceback), the run record keeps them (a resumed run must state the same), and the launcher reads its serving
fields from them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trl_ext.recipes.yaml_chain import load_recipe_yaml


def cli_overrides(argv: Sequence[str]) -> dict[str, str]:
    """`--key value`, `--key=value` and bare `--flag` (= "true") of a recipe command line, `--config` aside; dashed
    keys read as underscores, as TrlParser reads them."""
    out: dict[str, str] = {}
    i = 0
    while i < len(argv):
        token = argv[i]
        if token.startswith("--"):
            key, has_value, value = token[2:].partition("=")
            key = key.replace("-", "_")
            if not has_value:
                if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                    value = argv[i + 1]
                    i += 1
                else:
                    value = "true"
            if key != "config":
                out[key] = value
        i += 1
    return out


def stated_values(config: str | Path | None, argv: Sequence[str] = ()) -> dict[str, Any]:
    """The fields a recipe states: its YAML chain (`base:` resolved, `env` dropped) updated by the flags."""
    values = dict(load_recipe_yaml(config)) if config is not None else {}
    values.pop("env", None)
    values.update(cli_overrides(argv))
    return values
