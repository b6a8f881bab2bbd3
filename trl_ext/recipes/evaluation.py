"""`trl-ext eval --recipe`: evaluate a model exactly as a GRPO recipe validates during training.

The recipe is parsed by the same `trl_ext.recipes.parse_recipe_args` the training entry points use, and its
validation settings become the `EvalConfig`: the validation split and size (`eval_source` / `eval_split` /
`eval_limit`), the prompt and whether it goes through the chat template, `chat_template_kwargs` (Qwen3's
`enable_thinking`), the sampling (`temperature`, `top_p`, `num_generations_eval`), the stop strings and `min_tokens`
of `generation_kwargs`, the reward, the seed, and the budget (`max_completion_length`, or several with
`--max-tokens`). Assignment 2's zero-shot baseline is this with the untrained model at 256, 512 and 1024 tokens:

    trl-ext eval --recipe recipes/countdown/qwen3_1.7b_grpo_l512.yaml --max-tokens 256,512,1024 \\
        --output-dir runs/countdown/qwen3_1.7b_zero_shot
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trl_ext.evaluation.config import REWARD_NAMES, EvalConfig
from trl_ext.recipes.arguments import TASK_DEFAULTS
from trl_ext.recipes.parsing import parse_recipe_args
from trl_ext.recipes.yaml_chain import load_recipe_yaml_with_sources

# Fields `--recipe` sets; giving them on the command line as well would evaluate something else than training does.
RECIPE_FIELDS = ("data_file", "split", "prompt", "chat", "temperature", "top_p", "n", "reward")


def recipe_yaml_task(recipe: str | Path) -> str:
    """The task of a recipe YAML: its folder (`recipes/countdown/x.yaml` -> "countdown"), else the task folder of
    the files its `base:` chain reaches."""
    own = Path(recipe).resolve().parent.name
    if own in TASK_DEFAULTS:
        return own
    tasks = {p.parent.name for p in load_recipe_yaml_with_sources(recipe)[1].values()} & set(TASK_DEFAULTS)
    if len(tasks) != 1:
        raise ValueError(
            f"--recipe {recipe}: cannot tell its task from its `base:` chain ({sorted(tasks)}); pass --task"
        )
    return tasks.pop()


def eval_config_from_recipe(recipe: str | Path, model: str | None = None, **overrides: Any) -> EvalConfig:
    """The `EvalConfig` that evaluates like `recipe`'s in-training validation.

    Args:
        recipe: a GRPO recipe YAML.
        model: the model to evaluate (default: the recipe's `model_name_or_path`, i.e. the zero-shot baseline).
        overrides: other `EvalConfig` fields that do not change what is validated (`max_tokens`, `output_dir`,
            `backend`, `batch_size`, `dtype`, `limit`, `ns`, ...).

    Raises:
        ValueError: a recipe field this evaluation cannot reproduce (a hub `eval_source` other than the task's,
            several reward functions), or an override of a field the recipe decides.
    """
    clash = sorted(set(overrides) & set(RECIPE_FIELDS))
    if clash:
        raise ValueError(f"{clash}: set by --recipe {recipe} (its validation settings); drop them")
    task = overrides.pop("task", None) or recipe_yaml_task(recipe)
    script, args, model_args = parse_recipe_args(task, ["--config", str(recipe), "--use_cpu", "true"])
    source = script.eval_source if script.eval_source is not None else script.dataset_source
    if source is not None and not Path(source).is_file():
        raise ValueError(
            f"{recipe}: eval_source {source!r} is not a local file; trl-ext eval reads the task's hub set"
        )
    if str(script.eval_split).lower() in ("none", "no", ""):
        raise ValueError(f"{recipe}: eval_split is {script.eval_split!r}: this recipe does not validate")
    rewards = list(script.reward_funcs or [])
    if len(rewards) != 1 or rewards[0] not in REWARD_NAMES:
        raise ValueError(f"{recipe}: reward_funcs {rewards}; trl-ext eval scores with one of {REWARD_NAMES}")
    generation = dict(args.generation_kwargs or {})
    settings = {
        "model": model or model_args.model_name_or_path,
        "task": task,
        "data_file": source,
        "split": script.eval_split,
        "prompt": script.prompt,
        "chat": script.chat_template,
        "chat_template_kwargs": args.chat_template_kwargs or None,
        "max_tokens": (args.max_completion_length,),
        "temperature": args.temperature,
        "top_p": args.top_p,
        "n": args.num_generations_eval or args.num_generations,
        "seed": args.seed,
        "limit": script.eval_limit,
        "reward": rewards[0],
        "stop": tuple(generation.get("stop") or ()),
        "min_tokens": int(generation.get("min_tokens", 0)),
        "output_dir": str(Path("runs") / task / f"{Path(recipe).stem}_zero_shot"),
    }
    settings.update(overrides)
    return EvalConfig(**settings)
