"""The preflight's async part (`trl_ext.preflight.async_plan`): the plan of the two-GPU async recipe states the
staleness and the host memory of the batch queued ahead (computed by hand below), and refuses a queue that would
not fit the host's available memory."""

from __future__ import annotations

from pathlib import Path

from trl_ext.preflight import plan_batches
from trl_ext.preflight.async_plan import (
    BYTES_PER_COMPLETION_TOKEN,
    BYTES_PER_PROMPT_TOKEN,
    AsyncPlan,
    check_async,
    plan_async,
)
from trl_ext.preflight.plan import RunContext, check_recipe
from trl_ext.recipes import parse_recipe_args, stated_values

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
ASYNC = RECIPES / "countdown" / "qwen3_1.7b_grpo_l512_async.yaml"
# The two-GPU layout: vLLM on GPU 0, one training process on GPU 1 (accelerate_configs/vllm_server_gpu0_train_gpu1).
TWO_GPUS = RunContext(check_packages=False, train_devices=("1",), server_devices=("0",), gpu_memory_gib=80,
                      memory_limit_gib=80, label="vllm_server_gpu0_train_gpu1.yaml")  # fmt: skip


def _report(tmp_path, recipe: Path, *extra: str):
    argv = ["--config", str(recipe), "--use_cpu", "true", "--output_dir", str(tmp_path / "run"), *extra]
    parsed = parse_recipe_args("countdown", argv)  # use_cpu: parsed on a machine without the GPUs it plans for
    return check_recipe("countdown", recipe, [], parsed, TWO_GPUS, stated_values(recipe))


def test_two_gpu_async_plan_states_the_staleness_and_the_queued_memory(tmp_path):
    report = _report(tmp_path, ASYNC)
    text = report.render()
    # 256 completions x (512 x 450 + 266 x 40) bytes = 61,706,240 B = 58.8 MiB (countdown's prompt estimate: 266).
    assert 256 * (512 * BYTES_PER_COMPLETION_TOKEN + 266 * BYTES_PER_PROMPT_TOKEN) == 61_706_240
    assert "the next generation batch is requested as soon as this one is generated" in text
    assert "scored 1 optimizer step(s) after the policy that drew them (max_staleness 1, 1 step(s) per batch)" in text
    assert "TRL's vLLM importance-sampling correction (sequence_mask, clip max 3.0)" in text
    assert "queued: 1 batch of 256 completions x (<= 512 + 266 prompt) tokens" in text
    assert "<= 59 MiB of host memory on the main training process" in text
    assert not [p for p in report.problems if p.field == "async_rollouts"]


def test_staleness_below_the_steps_per_batch_says_when_the_next_batch_is_requested(tmp_path):
    # offpolicy_e1_tb64: 256 completions per rollout, 64 per optimizer step: 4 steps per batch; max_staleness 2
    # requests the next batch after 2 of them.
    recipe = RECIPES / "countdown" / "offpolicy_e1_tb64.yaml"
    flags = ["--async_rollouts", "true", "--max_staleness", "2", "--vllm_importance_sampling_correction", "true"]
    text = _report(tmp_path, recipe, *flags).render()
    assert "requested after 2 of its optimizer steps" in text
    assert "(max_staleness 2, 4 step(s) per batch)" in text


def test_no_async_line_without_async_and_a_synchronous_line_at_zero(tmp_path):
    plain = _report(tmp_path, RECIPES / "countdown" / "qwen3_1.7b_grpo_l512.yaml").render()
    assert "async:" not in plain
    zero = _report(tmp_path, ASYNC, "--max_staleness", "0").render()
    assert "async:   max_staleness 0: generation is synchronous (nothing requested ahead)" in zero
    assert "queued:" not in zero


def test_a_queue_larger_than_half_the_available_memory_is_refused(tmp_path):
    argv = ["--config", str(ASYNC), "--use_cpu", "true", "--output_dir", str(tmp_path / "run")]
    _, args, _ = parse_recipe_args("countdown", argv)
    plan = plan_async(args, plan_batches(stated_values(ASYNC), 1), 266)
    assert plan == AsyncPlan(1, 1, 256, 512, 266, 61_706_240)
    assert check_async(plan, available=2 * 61_706_240) == []  # exactly half: fits
    assert check_async(plan, available=None) == []  # unknown: no claim
    [problem] = check_async(plan, available=2 * 61_706_240 - 2)
    assert problem.field == "async_rollouts"
    assert "may hold 59 MiB on the main training process, more than half of the 118 MiB" in problem.message
    assert problem.fix == "lower rollout_batch_size or max_completion_length, or set max_staleness 0"
