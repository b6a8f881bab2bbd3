"""Every course recipe against the courses' stated values (`tests/data/course_values.tsv`), so an edit cannot drift
silently.

Each recipe (GRPO, SFT and expert-iteration) is parsed by its entry point's own parser (no model) and each stated
value is read back from the resolved configs, in the courses' vocabulary, by the small readers below: they read the
fields TRL trains with (`generation_batch_size`, `num_generations`, `num_iterations`, the resolved advantage and
loss), not the YAML, so the whole chain (YAML `base:` files -> parser -> configs -> TRL's fields) is checked. The
`prompt_text` rows compare the prompt a recipe renders with the course's printed text (`tests/data/course_prompts/`;
Countdown with NYU Assignment 3's example problem, the others with the `{question}` placeholder). A value that differs
from the course is in the file with the recipe's value and the reason; a value the course does not state but the recipe
chooses has `"not stated"` as the course's value, the recipe's value and where it comes from.
"""

from __future__ import annotations

import csv
import fnmatch
import json
from functools import cache
from pathlib import Path

import pytest
from conftest import shared_path

from trl_ext.evaluation import reward_name_for
from trl_ext.launch import plan_launch
from trl_ext.launch.configs import read_recipe_serving
from trl_ext.recipes import load_recipe_yaml_with_sources, parse_ei_args, parse_recipe_args
from trl_ext.tasks import PROMPTS, countdown_prompt, format_prompt
from trl_ext.tasks.math import TEST_HUB_ID as MATH_TEST_HUB_ID
from trl_ext.tasks.math import TRAIN_HUB_ID as MATH_TRAIN_HUB_ID
from trl_ext.tasks.splits import DEFAULT_SOURCES

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
CONFIGS = RECIPES.parent / "accelerate_configs"
TABLE = shared_path("course_values.tsv")
DEFAULTS = RECIPES / "grpo_defaults.yaml"
EI_DEFAULTS = RECIPES / "expert_iteration" / "defaults.yaml"
SFT_BASE = RECIPES / "sft" / "base.yaml"
# the `course` column: Assignment 2, NYU Assignment 3, NLPDL HW3, CS336 A5, the GSM8K report
COURSES = {"assignment2_grpo", "nyu_reasoners_a3", "nlpdl_hw3", "cs336_a5", "gsm8k_report"}
COURSE_LOSSES = {
    "raw": "no_baseline",
    "group_mean": "reinforce_with_baseline",
    "group_mean_std": "reinforce_with_baseline",
}


def _loss(args) -> str:
    if args.pg_loss_type == "reinforce":  # the courses' presets: -A logp with raw or baselined advantages
        return COURSE_LOSSES[args.advantage_type]
    return {"grpo_no_clip": "GRPO-No-Clip"}.get(args.pg_loss_type, args.pg_loss_type)


def _math_hub_id(split: str) -> str:
    """The hub set `trl_ext.tasks.load_math` reads for `split` when no source is given."""
    return MATH_TRAIN_HUB_ID if split.split("[")[0] == "train" else MATH_TEST_HUB_ID


def _eval_data(task, script, args, model):
    if script.eval_source is not None:
        return script.eval_source
    if script.dataset_source is not None:
        return script.dataset_source
    return MATH_TEST_HUB_ID if task == "math" and script.eval_split != "train" else DEFAULT_SOURCES[task][0]


def _attention(task, script, args, model):
    """The attention the recipe asks `from_pretrained` for: `model_init_kwargs` over ModelConfig's field."""
    return (args.model_init_kwargs or {}).get("attn_implementation", model.attn_implementation)


def _prompt_text(task, script, args, model):
    """The recipe's rendered prompt: Countdown on NYU Assignment 3's example problem, the others with `{question}`."""
    if task == "countdown":
        return countdown_prompt([96, 97, 68], 125, prompt=script.prompt, chat=script.chat_template)
    return format_prompt(script.prompt, chat=script.chat_template, question="{question}")


# key -> reader of (task, script args, training args, model args), in the courses' vocabulary; one process (W = 1).
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
    "vllm_mode": lambda t, s, a, m: a.vllm_mode,
    "dtype": lambda t, s, a, m: m.dtype,
    "gradient_checkpointing": lambda t, s, a, m: a.gradient_checkpointing,
    "prompt_text": _prompt_text,
    "enable_thinking": lambda t, s, a, m: (a.chat_template_kwargs or {}).get("enable_thinking"),
    "attn_implementation": _attention,
}
# Expert iteration (recipes/expert_iteration.py): the GRPO readers that apply, and the EI step's own fields.
READ_EI = {
    **{k: READ[k] for k in ("model", "train_data", "validation_examples_min", "prompt", "reward", "stop")},
    **{k: READ[k] for k in ("temperature", "top_p", "min_tokens", "max_tokens", "group_size", "learning_rate")},
    **{k: READ[k] for k in ("max_grad_norm", "use_vllm", "dtype", "prompt_text", "attn_implementation")},
    "n_ei_steps": lambda t, s, a, m: a.n_ei_steps,
    "questions_per_step": lambda t, s, a, m: a.questions_per_step,
    "sft_epochs": lambda t, s, a, m: a.sft_epochs,
    "keep_min_reward": lambda t, s, a, m: a.keep_min_reward,
}
# SFT (recipes/sft.py, NYU Assignment 3 section 4): the training run and its validation accuracy's generation.
READ_SFT = {
    "model": lambda t, s, a, m: m.model_name_or_path,
    "sft_examples": lambda t, s, a, m: s.limit,
    "max_grad_norm": lambda t, s, a, m: a.max_grad_norm,
    "dtype": lambda t, s, a, m: m.dtype,
    "attn_implementation": READ["attn_implementation"],
    "validation_temperature": lambda t, s, a, m: s.accuracy_temperature,
    "validation_max_tokens": lambda t, s, a, m: s.accuracy_max_tokens,
    "prompt": lambda t, s, a, m: s.accuracy_prompt,
    "prompt_text": lambda t, s, a, m: PROMPTS[s.accuracy_prompt],
    "train_data": lambda t, s, a, m: s.dataset_source,
    "validation_data": lambda t, s, a, m: [s.accuracy_source or _math_hub_id(s.accuracy_split), s.accuracy_split],
    "validation_chat_template": lambda t, s, a, m: s.accuracy_chat,
    "validation_reward": lambda t, s, a, m: reward_name_for(s.accuracy_task, s.accuracy_prompt),
}
READERS = {"grpo": READ, "ei": READ_EI, "sft": READ_SFT}


def _rows() -> list[dict]:
    lines = [line for line in TABLE.read_text().splitlines() if not line.startswith("#")]
    return list(csv.DictReader(lines, delimiter="\t", quoting=csv.QUOTE_NONE))


def _matches(recipe: str, patterns: str) -> bool:
    globs = patterns.split()
    wanted = [g for g in globs if not g.startswith("!")]
    unwanted = [g[1:] for g in globs if g.startswith("!")]
    return any(fnmatch.fnmatch(recipe, g) for g in wanted) and not any(fnmatch.fnmatch(recipe, g) for g in unwanted)


def _kind(recipe: str) -> str:
    """`grpo`, `ei` or `sft`: the entry point a recipe runs with, from the root of its `base:` chain."""
    sources = set(load_recipe_yaml_with_sources(RECIPES / recipe)[1].values())
    roots = {"grpo": DEFAULTS, "ei": EI_DEFAULTS, "sft": SFT_BASE}
    kinds = [kind for kind, root in roots.items() if root.resolve() in sources]
    assert len(kinds) == 1, (recipe, kinds)
    return kinds[0]


def _course_recipes() -> list[str]:
    """The recipes of the courses' folders: GRPO (their `base:` chain reaches grpo_defaults.yaml) and expert iteration
    in gsm8k/ and math/, Assignment 2/NYU Assignment 3's Countdown files, and NYU Assignment 3's SFT sweep in sft/; the
    Countdown ablations of the other courses on Qwen3-1.7B are not a course's own run."""
    paths = [*RECIPES.glob("gsm8k/*.yaml"), *RECIPES.glob("math/*.yaml"), *RECIPES.glob("countdown/qwen*")]
    return sorted(
        [p.relative_to(RECIPES).as_posix() for p in paths if p.name != "base.yaml"]
        + [p.relative_to(RECIPES).as_posix() for p in RECIPES.glob("sft/*.yaml")]
    )


ROWS = _rows()
COURSE_RECIPES = _course_recipes()
KIND = {recipe: _kind(recipe) for recipe in COURSE_RECIPES}


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
    argv = ["--config", str(RECIPES / recipe), "--use_cpu", "true"]
    if KIND[recipe] == "ei":
        script = parse_ei_args(argv)
        return (script[0].task, *script)
    task = "sft" if KIND[recipe] == "sft" else recipe.split("/")[0]
    return (task, *parse_recipe_args(task, argv))


def _course_text(row: dict) -> str:
    """The course's printed prompt (a file of tests/data/course_prompts), with the recipe's stated word changes
    applied."""
    text = shared_path("course_prompts", json.loads(row["course_value"])).read_text(encoding="utf-8")
    for course_words, recipe_words in (json.loads(row["recipe_value"]) if row["recipe_value"] else {}).items():
        assert text.count(course_words) == 1, (row["section"], course_words)
        text = text.replace(course_words, recipe_words)
    return text


def test_the_table_is_well_formed_and_every_row_applies():
    assert len(ROWS) >= 200 and len(COURSE_RECIPES) >= 70
    assert {KIND[r] for r in COURSE_RECIPES} == {"grpo", "ei", "sft"}
    for i, row in enumerate(ROWS, start=2):
        assert row["course"] in COURSES and row["section"], i
        json.loads(row["course_value"])
        if row["recipe_value"]:
            json.loads(row["recipe_value"])
            assert row["reason"], f"row {i}: a value that differs from the course says why"
        if json.loads(row["course_value"]) == "not stated":
            assert row["recipe_value"] and row["reason"], f"row {i}: a chosen value says what it is and why"
        matched = [r for r in COURSE_RECIPES if _matches(r, row["recipes"])]
        assert matched, f"row {i} matches no recipe: {row['recipes']}"
        unread = [r for r in matched if row["key"] not in READERS[KIND[r]]]
        assert unread == [], f"row {i}: no {row['key']!r} reader for {unread}"
        if row["key"] == "prompt_text":
            _course_text(row)


def test_gsm8k_report_recipe_lists_every_value_it_chooses_where_the_report_is_silent():
    """The GSM8K report is a student's report: what it does not state, the recipe inherits. Each such value (a "not
    stated" row) is named, as `key value`, in the recipe's list of chosen values, so none is inherited silently."""
    recipe = "gsm8k/qwen2.5_1.5b_instruct_grpo.yaml"
    header = " ".join(
        line.lstrip("# ") for line in (RECIPES / recipe).read_text().splitlines() if line.startswith("#")
    )
    chosen = {k: r for k, r in _expected(recipe).items() if json.loads(r["course_value"]) == "not stated"}
    assert {"kl_beta", "length_normalization", "top_p", "min_tokens", "advantage_eps"} <= set(chosen)
    for key, row in chosen.items():
        value = json.loads(row["recipe_value"])
        assert f"{key} {value if isinstance(value, str) else json.dumps(value)}" in header, key


def test_the_recipes_page_names_every_entry_point():
    """docs/recipes.md's count and list of entry points is the `recipes/*.py` there are."""
    import re

    numbers = {"four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8}
    page = (RECIPES.parent / "docs" / "recipes.md").read_text()
    count, listed = re.search(r"(\w+) thin entry points \(([^)]*)\)", page).groups()
    names = {name.removeprefix("recipes/") for name in re.findall(r"`([\w/]+\.py)`", listed)}
    assert names == {p.name for p in RECIPES.glob("*.py")} and numbers[count.lower()] == len(names)


def test_every_course_recipe_states_its_courses_model():
    assert {r for r in COURSE_RECIPES if "model" not in _expected(r)} == set()


@pytest.mark.parametrize("recipe", COURSE_RECIPES)
def test_recipe_matches_the_courses_stated_values(recipe):
    task, script, args, model = _parsed(recipe)
    wrong = {}
    for key, row in _expected(recipe).items():
        value = READERS[KIND[recipe]][key](task, script, args, model)
        stated = json.loads(row["course_value"])
        expected = json.loads(row["recipe_value"]) if row["recipe_value"] else stated
        if key == "prompt_text":
            ok = value == _course_text(row)
        elif key.endswith("_min"):
            ok = value >= stated and (not row["recipe_value"] or value == expected)
        elif key.endswith("_max"):
            ok = value <= stated and (not row["recipe_value"] or value == expected)
        elif key.endswith("_range"):
            ok = stated[0] <= value <= stated[1]
        else:
            ok = _same(value, expected)
        if not ok:
            wrong[key] = (value, expected, f"{row['course']} {row['section']}")
    assert wrong == {}


def test_the_vllm_share_reaches_the_server_the_launcher_starts(tmp_path):
    """The courses' gpu_memory_utilization is the server's in server mode: `trl-ext launch` passes the recipe's value
    to
    `trl vllm-serve` (whose own default is 0.9), unless --vllm-args gives one."""
    for recipe in COURSE_RECIPES:
        if _expected(recipe).get("vllm_gpu_memory_utilization"):
            args = _parsed(recipe)[2]
            assert read_recipe_serving(RECIPES / recipe).gpu_memory_utilization == args.vllm_gpu_memory_utilization
    script = tmp_path / "recipe.py"  # a stand-in script: no preflight, the plan only
    script.write_text("")
    config = RECIPES / "countdown" / "qwen2.5_math_1.5b_instruct_grpo.yaml"
    plan = plan_launch(CONFIGS / "vllm_server_gpu0_train_gpu1.yaml", script, config, num_gpus=2, log_dir=tmp_path)
    argv = list(plan.server.argv)
    assert argv[argv.index("--gpu_memory_utilization") + 1] == "0.8"
    given = ["--gpu-memory-utilization", "0.5"]
    plan = plan_launch(
        CONFIGS / "vllm_server_gpu0_train_gpu1.yaml", script, config, num_gpus=2, log_dir=tmp_path, vllm_args=given
    )
    assert [a for a in plan.server.argv if "memory" in a] == ["--gpu-memory-utilization"]
