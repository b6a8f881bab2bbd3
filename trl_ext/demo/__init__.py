"""The embedded default: where demonstrations are scarce, GRPO with a verifier beats more imitation, on a CPU.

`make run` (and `accelerate launch recipes/countdown.py` with no `--config`) lands here. One process, no hub, no GPU:

1. build: a character-level tokenizer and a ~0.6M-parameter Qwen3-architecture model from a config (`trl_ext.tiny`);
2. SFT warm start on a small labelled set (`num_labelled` of the training problems): TRL's `SFTTrainer` on
   `"[14, 1, 10] -> 5 :"` -> `"<answer>14-(10-1)</answer>"`, loss on the completion only, each pass drawing one of
   all a problem's solutions (`countdown_solutions`);
3. GRPO from that start on the other, unlabelled training problems, with the Countdown verifier as the only signal
   (`AblationGRPOTrainer`: group-std advantages, clipped surrogate, per-sequence masked mean);
4. the SFT-only control from the same start: more SFT on the same labelled set for about GRPO's CPU time
   (`--no-control` skips it); with `--ei`, also expert iteration from the same start on the unlabelled problems
   (`trl_ext.expert_iteration`), and the sampled responses' entropy and length along every curve;
5. both scored on the same fixed held-out problems (seed `EVAL_SEED`, no (sorted numbers, target) key shared with
   training): greedy accuracy, mean accuracy of `eval_samples` samples at temperature 1, pass@`eval_samples`, and
   exact paired sign tests; a table, `metrics.json` and `curve.png` (both arms on one axis of CPU seconds).

Modules: `config` (flags), `phases` (training and its CPU clock), `control` (the control arm, the arms' child
processes), `ei` (the expert-iteration arm), `report` (tests, table, plots), `run` (`main`). The problems, the model,
the SFT warm start and the held-out scoring are the CPU testbed's (`trl_ext.testbed`), which the `demo_warm_start`
recipes share. docs/demo.md has the measured results and the tuning history.
"""

from trl_ext.demo.config import GPU_COMMAND, GPU_RECIPE, DemoConfig, check, parse_args
from trl_ext.demo.report import compare, paired_sign_test
from trl_ext.demo.run import main
from trl_ext.testbed.problems import (
    DEMO_CHARS,
    EVAL_SEED,
    grpo_dataset,
    make_splits,
    problem_key,
    sft_dataset,
    split_labelled,
)

__all__ = [
    "DEMO_CHARS",
    "EVAL_SEED",
    "GPU_COMMAND",
    "GPU_RECIPE",
    "DemoConfig",
    "check",
    "compare",
    "grpo_dataset",
    "main",
    "make_splits",
    "paired_sign_test",
    "parse_args",
    "problem_key",
    "sft_dataset",
    "split_labelled",
]
