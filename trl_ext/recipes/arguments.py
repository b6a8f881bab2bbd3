"""The recipes' script-argument dataclasses (GRPO and SFT) and the per-task defaults they fall back to."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trl_ext.recipes.yaml_chain import RecipeError

# Per task: default prompt, reward functions, and the splits that keep training and validation disjoint.
# Countdown's are `auto`, read from the source when the data loads (trl_ext.tasks.splits): its own held-out split
# when it has one (validation, valid, dev, test), else its last 1024 rows of `train` (then training on the rest).
TASK_DEFAULTS: dict[str, dict[str, Any]] = {
    "countdown": {
        "prompt": "countdown",
        "reward_funcs": ["countdown"],
        "dataset_split": "auto",
        "eval_split": "auto",
    },
    "gsm8k": {"prompt": "r1_zero", "reward_funcs": ["r1_zero"], "dataset_split": "train", "eval_split": "test"},
    "math": {"prompt": "r1_zero", "reward_funcs": ["r1_zero"], "dataset_split": "train", "eval_split": "test"},
    # One problem asked over and over (trl_ext.tasks.kissing): validation samples the same prompt.
    "kissing": {"prompt": "kissing", "reward_funcs": ["kissing"], "dataset_split": "train", "eval_split": "train"},
}
SFT_DEFAULT_DATASET = "PrimeIntellect/INTELLECT-MATH-SFT-Data"

# The entry point of each recipe folder (`recipes/<folder>/<x>.yaml` runs with `recipes/<script>`): the folder's name,
# but for MATH, whose script named `math.py` would be what `import math` finds for any program run with recipes/ first
# on sys.path (`python recipes/<x>.py` puts it there).
RECIPE_SCRIPTS = {
    "countdown": "countdown.py",
    "gsm8k": "gsm8k.py",
    "math": "math_grpo.py",
    "kissing": "kissing.py",
    "sft": "sft.py",
    "expert_iteration": "expert_iteration.py",
}


def recipe_script(folder: str) -> str:
    """The entry point's file name for the recipes of `recipes/<folder>/` (`math` -> `math_grpo.py`)."""
    return RECIPE_SCRIPTS.get(folder, f"{folder}.py")


def script_task(script) -> str | None:
    """The GRPO task a recipe entry point trains (`recipes/math_grpo.py` -> "math"), None for any other script."""
    name = Path(script).name
    return next((task for task in TASK_DEFAULTS if RECIPE_SCRIPTS.get(task) == name), None)


@dataclass
class GRPOScriptArguments:
    """Recipe fields that are neither training-config nor model fields (GRPO recipes: countdown, gsm8k, math).

    `None` means the task's default (`trl_ext.recipes.TASK_DEFAULTS`), filled in by `apply_task_defaults`.
    """

    dataset_source: str | None = field(
        default=None,
        metadata={"help": "Training problems: a hub dataset id or a local .parquet/.jsonl file. Default: the task's."},
    )
    dataset_split: str | None = field(
        default=None,
        metadata={
            "help": "Split of dataset_source, with datasets' slicing (e.g. 'train[:-1024]'); 'auto': 'train', or "
            "'train[:-1024]' when validation takes the last 1024 rows of the same 'train'. Default: the task's "
            "(Countdown: 'auto'; GSM8K, MATH: 'train')."
        },
    )
    limit: int | None = field(default=None, metadata={"help": "Use only the first N training problems."})
    prompt: str | None = field(
        default=None,
        metadata={
            "help": "Prompt template name in trl_ext.tasks (r1_zero, question_only, countdown, tinyzero, intellect). "
            "Default: the task's (Countdown: countdown; GSM8K, MATH: r1_zero)."
        },
    )
    chat_template: bool = field(
        default=False,
        metadata={
            "help": "Send prompts as chat messages, so the tokenizer's chat template wraps them (instruct models); "
            "else as plain text (base models, R1-Zero style)."
        },
    )
    reward_funcs: list[str] | None = field(
        default=None,
        metadata={
            "help": "Reward functions: names from trl_ext.rewards.REWARD_FUNCS (countdown, r1_zero, question_only), "
            "parameterised ones with keyword arguments ('soft_overlong(max_length=1024, buffer_length=256)'), or "
            "import paths 'my_pkg.rewards:function' / 'my_pkg.rewards:Class(key=value)'. Default: the task's."
        },
    )
    eval_source: str | None = field(
        default=None,
        metadata={"help": "Validation problems: hub id or local file. Default: the task's source for eval_split."},
    )
    eval_split: str | None = field(
        default=None,
        metadata={
            "help": "Split of eval_source used for validation during and after training; 'none' disables it; "
            "'auto': the source's own held-out split (validation, valid, dev or test, read when the data loads), "
            "else its last 1024 rows of 'train'. Default: the task's (Countdown: 'auto'; GSM8K, MATH: 'test')."
        },
    )
    eval_limit: int | None = field(
        default=1024,
        metadata={
            "help": "Validate on the first N problems of the eval split (the courses: >= 1024 where available)."
        },
    )
    n_grpo_steps: int | None = field(
        default=None,
        metadata={
            "help": "The courses' GRPO steps (rollout batches). Sets max_steps = n_grpo_steps * num_iterations * "
            "steps_per_generation / gradient_accumulation_steps (optimizer steps per rollout batch). Setting "
            "max_steps to a different value as well is an error."
        },
    )
    rollout_log_steps: int = field(
        default=10,
        metadata={"help": "Write example rollouts to <output_dir>/rollouts.jsonl every N steps (0: never)."},
    )
    final_eval: bool = field(
        default=True, metadata={"help": "Evaluate on the validation split after training and save eval metrics."}
    )
    resume: bool = field(
        default=False,
        metadata={
            "help": "Continue the last checkpoint in output_dir. Without it a non-empty output_dir is an error (never "
            "a silent resume); with it, output_dir must hold a run of the same config (trl_ext_run.json)."
        },
    )
    gpu_memory_gb: float | None = field(
        default=None,
        metadata={
            "help": "Refuse to start when the preflight's peak-memory estimate per training GPU exceeds this many GiB "
            "(default: the training GPU's memory); the error lists the knobs that would make the plan fit."
        },
    )
    tiny_model: bool = field(
        default=False,
        metadata={
            "help": "model_name_or_path is a folder for trl_ext.tiny's model (the CPU demo's size, character "
            "tokenizer, float32, seed 0): built there, offline, when it holds no model, before anything loads it "
            "(`trl-ext launch` builds it before the vLLM server starts). For CPU runs such as "
            "countdown/cpu_server.yaml."
        },
    )
    demo_warm_start: bool = field(
        default=False,
        metadata={
            "help": "Train the CPU demo's GRPO phase (trl_ext.recipes.demo_warm_start): from the demo's SFT warm "
            "start, built into model_name_or_path on first use, on the demo's unlabelled problems, validated on its "
            "held-out problems (greedy and sampled accuracy, entropy, correct / incorrect length as heldout/* in "
            "the log history). Countdown only; the data fields are then the demo's (stating them is an error)."
        },
    )
    demo_working: bool = field(
        default=False,
        metadata={
            "help": "With demo_warm_start: the warm start taught to write a worked search before its answer (the "
            "demo's --working: dead-end steps, then a solution's, so the response length is free apart from its "
            "correctness; 192 positions), built into model_name_or_path; see docs/ablations.md."
        },
    )
    expected_completion_tokens: int | None = field(
        default=None,
        metadata={
            "help": "Completion tokens a row is expected to have, for the preflight's memory estimate of a "
            "padding_free run (its micro-batches pack real tokens only). Default: half of max_completion_length. "
            "Planning only: training does not read it."
        },
    )


@dataclass
class SFTScriptArguments:
    """Recipe fields of the SFT recipe (MATH reasoning traces in `messages` form)."""

    dataset_source: str = field(
        default=SFT_DEFAULT_DATASET,
        metadata={
            "help": "SFT examples: a hub dataset id or local .jsonl/.parquet file whose rows hold NYU Assignment 3's "
            "`prompt` and `response` strings (tokenized separately, concatenated as plain text) or `messages` "
            "(system?, user, assistant: prompt = all but the last assistant turn -> completion = the last assistant "
            "turn, through the chat template); loss on the response / completion only."
        },
    )
    dataset_split: str = field(default="train[:-1024]", metadata={"help": "Training split (datasets' slicing)."})
    limit: int | None = field(
        default=None,
        metadata={"help": "Dataset size: use only the first N examples (NYU Assignment 3: 128 ... 1024, full)."},
    )
    eval_source: str | None = field(
        default=None, metadata={"help": "Validation traces (hub id or local file). Default: dataset_source."}
    )
    eval_split: str = field(
        default="train[-1024:]", metadata={"help": "Validation split of eval_source; 'none' disables validation."}
    )
    eval_limit: int | None = field(default=1024, metadata={"help": "Validate on the first N examples."})
    accuracy_backend: str = field(
        default="none",
        metadata={
            "help": "Validation accuracy at every evaluation (besides the loss): generate answers with 'vllm' (TRL's "
            "engine, accuracy_vllm_mode) or 'transformers' and score them with the reward; 'none': loss only.",
            "choices": ["none", "transformers", "vllm"],
        },
    )
    accuracy_task: str = field(default="math", metadata={"help": "Task of the accuracy problems (trl_ext.tasks)."})
    accuracy_source: str | None = field(
        default=None, metadata={"help": "Accuracy problems: a local .jsonl/.parquet file; None: the task's hub set."}
    )
    accuracy_split: str = field(
        default="train[-500:]",
        metadata={
            "help": "Split of the accuracy problems. Default: NYU Assignment 3's MATH validation, the last 500 "
            "problems of MATH train (hiyouga/math12k), none of them in MATH-500 ('test', the course's test set)."
        },
    )
    accuracy_limit: int | None = field(default=None, metadata={"help": "Measure on the first N problems (all: None)."})
    accuracy_prompt: str = field(
        default="intellect", metadata={"help": "Prompt of the accuracy problems (the traces' own: intellect)."}
    )
    accuracy_chat: bool = field(
        default=False,
        metadata={
            "help": "Render the accuracy prompts with the tokenizer's chat template: true for `messages` traces "
            "(trained through it); NYU Assignment 3's prompt / response examples are plain text (false)."
        },
    )
    accuracy_max_tokens: int = field(default=2048, metadata={"help": "Generation budget (NYU Assignment 3: 2048)."})
    accuracy_temperature: float = field(
        default=0.0, metadata={"help": "Sampling temperature; 0: greedy (NYU Assignment 3)."}
    )
    accuracy_batch_size: int = field(
        default=64, metadata={"help": "Sequences per generate() call (accuracy_backend transformers)."}
    )
    accuracy_vllm_mode: str = field(
        default="colocate",
        metadata={
            "help": "accuracy_backend vllm: 'colocate' (an engine on the training GPU) or 'server' (trl vllm-serve).",
            "choices": ["colocate", "server"],
        },
    )
    accuracy_vllm_gpu_memory_utilization: float = field(
        default=0.3, metadata={"help": "Share of the GPU of the colocated engine (accuracy_vllm_mode colocate)."}
    )
    # TRL's `VLLMGeneration` defaults (trl_ext.expert_iteration.sft_validation.SERVER_DEFAULTS).
    accuracy_vllm_server_host: str = field(
        default="0.0.0.0", metadata={"help": "Host of the `trl vllm-serve` server (accuracy_vllm_mode server)."}
    )
    accuracy_vllm_server_port: int = field(
        default=8000, metadata={"help": "Port of the `trl vllm-serve` server (accuracy_vllm_mode server)."}
    )
    accuracy_vllm_group_port: int = field(
        default=51216, metadata={"help": "The server's weight-sync port (accuracy_vllm_mode server)."}
    )
    final_eval: bool = field(default=True, metadata={"help": "Evaluate after training and save eval metrics."})
    resume: bool = field(
        default=False,
        metadata={
            "help": "Continue the last checkpoint in output_dir. Without it a non-empty output_dir is an error (never "
            "a silent resume); with it, output_dir must hold a run of the same config (trl_ext_run.json)."
        },
    )


@dataclass
class EIScriptArguments(GRPOScriptArguments):
    """The expert-iteration recipe's fields (`trl_ext.recipes.expert_iteration`): a GRPO recipe's plus the task,
    which an EI recipe names itself (one entry point serves every task). `n_grpo_steps` and `resume` do not apply
    (EI counts `n_ei_steps` and cannot resume: setting them is an error); `rollout_log_steps` counts SFT steps."""

    task: str | None = field(
        default=None, metadata={"help": f"The task whose problems and rewards to use: one of {sorted(TASK_DEFAULTS)}."}
    )


def apply_task_defaults(task: str, script_args: GRPOScriptArguments) -> GRPOScriptArguments:
    """Fill the `None` fields of `script_args` with `TASK_DEFAULTS[task]` (in place; returned for chaining)."""
    if task not in TASK_DEFAULTS:
        raise RecipeError(f"unknown task {task!r}; choose one of {sorted(TASK_DEFAULTS)}")
    for key, value in TASK_DEFAULTS[task].items():
        if getattr(script_args, key) is None:
            setattr(script_args, key, list(value) if isinstance(value, list) else value)
    return script_args
