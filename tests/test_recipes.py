"""Every recipe YAML parses into configs without a model; ablations differ from their reference only where intended.

Parsing goes through the same `trl_ext.recipes.parse_recipe_args` the entry points use (TrlParser + `base:`
chains). `--use_cpu true` is the only override: TrainingArguments refuses the recipes' `bf16: true` on a machine
without a GPU unless told it trains on the CPU.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import shared_path

from trl_ext.recipes import (
    GRPOScriptArguments,
    RecipeError,
    adapt_generation_kwargs,
    load_recipe_yaml,
    load_sft_dataset,
    make_parser,
    optimizer_steps_per_rollout,
    parse_recipe_args,
)

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "recipes"
# Expert-iteration recipes parse with their own parser: tests/test_expert_iteration.py checks them; study files
# (recipes/studies/) are no recipes: tests/test_study.py plans every arm of each.
ALL_YAMLS = sorted(
    p.relative_to(RECIPES).as_posix()
    for p in RECIPES.rglob("*.yaml")
    if "expert_iteration" not in p.as_posix() and p.relative_to(RECIPES).parts[0] != "studies"
)
CPU = ["--use_cpu", "true"]


def _task(recipe: str) -> str:
    return recipe.split("/")[0] if "/" in recipe else "countdown"


def _parse(recipe: str, *extra: str):
    return parse_recipe_args(_task(recipe), ["--config", str(RECIPES / recipe), *CPU, *extra])


LRS = ("3e-6", "3e-5", "1e-4")


def _course_ablations(task: str) -> dict[str, tuple[str, set[str]]]:
    """NLPDL HW3 (GSM8K) and 003 (MATH): the same ablation files on each task, against its r1_zero.yaml."""
    root, broad = f"{task}/offpolicy_e1_tb256.yaml", f"{task}/offpolicy_e1_tb256_broad.yaml"

    def grid(epochs: int, train: int) -> set[str]:
        return ({"epochs_per_rollout_batch"} if epochs != 1 else set()) | (
            {"train_batch_size"} if train != 256 else set()
        )

    return {
        **{f"{task}/lr_{lr}.yaml": (f"{task}/r1_zero.yaml", {"learning_rate"}) for lr in LRS},
        f"{task}/no_baseline.yaml": (
            f"{task}/r1_zero.yaml",
            {"pg_loss_type", "use_std_normalization", "advantage_eps"},
        ),
        f"{task}/masked_normalize.yaml": (f"{task}/r1_zero.yaml", {"length_normalization"}),
        f"{task}/no_std.yaml": (f"{task}/r1_zero.yaml", {"use_std_normalization", "advantage_eps"}),
        f"{task}/question_only.yaml": (f"{task}/r1_zero.yaml", {"prompt", "reward_funcs", "generation_kwargs"}),
        root: (f"{task}/r1_zero.yaml", {"pg_loss_type", "epsilon"}),
        **{f"{task}/offpolicy_e{e}_tb{t}.yaml": (root, grid(e, t)) for e, t in ((1, 64), (2, 128), (4, 256))},
        broad: (root, {"n_grpo_steps", "eval_steps"}),
        **{
            f"{task}/offpolicy_e{e}_tb{t}_broad.yaml": (broad, grid(e, t))
            for e in (1, 2, 4, 8)
            for t in (256, 128, 64)
            if (e, t) != (1, 256)
        },
        f"{task}/grpo_no_clip.yaml": (f"{task}/offpolicy_e2_tb128.yaml", {"pg_loss_type", "epsilon"}),
    }


# recipe -> (the recipe it is compared with, the keys whose resolved values must differ). Every YAML except the
# two roots must be listed, so a new recipe cannot skip this check.
OFF_POLICY = {
    f"countdown/offpolicy_e{e}_tb{t}.yaml": (
        "countdown/offpolicy_e1_tb256.yaml",
        ({"epochs_per_rollout_batch"} if e != 1 else set())
        | ({"train_batch_size"} if t != 256 else set()),  # GA follows from it and the world size
    )
    for e in (1, 2, 4)
    for t in (256, 128, 64)
    if (e, t) != (1, 256)
}
DIFFS = {
    "countdown/base.yaml": (
        "grpo_defaults.yaml",
        {"model_name_or_path", "prompt", "chat_template", "chat_template_kwargs", "reward_funcs"},
    ),
    # NYU Assignment 3's own run: its model, data files, prompt as plain text, 1 / 0 reward, temperature and vLLM share
    "countdown/qwen2.5_math_1.5b_instruct_grpo.yaml": (
        "grpo_defaults.yaml",
        {"model_name_or_path", "prompt", "chat_template", "reward_funcs", "temperature", "vllm_gpu_memory_utilization"}
        | {"dataset_source", "dataset_split", "eval_source", "eval_split", "model_init_kwargs"},  # + FlashAttention-2
    ),
    **{
        f"countdown/qwen2.5_math_1.5b_instruct_lr_{lr}.yaml": (
            "countdown/qwen2.5_math_1.5b_instruct_grpo.yaml",
            {"learning_rate"},
        )
        for lr in LRS
    },
    "countdown/qwen2.5_math_1.5b_instruct_no_baseline.yaml": (
        "countdown/qwen2.5_math_1.5b_instruct_grpo.yaml",
        {"pg_loss_type", "use_std_normalization", "advantage_eps"},
    ),
    "countdown/qwen2.5_math_1.5b_instruct_masked_normalize.yaml": (
        "countdown/qwen2.5_math_1.5b_instruct_grpo.yaml",
        {"length_normalization"},
    ),
    "countdown/qwen2.5_math_1.5b_instruct_no_std.yaml": (
        "countdown/qwen2.5_math_1.5b_instruct_grpo.yaml",
        {"use_std_normalization", "advantage_eps"},
    ),
    "countdown/qwen3_1.7b_grpo_l512.yaml": (
        "countdown/base.yaml",
        {"prompt", "reward_funcs", "pg_loss_type", "epsilon", "max_completion_length"},
    ),
    "countdown/qwen3_1.7b_grpo_l256.yaml": ("countdown/qwen3_1.7b_grpo_l512.yaml", {"max_completion_length"}),
    "countdown/qwen3_1.7b_drgrpo_l512.yaml": (
        "countdown/qwen3_1.7b_grpo_l512.yaml",
        {"use_std_normalization", "advantage_eps", "length_normalization"},
    ),
    # compared with GRPO at the same length, not with its `base:` (Dr. GRPO L512)
    "countdown/qwen3_1.7b_drgrpo_l256.yaml": (
        "countdown/qwen3_1.7b_grpo_l256.yaml",
        {"use_std_normalization", "advantage_eps", "length_normalization"},
    ),
    "countdown/lr_3e-6.yaml": ("countdown/base.yaml", {"learning_rate"}),
    "countdown/lr_3e-5.yaml": ("countdown/base.yaml", {"learning_rate"}),
    "countdown/lr_1e-4.yaml": ("countdown/base.yaml", {"learning_rate"}),
    "countdown/no_baseline.yaml": ("countdown/base.yaml", {"pg_loss_type", "use_std_normalization", "advantage_eps"}),
    "countdown/masked_normalize.yaml": ("countdown/base.yaml", {"length_normalization"}),
    "countdown/no_std.yaml": ("countdown/base.yaml", {"use_std_normalization", "advantage_eps"}),
    "countdown/offpolicy_e1_tb256.yaml": ("countdown/base.yaml", {"pg_loss_type", "epsilon"}),
    **OFF_POLICY,
    "countdown/grpo_no_clip.yaml": ("countdown/offpolicy_e2_tb128.yaml", {"pg_loss_type", "epsilon"}),
    # DAPO, RLOO and GSPO on the 4-steps-per-rollout grid point, each also with vLLM's importance-sampling fix
    "countdown/dapo.yaml": (
        "countdown/offpolicy_e1_tb64.yaml",
        {"epsilon_high", "length_normalization", "dynamic_sampling", "max_generation_batches", "reward_funcs"},
    ),
    "countdown/rloo.yaml": (
        "countdown/offpolicy_e1_tb64.yaml",
        {"advantage_type", "use_std_normalization", "advantage_eps"},
    ),
    "countdown/gspo.yaml": ("countdown/offpolicy_e1_tb64.yaml", {"pg_loss_type", "epsilon", "epsilon_high"}),
    **{
        f"countdown/{name}_is.yaml": (f"countdown/{name}.yaml", {"vllm_importance_sampling_correction"})
        for name in ("dapo", "rloo", "gspo")
    },
    # the courses' exact precision: bf16 weights and AdamW states (the references keep fp32 master weights)
    **{
        f"countdown/qwen3_1.7b_{run}_pure_bf16.yaml": (f"countdown/qwen3_1.7b_{run}.yaml", {"dtype"})
        for run in ("grpo_l256", "grpo_l512", "drgrpo_l256", "drgrpo_l512")
    },
    # Assignment 2 on one GPU (it names one A100, not its size): each run with vLLM colocated on it
    **{
        f"countdown/qwen3_1.7b_{run}{precision}_1gpu.yaml": (
            f"countdown/qwen3_1.7b_{run}{precision}.yaml",
            {"vllm_mode", "vllm_gpu_memory_utilization"},
        )
        for run in ("grpo_l256", "grpo_l512", "drgrpo_l256", "drgrpo_l512")
        for precision in ("", "_pure_bf16")
    },
    # the GSM8K report: one 24 GB GPU, group size 8 kept (colocated vLLM, sleep mode, 8-bit AdamW, smaller eval batch)
    "gsm8k/qwen2.5_1.5b_instruct_grpo_24gb.yaml": (
        "gsm8k/r1_zero.yaml",
        {
            "model_name_or_path",
            "vllm_mode",
            "vllm_gpu_memory_utilization",
            "vllm_enable_sleep_mode",
            "optim",
            "per_device_eval_batch_size",
        },
    ),
    # the GSM8K report's own run (section 3's table; tests/test_recipes_course_values.py pins the values)
    "gsm8k/qwen2.5_1.5b_instruct_grpo.yaml": (
        "gsm8k/r1_zero.yaml",
        {"model_name_or_path", "n_grpo_steps", "group_size", "rollout_batch_size", "train_batch_size"}
        | {"per_device_train_batch_size", "max_completion_length", "learning_rate", "pg_loss_type", "epsilon"}
        | {"dtype", "use_vllm", "eval_steps", "eval_limit"},
    ),
    "gsm8k/r1_zero.yaml": ("grpo_defaults.yaml", {"model_name_or_path", "prompt", "chat_template", "reward_funcs"}),
    "math/r1_zero.yaml": (  # FlashAttention-2, as NYU Assignment 3 loads it (tests/test_preflight_attention.py)
        "grpo_defaults.yaml",
        {"model_name_or_path", "prompt", "chat_template", "reward_funcs", "model_init_kwargs"},
    ),
    **{key: value for task in ("gsm8k", "math") for key, value in _course_ablations(task).items()},
    "kissing/grpo.yaml": (
        "grpo_defaults.yaml",
        {"model_name_or_path", "prompt", "chat_template", "reward_funcs"}
        | {"chat_template_kwargs", "max_completion_length", "generation_kwargs"},
    ),
    "sft/size_128.yaml": ("sft/base.yaml", {"limit", "gradient_accumulation_steps"}),
    "sft/size_256.yaml": ("sft/base.yaml", {"limit", "gradient_accumulation_steps"}),
    "sft/size_512.yaml": ("sft/base.yaml", {"limit"}),
    "sft/size_1024.yaml": ("sft/base.yaml", {"limit"}),
    "sft/full.yaml": ("sft/base.yaml", {"num_train_epochs"}),  # limit: null is base's default (all rows)
    # the hub's traces instead of the course's file: messages through the chat template, a validation-loss split
    "sft/hub_full.yaml": (
        "sft/base.yaml",
        {"dataset_source", "dataset_split", "eval_split", "eval_limit", "per_device_eval_batch_size"}
        | {"accuracy_chat", "num_train_epochs"},
    ),
}
# The CPU server layout: trl_ext.tiny's model on the shipped Countdown problems, a short float32 run with
# TRL's importance-sampling ratio logged and no wandb.
DIFFS["countdown/cpu_server.yaml"] = (
    "grpo_defaults.yaml",
    {"model_name_or_path", "tiny_model", "bf16", "gradient_checkpointing", "dataset_source", "dataset_split", "prompt"}
    | {"chat_template", "rollout_batch_size", "group_size", "train_batch_size", "per_device_train_batch_size"}
    | {"n_grpo_steps", "max_completion_length", "generation_kwargs", "learning_rate", "eval_strategy", "final_eval"}
    | {"vllm_importance_sampling_correction", "report_to", "log_completions", "save_strategy"},
)
# A plain CPU run of the same tiny model with transformers generation (the CPU study's arms): validation
# and checkpoints every 4 of its 8 steps.
DIFFS["countdown/cpu_tiny.yaml"] = (
    "grpo_defaults.yaml",
    {"model_name_or_path", "tiny_model", "bf16", "gradient_checkpointing", "use_vllm", "dataset_source", "prompt"}
    | {"dataset_split", "chat_template", "rollout_batch_size", "group_size", "train_batch_size", "learning_rate"}
    | {"per_device_train_batch_size", "n_grpo_steps", "max_completion_length", "generation_kwargs", "eval_steps"}
    | {"eval_limit", "per_device_eval_batch_size", "report_to", "log_completions", "rollout_log_steps", "save_steps"},
)
# The CPU demo's GRPO phase (docs/ablations.md): a recipe of its own (no base), and its arms, which change only the
# objective (or, off-policy, the optimizer batches per rollout).
_DEMO_AXES = {"advantage_type", "advantage_eps"}
DIFFS["countdown/cpu_demo_no_std.yaml"] = ("countdown/cpu_demo.yaml", _DEMO_AXES)
DIFFS["countdown/cpu_demo_drgrpo_std.yaml"] = ("countdown/cpu_demo.yaml", {"length_normalization"})
DIFFS["countdown/cpu_demo_drgrpo.yaml"] = ("countdown/cpu_demo.yaml", _DEMO_AXES | {"length_normalization"})
DIFFS["countdown/cpu_demo_no_clip.yaml"] = ("countdown/cpu_demo.yaml", {"pg_loss_type", "epsilon"})
for _arm in ("no_baseline", "reinforce_baseline"):
    DIFFS[f"countdown/cpu_demo_{_arm}.yaml"] = ("countdown/cpu_demo.yaml", _DEMO_AXES | {"pg_loss_type", "epsilon"})
DIFFS["countdown/cpu_demo_offpolicy_clip.yaml"] = (
    "countdown/cpu_demo.yaml",
    {"train_batch_size", "per_device_train_batch_size", "epochs_per_rollout_batch"},
)
DIFFS["countdown/cpu_demo_offpolicy_no_clip.yaml"] = (
    "countdown/cpu_demo_offpolicy_clip.yaml",
    {"pg_loss_type", "epsilon"},
)
# The same phase from the working warm start (room for the length to move), and its arms, which change what the
# compact arms change.
DIFFS["countdown/cpu_demo_working.yaml"] = (
    "countdown/cpu_demo.yaml",
    {"demo_working", "model_name_or_path", "max_completion_length"},
)
for _arm in ("no_std", "drgrpo", "no_baseline", "offpolicy_clip"):
    DIFFS[f"countdown/cpu_demo_working_{_arm}.yaml"] = (
        "countdown/cpu_demo_working.yaml",
        DIFFS[f"countdown/cpu_demo_{_arm}.yaml"][1],
    )
DIFFS["countdown/cpu_demo_working_offpolicy_no_clip.yaml"] = (
    "countdown/cpu_demo_working_offpolicy_clip.yaml",
    {"pg_loss_type", "epsilon"},
)
# Asynchronous rollouts: generation one optimizer step ahead, with TRL's importance-sampling correction.
for _async, _sync in (("countdown/qwen3_1.7b_grpo_l512_async.yaml", "countdown/qwen3_1.7b_grpo_l512.yaml"),
                      ("gsm8k/r1_zero_async.yaml", "gsm8k/r1_zero.yaml")):  # fmt: skip
    DIFFS[_async] = (_sync, {"async_rollouts", "max_staleness", "vllm_importance_sampling_correction"})
ROOTS = {"grpo_defaults.yaml", "sft/base.yaml", "countdown/cpu_demo.yaml"}


def test_every_recipe_is_in_the_diff_table():
    assert set(ALL_YAMLS) == set(DIFFS) | ROOTS


@pytest.mark.parametrize("recipe", sorted(DIFFS))
def test_recipe_differs_from_its_reference_only_in_the_intended_keys(recipe):
    reference, expected = DIFFS[recipe]
    mine, theirs = load_recipe_yaml(RECIPES / recipe), load_recipe_yaml(RECIPES / reference)
    differing = {key for key in mine.keys() | theirs.keys() if mine.get(key) != theirs.get(key)}
    assert differing == expected


@pytest.mark.parametrize("recipe", ALL_YAMLS)
def test_every_recipe_parses_into_the_three_configs(recipe):
    from trl import ModelConfig, SFTConfig

    from trl_ext.grpo.config import AblationGRPOConfig

    script_args, training_args, model_args = _parse(recipe)
    assert isinstance(model_args, ModelConfig)
    name = f"{(RECIPES / recipe).parent.name}/{Path(recipe).stem}"
    assert training_args.output_dir == str(Path("runs") / name) and training_args.run_name == name
    if recipe.startswith("sft/"):
        assert isinstance(training_args, SFTConfig)
        assert model_args.model_name_or_path == "Qwen/Qwen2.5-Math-1.5B"
        return
    assert isinstance(training_args, AblationGRPOConfig)
    assert isinstance(script_args, GRPOScriptArguments)
    if recipe == "countdown/cpu_server.yaml":  # the CPU server layout: a built tiny model, float32, no wandb
        assert script_args.tiny_model and not training_args.bf16 and training_args.report_to == []
        assert (training_args.use_vllm, training_args.vllm_mode) == (True, "server")
        assert training_args.vllm_importance_sampling_correction
        return
    if recipe == "countdown/cpu_tiny.yaml":  # the CPU study's plain run: a built tiny model, no vLLM, no wandb
        assert script_args.tiny_model and not training_args.use_vllm and training_args.report_to == []
        assert (training_args.max_steps, training_args.num_generations, training_args.eval_steps) == (8, 4, 4)
        return
    if recipe.startswith("countdown/cpu_demo"):  # the demo's GRPO phase: its warm start, one core, no wandb
        assert script_args.demo_warm_start and not training_args.use_vllm and training_args.report_to == []
        per_rollout = 4 if "offpolicy" in recipe else 1  # 2 epochs x 2 batches of 64
        budget = 144 if "working" in recipe else 32  # four times the warm start's typical response
        assert (training_args.max_steps, training_args.max_completion_length) == (160 * per_rollout, budget)
        assert script_args.demo_working == ("working" in recipe)
        return
    assert training_args.report_to == ["wandb"]
    if recipe != "grpo_defaults.yaml":
        assert model_args.model_name_or_path.startswith("Qwen/")
    # the report's own run: transformers generation, group 4, its own validation
    if recipe == "gsm8k/qwen2.5_1.5b_instruct_grpo.yaml":
        assert (training_args.use_vllm, training_args.num_generations) == (False, 4)
        return
    # GPU recipes: vLLM server mode (colocated on the one GPU of the GSM8K report's and Assignment 2's *_1gpu
    # recipes), wandb, hub ids
    mode = (
        "colocate"
        if recipe == "gsm8k/qwen2.5_1.5b_instruct_grpo_24gb.yaml" or recipe.endswith("_1gpu.yaml")
        else "server"
    )
    assert (training_args.use_vllm, training_args.vllm_mode) == (True, mode)
    # Validation every 5-10 GRPO steps on >= 1024 problems where the split has them (MATH-500 has 500)
    assert training_args.eval_strategy == "steps"
    assert 5 <= training_args.eval_steps * script_args.n_grpo_steps <= 10
    assert script_args.eval_limit >= 1024 and script_args.eval_split
    # the courses' objective constants (the eps only where the advantage divides by a std)
    assert training_args.advantage_eps == (1e-6 if training_args.advantage_type == "group_mean_std" else None)
    assert training_args.beta == 0.0
    assert (training_args.adam_beta1, training_args.adam_beta2, training_args.weight_decay) == (0.9, 0.95, 0.0)
    assert training_args.max_grad_norm == 1.0 and training_args.num_generations == 8


def test_course_batch_arithmetic_on_one_gpu():
    """rollout 256 / group 8 / train 256 / GA 128 -> per-device 2, 128 micro-batches per rollout, 1 step each."""
    script_args, args, _ = _parse("countdown/base.yaml")
    assert args.generation_batch_size == 256 and args.num_generations == 8  # 32 problems x 8 completions
    assert args.per_device_train_batch_size == 2 and args.gradient_accumulation_steps == 128
    assert args.steps_per_generation == 128 and args.num_iterations == 1
    assert optimizer_steps_per_rollout(args) == 1
    assert script_args.n_grpo_steps == 200 and args.max_steps == 200
    assert args.learning_rate == 1e-5 and args.temperature == 1.0 and args.max_completion_length == 1024
    # reinforce_with_baseline with the std switch on: the courses' GRPO advantage under the -A logp loss
    assert (args.advantage_type, args.pg_loss_type, args.length_normalization) == (
        "group_mean_std",
        "reinforce",
        "masked_mean",
    )
    assert args.generation_kwargs == {"stop": ["</answer>"], "include_stop_str_in_output": True, "min_tokens": 4}
    # NYU Assignment 3 samples at 0.7
    assert _parse("countdown/qwen2.5_math_1.5b_instruct_grpo.yaml")[1].temperature == 0.7


@pytest.mark.parametrize(("epochs", "train"), [(1, 128), (2, 256), (2, 64), (4, 64)])
def test_off_policy_grid_maps_grpo_steps_to_optimizer_steps(epochs, train):
    _, args, _ = _parse(f"countdown/offpolicy_e{epochs}_tb{train}.yaml")
    assert args.per_device_train_batch_size == 2  # the micro-batch stays 2; GA = train / 2
    assert args.gradient_accumulation_steps == train // 2
    assert args.num_iterations == epochs and args.generation_batch_size == 256
    assert optimizer_steps_per_rollout(args) == epochs * 256 // train
    assert args.max_steps == 200 * epochs * 256 // train
    assert args.pg_loss_type == "grpo_clip"


def test_grpo_and_drgrpo_recipes_differ_in_three_lines_and_map_onto_trl():
    text = (RECIPES / "countdown" / "qwen3_1.7b_drgrpo_l512.yaml").read_text().splitlines()
    settings = [line.split("#")[0].strip() for line in text if line.split("#")[0].strip()]
    assert sorted(settings) == [
        "advantage_eps: null",
        "base: qwen3_1.7b_grpo_l512.yaml",
        "length_normalization: masked_normalize",
        "use_std_normalization: false",
    ]
    _, grpo, _ = _parse("countdown/qwen3_1.7b_grpo_l512.yaml")
    _, drgrpo, _ = _parse("countdown/qwen3_1.7b_drgrpo_l512.yaml")
    assert (grpo.loss_type, grpo.scale_rewards, grpo.pg_loss_type) == ("grpo", "group", "grpo_clip")
    assert (drgrpo.loss_type, drgrpo.scale_rewards, drgrpo.pg_loss_type) == ("dr_grpo", "none", "grpo_clip")
    assert drgrpo.normalize_constant == 512 == drgrpo.max_completion_length
    assert _parse("countdown/qwen3_1.7b_drgrpo_l256.yaml")[1].normalize_constant == 256
    naming = {"output_dir", "run_name", "logging_dir"}
    differing = {
        f.name
        for f in dataclasses.fields(grpo)
        if f.name not in naming and getattr(grpo, f.name) != getattr(drgrpo, f.name)
    }
    # the two Dr. GRPO changes, the eps the std took with it, and their resolved and TRL names
    assert differing == {
        "use_std_normalization",
        "advantage_eps",
        "length_normalization",
        "normalize_constant",
        "advantage_type",
        "loss_type",
        "scale_rewards",
    }


def test_qwen3_countdown_recipes_use_the_tinyzero_prompt_through_qwen3_chat_template():
    for name in ("grpo_l256", "grpo_l512", "drgrpo_l256", "drgrpo_l512"):
        script_args, args, model_args = _parse(f"countdown/qwen3_1.7b_{name}.yaml")
        assert model_args.model_name_or_path == "Qwen/Qwen3-1.7B"
        assert (script_args.prompt, script_args.chat_template) == ("tinyzero", True)
        assert args.max_completion_length == int(name[-3:])


def test_task_defaults_fill_unset_script_fields():
    script_args, _, _ = _parse("math/question_only.yaml")
    assert script_args.reward_funcs == ["question_only"] and script_args.prompt == "question_only"
    assert (script_args.dataset_split, script_args.eval_split) == ("train", "test")
    countdown, _, _ = _parse("countdown/base.yaml")
    # decided from the source's own splits when the data loads (tests/test_tasks_splits.py)
    assert (countdown.dataset_split, countdown.eval_split) == ("auto", "auto")


def test_command_line_overrides_the_yaml_chain():
    script_args, args, model_args = _parse(
        "countdown/qwen2.5_math_1.5b_instruct_grpo.yaml",
        "--learning_rate",
        "5e-6",
        "--model_name_or_path",
        "/tmp/m",
        "--eval_limit",
        "64",
    )
    assert args.learning_rate == 5e-6 and model_args.model_name_or_path == "/tmp/m" and script_args.eval_limit == 64
    assert args.temperature == 0.7  # still the child's value over its base's 1.0
    # GA follows an overridden micro-batch: 256 / (4 x 1 process)
    assert _parse("countdown/base.yaml", "--per_device_train_batch_size", "4")[1].gradient_accumulation_steps == 64
    # a GA that contradicts the recipe's micro-batch is an error naming both, not a silently changed micro-batch
    with pytest.raises(RecipeError, match="per_device_train_batch_size"):
        _parse("countdown/base.yaml", "--gradient_accumulation_steps", "64")


def test_help_lists_every_field_with_its_help():
    parser = make_parser("grpo", prog="recipes/countdown.py")
    text = " ".join(parser.format_help().split())  # argparse wraps lines
    for dataclass_type in parser.dataclass_types:
        for f in dataclasses.fields(dataclass_type):
            if f.init and not f.name.startswith("_"):
                assert f"--{f.name}" in text, f.name
    for f in dataclasses.fields(GRPOScriptArguments):
        assert " ".join(f.metadata["help"].split())[:60] in text, f.name
    assert "Per-token policy-gradient loss" in text  # AblationGRPOConfig's own help
    assert "base:" in text  # the epilog explains recipes


def test_math_script_help_runs_in_a_subprocess():
    """`python recipes/math_grpo.py` runs with recipes/ first on sys.path and no entry point edits it: no file there
    may be what `import math` (or any module the run imports) finds. Every recipe folder has its entry point beside
    it (`trl_ext.recipes.RECIPE_SCRIPTS`), and the launcher reads the GRPO task back from it."""
    from trl_ext.launch.checks import recipe_script_task
    from trl_ext.recipes import TASK_DEFAULTS, recipe_script

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(RECIPES / "math_grpo.py"), "--help"], capture_output=True, text=True, env=env, timeout=120
    )
    for folder in ("countdown", "gsm8k", "math", "kissing", "sft", "expert_iteration"):
        script = RECIPES / recipe_script(folder)
        assert script.is_file() and "sys.path" not in script.read_text(), script
        assert recipe_script_task(script) == (folder if folder in TASK_DEFAULTS else None)
    assert not (RECIPES / "math.py").exists()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--pg_loss_type" in proc.stdout and "--n_grpo_steps" in proc.stdout


def test_a_parse_after_another_gives_what_a_new_parser_gives(tmp_path):
    """`parse_recipe_args` reuses one parser per kind in a process. A parse after others (whose YAMLs and flags set
    other values, one refused, one whose result a caller grew in place) gives what a newly built parser gives."""
    from trl_ext.recipes.arguments import apply_task_defaults
    from trl_ext.recipes.parsing import resolve_max_steps

    countdown_l512 = ["--config", str(RECIPES / "countdown" / "qwen3_1.7b_grpo_l512.yaml"), *CPU]
    first = parse_recipe_args(
        "countdown", [*countdown_l512, "--learning_rate", "1e-4", "--pg_loss_type", "no_baseline"]
    )
    assert first[1].learning_rate == 1e-4 and first[1].include_for_metrics == []
    first[1].include_for_metrics.append("inputs")  # a list default, grown in place by a caller
    bad = _write(tmp_path / "bad.yaml", f"base: {RECIPES / 'countdown' / 'base.yaml'}\nno_such_field: 1\n")
    with pytest.raises(RecipeError, match="no_such_field"):
        parse_recipe_args("countdown", ["--config", str(bad), *CPU])
    argv = ["--config", str(RECIPES / "countdown" / "base.yaml"), *CPU]
    again = parse_recipe_args("countdown", argv)
    script, args, model = make_parser("grpo", task="countdown").parse_args_and_config(list(argv))
    apply_task_defaults("countdown", script)
    resolve_max_steps(script, args)
    assert [dataclasses.asdict(x) for x in again] == [dataclasses.asdict(x) for x in (script, args, model)]
    assert again[1].include_for_metrics == [] and again[1].learning_rate != 1e-4


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_recipe_files_read_as_they_are_now_and_a_loaded_mapping_is_the_callers(tmp_path):
    """Recipe YAML texts are parsed once per process: an edited file reads as edited, and a caller that changes a
    loaded mapping (a nested value too) does not change the next load."""
    base = _write(tmp_path / "base.yaml", "learning_rate: 1.0e-5\ngeneration_kwargs: {stop: ['</answer>']}\n")
    child = _write(tmp_path / "child.yaml", "base: base.yaml\nseed: 3\n")
    expected = {"learning_rate": 1e-5, "generation_kwargs": {"stop": ["</answer>"]}, "seed": 3}
    first = load_recipe_yaml(child)
    assert first == expected
    first["generation_kwargs"]["stop"].append("</think>")
    first["seed"] = 4
    assert load_recipe_yaml(child) == expected
    base.write_text("learning_rate: 3.0e-5\n")
    assert load_recipe_yaml(child) == {"learning_rate": 3e-5, "seed": 3}


def test_base_chain_resolves_relative_paths_and_merges_env(tmp_path):
    (tmp_path / "sub").mkdir()
    _write(tmp_path / "root.yaml", "learning_rate: 1.0e-3\ntemperature: 0.5\nenv: {A: '1', B: '2'}\n")
    _write(tmp_path / "sub" / "mid.yaml", "base: ../root.yaml\ntemperature: 0.6\nenv: {B: '3'}\n")
    leaf = _write(tmp_path / "sub" / "leaf.yaml", "base: mid.yaml\nseed: 7\n")
    assert load_recipe_yaml(leaf) == {
        "learning_rate": 1e-3,
        "temperature": 0.6,
        "env": {"A": "1", "B": "3"},
        "seed": 7,
    }


def test_unknown_key_names_the_file_that_has_it(tmp_path):
    parent = _write(tmp_path / "parent.yaml", f"base: {RECIPES / 'countdown' / 'base.yaml'}\nlearning_rat: 1.0e-3\n")
    child = _write(tmp_path / "child.yaml", "base: parent.yaml\ntemperature: 0.9\n")
    with pytest.raises(RecipeError) as err:
        parse_recipe_args("countdown", ["--config", str(child), *CPU])
    message = str(err.value)
    assert str(parent) in message and str(child) not in message
    assert "'learning_rat'" in message and "learning_rate" in message  # the key and the suggestion


def test_base_cycle_is_reported_with_the_chain(tmp_path):
    _write(tmp_path / "a.yaml", "base: b.yaml\n")
    _write(tmp_path / "b.yaml", "base: a.yaml\n")
    with pytest.raises(RecipeError, match="cycle") as err:
        load_recipe_yaml(tmp_path / "a.yaml")
    assert f"{tmp_path / 'a.yaml'} -> {tmp_path / 'b.yaml'} -> {tmp_path / 'a.yaml'}" in str(err.value)


def test_missing_base_names_the_referring_file_and_the_missing_one(tmp_path):
    child = _write(tmp_path / "child.yaml", "base: nowhere/parent.yaml\n")
    with pytest.raises(RecipeError) as err:
        load_recipe_yaml(child)
    assert str(child) in str(err.value) and str(tmp_path / "nowhere" / "parent.yaml") in str(err.value)


def test_malformed_recipes_name_their_file(tmp_path):
    not_mapping = _write(tmp_path / "list.yaml", "- a\n- b\n")
    with pytest.raises(RecipeError, match=f"{not_mapping}: a recipe must be a YAML mapping"):
        load_recipe_yaml(not_mapping)
    broken = _write(tmp_path / "broken.yaml", "a: [1, 2\n")
    with pytest.raises(RecipeError, match=f"{broken}: invalid YAML"):
        load_recipe_yaml(broken)
    bad_value = _write(
        tmp_path / "bad_value.yaml", f"base: {RECIPES / 'countdown' / 'base.yaml'}\npg_loss_type: ppo\n"
    )
    with pytest.raises(RecipeError) as err:
        parse_recipe_args("countdown", ["--config", str(bad_value), *CPU])
    assert str(bad_value) in str(err.value) and "pg_loss_type" in str(err.value)


def test_n_grpo_steps_and_a_contradicting_max_steps_is_an_error():
    with pytest.raises(RecipeError, match="max_steps=50 contradicts n_grpo_steps=200"):
        _parse("countdown/base.yaml", "--max_steps", "50")
    assert _parse("countdown/base.yaml", "--max_steps", "200")[1].max_steps == 200


def test_generation_kwargs_follow_the_backend():
    from transformers import GenerationConfig

    _, vllm_args, _ = _parse("countdown/base.yaml")
    assert adapt_generation_kwargs(vllm_args) == []
    assert vllm_args.generation_kwargs["stop"] == ["</answer>"]  # vLLM SamplingParams take it as is

    _, hf_args, _ = _parse("countdown/base.yaml", "--use_vllm", "false")
    assert sorted(adapt_generation_kwargs(hf_args)) == ["include_stop_str_in_output", "stop"]
    assert hf_args.generation_kwargs == {"min_new_tokens": 4}
    GenerationConfig(**hf_args.generation_kwargs).validate(strict=True)  # transformers accepts what is left


def test_sft_traces_become_prompt_completion_conversations():
    source = shared_path("intellect_math", "dev_head5.jsonl")
    dataset = load_sft_dataset(str(source), "train[:-1]", limit=3)
    assert len(dataset) == 3 and dataset.column_names == ["prompt", "completion"]
    row = dataset[0]
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    assert [m["role"] for m in row["completion"]] == ["assistant"]
    assert "\\boxed" in row["completion"][0]["content"]
    assert len(load_sft_dataset(str(source), "test[-2:]")) == 2  # a local file's one split, sliced


def test_sft_trace_without_a_final_assistant_turn_names_file_and_row(tmp_path):
    import json

    good = {"messages": [{"role": "user", "content": "1+1"}, {"role": "assistant", "content": "2"}]}
    bad = {"messages": [{"role": "user", "content": "2+2"}]}
    path = _write(tmp_path / "traces.jsonl", "".join(json.dumps(r) + "\n" for r in (good, good, bad)))
    with pytest.raises(RecipeError, match=f"{path}: row 2: .*assistant"):
        load_sft_dataset(str(path), "train")


@pytest.fixture
def demo_calls(monkeypatch):
    """Replaces trl_ext.demo.main (our own entry point, not a library) by a recorder of the argv it gets."""
    import trl_ext.demo

    calls = []
    monkeypatch.setattr(trl_ext.demo, "main", lambda argv=None: calls.append(argv) or {"demo": True})
    return calls


def test_countdown_script_without_config_on_cpu_runs_the_demo_and_says_so(demo_calls, capsys):
    """No --config and no GPU: the argv goes to trl_ext.demo.main, with a printed line naming the demo."""
    assert _load_script("countdown").main(["--seed", "3"], cuda_available=False) == {"demo": True}
    assert demo_calls == [["--seed", "3"]]
    assert "running the CPU demo" in capsys.readouterr().out


def test_countdown_script_without_config_on_a_gpu_machine_refuses_the_demo(demo_calls):
    """No --config with a GPU visible: exit naming the GPU recipe command; the CPU demo must not start.
    Catches a silent fall-back to the toy demo on a GPU machine."""
    from trl_ext.demo import GPU_COMMAND

    with pytest.raises(SystemExit, match="no --config on a machine with a GPU") as exc:
        _load_script("countdown").main(["--seed", "3"], cuda_available=True)
    assert GPU_COMMAND in str(exc.value) and "--demo" in str(exc.value)
    assert demo_calls == []


@pytest.mark.parametrize("cuda_available", [False, True])
def test_countdown_script_demo_flag_runs_the_demo_anywhere(demo_calls, cuda_available):
    """`--demo` (what `make run` passes) runs the demo with a GPU too, the flag itself removed from its argv."""
    assert _load_script("countdown").main(["--demo", "--seed", "3"], cuda_available=cuda_available) == {"demo": True}
    assert demo_calls == [["--seed", "3"]]


def test_countdown_script_demo_and_config_together_are_an_error(demo_calls):
    config = str(RECIPES / "countdown" / "qwen2.5_math_1.5b_instruct_grpo.yaml")
    with pytest.raises(SystemExit, match="--demo .* or --config YAML .*, not both"):
        _load_script("countdown").main(["--demo", "--config", config], cuda_available=False)
    assert demo_calls == []


def test_countdown_help_explains_the_demo_rule():
    epilog = make_parser("grpo", task="countdown").epilog
    assert "--demo" in epilog and "no GPU is visible" in epilog and "GPU recipe command" in epilog


def test_config_flag_accepts_the_equals_form():
    script_args, args, _ = parse_recipe_args(
        "countdown", [f"--config={RECIPES / 'countdown' / 'qwen2.5_math_1.5b_instruct_grpo.yaml'}", *CPU]
    )
    assert args.temperature == 0.7 and script_args.prompt == "countdown"


def _load_script(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"{name}_recipe", RECIPES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bad_data_and_reward_names_fail_before_the_model_loads(tmp_path):
    """The model folder has a config but no weights: reaching the model load would raise OSError instead of these
    errors (the preflight before them accepts the folder; generation on transformers needs no vLLM here)."""
    import json

    data = _write(tmp_path / "cd.jsonl", json.dumps({"nums": [1, 2, 3], "target": 6}) + "\n")
    _write(tmp_path / "no" / "config.json", "{}")
    common = ["--config", str(RECIPES / "countdown" / "base.yaml"), *CPU, "--model_name_or_path", str(tmp_path / "no")]
    common += ["--dataset_source", str(data), "--dataset_split", "train", "--eval_split", "none"]
    common += ["--use_vllm", "false", "--output_dir", str(tmp_path / "run")]
    countdown = _load_script("countdown")
    with pytest.raises(ValueError, match="unknown reward function.*'nope'"):
        countdown.main([*common, "--reward_funcs", "nope"])
    with pytest.raises(ValueError, match="unknown prompt 'nope'"):
        countdown.main([*common, "--prompt", "nope"])
    with pytest.raises(RecipeError, match=r"split 'train\[5:\]' has no rows"):
        countdown.main([*common, "--dataset_split", "train[5:]"])
    from trl_ext.preflight import PreflightError

    with pytest.raises(PreflightError, match=r"dataset_source: data file .*missing.jsonl not found"):
        countdown.main([*common, "--dataset_source", str(tmp_path / "missing.jsonl")])


@pytest.mark.parametrize(
    ("recipe", "train_file", "eval_file"),
    [
        ("gsm8k/r1_zero.yaml", ("gsm8k", "train_head16.jsonl"), ("gsm8k", "test.jsonl")),
        ("math/r1_zero.yaml", ("math", "math12k_train_subset.jsonl"), ("math", "math500_test.jsonl")),
        ("math/question_only.yaml", ("math", "math12k_train_subset.jsonl"), ("math", "math500_test.jsonl")),
        (
            "countdown/qwen3_1.7b_grpo_l512.yaml",
            ("countdown", "train_10k_head16.parquet"),
            ("countdown", "dev.parquet"),
        ),
        # NYU Assignment 3: the course's files, here the shipped subset in place of data/countdown/
        (
            "countdown/qwen2.5_math_1.5b_instruct_grpo.yaml",
            ("countdown", "train_10k_head16.parquet"),
            ("countdown", "dev.parquet"),
        ),
    ],
)
def test_recipe_data_on_the_real_files(recipe, train_file, eval_file):
    """The recipe's prompt settings reach the task loaders; the reward's columns are there (real data, no model)."""
    from trl_ext.recipes import load_grpo_datasets

    train_path, eval_path = shared_path(*train_file), shared_path(*eval_file)
    overrides = ["--dataset_source", str(train_path), "--dataset_split", "train", "--limit", "8"]
    overrides += ["--eval_source", str(eval_path), "--eval_split", "train"]
    script_args, training_args, _ = _parse(recipe, *overrides)
    train, evaluation = load_grpo_datasets(_task(recipe), script_args, training_args)
    assert len(train) == 8
    rows = {"test.jsonl": 1319, "math500_test.jsonl": 500, "dev.parquet": 1024}[eval_file[1]]
    assert len(evaluation) == min(1024, rows)  # eval_limit 1024
    prompt = train[0]["prompt"]
    if script_args.chat_template:  # Assignment 2: TinyZero's question as the user turn of the chat template
        assert [m["role"] for m in prompt] == ["user"] and "<answer> </answer> tags" in prompt[0]["content"]
        assert {"nums", "target"} <= set(train.column_names)
    elif script_args.prompt == "r1_zero":
        assert prompt.endswith("Assistant: <think>") and "ground_truth" in train.column_names
    elif script_args.prompt == "countdown":  # NYU Assignment 3: its prompt as it prints it, the problem filled in
        row = pq.read_table(train_path).slice(0, 1).to_pylist()[0]
        nums, target = list(row["nums"]), row["target"]
        question = f"Using the numbers in the list {nums}, create an equation that equals {target}."
        assert f"Problem\n{question}\nYou can use basic" in prompt
        assert prompt.rstrip().endswith("Let's think step by step.") and {"nums", "target"} <= set(train.column_names)
    else:  # question_only: the bare problem text
        import json

        assert prompt == json.loads(train_path.read_text().splitlines()[0])["problem"]
        assert "ground_truth" in train.column_names
