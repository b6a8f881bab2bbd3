"""Reward specs of a recipe -> TRL reward callables: registry names, `module:function` / `module:Class` import
paths, and keyword arguments for parameterised rewards.

    countdown                                              a ready instance of `REWARD_FUNCS`
    soft_overlong(max_length=1024, buffer_length=256)      a class of `REWARD_CLASSES`, built with the arguments
    my_pkg.rewards:length_reward                           a function, imported
    my_pkg.rewards:LengthReward(target=200)                a class, imported and built (picklable if defined at
                                                           module level; `__name__` names its metrics)

Arguments are keywords with Python literal values (`ast.literal_eval`); nothing else is evaluated. Every failure is
a ValueError naming the spec and the module, attribute or argument at fault, raised when a recipe is parsed, before
a model loads.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from collections.abc import Mapping

__all__ = ["parse_reward_spec", "resolve_reward_spec", "split_reward_specs"]

_SPEC = re.compile(r"^\s*(?P<name>[A-Za-z_][\w.]*(?::[A-Za-z_][\w.]*)?)\s*(?:\((?P<args>.*)\))?\s*$", re.DOTALL)


def split_reward_specs(names: str) -> list[str]:
    """Split a comma-separated list of specs, keeping commas inside parentheses: `"a, b(x=1, y=2)"` -> 2 specs."""
    specs, depth, current = [], 0, []
    for ch in names:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            specs.append("".join(current))
            current = []
        else:
            current.append(ch)
    specs.append("".join(current))
    return [spec.strip() for spec in specs if spec.strip()]


def parse_reward_spec(spec: str) -> tuple[str, dict]:
    """`"name(k=v, ...)"` -> `("name", {k: v})`; `name` may be `module.path:attr`.

    Raises:
        ValueError: malformed spec, positional or `**` arguments, or a value that is not a Python literal.
    """
    match = _SPEC.match(spec) if isinstance(spec, str) else None
    if match is None:
        raise ValueError(
            f"reward function {spec!r}: expected a registry name or module.path:attr, optionally with keyword "
            "arguments, e.g. 'soft_overlong(max_length=1024, buffer_length=256)'"
        )
    name, args = match["name"], match["args"]
    if args is None or not args.strip():
        return name, {}
    try:
        call = ast.parse(f"f({args})", mode="eval").body
    except SyntaxError as err:
        raise ValueError(f"reward function {spec!r}: cannot parse the arguments {args!r}: {err.msg}") from err
    if call.args or any(kw.arg is None for kw in call.keywords):
        raise ValueError(f"reward function {spec!r}: give arguments as keywords, e.g. {name}(max_length=1024)")
    kwargs = {}
    for kw in call.keywords:
        try:
            kwargs[kw.arg] = ast.literal_eval(kw.value)
        except ValueError as err:
            raise ValueError(
                f"reward function {spec!r}: argument {kw.arg}={ast.unparse(kw.value)} is not a Python literal"
            ) from err
    return name, kwargs


def _import_attr(spec: str, path: str):
    module_name, _, attr_path = path.partition(":")
    try:
        obj = importlib.import_module(module_name)
    except Exception as err:  # a broken user module can raise anything on import
        raise ValueError(
            f"reward function {spec!r}: cannot import module {module_name!r} ({type(err).__name__}: {err}); is it "
            "installed or on PYTHONPATH?"
        ) from err
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"reward function {spec!r}: module {module_name!r} has no attribute {attr_path!r}")
        obj = getattr(obj, part)
    return obj


def _build(spec: str, cls: type, kwargs: dict):
    try:
        return cls(**kwargs)
    except TypeError as err:
        params = inspect.signature(cls).parameters.values()
        shown = ", ".join(p.name if p.default is p.empty else f"{p.name}={p.default!r}" for p in params)
        raise ValueError(f"reward function {spec!r}: {cls.__name__}({shown}): {err}") from err


def resolve_reward_spec(spec: str, funcs: Mapping[str, object], classes: Mapping[str, type]):
    """One TRL reward callable from a spec (module docstring: the forms).

    Args:
        spec: the recipe's string.
        funcs: ready instances by registry name (`REWARD_FUNCS`).
        classes: parameterised reward classes by registry name (`REWARD_CLASSES`).

    Raises:
        ValueError: unknown name (listing the valid ones), an import that fails (naming the module) or a missing
            attribute (naming it), arguments a function or ready instance cannot take, bad arguments of a class,
            or a result that is not callable or has no `__name__` (TRL names the reward's metrics after it).
    """
    name, kwargs = parse_reward_spec(spec)
    if name in funcs:
        if kwargs:
            raise ValueError(f"reward function {spec!r}: the registered {name!r} takes no arguments")
        return funcs[name]
    if name in classes:
        return _build(spec, classes[name], kwargs)
    if ":" not in name:
        valid = sorted({*funcs, *classes})
        raise ValueError(f"unknown reward function(s) [{name!r}]; valid: {valid}, or an import path module:function")
    obj = _import_attr(spec, name)
    if inspect.isclass(obj):
        obj = _build(spec, obj, kwargs)
    elif kwargs:
        raise ValueError(f"reward function {spec!r}: {name} is not a class, so it takes no arguments")
    if not callable(obj):
        raise ValueError(f"reward function {spec!r}: {name} is a {type(obj).__name__}, not a callable")
    if not isinstance(getattr(obj, "__name__", None), str):
        raise ValueError(
            f"reward function {spec!r}: the instance has no `__name__`; give its class a `__name__ = ...` attribute "
            "(TRL logs rewards/<__name__>/mean)"
        )
    return obj
