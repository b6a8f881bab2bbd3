"""trl_ext: GRPO / Dr.GRPO ablations with verified rewards, on top of Hugging Face TRL.

Light to import: `trl_ext.rewards` and `trl_ext.tasks` do not pull in TRL; the trainer and its config load on
first use of `trl_ext.AblationGRPOConfig` / `trl_ext.AblationGRPOTrainer`.

Modules that moved keep working under their old path with a `FutureWarning` naming the new one (docs/architecture.md):
the GRPO trainer's modules went to `trl_ext.grpo`, the SFT validation beside the SFT in `trl_ext.expert_iteration`, and
what turns a recipe into an evaluation to `trl_ext.recipes`.
"""

import importlib.abc
import importlib.util
import sys
import warnings
from importlib import import_module

__version__ = "0.1.0"

_LAZY = {
    "AblationGRPOConfig": "trl_ext.grpo.config",
    "AblationGRPOTrainer": "trl_ext.grpo.trainer",
}

# old module path -> new one
MOVED_MODULES = {
    **{
        f"trl_ext.{name}": f"trl_ext.grpo.{name}"
        for name in ("axes", "callbacks", "config", "finished", "fused_head", "packing", "sampling", "trainer")
    },
    "trl_ext.vllm_sync": "trl_ext.grpo.weight_sync.colocate",
    "trl_ext.sft_validation": "trl_ext.expert_iteration.sft_validation",
    "trl_ext.evaluation.recipe": "trl_ext.recipes.evaluation",
    "trl_ext.evaluation.cli": "trl_ext.recipes.eval_command",
}

__all__ = ["AblationGRPOConfig", "AblationGRPOTrainer", "MOVED_MODULES", "__version__"]


def __getattr__(name):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'trl_ext' has no attribute {name!r}")


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves an old module path (`MOVED_MODULES`) to the module at its new path, with a `FutureWarning`: the
    same module object, so `isinstance` checks and monkeypatching see one module under both names."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED_MODULES:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        new = MOVED_MODULES[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; import it from there", FutureWarning, stacklevel=3)
        return import_module(new)

    def exec_module(self, module):
        pass  # the module at the new path is already executed


if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModuleFinder())
