"""Presets from the command line: every flag a recipe YAML can set, the command line can set or unset.

Bugs caught: `recipes/gsm8k.py --config recipes/gsm8k/r1_zero.yaml --pg_loss_type no_baseline` failing on the
recipe's `use_std_normalization: true` ("unset use_std_normalization"), and `--use_std_normalization null` refused by
the parser. The reference for "resolves" is independent of the flag path: a YAML that states the same ablation.
"""

from __future__ import annotations

import dataclasses
import logging
import typing
from pathlib import Path

import pytest

from trl_ext.recipes import RecipeError, make_parser, parse_recipe_args

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
GSM8K = ["--config", str(RECIPES / "gsm8k" / "r1_zero.yaml"), "--use_cpu", "true"]
NAMING = {"output_dir", "run_name", "logging_dir"}


def _resolved(args) -> dict:
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(args) if f.name not in NAMING}


def test_a_preset_flag_resolves_to_what_the_yaml_ablation_trains(tmp_path, caplog):
    """`--pg_loss_type no_baseline` on r1_zero.yaml == a YAML that unsets std and eps (as no_baseline.yaml does)."""
    yaml = tmp_path / "gsm8k" / "no_baseline.yaml"
    yaml.parent.mkdir()
    base = RECIPES / "gsm8k" / "r1_zero.yaml"
    yaml.write_text(f"base: {base}\npg_loss_type: no_baseline\nuse_std_normalization: null\nadvantage_eps: null\n")
    reference = parse_recipe_args("gsm8k", ["--config", str(yaml), "--use_cpu", "true"])[1]
    with caplog.at_level(logging.WARNING, logger="trl_ext.recipes.parsing"):
        _, args, _ = parse_recipe_args("gsm8k", [*GSM8K, "--pg_loss_type", "no_baseline"])
    assert (args.advantage_type, args.pg_loss_type, args.advantage_eps, args.use_std_normalization) == (
        "raw",
        "reinforce",
        None,
        None,
    )
    assert _resolved(args) == _resolved(reference)
    dropped = [r.getMessage() for r in caplog.records]
    defaults = str(RECIPES / "grpo_defaults.yaml")
    assert len(dropped) == 2 and all(m.startswith(defaults) for m in dropped)
    assert "use_std_normalization: True dropped" in dropped[0] and "advantage_eps: 1e-06 dropped" in dropped[1]
    # the explicit spelling works too, and then nothing needs dropping
    caplog.clear()
    explicit = ["--pg_loss_type", "no_baseline", "--use_std_normalization", "null", "--advantage_eps", "null"]
    with caplog.at_level(logging.WARNING, logger="trl_ext.recipes.parsing"):
        _, args, _ = parse_recipe_args("gsm8k", [*GSM8K, *explicit])
    assert _resolved(args) == _resolved(reference) and not caplog.records


def test_a_contradiction_names_the_exact_flags_and_they_work():
    with pytest.raises(RecipeError) as err:
        parse_recipe_args("gsm8k", [*GSM8K, "--loss_type", "dr_grpo"])
    message = str(err.value)
    assert message.endswith("add --pg_loss_type null --length_normalization null")
    assert "pg_loss_type is set in" in message and str(RECIPES / "grpo_defaults.yaml") in message
    flags = ["--loss_type", "dr_grpo", "--pg_loss_type", "null", "--length_normalization", "null"]
    _, args, _ = parse_recipe_args("gsm8k", [*GSM8K, *flags])
    assert (args.pg_loss_type, args.length_normalization, args.advantage_type) == (
        "grpo_clip",
        "masked_normalize",
        "group_mean_std",  # the recipe's std normalisation stays: TRL's dr_grpo says nothing about the advantage
    )
    assert args.normalize_constant == args.max_completion_length == 1024


def test_values_the_user_states_are_never_dropped(tmp_path):
    """Only YAML values, and only when an axis flag made them meaningless: an inconsistent YAML stays an error, and
    so does an ignored value given on the command line itself."""
    broken = tmp_path / "broken.yaml"
    broken.write_text(f"base: {RECIPES / 'gsm8k' / 'r1_zero.yaml'}\npg_loss_type: no_baseline\n")
    with pytest.raises(RecipeError, match=f"use_std_normalization=True is ignored .*is set in {RECIPES}"):
        parse_recipe_args("gsm8k", ["--config", str(broken), "--use_cpu", "true", "--learning_rate", "1e-6"])
    with pytest.raises(RecipeError, match="use_std_normalization=True is ignored"):
        parse_recipe_args("gsm8k", [*GSM8K, "--pg_loss_type", "no_baseline", "--use_std_normalization", "true"])


def test_every_field_that_may_be_none_takes_null_on_the_command_line():
    parser = make_parser("grpo")
    hints = {}
    for dataclass_type in parser.dataclass_types:
        types = typing.get_type_hints(dataclass_type)
        hints.update({f.name: types[f.name] for f in dataclasses.fields(dataclass_type) if f.init})
    optional = sorted(name for name, hint in hints.items() if type(None) in typing.get_args(hint))
    assert {"use_std_normalization", "pg_loss_type", "reward_funcs", "generation_kwargs", "advantage_eps"} <= set(
        optional
    )
    for name in optional:
        namespace, rest = parser.parse_known_args([f"--{name}", "null"])
        assert getattr(namespace, name) is None and rest == [], name
    with pytest.raises(SystemExit):  # a field that cannot be None still refuses it
        parser.parse_known_args(["--learning_rate", "null"])
    # `none` stays a value where it is one: eval_split 'none' disables validation, report_to 'none' logs nowhere
    namespace, _ = parser.parse_known_args(["--eval_split", "none", "--report_to", "none"])
    assert namespace.eval_split == "none" and namespace.report_to == "none"
