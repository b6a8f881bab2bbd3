"""The embedded default's knobs: `DemoConfig`, its command-line flags and the checks that run before any model."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, fields

from trl_ext.testbed.config import WORKING_POSITIONS, TestbedConfig, longest_prompt_tokens, model_positions

GPU_RECIPE = "recipes/countdown/qwen3_1.7b_grpo_l512.yaml"
GPU_COMMAND = (
    "trl-ext launch --accelerate-config accelerate_configs/vllm_server_gpu0_train_gpu1.yaml "
    f"recipes/countdown.py --config {GPU_RECIPE}"
)


@dataclass
class DemoConfig(TestbedConfig):
    """Every knob of the embedded default; `python -m trl_ext.demo --help` lists them. The problems, the model and
    the SFT warm start are the CPU testbed's (`trl_ext.testbed.TestbedConfig`, listed first)."""

    output_dir: str = field(default="runs/countdown_demo", metadata={"help": "Run folder (created)."})
    threads: int = field(default=0, metadata={"help": "torch CPU threads; 0 = min(number of CPUs, 4)."})
    wandb: bool = field(default=True, metadata={"help": "Log to a wandb run (WANDB_MODE defaults to offline)."})
    init_model: str = field(
        default="", metadata={"help": "Start from this saved model (e.g. a run's `sft_model`), skipping SFT."}
    )
    eval_samples: int = field(default=4, metadata={"help": "Samples per held-out problem at temperature 1."})
    curve_points: int = field(
        default=10, metadata={"help": "Held-out greedy accuracy at this many evenly spaced steps of each phase."}
    )
    # GRPO on the unlabelled problems
    grpo_steps: int = field(default=1000, metadata={"help": "GRPO optimizer steps (one rollout batch each)."})
    grpo_batch_size: int = field(default=128, metadata={"help": "Completions per GRPO optimizer step."})
    rollout_batch_size: int = field(
        default=0, metadata={"help": "Completions per rollout (a multiple of --grpo_batch_size); 0 = grpo_batch_size."}
    )
    epochs_per_rollout: int = field(
        default=1, metadata={"help": "Passes over each rollout batch (> 1 is off-policy: the clip matters)."}
    )
    num_generations: int = field(default=8, metadata={"help": "Completions per prompt (group size)."})
    max_completion_length: int = field(default=24, metadata={"help": "Longest completion in tokens."})
    learning_rate: float = field(default=2e-4, metadata={"help": "GRPO peak learning rate."})
    lr_scheduler_type: str = field(default="linear", metadata={"help": "GRPO learning-rate schedule."})
    grpo_warmup_steps: int = field(default=0, metadata={"help": "GRPO linear warmup steps."})
    epsilon: float = field(default=0.2, metadata={"help": "Clip range of the GRPO surrogate."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature of GRPO rollouts."})
    dynamic_sampling: bool = field(
        default=False,
        metadata={
            "help": "DAPO dynamic sampling: drop equal-reward groups, generate more (see docs/dynamic_sampling.md)."
        },
    )
    static_cache: bool = field(
        default=True,
        metadata={
            "help": "Sample GRPO's rollouts and every held-out evaluation with trl_ext's loop over a preallocated KV "
            "cache (trl_ext.static_cache; AblationGRPOConfig.static_cache_generation) instead of transformers' "
            "generate: the same sampling at a fraction of the CPU (--no-static_cache: generate)."
        },
    )
    skip_zero_advantage: bool = field(
        default=True,
        metadata={
            "help": "Leave completions with advantage 0 (groups whose rewards are all equal) out of the loss's "
            "forward and backward: same gradient, faster steps (AblationGRPOConfig.skip_zero_advantage_completions)."
        },
    )
    # SFT-only control: more SFT on the labelled problems, from the same start, for GRPO's CPU time
    control: bool = field(
        default=True, metadata={"help": "Run the SFT-only control after GRPO (--no-control: GRPO only)."}
    )
    control_steps: int = field(
        default=480,
        metadata={"help": "Control SFT steps; the default costs about GRPO's CPU seconds (both are measured)."},
    )
    parallel_arms: bool = field(
        default=True,
        metadata={"help": "Run the control in a child process beside GRPO, each with half the threads (else after)."},
    )
    control_learning_rate: float = field(
        default=3e-3,
        metadata={"help": "Control peak learning rate (linear warmup, then linear decay); the warm start's."},
    )
    # Expert-iteration arm (off by default): sample, keep the correct, SFT on them, from the same start
    ei: bool = field(
        default=False,
        metadata={
            "help": "Also run expert iteration (trl_ext.expert_iteration) from the same start on the unlabelled "
            "problems, beside GRPO and the control; every curve point then also holds the held-out responses' "
            "entropy and length (docs/expert_iteration.md)."
        },
    )
    ei_steps: int = field(
        default=150,
        metadata={"help": "EI steps (--ei); the default costs about GRPO's CPU seconds (both are measured)."},
    )
    ei_questions: int = field(
        default=128,
        metadata={"help": "Questions per EI step, --num_generations completions each (a multiple of 16)."},
    )
    ei_learning_rate: float = field(
        default=2e-4, metadata={"help": "EI's SFT learning rate (constant; GRPO's peak, --learning_rate)."}
    )
    ei_sft_epochs: int = field(default=1, metadata={"help": "EI's SFT passes over each EI step's kept completions."})


def parse_args(argv: list[str] | None = None) -> DemoConfig:
    """`DemoConfig` from command-line flags (`--grpo_steps 50`, `--no-wandb`, ...)."""
    from trl_ext.demo import __doc__ as demo_doc

    parser = argparse.ArgumentParser(
        prog="python -m trl_ext.demo",
        description=(demo_doc or "").split("\n")[0],
        allow_abbrev=False,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    for f in fields(DemoConfig):
        if f.type == "bool":
            parser.add_argument(
                f"--{f.name}", action=argparse.BooleanOptionalAction, default=f.default, help=f.metadata["help"]
            )
        else:
            kind = {"int": int, "float": float, "str": str}[f.type]
            parser.add_argument(f"--{f.name}", type=kind, default=f.default, help=f.metadata["help"])
    cfg = DemoConfig(**vars(parser.parse_args(argv)))
    check(cfg)
    return cfg


def check(cfg: DemoConfig) -> None:
    """Bad sizes fail here, before any model is built; each message names the flag."""
    positive = [
        "num_train_problems",
        "num_eval_problems",
        "sft_batch_size",
        "grpo_batch_size",
        "num_generations",
        "max_completion_length",
        "hidden_size",
        "num_layers",
        "num_heads",
        "num_kv_heads",
        "epochs_per_rollout",
    ]
    for name in positive:
        if getattr(cfg, name) <= 0:
            raise ValueError(f"--{name} must be positive, got {getattr(cfg, name)}")
    non_negative = ["sft_steps", "grpo_steps", "grpo_warmup_steps", "control_steps", "eval_samples", "curve_points"]
    for name in non_negative + ["threads"]:
        if getattr(cfg, name) < 0:
            raise ValueError(f"--{name} must be >= 0, got {getattr(cfg, name)}")
    if cfg.problem_seed < -1:
        raise ValueError(f"--problem_seed must be >= 0, or -1 for --seed, got {cfg.problem_seed}")
    if not 0 < cfg.num_labelled < cfg.num_train_problems:
        raise ValueError(
            f"--num_labelled must lie in 1..{cfg.num_train_problems - 1} (--num_train_problems leaves the rest "
            f"unlabelled for GRPO), got {cfg.num_labelled}"
        )
    if cfg.num_generations < 2:
        raise ValueError(f"--num_generations must be >= 2 (a group needs a baseline), got {cfg.num_generations}")
    if cfg.grpo_batch_size % cfg.num_generations:
        raise ValueError(
            f"--grpo_batch_size ({cfg.grpo_batch_size}) must be a multiple of "
            f"--num_generations ({cfg.num_generations})"
        )
    if cfg.rollout_batch_size < 0 or cfg.rollout_batch_size % cfg.grpo_batch_size:
        raise ValueError(
            f"--rollout_batch_size ({cfg.rollout_batch_size}) must be 0 or a multiple of "
            f"--grpo_batch_size ({cfg.grpo_batch_size})"
        )
    ei_fields = ("ei_steps", "ei_questions", "ei_learning_rate", "ei_sft_epochs")
    defaults = {f.name: f.default for f in fields(DemoConfig)}
    changed = [name for name in ei_fields if getattr(cfg, name) != defaults[name]]
    if changed and not cfg.ei:
        raise ValueError(f"--{changed[0]} configures the expert-iteration arm, which runs only with --ei")
    for name in ei_fields:
        if getattr(cfg, name) <= 0:
            raise ValueError(f"--{name} must be positive, got {getattr(cfg, name)}")
    if cfg.ei and (cfg.ei_questions * cfg.num_generations) % cfg.grpo_batch_size:
        raise ValueError(
            f"--ei_questions x --num_generations ({cfg.ei_questions} x {cfg.num_generations}) must be a multiple of "
            f"--grpo_batch_size ({cfg.grpo_batch_size}): EI generates in calls of that many completions, as GRPO does"
        )
    if cfg.working_dead_ends < 0:
        raise ValueError(f"--working_dead_ends must be >= 0, got {cfg.working_dead_ends}")
    if cfg.working_dead_ends != defaults["working_dead_ends"] and not cfg.working:
        raise ValueError("--working_dead_ends shapes the worked search the SFT completions write, only with --working")
    longest_prompt = longest_prompt_tokens(cfg)
    if longest_prompt + cfg.max_completion_length > model_positions(cfg):
        raise ValueError(
            f"--max_completion_length {cfg.max_completion_length} and the longest prompt ({longest_prompt} tokens) "
            f"exceed the model's {model_positions(cfg)} positions"
            + ("" if cfg.working else f"; --working gives it {WORKING_POSITIONS}")
        )
    if cfg.hidden_size % cfg.num_heads or cfg.num_heads % cfg.num_kv_heads:
        raise ValueError("--hidden_size must be divisible by --num_heads, and --num_heads by --num_kv_heads")
