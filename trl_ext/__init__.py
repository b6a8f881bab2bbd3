"""trl_ext: GRPO / Dr.GRPO ablations with verified rewards, on top of Hugging Face TRL.

Light to import: `trl_ext.rewards` and `trl_ext.tasks` do not pull in TRL; the trainer and its config load on
first use of `trl_ext.AblationGRPOConfig` / `trl_ext.AblationGRPOTrainer`.
"""

from trl_ext.lazy import lazy_names

__version__ = "0.1.0"

_LAZY = {
    "AblationGRPOConfig": "trl_ext.grpo.config",
    "AblationGRPOTrainer": "trl_ext.grpo.trainer",
}

__all__ = ["AblationGRPOConfig", "AblationGRPOTrainer", "__version__"]


__getattr__ = lazy_names(__name__, _LAZY)
