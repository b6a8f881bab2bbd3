"""Keep vLLM out of a recipe process that will not use it.

TRL's GRPO module imports vLLM whenever it is installed (`trl.generation.vllm_generation` at import time): about 10
CPU seconds of a trainer process's start on a 2-core CPU (23 s against 13 s to import `AblationGRPOTrainer`), though
a run with `use_vllm: false` never calls it. That is most of a short CPU run's start, and a study of CPU runs pays it
once per run. So a recipe script run as a program calls `skip_unused_vllm(argv)` before anything imports TRL: when
the recipe states no use of vLLM, `trl_ext.lazy.hide_vllm` makes TRL's `is_vllm_available()` False and none of vLLM
loads.

Only program entry points call it (`recipes/*.py` under `if __name__ == "__main__"`): a function called inside another
program (a test, a notebook) leaves that program's imports alone.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from trl_ext.lazy import hide_vllm

_OFF = (False, "false", "False", "0", "no")


def uses_vllm(argv: Sequence[str]) -> bool:
    """Whether the recipe command line `argv` (without the program name) may use vLLM: it states `use_vllm` other
    than false, or `accuracy_backend: vllm` (SFT's validation), in its YAML chain or its flags. A command line whose
    recipe cannot be read counts as using it: the recipe's own checks then report the problem with every import in
    place."""
    from trl_ext.recipes.parsing import pop_config_flag
    from trl_ext.recipes.stated import stated_values
    from trl_ext.recipes.yaml_chain import RecipeError

    args = list(argv)
    try:
        stated = stated_values(pop_config_flag(args), args)
    except (RecipeError, OSError, ValueError):
        return True
    return stated.get("use_vllm", False) not in _OFF or str(stated.get("accuracy_backend", "")) == "vllm"


def skip_unused_vllm(argv: Sequence[str] | None = None) -> bool:
    """Hide vLLM from this process when the recipe command line (default `sys.argv[1:]`) does not use it
    (`uses_vllm`) and nothing has imported it yet. Returns whether it was hidden."""
    return not uses_vllm(sys.argv[1:] if argv is None else argv) and hide_vllm()
