"""Expected seconds of the GPU kit's parts on one H100: estimates, not measurements.

Not yet run on a GPU: each is derived from the model's size, the tokens a step processes and the steps a run takes,
at these stated assumptions (the kit records the measured seconds beside them, so a run on a GPU corrects them):

- compute: `TRAIN_TFLOPS` = 150 TFLOP/s of useful bf16 work in a GRPO training step (forward, backward, recompute).
  That is 19% of the 798 TFLOP/s an 8192^3 bf16 matmul reaches on an H100: the kit's micro-batches are 0.8k-19k tokens
  through 28 layers of 1.5k-2k wide matmuls, between which small elementwise kernels (norms, rotary, casts) run at
  launch speed.
- memory traffic the matmul count misses, at `MEMORY_TBPS` = 2.5 TB/s (the same H100 copied at 3.0): with fp32
  master weights each micro-batch casts the weights to bf16 twice (forward and the checkpointed recompute: 4 bytes
  read, 2 written per parameter each) and adds its gradient into the fp32 one (2 + 4 read, 4 written): 22 bytes per
  parameter; pure bf16 accumulates in bf16 (6 bytes). The optimizer step reads and writes weights and states once:
  AdamW fp32 28, AdamW bf16 14, 8-bit AdamW 16 bytes per parameter.
- `RUN_OVERHEAD_S` = 15 s per trainer run: the random-init model built on the GPU, the trainer's set-up, the first
  step's one-off costs (optimizer states, kernel selection).
- `SETUP_S` = 40 s once: the carried wheels installed (~10 s), torch / transformers / TRL / trl_ext imported on a
  fresh machine (~25 s), CUDA initialised (~5 s).

FLOPs per processed token (padding included; the kit trains with gradient checkpointing): 2 per weight in the
forward, 4 in the backward, 2 more in the body's recompute, so `8 x body + 6 x head` (the tied embedding's
projection is the head), plus attention scores `8 x layers x q_dim x seq`.
"""

from __future__ import annotations

from dataclasses import dataclass

TRAIN_TFLOPS = 150.0
MEMORY_TBPS = 2.5
RUN_OVERHEAD_S = 15.0
SETUP_S = 40.0
BUDGET_S = 480.0
MICRO_BATCH_BYTES = {"fp32_master": 22, "pure_bf16": 6}  # per parameter, beyond the matmuls
OPTIMIZER_BYTES = {"adamw_fp32": 28, "adamw_bf16": 14, "adamw_8bit": 16}  # per parameter, one optimizer step


def shape_of(name: str):
    """The `ModelShape` of a shipped model's config (`trl_ext.preflight.KNOWN_CONFIGS`)."""
    from trl_ext.preflight import KNOWN_CONFIGS
    from trl_ext.preflight.models import ModelShape

    return ModelShape.from_config(KNOWN_CONFIGS[name], name=name)


def recipe_value(recipe, key: str):
    """A recipe's value of `key`, its `base:` chain resolved."""
    from trl_ext.recipes.yaml_chain import load_recipe_yaml

    return load_recipe_yaml(recipe)[key]


def task_prompt_tokens(task: str) -> int:
    """The longest prompt of `task`'s shipped data, the one the preflight's estimate pads every row to."""
    from trl_ext.preflight.setup import PROMPT_TOKENS

    return PROMPT_TOKENS[task]


def flops_per_token(shape, seq_tokens: int) -> float:
    """Training FLOPs per processed token of `shape` (a `trl_ext.preflight.models.ModelShape`) with gradient
    checkpointing, rows of `seq_tokens` tokens."""
    body = shape.params - shape.embedding_params
    return 8 * body + 6 * shape.embedding_params + 8 * shape.num_layers * shape.q_dim * seq_tokens


@dataclass(frozen=True)
class RunPlan:
    """One trainer run: `steps` optimizer steps, each processing `tokens_per_step` tokens at `flops_per_token` and
    moving `traffic_bytes_per_step` bytes the matmuls do not count."""

    label: str
    tokens_per_step: float
    flops_per_token: float
    steps: int
    traffic_bytes_per_step: float = 0.0

    @property
    def step_s(self) -> float:
        compute = self.tokens_per_step * self.flops_per_token / (TRAIN_TFLOPS * 1e12)
        return compute + self.traffic_bytes_per_step / (MEMORY_TBPS * 1e12)

    @property
    def seconds(self) -> float:
        return RUN_OVERHEAD_S + self.steps * self.step_s

    def basis(self) -> str:
        return (
            f"{self.label}: {RUN_OVERHEAD_S:.0f} s + {self.steps} steps x {self.step_s:.2f} s "
            f"({self.tokens_per_step / 1e3:.1f}k tokens x {self.flops_per_token / 1e9:.1f} GFLOP at "
            f"{TRAIN_TFLOPS:.0f} TFLOP/s + {self.traffic_bytes_per_step / 1e9:.0f} GB at {MEMORY_TBPS} TB/s)"
        )


@dataclass(frozen=True)
class PartPlan:
    """A part's expected seconds: its trainer runs, plus `fixed_s` for what is not a trainer run."""

    note: str
    runs: tuple[RunPlan, ...] = ()
    fixed_s: float = 0.0

    @property
    def seconds(self) -> float:
        return self.fixed_s + sum(run.seconds for run in self.runs)


def training_run(
    label: str, shape, rows: int, row_tokens: int, micro_batch: int, steps: int, precision: str, optimizer: str
) -> RunPlan:
    """A run whose step processes `rows` rows of `row_tokens` tokens in micro-batches of `micro_batch` rows."""
    micro_batches = -(-rows // micro_batch)
    traffic = shape.params * (micro_batches * MICRO_BATCH_BYTES[precision] + OPTIMIZER_BYTES[optimizer])
    return RunPlan(label, rows * row_tokens, flops_per_token(shape, row_tokens), steps, traffic)


def plan_lines(plans: dict[str, PartPlan], budget_s: float | None) -> list[str]:
    """The printed plan: the set-up, each part with its runs' derivation, the total against `budget_s` (None: a
    listing of parts, not one run)."""
    lines = [
        "Expected seconds on one H100: ESTIMATES, not measurements (not yet run on a GPU).",
        f"Assumed: {TRAIN_TFLOPS:.0f} TFLOP/s of useful bf16 training work, {MEMORY_TBPS} TB/s for the memory traffic "
        f"the matmuls miss, {RUN_OVERHEAD_S:.0f} s per trainer run;",
        "each part's seconds follow from its model size, tokens per step and steps (benchmarks/_gpu_plan.py).",
        f"  {'setup':<24}{SETUP_S:6.0f} s  wheels installed (~10 s), imports (~25 s), CUDA initialised (~5 s)",
    ]
    for name, plan in plans.items():
        lines.append(f"  {name:<24}{plan.seconds:6.0f} s  {plan.note}")
        lines += [f"  {'':<32}{run.basis()}" for run in plan.runs]
    total = SETUP_S + sum(plan.seconds for plan in plans.values())
    budget = f"of the {budget_s:.0f} s budget (--budget-s)" if budget_s else "(every part: a listing, not one run)"
    lines.append(f"  {'total':<24}{total:6.0f} s  {budget}")
    return lines
