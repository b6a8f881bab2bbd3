"""The CPU testbed's settings: its Countdown problems, its model and its SFT warm start (`TestbedConfig`).

The defaults are the testbed every `demo_warm_start` recipe trains from and the embedded default (`make run`) runs;
`trl_ext.demo.DemoConfig` adds the demo's own knobs (its arms, clocks, output) to these.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: Positions of the testbed's model: the longest compact prompt (21 characters) and a budget up to 43 tokens, or with
#: `working` a worked search too (its warm start samples 36 tokens a response, 10% above 45): room for 171 tokens.
COMPACT_POSITIONS = 64
WORKING_POSITIONS = 192


@dataclass
class TestbedConfig:
    """The problems (seeded, disjoint held-out set), the ~0.6M-parameter Qwen3 and the SFT warm start."""

    __test__ = False  # a settings class, not a test class (its name starts with "Test")

    seed: int = field(default=0, metadata={"help": "Seed of the model init, the training problems and training."})
    problem_seed: int = field(
        default=-1,
        metadata={
            "help": "Seed of the training problems (the labelled / unlabelled split) when it differs from --seed; "
            "-1 = --seed. With --init_model from a run of another seed, give that run's seed, so the arms train on "
            "the problems their start was trained on."
        },
    )
    # model (trl_ext.tiny.build_tiny_qwen3)
    hidden_size: int = field(default=128, metadata={"help": "Model width."})
    num_layers: int = field(default=4, metadata={"help": "Transformer blocks."})
    num_heads: int = field(default=4, metadata={"help": "Attention heads."})
    num_kv_heads: int = field(default=2, metadata={"help": "Key/value heads (grouped-query attention)."})
    intermediate_size: int = field(default=256, metadata={"help": "MLP width."})
    # task
    max_number: int = field(default=20, metadata={"help": "Problems use 3 numbers in 1..max_number."})
    max_target: int = field(default=100, metadata={"help": "Targets lie in 1..max_target."})
    num_train_problems: int = field(
        default=12000, metadata={"help": "Distinct training problems: the labelled ones first, the rest unlabelled."}
    )
    num_labelled: int = field(
        default=512,
        metadata={"help": "Training problems whose solutions SFT (and the demo's control) see; GRPO gets the others."},
    )
    num_eval_problems: int = field(default=512, metadata={"help": "Held-out problems (fixed seed EVAL_SEED)."})
    # SFT warm start on the labelled problems
    sft_steps: int = field(default=300, metadata={"help": "SFT optimizer steps."})
    sft_batch_size: int = field(default=128, metadata={"help": "SFT (and the demo's control) examples per step."})
    sft_learning_rate: float = field(default=3e-3, metadata={"help": "SFT peak learning rate (linear decay)."})
    sft_warmup_steps: int = field(default=20, metadata={"help": "SFT linear warmup steps."})
    sft_all_solutions: bool = field(
        default=True,
        metadata={"help": "SFT on a random one of all solutions of a problem (else the solver's single one)."},
    )
    working: bool = field(
        default=False,
        metadata={
            "help": "SFT completions write a worked search before the answer (`14*1=14,10-1=9,14-9=5<answer>"
            "14-(10-1)</answer>`, tasks.countdown_working): 0 to --working_dead_ends dead-end steps, then a "
            "solution's steps, so a response's length is free apart from its correctness. The model gets "
            "WORKING_POSITIONS positions (else COMPACT_POSITIONS)."
        },
    )
    working_dead_ends: int = field(
        default=2, metadata={"help": "With --working: the most dead-end steps an SFT completion writes (uniform)."}
    )


def model_positions(cfg: TestbedConfig) -> int:
    """The positions of the testbed's model and tokenizer for `cfg`: `WORKING_POSITIONS` with `working`."""
    return WORKING_POSITIONS if cfg.working else COMPACT_POSITIONS


def longest_prompt_tokens(cfg: TestbedConfig) -> int:
    """Tokens (characters) of the longest compact prompt of `cfg`'s problems: `[20, 20, 20] -> 100 :`, 21."""
    from trl_ext.tasks import compact_prompt

    return len(compact_prompt([cfg.max_number] * 3, cfg.max_target))
