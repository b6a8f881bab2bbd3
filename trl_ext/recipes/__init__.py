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
Top-level imports are stdlib only; torch / TRL / datasets load inside the functions that need them, and the names
below load their modules on first use (`trl-ext eval`, which lives here, registers without the parser or the
preflight).
"""

from trl_ext.lazy import lazy_names

_LAZY = {
    "RECIPE_SCRIPTS": "trl_ext.recipes.arguments",
    "SFT_DEFAULT_DATASET": "trl_ext.recipes.arguments",
    "TASK_DEFAULTS": "trl_ext.recipes.arguments",
    "EIScriptArguments": "trl_ext.recipes.arguments",
    "GRPOScriptArguments": "trl_ext.recipes.arguments",
    "SFTScriptArguments": "trl_ext.recipes.arguments",
    "apply_task_defaults": "trl_ext.recipes.arguments",
    "recipe_script": "trl_ext.recipes.arguments",
    "script_task": "trl_ext.recipes.arguments",
    "load_grpo_datasets": "trl_ext.recipes.data",
    "load_sft_dataset": "trl_ext.recipes.data",
    "load_sft_datasets": "trl_ext.recipes.data",
    "ParsedRecipe": "trl_ext.recipes.entry",
    "entry_preflight": "trl_ext.recipes.entry",
    "parse_recipe": "trl_ext.recipes.entry",
    "preflight_recipe": "trl_ext.recipes.entry",
    "build_ei_trainer": "trl_ext.recipes.expert_iteration",
    "parse_ei_args": "trl_ext.recipes.expert_iteration",
    "run_expert_iteration_recipe": "trl_ext.recipes.expert_iteration",
    "VLLM_ONLY_GENERATION_KWARGS": "trl_ext.recipes.parsing",
    "adapt_generation_kwargs": "trl_ext.recipes.parsing",
    "make_parser": "trl_ext.recipes.parsing",
    "optimizer_steps_per_rollout": "trl_ext.recipes.parsing",
    "parse_recipe_args": "trl_ext.recipes.parsing",
    "resolve_max_steps": "trl_ext.recipes.parsing",
    "cli_overrides": "trl_ext.recipes.stated",
    "stated_values": "trl_ext.recipes.stated",
    "add_rollout_logging": "trl_ext.recipes.training",
    "build_grpo_trainer": "trl_ext.recipes.training",
    "build_sft_trainer": "trl_ext.recipes.training",
    "model_init_kwargs": "trl_ext.recipes.training",
    "run_grpo_recipe": "trl_ext.recipes.training",
    "run_sft_recipe": "trl_ext.recipes.training",
    "train_save_evaluate": "trl_ext.recipes.training",
    "BASE_KEY": "trl_ext.recipes.yaml_chain",
    "RecipeError": "trl_ext.recipes.yaml_chain",
    "load_recipe_yaml": "trl_ext.recipes.yaml_chain",
    "load_recipe_yaml_with_sources": "trl_ext.recipes.yaml_chain",
}

__all__ = [
    "BASE_KEY",
    "EIScriptArguments",
    "GRPOScriptArguments",
    "ParsedRecipe",
    "RECIPE_SCRIPTS",
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
    "recipe_script",
    "resolve_max_steps",
    "run_expert_iteration_recipe",
    "run_grpo_recipe",
    "run_sft_recipe",
    "script_task",
    "stated_values",
    "train_save_evaluate",
]


__getattr__ = lazy_names(__name__, _LAZY)
