"""TRL's defaults, read from `trl.GRPOConfig` itself rather than restated, so a TRL release that changes one changes
ours with it. TRL is imported on the first read only: `import trl_ext.preflight` stays light for the launcher."""

from __future__ import annotations

import functools
from dataclasses import MISSING, fields
from typing import Any


@functools.cache
def grpo_config_defaults() -> dict[str, Any]:
    """Every `trl.GRPOConfig` field's default (a `default_factory` called once), by field name."""
    from trl import GRPOConfig

    return {
        f.name: f.default_factory() if f.default_factory is not MISSING else f.default
        for f in fields(GRPOConfig)
        if f.default is not MISSING or f.default_factory is not MISSING
    }


def trl_default(name: str) -> Any:
    """`trl.GRPOConfig`'s default of field `name` (KeyError for a field TRL does not have)."""
    return grpo_config_defaults()[name]
