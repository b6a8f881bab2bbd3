"""Every seed recipe against the seeds' stated values (`tests/data/seed_values.tsv`), so an edit cannot drift silently.

Each recipe is parsed by the entry points' own parser (no model) and each stated value is read back from the
resolved configs, in the seeds' vocabulary, by the small readers below: they read the fields TRL trains with
(`generation_batch_size`, `num_generations`, `num_iterations`, the resolved advantage and loss), not the YAML, so the
whole chain (YAML `base:` files -> parser -> AblationGRPOConfig -> TRL's fields) is checked. A value that differs
from the seed is in the file with the recipe's value and the reason.
"""

from __future__ import annotations

import csv
import fnmatch
import json
from functools import cache
from pathlib import Path

import pytest
from conftest import shared_path

from trl_ext.launch import plan_launch
from trl_ext.launch.configs import read_recipe_serving
from trl_ext.recipes import load_recipe_yaml_with_sources, parse_recipe_args
from trl_ext.tasks.math import TEST_HUB_ID as MATH_TEST_HUB_ID
from trl_ext.tasks.splits import DEFAULT_SOURCES

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
CONFIGS = RECIPES.parent / "accelerate_configs"
TABLE = shared_path("seed_values.tsv")
DEFAULTS = RECIPES / "grpo_defaults.yaml"
SEED_LOSSES = {
    "raw": "no_baseline",
    "group_mean": "reinforce_with_baseline",
    "group_mean_std": "reinforce_with_baseline",
}


def _loss(args) -> str:
    if args.pg_loss_type == "reinforce":  # the seeds' presets: -A logp with raw or baselined advantages
        return SEED_LOSSES[args.advantage_type]
    return {"grpo_no_clip": "GRPO-No-Clip"}.get(args.pg_loss_type, args.pg_loss_type)


def _eval_data(task, script, args, model):
    if script.eval_source is not None:
        return script.eval_source
    if script.dataset_source is not None:
        return script.dataset_source
    return MATH_TEST_HUB_ID if task == "math" and script.eval_split != "train" else DEFAULT_SOURCES[task][0]


# key -> reader of (task, script args, training args, model args), in the seeds' vocabulary; one process (W = 1).
READ = {
    "model": lambda t, s, a, m: m.model_name_or_path,
    "train_data": lambda t, s, a, m: s.dataset_source or DEFAULT_SOURCES[t][0],
    "eval_data": _eval_data,
    "validation_examples_min": lambda t, s, a, m: s.eval_limit,
    "validation_every_grpo_steps_range": lambda t, s, a, m: a.eval_steps * s.n_grpo_steps,
    "prompt": lambda t, s, a, m: s.prompt,
    "reward": lambda t, s, a, m: s.reward_funcs,
    "stop": lambda t, s, a, m: (a.generation_kwargs or {}).get("stop"),
    "n_grpo_steps": lambda t, s, a, m: s.n_grpo_steps,
    "n_grpo_steps_max": lambda t, s, a, m: s.n_grpo_steps,
    "learning_rate": lambda t, s, a, m: a.learning_rate,
    "advantage_eps": lambda t, s, a, m: a.advantage_eps,
    "rollout_batch_size": lambda t, s, a, m: a.generation_batch_size,
    "group_size": lambda t, s, a, m: a.num_generations,
    "questions_per_step": lambda t, s, a, m: a.generation_batch_size // a.num_generations,
    "temperature": lambda t, s, a, m: a.temperature,
    "top_p": lambda t, s, a, m: a.top_p,
    "min_tokens": lambda t, s, a, m: (a.generation_kwargs or {}).get("min_tokens"),
    "max_tokens": lambda t, s, a, m: a.max_completion_length,
    "epochs_per_rollout_batch": lambda t, s, a, m: a.num_iterations,
    "train_batch_size": lambda t, s, a, m: a.per_device_train_batch_size * a.gradient_accumulation_steps,
    "gradient_accumulation_steps": lambda t, s, a, m: a.gradient_accumulation_steps,
    "per_device_train_batch_size": lambda t, s, a, m: a.per_device_train_batch_size,
    "vllm_gpu_memory_utilization": lambda t, s, a, m: a.vllm_gpu_memory_utilization,
    "loss_type": lambda t, s, a, m: _loss(a),
    "use_std_normalization": lambda t, s, a, m: {"group_mean_std": True, "group_mean": False}.get(a.advantage_type),
    "length_normalization": lambda t, s, a, m: a.length_normalization,
    "normalize_constant": lambda t, s, a, m: a.normalize_constant,
    "cliprange": lambda t, s, a, m: a.epsilon,
    "weight_decay": lambda t, s, a, m: a.weight_decay,
    "adam_betas": lambda t, s, a, m: [a.adam_beta1, a.adam_beta2],
    "optimizer": lambda t, s, a, m: a.optim,
    "max_grad_norm": lambda t, s, a, m: a.max_grad_norm,
    "kl_beta": lambda t, s, a, m: a.beta,
    "use_vllm": lambda t, s, a, m: a.use_vllm,
    "dtype": lambda t, s, a, m: m.dtype,
    "gradient_checkpointing": lambda t, s, a, m: a.gradient_checkpointing,
}


def _rows() -> list[dict]:
    lines = [line for line in TABLE.read_text().splitlines() if not line.startswith("#")]
    return list(csv.DictReader(lines, delimiter="\t", quoting=csv.QUOTE_NONE))


def _matches(recipe: str, patterns: str) -> bool:
    globs = patterns.split()
    wanted = [g for g in globs if not g.startswith("!")]
    unwanted = [g[1:] for g in globs if g.startswith("!")]
    return any(fnmatch.fnmatch(recipe, g) for g in wanted) and not any(fnmatch.fnmatch(recipe, g) for g in unwanted)


def _seed_recipes() -> list[str]:
    """The GRPO recipes of the seeds' folders (their `base:` chain reaches grpo_defaults.yaml), seed 000/001's
    Countdown files included; the Countdown ablations of other seeds on Qwen3-1.7B are not a seed's own run."""
    found = []
    for path in sorted(
        [*RECIPES.glob("gsm8k/*.yaml"), *RECIPES.glob("math/*.yaml"), *RECIPES.glob("countdown/seed*")]
    ):
        if DEFAULTS.resolve() in set(load_recipe_yaml_with_sources(path)[1].values()):
            found.append(path.relative_to(RECIPES).as_posix())
    return found


ROWS = _rows()
SEED_RECIPES = _seed_recipes()


def _expected(recipe: str) -> dict[str, dict]:
    """key -> the last row that applies to `recipe` (later rows override earlier ones)."""
    out = {}
    for row in ROWS:
        if _matches(recipe, row["recipes"]):
            out[row["key"]] = row
    return out


def _same(value, expected) -> bool:
    """Equal, with bools and None compared by identity (True is not 1, an unset field is not 0)."""
    if isinstance(expected, bool) or expected is None:
        return value is expected
    return not isinstance(value, bool) and value == expected


@cache
def _parsed(recipe: str):
    task = recipe.split("/")[0]
    return (task, *parse_recipe_args(task, ["--config", str(RECIPES / recipe), "--use_cpu", "true"]))


def test_the_table_is_well_formed_and_every_row_applies():
    assert len(ROWS) >= 150 and len(SEED_RECIPES) >= 60
    for i, row in enumerate(ROWS, start=2):
        assert row["seed"] in {"000", "001", "002", "003", "004"} and row["section"], i
        assert row["key"] in READ, (i, row["key"])
        json.loads(row["seed_value"])
        if row["recipe_value"]:
            json.loads(row["recipe_value"])
            assert row["reason"], f"row {i}: a value that differs from the seed says why"
        assert any(_matches(r, row["recipes"]) for r in SEED_RECIPES), f"row {i} matches no recipe: {row['recipes']}"


def test_every_seed_recipe_states_its_seeds_model():
    assert {r for r in SEED_RECIPES if "model" not in _expected(r)} == set()


@pytest.mark.parametrize("recipe", SEED_RECIPES)
def test_recipe_matches_the_seeds_stated_values(recipe):
    task, script, args, model = _parsed(recipe)
    wrong = {}
    for key, row in _expected(recipe).items():
        value = READ[key](task, script, args, model)
        stated = json.loads(row["seed_value"])
        expected = json.loads(row["recipe_value"]) if row["recipe_value"] else stated
        if key.endswith("_min"):
            ok = value >= stated and (not row["recipe_value"] or value == expected)
        elif key.endswith("_max"):
            ok = value <= stated and (not row["recipe_value"] or value == expected)
        elif key.endswith("_range"):
            ok = stated[0] <= value <= stated[1]
        else:
            ok = _same(value, expected)
        if not ok:
            wrong[key] = (value, expected, f"seed {row['seed']} {row['section']}")
    assert wrong == {}


def test_the_vllm_share_reaches_the_server_the_launcher_starts(tmp_path):
    """The seeds' gpu_memory_utilization is the server's in server mode: `trl-ext launch` passes the recipe's value to
    `trl vllm-serve` (whose own default is 0.9), unless --vllm-args gives one."""
    for recipe in SEED_RECIPES:
        if _expected(recipe).get("vllm_gpu_memory_utilization"):
            args = _parsed(recipe)[2]
            assert read_recipe_serving(RECIPES / recipe).gpu_memory_utilization == args.vllm_gpu_memory_utilization
    script = tmp_path / "recipe.py"  # a stand-in script: no preflight, the plan only
    script.write_text("")
    config = RECIPES / "countdown" / "seed001.yaml"
    plan = plan_launch(CONFIGS / "vllm_server_gpu0_train_gpu1.yaml", script, config, num_gpus=2, log_dir=tmp_path)
    argv = list(plan.server.argv)
    assert argv[argv.index("--gpu_memory_utilization") + 1] == "0.8"
    given = ["--gpu-memory-utilization", "0.5"]
    plan = plan_launch(
        CONFIGS / "vllm_server_gpu0_train_gpu1.yaml", script, config, num_gpus=2, log_dir=tmp_path, vllm_args=given
    )
    assert [a for a in plan.server.argv if "memory" in a] == ["--gpu-memory-utilization"]
