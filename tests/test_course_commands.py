"""The commands docs/recipes.md documents for the courses parse and resolve to each course's sampling (no model loads).

Bug caught: a documented command that a user copies and that fails at once (a flag renamed, a reward name the CLI
does not know, a recipe path that moved), or that silently samples otherwise than its course says.
"""

from __future__ import annotations

import itertools
import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

import trl_ext.recipes.eval_command as eval_cli
from trl_ext.cli import app
from trl_ext.recipes import optimizer_steps_per_rollout, parse_recipe_args

REPO = Path(__file__).resolve().parents[1]
DOC = (REPO / "docs" / "recipes.md").read_text()
COMMANDS = [line.strip() for line in DOC.splitlines() if line.strip().startswith("trl-ext eval ")]

# What each course says its zero-shot baseline samples (the cfg fields `trl-ext eval` resolves them to).
EXPECTED = {
    # Assignment 2, 1.6.1: as the Assignment 2 recipes validate, at the three budgets
    "recipes/countdown/qwen3_1.7b_grpo_l512.yaml": dict(
        model="Qwen/Qwen3-1.7B", task="countdown", split="auto", prompt="tinyzero", chat=True,
        chat_template_kwargs={"enable_thinking": True}, reward="countdown_single_equation", temperature=1.0, top_p=1.0,
        max_tokens=(256, 512, 1024), n=1, stop=("</answer>",), min_tokens=4, limit=1024,
    ),
    # NYU Assignment 3, 3.2: MATH test (500), intellect prompt, greedy, 2048 tokens, the boxed-answer reward
    "Qwen/Qwen2.5-Math-1.5B": dict(
        model="Qwen/Qwen2.5-Math-1.5B", task="math", split="test", prompt="intellect", chat=False,
        reward="question_only", temperature=0.0, max_tokens=(2048,), n=1, limit=None,
    ),
    # NLPDL HW3, 3.2-3.3: GSM8K test (all 1319), r1_zero, temperature 1.0, top-p 1.0, 1024 tokens, stop after the
    # answer; pass@N / Best@N for N in 1, 4, 8, 16 from 16 samples
    "Qwen/Qwen3-0.6B": dict(
        model="Qwen/Qwen3-0.6B", task="gsm8k", split="test", prompt="r1_zero", chat=False, reward="r1_zero",
        temperature=1.0, top_p=1.0, max_tokens=(1024,), n=16, ns=(1, 4, 8, 16), stop=("</answer>",), limit=None,
    ),
    # NYU Assignment 3, 4.3 question 2: the best SFT model on the Prime Intellect test set (the user turns,
    # `ground_truth`), prompted and sampled as the SFT recipes validate (intellect as plain text, greedy, 2048 tokens,
    # question_only)
    "runs/sft/full": dict(
        model="runs/sft/full", task="math", split="train", prompt="intellect", chat=False, reward="question_only",
        temperature=0.0, max_tokens=(2048,), n=1, limit=None,
    ),
    # NYU Assignment 3 after training: its model on the course's test file, sampled as its validation (0.7, 1024 tok)
    "runs/countdown/qwen2.5_math_1.5b_instruct_grpo": dict(
        model="runs/countdown/qwen2.5_math_1.5b_instruct_grpo", task="countdown", split="train", prompt="countdown",
        chat=False,
        reward="countdown_binary", temperature=0.7, max_tokens=(1024,), n=1, stop=("</answer>",), limit=None,
    ),
}  # fmt: skip


class _Recorded(Exception):
    pass


@pytest.fixture
def recorded(monkeypatch):
    """Replaces our own `evaluate` (no TRL / transformers / torch code) by a recorder of the config it is given."""
    configs = []

    def record(cfg, *args, **kwargs):
        configs.append(cfg)
        raise _Recorded

    monkeypatch.setattr(eval_cli, "evaluate", record)
    return configs


def test_the_page_documents_the_zero_shot_commands():
    subjects = [shlex.split(c)[2] if shlex.split(c)[2] != "--recipe" else shlex.split(c)[3] for c in COMMANDS]
    assert sorted(subjects) == sorted(EXPECTED)


# The course's files the commands name, as tests/data ships them: Countdown's test file whole, the Prime Intellect
# test set as its first rows and one with an empty ground truth (intellect_math/test_subset.jsonl).
SHIPPED = {"data/intellect_math/test.jsonl": "data/intellect_math/test_subset.jsonl"}


@pytest.mark.parametrize("command", COMMANDS)
def test_each_zero_shot_command_resolves_to_its_courses_sampling(command, recorded):
    argv = [
        str(REPO / a) if a.startswith("recipes/") else str(REPO / "tests" / SHIPPED.get(a, a)) if a.startswith("data/")
        else a
        for a in shlex.split(command)[1:]
    ]  # fmt: skip
    result = CliRunner().invoke(app, argv)
    assert isinstance(result.exception, _Recorded), result.output
    [cfg] = recorded
    subject = shlex.split(command)[2] if "--recipe" not in command else shlex.split(command)[3]
    for field, value in EXPECTED[subject].items():
        assert getattr(cfg, field) == value, (field, getattr(cfg, field))


def test_nyu_a3_off_policy_point_is_one_set_of_flags():
    flags = re.search(r"`countdown/qwen2\.5_math_1\.5b_instruct_grpo\.yaml` with `([^`]+)`", DOC).group(1).split()
    script, args, _ = parse_recipe_args(
        "countdown",
        [
            "--config",
            str(REPO / "recipes" / "countdown" / "qwen2.5_math_1.5b_instruct_grpo.yaml"),
            "--use_cpu",
            "true",
            *flags,
        ],
    )
    assert (args.pg_loss_type, args.epsilon, args.num_iterations) == ("grpo_clip", 0.2, 2)
    assert optimizer_steps_per_rollout(args) == 4 and args.max_steps == 800 and args.temperature == 0.7


def _expand(pattern: str) -> list[str]:
    parts = re.split(r"\{([^}]*)\}", pattern)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def test_every_recipe_the_page_names_exists():
    names = set(re.findall(r"`([\w./{},-]+\.yaml)`", DOC))
    recipes = {p.relative_to(REPO / "recipes").as_posix() for p in (REPO / "recipes").rglob("*.yaml")}
    basenames = {Path(r).name for r in recipes}
    missing = []
    for name in names:
        for path in _expand(name.removeprefix("recipes/")):
            if ("/" in path and path not in recipes and not (REPO / path).exists()) or (
                "/" not in path and path not in basenames
            ):
                missing.append(path)
    assert missing == [] and len(names) >= 40
