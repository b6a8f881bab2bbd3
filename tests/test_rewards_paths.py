"""Reward specs in recipes: registry names, `module:function` / `module:Class(...)` import paths, keyword
arguments, and the `soft_overlong` shaping reward (checked against TRL's own `get_soft_overlong_punishment`)."""

from __future__ import annotations

import pickle
import textwrap
from pathlib import Path

import pytest

from trl_ext.recipes import parse_recipe_args
from trl_ext.rewards import (
    REWARD_CLASSES,
    SoftOverlong,
    countdown_reward,
    get_reward_funcs,
    soft_overlong_penalty,
)
from trl_ext.rewards.resolve import parse_reward_spec, split_reward_specs

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
USER_MODULE = textwrap.dedent(
    '''
    """A user's reward module, imported by path from a recipe."""


    def length_reward(completions, **kwargs):
        return [float(len(c)) for c in completions]


    class TargetLength:
        __name__ = "target_length"

        def __init__(self, target=10, scale=1.0):
            self.target, self.scale = target, scale

        def __call__(self, completions, **kwargs):
            return [-self.scale * abs(len(c) - self.target) for c in completions]


    class Nameless:
        def __call__(self, completions, **kwargs):
            return [0.0] * len(completions)


    NOT_CALLABLE = 3
    '''
)


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """`my_rewards_pkg.rewards` on sys.path (a package, so dotted module paths are exercised)."""
    package = tmp_path / "my_rewards_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "rewards.py").write_text(USER_MODULE)
    (package / "broken.py").write_text("raise RuntimeError('this module fails on import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_rewards_pkg.rewards"


def test_import_paths_resolve_to_the_function_and_a_built_instance(user_module):
    from my_rewards_pkg.rewards import TargetLength, length_reward

    specs = [f"{user_module}:length_reward", f"{user_module}:TargetLength(target=3, scale=0.5)"]
    func, built = get_reward_funcs(specs)
    assert func is length_reward
    assert isinstance(built, TargetLength) and (built.target, built.scale) == (3, 0.5)
    assert built(["abcde", "a"]) == [-1.0, -1.0]  # |5 - 3| * 0.5, |1 - 3| * 0.5
    clone = pickle.loads(pickle.dumps(built))  # TRL's async rollout worker pickles reward functions
    assert (clone.__name__, clone.target, clone.scale) == ("target_length", 3, 0.5)
    assert get_reward_funcs(f"{user_module}:TargetLength")[0].target == 10  # a class without arguments: defaults


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        # the module is named, whether it is missing or fails on import
        ("no_such_pkg_xyz.rewards:f", r"cannot import module 'no_such_pkg_xyz\.rewards' \(ModuleNotFoundError"),
        ("my_rewards_pkg.broken:f", r"cannot import module 'my_rewards_pkg\.broken' \(RuntimeError: this module"),
        # the attribute is named
        ("my_rewards_pkg.rewards:nope", r"module 'my_rewards_pkg\.rewards' has no attribute 'nope'"),
        ("my_rewards_pkg.rewards:TargetLength.nope", r"has no attribute 'TargetLength\.nope'"),
        # arguments only for classes, only keywords, only literals (nothing is evaluated)
        ("my_rewards_pkg.rewards:length_reward(x=1)", "is not a class, so it takes no arguments"),
        ("my_rewards_pkg.rewards:TargetLength(3)", "give arguments as keywords"),
        ("my_rewards_pkg.rewards:TargetLength(target=__import__('os'))", "is not a Python literal"),
        ("my_rewards_pkg.rewards:TargetLength(bogus=1)", r"TargetLength\(target=10, scale=1\.0\): .*bogus"),
        ("my_rewards_pkg.rewards:NOT_CALLABLE", "is a int, not a callable"),
        ("my_rewards_pkg.rewards:Nameless", "has no `__name__`"),
        ("countdown(require_all=True)", "the registered 'countdown' takes no arguments"),
        ("soft_overlong", r"SoftOverlong\(max_length, buffer_length, penalty=1\.0\): .*missing"),
        ("nope", r"unknown reward function\(s\) \['nope'\]; valid: \['countdown', .*'soft_overlong'"),
        ("my rewards", "expected a registry name or module.path:attr"),
    ],
)
def test_bad_specs_name_what_is_wrong(user_module, spec, message):
    with pytest.raises(ValueError, match=message):
        get_reward_funcs([spec])


def test_spec_parsing_and_comma_separated_lists():
    assert parse_reward_spec("soft_overlong(max_length=8, buffer_length=2, penalty=0.5)") == (
        "soft_overlong",
        {"max_length": 8, "buffer_length": 2, "penalty": 0.5},
    )
    assert parse_reward_spec(" a.b:C ") == ("a.b:C", {})
    # commas inside the parentheses do not split
    assert split_reward_specs("countdown, soft_overlong(max_length=8, buffer_length=2),r1_zero") == [
        "countdown",
        "soft_overlong(max_length=8, buffer_length=2)",
        "r1_zero",
    ]
    funcs = get_reward_funcs("countdown, soft_overlong(max_length=8, buffer_length=2)")
    assert funcs[0] is countdown_reward and isinstance(funcs[1], SoftOverlong) and funcs[1].max_length == 8


def test_soft_overlong_equals_trl_soft_overlong_punishment():
    from trl.rewards import get_soft_overlong_punishment

    max_length, buffer_length = 20, 6
    ids = [[7] * n for n in range(0, max_length + 4)]
    ours = SoftOverlong(max_length=max_length, buffer_length=buffer_length)(completion_ids=ids)
    assert ours == pytest.approx(get_soft_overlong_punishment(max_length, buffer_length)(completion_ids=ids))
    # by hand, L_max 10, buffer 4: free up to 6 tokens, then -1/4 per token, -1 from L_max on
    by_hand = {0: 0.0, 6: 0.0, 7: -0.25, 8: -0.5, 10: -1.0, 11: -1.0}
    assert {n: soft_overlong_penalty(n, 10, 4) for n in by_hand} == by_hand
    assert soft_overlong_penalty(8, 10, 4, penalty=0.5) == -0.25  # verl's penalty_factor scales it


def test_soft_overlong_is_a_picklable_registered_shaping_reward():
    reward = get_reward_funcs(["soft_overlong(max_length=10, buffer_length=4, penalty=2.0)"])[0]
    assert REWARD_CLASSES["soft_overlong"] is SoftOverlong
    clone = pickle.loads(pickle.dumps(reward))
    assert clone.__name__ == "soft_overlong" and clone.shaping is True
    assert clone(completions=["x"] * 2, completion_ids=[[1] * 8, [1] * 3]) == [-1.0, 0.0]
    with pytest.raises(ValueError, match="needs `completion_ids`"):
        reward(completions=["x"])
    for kwargs, message in [
        ({"max_length": 4, "buffer_length": 5}, "buffer_length=5 must be <= max_length=4"),
        ({"max_length": 0, "buffer_length": 0}, "max_length=0 must be a positive integer"),
        ({"max_length": 4, "buffer_length": 2, "penalty": -1}, "penalty=-1 must be a number >= 0"),
    ]:
        with pytest.raises(ValueError, match=message):
            SoftOverlong(**kwargs)


def _recipe(tmp_path, rewards: str, extra: str = "") -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(f"base: {RECIPES / 'countdown' / 'base.yaml'}\nreward_funcs: {rewards}\n{extra}")
    return path


def test_recipes_resolve_reward_specs_when_parsed(tmp_path, user_module):
    """Parsing alone (no model, no data) imports the paths and checks the shaping against the config."""
    ok = _recipe(
        tmp_path,
        f"[countdown, '{user_module}:TargetLength(target=5)', 'soft_overlong(max_length=512, buffer_length=128)']",
        "max_completion_length: 512\n",
    )
    script_args, _, _ = parse_recipe_args("countdown", ["--config", str(ok), "--use_cpu", "true"])
    assert script_args.reward_funcs[1] == f"{user_module}:TargetLength(target=5)"

    missing = _recipe(tmp_path, "[countdown, 'no_such_pkg_xyz:reward']")
    with pytest.raises(ValueError, match="cannot import module 'no_such_pkg_xyz'"):
        parse_recipe_args("countdown", ["--config", str(missing), "--use_cpu", "true"])
    too_long = _recipe(tmp_path, "['soft_overlong(max_length=2048, buffer_length=128)']")
    with pytest.raises(ValueError, match="max_length=2048 exceeds max_completion_length=1024"):
        parse_recipe_args("countdown", ["--config", str(too_long), "--use_cpu", "true"])
