"""`demo_warm_start: true`: a Countdown recipe that trains the CPU demo's GRPO phase (recipes/countdown/cpu_demo.yaml)
on the CPU testbed (`trl_ext.testbed`, which the demo shares).

- the model: the testbed's SFT warm start, built into `model_name_or_path` by the run's first step when it is not
  there (`trl_ext.testbed.warm_start.ensure_warm_start`; the preflight's plan shows the step, the checks build
  nothing); with `demo_working: true` the warm start taught to write a worked search before its answer (the
  testbed's `working`, 192 positions), whose response length is free apart from its correctness;
- the training problems: the testbed's unlabelled ones (`limit` keeps the first N), compact prompts; `data_seed`
  reorders them (the same sampling seed, another data order);
- the validation: the testbed's held-out problems (`eval_limit`: the first N of the 512) scored by
  `trl_ext.testbed.heldout.evaluate` (greedy accuracy, and the mean accuracy of `num_generations_eval` samples at
  temperature 1) and the responses' entropy, mean length, mean length of the correct and of the incorrect
  responses (in tokens), at step 0, every `eval_steps` and after the last step (`final_eval`); sampled as the
  rollouts are. With `static_cache_generation` the sampling goes through `trl_ext.static_cache`, which gives each
  token's entropy as it samples, so the response statistics are those of the `num_generations_eval` samples per
  problem that the sampled accuracy scores (no sampling or forward of their own); otherwise (or with
  `num_generations_eval: 0`) `heldout.response_stats` draws one sample per problem for them.
  The numbers go into the trainer's log history as `heldout/<name>` (trainer_state.json), where `trl-ext study
  report` and `trl-ext plot` read them; TRL's own evaluation does not run.

The recipe states no data fields: the problems are the demo's. A field the combination ignores is an error.
"""

from __future__ import annotations

from dataclasses import fields

from trl_ext.recipes.yaml_chain import RecipeError

#: Prefix of the held-out numbers in the log history.
PREFIX = "heldout/"
#: Recipe fields that name data or a model build the demo's problems and warm start replace.
REPLACED = ("dataset_source", "dataset_split", "eval_source", "eval_split", "tiny_model")


def check_demo_recipe(stated: dict, script_args, training_args) -> None:
    """The checks of a `demo_warm_start` recipe, before anything is built or loaded.

    Raises:
        RecipeError: naming the field that the combination ignores or that contradicts the warm start.
    """
    from trl_ext.testbed.config import WORKING_POSITIONS, TestbedConfig, longest_prompt_tokens, model_positions

    testbed = warm_start_config(script_args)
    longest_prompt = longest_prompt_tokens(testbed)
    if longest_prompt + training_args.max_completion_length > model_positions(testbed):
        raise RecipeError(
            f"max_completion_length {training_args.max_completion_length} and the longest compact prompt "
            f"({longest_prompt} tokens) exceed the warm start's {model_positions(testbed)} positions"
            + ("" if script_args.demo_working else f" (demo_working: true gives {WORKING_POSITIONS})")
        )
    for name in REPLACED:
        if name in stated:
            raise RecipeError(f"{name} has no effect with demo_warm_start (the demo's problems and model); remove it")
    if script_args.prompt != "compact" or script_args.chat_template:
        raise RecipeError(
            f"demo_warm_start trains the demo's model, which reads compact prompts without a chat template: "
            f"set prompt: compact and chat_template: false (got prompt {script_args.prompt!r}, chat_template "
            f"{script_args.chat_template})"
        )
    size = TestbedConfig().num_eval_problems
    if script_args.eval_limit is None or not 1 <= script_args.eval_limit <= size:
        raise RecipeError(
            f"eval_limit={script_args.eval_limit}: demo_warm_start validates on the first N of the demo's "
            f"{size} held-out problems; give 1..{size}"
        )
    strategy = str(getattr(training_args.eval_strategy, "value", training_args.eval_strategy))
    if strategy not in ("steps", "no"):
        raise RecipeError(f"eval_strategy={strategy!r}: demo_warm_start validates by steps (eval_steps) or not ('no')")
    if strategy == "no" and not script_args.final_eval:
        for name in ("eval_limit", "eval_steps", "num_generations_eval"):
            if name in stated:
                raise RecipeError(f"{name} has no effect: eval_strategy 'no' and final_eval false never validate")
    if (training_args.num_generations_eval or 0) < 0:
        raise RecipeError(f"num_generations_eval={training_args.num_generations_eval} must be >= 0")
    default = {f.name: f.default for f in fields(type(training_args))}["per_device_eval_batch_size"]
    if training_args.per_device_eval_batch_size != default:
        raise RecipeError(
            "per_device_eval_batch_size has no effect with demo_warm_start (the held-out set is scored in one batch)"
        )


def warm_start_config(script_args):
    """The `TestbedConfig` whose warm start the recipe trains from: the testbed's defaults, with `working` when the
    recipe sets `demo_working`."""
    from trl_ext.testbed.config import TestbedConfig

    return TestbedConfig(working=bool(script_args.demo_working))


def check_warm_start_folder(path: str, script_args) -> None:
    """A model already in `path` is the warm start the recipe asks for: its positions are that warm start's (a folder
    built for the other one would train the wrong model without a word). Reads `config.json` only.

    Raises:
        RecipeError: naming model_name_or_path and both warm starts.
    """
    import json
    from pathlib import Path

    from trl_ext.testbed.config import model_positions

    config = Path(path) / "config.json"
    if not config.is_file():
        return
    expected = model_positions(warm_start_config(script_args))
    found = json.loads(config.read_text()).get("max_position_embeddings")
    if found != expected:
        wanted = "working (demo_working: true)" if script_args.demo_working else "compact"
        raise RecipeError(
            f"model_name_or_path {path} holds a model with {found} positions, not the {wanted} warm start's "
            f"{expected}: point model_name_or_path at another folder (each warm start is built into its own)"
        )


def load_demo_datasets(script_args, data_seed: int | None = None):
    """(training dataset of the testbed's unlabelled problems, the held-out problems to validate on).

    `data_seed` (the training arguments' `data_seed`), when set, shuffles the problems before the trainer's sampler
    draws its seed's order over them: two runs of one seed then see the problems in different orders with the same
    sampling seed (a noise-floor pair of an ablation study)."""
    import random

    from trl_ext.testbed.problems import grpo_dataset
    from trl_ext.testbed.warm_start import testbed_problems

    unlabelled, held_out = testbed_problems()
    if script_args.limit is not None:
        unlabelled = unlabelled[: script_args.limit]
    if data_seed is not None:
        unlabelled = list(unlabelled)
        random.Random(data_seed).shuffle(unlabelled)
    return grpo_dataset(unlabelled), held_out[: script_args.eval_limit]


def validation_points(
    max_steps: int, eval_strategy: str, eval_steps: float | None, final: bool, on_start: bool = False
) -> list[int]:
    """The optimizer steps after which the held-out set is scored: 0 (the start) with `on_start`, every
    `eval_steps` (a fraction below 1 is of `max_steps`, rounded up, as transformers reads it) and `max_steps` with
    `final`."""
    import math

    points: set[int] = {0} if on_start else set()
    if eval_strategy == "steps" and eval_steps:
        every = math.ceil(max_steps * eval_steps) if eval_steps < 1 else int(eval_steps)
        points |= set(range(every, max_steps + 1, every))
    if final:
        points.add(max_steps)
    return sorted(points)


def heldout_numbers(
    model, tokenizer, problems: list[dict], num_samples: int, max_new_tokens: int, static_cache: bool = False
) -> dict:
    """The `heldout/*` numbers of one validation (module docstring); `static_cache`: sampled through
    `trl_ext.static_cache` (the run's `static_cache_generation`)."""
    import time

    from trl_ext.testbed.heldout import evaluate, response_stats

    started, cpu = time.perf_counter(), time.process_time()
    scores = evaluate(model, tokenizer, problems, num_samples, max_new_tokens, static_cache)
    stats = scores.get("response") or response_stats(model, tokenizer, problems, max_new_tokens, static_cache)
    out = {"greedy_accuracy": scores["greedy_accuracy"]}
    if num_samples:
        out["sampled_accuracy"] = scores["sampled_accuracy"]
        out[f"pass@{num_samples}"] = scores[f"pass@{num_samples}"]
    out.update(
        entropy=stats["entropy"],
        mean_length=stats["mean_length"],
        correct_length=stats["correct_length"],
        incorrect_length=stats["incorrect_length"],
        sample_accuracy=stats["accuracy"],
        seconds=time.perf_counter() - started,
        cpu_seconds=time.process_time() - cpu,
    )
    return {PREFIX + k: v for k, v in out.items() if v is not None}


def heldout_callback(tokenizer, problems: list[dict], training_args, final: bool):
    """A `TrainerCallback` that scores `problems` at `validation_points` and appends `{"heldout/...": ..., "step"}`
    to the trainer's log history (main process only). Reads the eval schedule from `training_args`; the caller then
    turns TRL's own evaluation off."""
    from transformers import TrainerCallback

    strategy = str(getattr(training_args.eval_strategy, "value", training_args.eval_strategy))
    eval_steps = training_args.eval_steps
    on_start = bool(training_args.eval_on_start)
    num_samples = training_args.num_generations_eval or 0
    max_new_tokens = training_args.max_completion_length
    static_cache = bool(getattr(training_args, "static_cache_generation", False))

    class HeldoutValidation(TrainerCallback):
        def __init__(self):
            self.tokenizer = tokenizer  # None: set once the trainer has loaded it (`trainer.processing_class`)

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            self.points = set(validation_points(state.max_steps, strategy, eval_steps, final, on_start))
            if state.global_step == 0 and 0 in self.points:
                self._measure(state, model)

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step in self.points:
                self._measure(state, model)

        def _measure(self, state, model) -> None:
            if not state.is_world_process_zero:
                return
            numbers = heldout_numbers(
                getattr(model, "module", model), self.tokenizer, problems, num_samples, max_new_tokens, static_cache
            )
            state.log_history.append({**numbers, "step": state.global_step})
            shown = ", ".join(f"{k.removeprefix(PREFIX)} {v:.4g}" for k, v in numbers.items())
            print(f"held-out ({len(problems)} problems) at step {state.global_step}: {shown}", flush=True)

    return HeldoutValidation()
