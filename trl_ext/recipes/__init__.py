"""Wiring shared by the recipe entry points (`recipes/*.py`): YAML `base:` chains, parsing, data, trainer, run.

A recipe is one YAML file holding only what differs from its `base:` (a path relative to the file). Keys are the
fields of three dataclasses, parsed by `trl.TrlParser` as in TRL's own scripts: the script arguments (`arguments`), the
training config (`trl_ext.AblationGRPOConfig` or `trl.SFTConfig`) and `trl.ModelConfig`. Precedence, lowest first:
dataclass defaults < base YAML < child YAML < command-line flags.

The entry points follow open-r1's `src/open_r1/grpo.py`, one helper per step: `parse_recipe_args` ->
`load_grpo_datasets` (`trl_ext.tasks`) -> `get_reward_funcs` (`trl_ext.rewards`) -> `build_grpo_trainer`
(`AblationGRPOTrainer`; TRL loads the model from `model_name_or_path`) -> `train_save_evaluate` (train, save,
final evaluation on the validation split). Data and names are checked before any model loads. The expert-iteration
recipe (`expert_iteration`) goes the same way with `ExpertIterationTrainer`.

Modules: `yaml_chain` (`base:` chains), `stated` (the fields a recipe states), `arguments` (script-argument
dataclasses, task defaults), `parsing` (the parser and the values derived after parsing), `entry` (parse -> check
with `trl_ext.preflight`, shared by the entry points and `trl-ext launch`), `data` (datasets), `training` (trainers,
train / save / evaluate).
Top-level imports are stdlib only; torch / TRL / datasets load inside the functions that need them.
"""

from trl_ext.recipes.arguments import (
    SFT_DEFAULT_DATASET,
    TASK_DEFAULTS,
    EIScriptArguments,
    GRPOScriptArguments,
    SFTScriptArguments,
    apply_task_defaults,
)
from trl_ext.recipes.data import load_grpo_datasets, load_sft_dataset, load_sft_datasets
from trl_ext.recipes.entry import ParsedRecipe, entry_preflight, parse_recipe, preflight_recipe
from trl_ext.recipes.expert_iteration import build_ei_trainer, parse_ei_args, run_expert_iteration_recipe
from trl_ext.recipes.parsing import (
    VLLM_ONLY_GENERATION_KWARGS,
    adapt_generation_kwargs,
    make_parser,
    optimizer_steps_per_rollout,
    parse_recipe_args,
    resolve_max_steps,
)
from trl_ext.recipes.stated import cli_overrides, stated_values
from trl_ext.recipes.training import (
    add_rollout_logging,
    build_grpo_trainer,
    build_sft_trainer,
    model_init_kwargs,
    run_grpo_recipe,
    run_sft_recipe,
    train_save_evaluate,
)
from trl_ext.recipes.yaml_chain import BASE_KEY, RecipeError, load_recipe_yaml, load_recipe_yaml_with_sources

__all__ = [
    "BASE_KEY",
    "EIScriptArguments",
    "GRPOScriptArguments",
    "ParsedRecipe",
    "RecipeError",
    "SFTScriptArguments",
    "SFT_DEFAULT_DATASET",
    "TASK_DEFAULTS",
    "VLLM_ONLY_GENERATION_KWARGS",
    "adapt_generation_kwargs",
    "add_rollout_logging",
    "apply_task_defaults",
    "build_ei_trainer",
    "build_grpo_trainer",
    "build_sft_trainer",
    "cli_overrides",
    "entry_preflight",
    "load_grpo_datasets",
    "load_recipe_yaml",
    "load_recipe_yaml_with_sources",
    "load_sft_dataset",
    "load_sft_datasets",
    "make_parser",
    "model_init_kwargs",
    "optimizer_steps_per_rollout",
    "parse_recipe",
    "parse_ei_args",
    "parse_recipe_args",
    "preflight_recipe",
    "resolve_max_steps",
    "run_expert_iteration_recipe",
    "run_grpo_recipe",
    "run_sft_recipe",
    "stated_values",
    "train_save_evaluate",
]
