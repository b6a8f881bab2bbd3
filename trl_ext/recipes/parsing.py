"""Recipe command lines: `TrlParser` with `--config` YAML `base:` chains, then the steps and generation settings
derived from the parsed values (`max_steps` from `n_grpo_steps`, vLLM-only sampling options).

A recipe that states `train_batch_size` and `per_device_train_batch_size` but not `gradient_accumulation_steps` gets
GA derived for the number of training processes (`trl_ext.preflight.batch.derive_gradient_accumulation`), so the
same YAML trains 256 completions per step on 1, 2, 4 or 8 GPUs.

Every flag a YAML can set, the command line can set or unset: a field that may be None takes `null` (YAML's spelling
of None; `--use_std_normalization null`, `--reward_funcs null`). A flag that changes an objective axis
(`trl_ext.grpo.axes.AXIS_FIELDS`) can make a value the YAML states for another field meaningless: `--pg_loss_type
no_baseline` on a recipe with `use_std_normalization: true` (raw rewards have no std). Such a YAML value is dropped,
with a warning naming it and its file, because it would not change what trains. When a flag contradicts a YAML value
instead (both would change what trains), the error names the flag that unsets the YAML's value."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import difflib
import logging
import os
import sys
import threading
import typing
from collections.abc import Sequence
from pathlib import Path

from trl_ext.preflight.batch import derive_gradient_accumulation
from trl_ext.preflight.environment import world_size_from_env
from trl_ext.recipes.arguments import EIScriptArguments, GRPOScriptArguments, SFTScriptArguments, apply_task_defaults
from trl_ext.recipes.stated import cli_overrides
from trl_ext.recipes.yaml_chain import RecipeError, load_recipe_yaml_with_sources

logger = logging.getLogger(__name__)

# Sampling options only vLLM understands; the transformers backend gets an equivalent or a warning (see
# `adapt_generation_kwargs`).
VLLM_ONLY_GENERATION_KWARGS = ("stop", "include_stop_str_in_output")


def _recipe_parser_class():
    from trl import TrlParser

    class RecipeParser(TrlParser):
        """`TrlParser` whose `--config` YAML may have a `base:` chain; unknown keys name their file; `null` unsets
        any field that may be None (module docstring)."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._null_lists = accept_null(self)
            self.dropped: list[str] = []  # YAML values dropped by the last parse (module docstring)

        def parse_known_args(self, args=None, namespace=None):
            namespace, remaining = super().parse_known_args(args, namespace)
            for dest in self._null_lists:  # `--reward_funcs null` arrives as [None]
                if getattr(namespace, dest, None) == [None]:
                    setattr(namespace, dest, None)
            return namespace, remaining

        def parse_args_and_config(self, args: Sequence[str] | None = None, **kwargs):
            args = list(sys.argv[1:] if args is None else args)
            config_path = pop_config_flag(args)
            if config_path is None:
                return self.parse_args_into_dataclasses(args=args)
            config, sources = load_recipe_yaml_with_sources(config_path)
            env = config.pop("env", None) or {}
            if not isinstance(env, dict):
                raise RecipeError(f"{sources['env']}: `env` must be a mapping of variable: value")
            known = {action.dest for action in self._actions}
            for key in config:
                if key not in known:
                    close = difflib.get_close_matches(key, sorted(known), n=3)
                    hint = f"; did you mean {', '.join(close)}?" if close else ""
                    raise RecipeError(
                        f"{sources[key]}: unknown key {key!r} (not a field of "
                        f"{', '.join(t.__name__ for t in self.dataclass_types)}){hint}"
                    )
            for name, value in env.items():
                os.environ[str(name)] = str(value)
            _derive_gradient_accumulation(config, args)
            # Runs land in runs/<recipe folder>/<recipe name> unless the recipe or the command line says otherwise.
            name = f"{Path(config_path).resolve().parent.name}/{Path(config_path).stem}"
            if "output_dir" in known:
                config.setdefault("output_dir", str(Path("runs") / name))
            if "run_name" in known:
                config.setdefault("run_name", name)
            self.set_defaults_with_config(**config)
            return _parse_resolving_axes(self, args, config, sources, Path(config_path).resolve())

    return RecipeParser


def _parse_resolving_axes(parser, args: list[str], config: dict, sources: dict, path: Path):
    """`parse_args_into_dataclasses` with the YAML values that command-line axis flags make meaningless dropped, and
    the YAML values they contradict named with the flags that unset them (module docstring)."""
    from trl_ext.grpo.axes import AXIS_FIELDS, AxisFieldError

    given = fields_on_command_line(parser, args)
    changes_axes = bool(given & set(AXIS_FIELDS))
    parser.dropped, conflicts = [], []
    for _ in range(len(config) + 1):
        try:
            parsed = parser.parse_args_into_dataclasses(args=args)
            break
        except AxisFieldError as err:
            from_yaml = [f for f in err.fields if f not in given and config.get(f) is not None]
            if not (changes_axes and from_yaml) or (not err.ignored and len(from_yaml) == len(err.fields)):
                where = "".join(f"; {f} is set in {sources[f]}" for f in from_yaml)
                raise RecipeError(f"{path}: {err}{where}") from err
            field = from_yaml[0]
            if err.ignored:  # unsetting it changes nothing that trains
                note = f"{sources[field]}: {field}: {config[field]!r} dropped: {str(err).split(';')[0]}"
                parser.dropped.append(f"{note} (set by the command line)")
            else:
                conflicts.append((field, f"{err} ({field} is set in {sources[field]})"))
            config[field] = None
            parser.set_defaults_with_config(**{field: None})
        except (ValueError, TypeError) as err:
            if conflicts:
                break
            if isinstance(err, RecipeError):
                raise
            raise RecipeError(f"{path}: {err}") from err
    if conflicts:
        flags = " ".join(f"--{field} null" for field, _ in conflicts)
        raise RecipeError(
            f"{path}: the command line contradicts the recipe: {'; '.join(m for _, m in conflicts)}. To drop the "
            f"recipe's value{'s' if len(conflicts) > 1 else ''}, add {flags}"
        )
    for note in parser.dropped:
        logger.warning(note)
    return parsed


def fields_on_command_line(parser, args: Sequence[str]) -> set[str]:
    """Destinations of the flags in `args` (`--key value`, `--key=value`, `--no_key`), by the parser's own options."""
    by_option = {option: action.dest for action in parser._actions for option in action.option_strings}
    return {by_option[token.split("=", 1)[0]] for token in args if token.split("=", 1)[0] in by_option}


class _ChoicesOrNull(list):
    """An argparse `choices` list that also admits None (what `null` parses to); help still lists the choices."""

    def __contains__(self, value) -> bool:
        return value is None or super().__contains__(value)


def _null_or(convert):
    def parse(text):
        return None if isinstance(text, str) and text.lower() == "null" else convert(text)

    parse.__name__ = getattr(convert, "__name__", "value")  # argparse names the type in its error messages
    return parse


def accept_null(parser) -> list[str]:
    """Let every flag whose dataclass field may be None take `null`; returns the list-valued ones (`nargs='+'`).

    TRL's parser already maps `none` / `null` for numbers, not for `bool | None`, `str | None` (where `none` can be a
    real value, as `report_to: none`), choices or lists; `null` is YAML's spelling of None, so it is the one word.
    """
    hints = {}
    for dataclass_type in parser.dataclass_types:
        types = typing.get_type_hints(dataclass_type)
        hints.update({f.name: types[f.name] for f in dataclasses.fields(dataclass_type) if f.init})
    lists = []
    for action in parser._actions:
        hint = hints.get(action.dest)
        if action.type is None or hint is None or type(None) not in typing.get_args(hint):
            continue  # `--no_<flag>` store_false actions, help, fields that cannot be None
        action.type = _null_or(action.type)
        if action.choices is not None:
            action.choices = _ChoicesOrNull(action.choices)
        if action.nargs == "+":
            lists.append(action.dest)
    return lists


def _derive_gradient_accumulation(config: dict, args: Sequence[str]) -> None:
    """Set the YAML's GA for this world size when the recipe gives the micro-batch instead (module docstring)."""
    ga = derive_gradient_accumulation({**config, **cli_overrides(args)}, world_size_from_env())
    if ga is not None:
        config["gradient_accumulation_steps"] = ga


def pop_config_flag(args: list[str]) -> str | None:
    """Remove `--config PATH` / `--config=PATH` from `args` and return PATH (None when absent)."""
    for i, arg in enumerate(args):
        if arg == "--config":
            if i + 1 >= len(args):
                raise RecipeError("--config needs a path to a recipe YAML")
            path = args[i + 1]
            del args[i : i + 2]
            return path
        if arg.startswith("--config="):
            del args[i]
            return arg.split("=", 1)[1]
    return None


def make_parser(kind: str = "grpo", prog: str | None = None, task: str | None = None):
    """The recipe parser for `kind` ("grpo", "sft" or "ei"): (script args, training config, `trl.ModelConfig`)."""
    from trl import ModelConfig, SFTConfig

    if kind == "grpo":
        from trl_ext.grpo.config import AblationGRPOConfig

        types = (GRPOScriptArguments, AblationGRPOConfig, ModelConfig)
    elif kind == "sft":
        types = (SFTScriptArguments, SFTConfig, ModelConfig)
    elif kind == "ei":
        from trl_ext.expert_iteration.config import ExpertIterationConfig

        types = (EIScriptArguments, ExpertIterationConfig, ModelConfig)
    else:
        raise ValueError(f"kind={kind!r}; choose 'grpo', 'sft' or 'ei'")
    epilog = (
        "--config YAML: a recipe (recipes/<task>/*.yaml) whose keys are the flags above; `base: other.yaml` "
        "inherits from another recipe; command-line flags override the YAML."
    )
    if task == "countdown":
        epilog += (
            " --demo [flags] runs the embedded CPU demo instead (python -m trl_ext.demo --help lists its flags). "
            "Without --config or --demo the demo runs only where no GPU is visible; with a GPU visible the script "
            "exits and prints the GPU recipe command."
        )
    return _recipe_parser_class()(types, prog=prog, epilog=epilog)


# `parse_recipe_args`'s parsers, built once per process and kind (see `_recipe_parser`).
_PARSERS: dict[tuple[str, str | None, str], tuple[typing.Any, list]] = {}
_PARSERS_LOCK = threading.Lock()


@contextlib.contextmanager
def _recipe_parser(kind: str, task: str | None):
    """`make_parser(kind, task=task)`, built once per process: building one costs ~25 ms of CPU (about 250 options
    from three dataclasses), most of a recipe's parse, and a study or the planning table parses hundreds of recipes.
    A parse changes only its options' `default` and `required` (the YAML's values become defaults) and `dropped`:
    each use starts from the values the parser was built with, the defaults deep-copied (a list default a caller
    grows in place never reaches the next parse). A nested or concurrent parse gets a parser of its own."""
    if not _PARSERS_LOCK.acquire(blocking=False):
        yield make_parser(kind, task=task)
        return
    try:
        key = (kind, task, os.path.basename(sys.argv[0]) if sys.argv else "")  # argparse's `prog` comes from argv
        if key not in _PARSERS:
            parser = make_parser(kind, task=task)
            _PARSERS[key] = (parser, [(action, action.default, action.required) for action in parser._actions])
        parser, built = _PARSERS[key]
        for action, default, required in built:
            action.default, action.required = copy.deepcopy(default), required
        parser.dropped = []
        yield parser
    finally:
        _PARSERS_LOCK.release()


def parse_recipe_args(task: str, argv: Sequence[str] | None = None):
    """Parse a recipe's command line (`--config YAML` plus overrides) for `task`.

    Args:
        task: "countdown", "gsm8k", "math" (GRPO) or "sft".
        argv: command-line arguments without the program name (default: `sys.argv[1:]`).

    Returns:
        `(script_args, training_args, model_args)`; for GRPO tasks the task defaults are applied and `max_steps`
        is derived from `n_grpo_steps`.
    """
    kind = "sft" if task == "sft" else "grpo"
    with _recipe_parser(kind, task) as parser:
        script_args, training_args, model_args = parser.parse_args_and_config(argv)
    if kind == "grpo":
        apply_task_defaults(task, script_args)
        resolve_max_steps(script_args, training_args)
        from trl_ext.rewards import get_reward_funcs

        get_reward_funcs(script_args.reward_funcs, training_args)  # imports `module:function` names: fail early
    return script_args, training_args, model_args


def optimizer_steps_per_rollout(training_args) -> int:
    """Optimizer steps TRL takes per rollout (generation) batch.

    One rollout batch holds `generation_batch_size` completions; TRL cuts it into `steps_per_generation`
    micro-batches per process and passes over it `num_iterations` times; each optimizer step consumes
    `gradient_accumulation_steps` micro-batches:

        steps = num_iterations * steps_per_generation / gradient_accumulation_steps
              = epochs_per_rollout_batch * rollout_batch_size / train_batch_size      (the courses' vocabulary)
    """
    micro = training_args.num_iterations * training_args.steps_per_generation
    ga = training_args.gradient_accumulation_steps
    if micro % ga:
        raise RecipeError(
            f"num_iterations * steps_per_generation = {micro} micro-batches per rollout batch is not a whole number "
            f"of optimizer steps (gradient_accumulation_steps={ga}); make rollout_batch_size a multiple of "
            "train_batch_size"
        )
    return micro // ga


def resolve_max_steps(script_args: GRPOScriptArguments, training_args) -> None:
    """Set `training_args.max_steps` from `n_grpo_steps` (one GRPO step = one rollout batch)."""
    if script_args.n_grpo_steps is None:
        return
    if script_args.n_grpo_steps < 1:
        raise RecipeError(f"n_grpo_steps={script_args.n_grpo_steps} must be >= 1")
    max_steps = script_args.n_grpo_steps * optimizer_steps_per_rollout(training_args)
    if training_args.max_steps > 0 and training_args.max_steps != max_steps:
        raise RecipeError(
            f"max_steps={training_args.max_steps} contradicts n_grpo_steps={script_args.n_grpo_steps} (which gives "
            f"max_steps={max_steps}); set only one of them"
        )
    training_args.max_steps = max_steps


def adapt_generation_kwargs(training_args) -> list[str]:
    """Make `generation_kwargs` (written for vLLM's SamplingParams) valid for the generation backend in use.

    vLLM (server and colocate modes) takes `stop`, `include_stop_str_in_output` and `min_tokens` as they are.
    The transformers backend (`use_vllm: false`) gets `min_tokens` renamed to `min_new_tokens`; its stop strings
    need a tokenizer passed to `generate()`, which TRL does not do, so `stop` / `include_stop_str_in_output` are
    dropped there (with a warning): completions then run to EOS or `max_completion_length`, and the rewards grade
    the first `</answer>`-closed answer anyway.

    Returns:
        The dropped keys (empty with vLLM).
    """
    kwargs = training_args.generation_kwargs
    if training_args.use_vllm or not kwargs:
        return []
    kwargs = dict(kwargs)
    if "min_tokens" in kwargs:
        kwargs["min_new_tokens"] = kwargs.pop("min_tokens")
    dropped = [key for key in VLLM_ONLY_GENERATION_KWARGS if kwargs.pop(key, None) is not None]
    if dropped:
        logger.warning(
            "generation_kwargs %s apply to vLLM only; the transformers backend ignores them (no stop at </answer>)",
            dropped,
        )
    training_args.generation_kwargs = kwargs or None
    return dropped
