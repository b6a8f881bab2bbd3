"""The ablation recipes beyond the courses' (DAPO, RLOO, GSPO, each with and without vLLM's importance-sampling
correction) resolve to the objective they name, through the same parser the entry points use (no model, no data)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trl_ext.recipes import parse_recipe_args
from trl_ext.rewards import SoftOverlong, countdown_reward, get_reward_funcs

RECIPES = Path(__file__).resolve().parents[1] / "recipes" / "countdown"

# recipe -> (advantage_type, pg_loss_type, length_normalization, epsilon, epsilon_high, importance_sampling_level,
#            dynamic_sampling, TRL loss_type)
EXPECTED = {
    "dapo": ("group_mean_std", "grpo_clip", "token_mean", 0.2, 0.28, "token", True, "dapo"),
    "rloo": ("rloo", "grpo_clip", "masked_mean", 0.2, 0.2, "token", False, "grpo"),
    "gspo": ("group_mean_std", "gspo", "masked_mean", 3e-4, 4e-4, "sequence", False, "grpo"),
}


@pytest.mark.parametrize("correction", [False, True])
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_ablation_recipes_resolve_to_their_objective(name, correction):
    recipe = RECIPES / f"{name}{'_is' if correction else ''}.yaml"
    script_args, args, _ = parse_recipe_args("countdown", ["--config", str(recipe), "--use_cpu", "true"])
    resolved = (
        args.advantage_type,
        args.pg_loss_type,
        args.length_normalization,
        args.epsilon,
        args.epsilon_high,
        args.importance_sampling_level,
        args.dynamic_sampling,
        args.loss_type,
    )
    assert resolved == EXPECTED[name]
    assert args.vllm_importance_sampling_correction is correction
    assert args.vllm_importance_sampling_mode == "sequence_mask"  # TRL's default mode when the correction is on
    # 4 optimizer steps per rollout batch of 32 prompts x 8 (the clip and GSPO's sequence ratio act off-policy)
    assert (args.generation_batch_size, args.num_generations, args.max_steps) == (256, 8, 800)
    assert args.max_generation_batches == (4 if name == "dapo" else None)
    funcs = get_reward_funcs(script_args.reward_funcs, args)
    if name == "dapo":
        assert funcs[0] is countdown_reward and isinstance(funcs[1], SoftOverlong)
        assert (funcs[1].max_length, funcs[1].buffer_length) == (args.max_completion_length, 256)
    else:
        assert funcs == [countdown_reward]
