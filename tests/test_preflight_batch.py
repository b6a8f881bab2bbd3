"""trl_ext.preflight.batch: the batch arithmetic per world size, checked against the real parse (TRL's own derivation)
at one process and against the defining equations at 2, 4 and 8; failures name the field and fixes that pass."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from trl_ext.launch.table import grpo_recipes
from trl_ext.preflight import PreflightError, check_batches, derive_gradient_accumulation, plan_batches
from trl_ext.preflight.batch import TRL_BATCH_FIELDS, suggest_batch_fixes
from trl_ext.recipes import cli_overrides, stated_values

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "recipes"
COURSE_BATCH = {"rollout_batch_size": 256, "group_size": 8, "train_batch_size": 256, "per_device_train_batch_size": 2}


def test_absent_fields_take_trls_own_defaults():
    """Bug caught: TRL changing a default (e.g. per_device_train_batch_size 8 -> 4) while batch.py still assumed it.
    The defaults are now read from TRL; an empty recipe lays out as a default `trl.GRPOConfig` does."""
    from trl import GRPOConfig

    defaults = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}
    layout, _ = check_batches({}, 1)
    assert layout.per_device_train_batch_size == defaults["per_device_train_batch_size"]
    assert layout.gradient_accumulation_steps == defaults["gradient_accumulation_steps"]
    assert layout.group_size == defaults["num_generations"] and layout.num_iterations == defaults["num_iterations"]
    assert layout.max_steps == defaults["max_steps"] and layout.per_device_eval_batch_size == 0  # eval_strategy "no"
    assert TRL_BATCH_FIELDS == tuple(name for name in TRL_BATCH_FIELDS if name in defaults)


@pytest.mark.parametrize("recipe", grpo_recipes())
def test_one_process_layout_equals_the_parsed_config(recipe):
    """The pure arithmetic against TRL's: parse each shipped recipe for real (one process) and compare every field.
    Bug caught: a derivation that drifts from what AblationGRPOConfig / GRPOConfig.__post_init__ compute."""
    from trl_ext.recipes import parse_recipe_args

    layout = plan_batches(stated_values(RECIPES / recipe), 1)
    script, args, _ = parse_recipe_args(recipe.split("/")[0], ["--config", str(RECIPES / recipe), "--use_cpu", "true"])
    assert layout.per_device_train_batch_size == args.per_device_train_batch_size
    assert layout.gradient_accumulation_steps == args.gradient_accumulation_steps
    assert layout.steps_per_generation == args.steps_per_generation
    assert layout.rollout_batch_size == args.generation_batch_size
    assert layout.group_size == args.num_generations
    assert layout.num_iterations == args.num_iterations
    assert layout.max_steps == args.max_steps and layout.n_grpo_steps == script.n_grpo_steps
    assert layout.per_device_eval_batch_size == args.per_device_eval_batch_size


@pytest.mark.parametrize("world", [2, 4, 8])
# below: one GPU's run
@pytest.mark.parametrize("recipe", [r for r in grpo_recipes() if r != "gsm8k/qwen2.5_1.5b_instruct_grpo.yaml"])
def test_every_recipe_splits_its_batches_on_2_4_8_processes(recipe, world):
    """The defining equations, with the courses' completions per step unchanged. Bug caught: a recipe whose GA is
    fixed (e.g. 128) so that 256 cannot be split over 4 processes."""
    stated = stated_values(RECIPES / recipe)
    one, layout = plan_batches(stated, 1), plan_batches(stated, world)
    assert layout.train_batch_size == one.train_batch_size  # completions per optimizer step do not change
    assert layout.per_device_train_batch_size == one.per_device_train_batch_size  # nor the micro-batch (memory)
    assert layout.per_device_train_batch_size * layout.gradient_accumulation_steps * world == layout.train_batch_size
    assert layout.steps_per_generation * layout.per_device_train_batch_size * world == layout.rollout_batch_size
    assert layout.optimizer_steps_per_rollout == one.optimizer_steps_per_rollout
    assert layout.max_steps == one.max_steps
    # one validation batch holds per-device x W prompts: 1024 problems in 1024 / (128 W) generation calls
    assert layout.eval_requests == -(-1024 // (layout.per_device_eval_batch_size * world))


def test_gsm8k_reports_run_is_four_completions_a_step():
    """The GSM8K report's own run (one question x group 4 a step) splits over up to 4 processes and is refused on 8."""
    stated = stated_values(RECIPES / "gsm8k" / "qwen2.5_1.5b_instruct_grpo.yaml")
    one, four = plan_batches(stated, 1), plan_batches(stated, 4)
    assert (one.per_device_train_batch_size, one.gradient_accumulation_steps) == (1, 4)
    assert (four.per_device_train_batch_size, four.gradient_accumulation_steps) == (1, 1)
    with pytest.raises(PreflightError, match="4 completions per optimizer step do not split"):
        plan_batches(stated, 8)


def test_seven_processes_fail_with_fixes_that_pass():
    """256 completions cannot split over 7 processes; the README's `--gradient_accumulation_steps 18`
    fails too. Each suggested fix must make the check pass when applied."""
    with pytest.raises(PreflightError) as err:
        plan_batches(COURSE_BATCH, 7)
    message = str(err.value)
    assert "train_batch_size: 256 completions per optimizer step do not split" in message
    assert "train on 1 / 2 / 4 / 8 / 16 process(es)" in message
    assert check_batches({**COURSE_BATCH, "gradient_accumulation_steps": 18}, 7)[0] is None
    fixes = suggest_batch_fixes(COURSE_BATCH, 7)
    flag_fixes = [fix.split(" (")[0] for fix in fixes if fix.startswith("--")]
    assert flag_fixes == [
        "--rollout_batch_size 224 --train_batch_size 224",
        "--rollout_batch_size 280 --train_batch_size 280",
    ]
    for fix in flag_fixes:
        layout = plan_batches({**COURSE_BATCH, **cli_overrides(fix.split())}, 7)
        assert layout.per_device_train_batch_size * layout.gradient_accumulation_steps * 7 == layout.train_batch_size


def test_a_fixed_ga_gets_a_flag_fix_for_the_world_size():
    """A recipe that states GA 128: on 4 processes 256 % (128 x 4) != 0. The fix is a pair of flags that works."""
    old = {"rollout_batch_size": 256, "group_size": 8, "train_batch_size": 256, "gradient_accumulation_steps": 128}
    assert plan_batches(old, 2).per_device_train_batch_size == 1  # 2 processes still divide
    with pytest.raises(PreflightError, match=r"train_batch_size: 256 must be .*=128 x 4 process\(es\) = 512"):
        plan_batches(old, 4)
    fixes = [f for f in suggest_batch_fixes(old, 4) if f.startswith("--")]
    assert fixes[0] == "--per_device_train_batch_size 2 --gradient_accumulation_steps 32"
    assert plan_batches({**old, **cli_overrides(fixes[0].split())}, 4).gradient_accumulation_steps == 32


def test_bad_values_and_contradictions_name_their_field():
    assert check_batches({**COURSE_BATCH, "group_size": "eight"}, 1)[1][0].field == "group_size"
    assert check_batches({**COURSE_BATCH, "rollout_batch_size": 252}, 1)[1][0].field == "rollout_batch_size"  # 252 % 8
    contradiction = {**COURSE_BATCH, "gradient_accumulation_steps": 64}  # 256 / 64 = 4 per device, not 2
    assert check_batches(contradiction, 1)[1][0].field == "per_device_train_batch_size"
    odd_eval = {**COURSE_BATCH, "eval_strategy": "steps", "per_device_eval_batch_size": 3, "num_generations_eval": 2}
    assert check_batches(odd_eval, 1)[1][0].field == "per_device_eval_batch_size"  # TRL: 3 x 1 % 2 != 0
    assert check_batches({**odd_eval, "eval_split": "none"}, 1)[0] is not None  # no validation, nothing to split


def test_ga_is_derived_only_when_the_recipe_gives_the_micro_batch():
    assert derive_gradient_accumulation(COURSE_BATCH, 4) == 32
    assert derive_gradient_accumulation({**COURSE_BATCH, "gradient_accumulation_steps": 8}, 4) is None  # stated: kept
    assert derive_gradient_accumulation({"train_batch_size": 256}, 4) is None  # no micro-batch: config derives it
    assert derive_gradient_accumulation(COURSE_BATCH, 3) is None  # indivisible: left for the check to report


def test_cli_overrides_read_flags_as_trl_parser_does():
    args = ["--config", "x.yaml", "--learning_rate", "1e-4", "--use_vllm", "--gpu-memory-gb=24", "--seed", "3"]
    assert cli_overrides(args) == {"learning_rate": "1e-4", "use_vllm": "true", "gpu_memory_gb": "24", "seed": "3"}
