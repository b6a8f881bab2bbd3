"""GRPO with dynamic sampling in vLLM colocate mode on the CPU engine, with records for
tests/vllm_dynamic_sampling_checks.py.

Usage: vllm_dynamic_sampling.py OUT_DIR [STEPS]. Trains `AblationGRPOTrainer` (`use_vllm=True,
vllm_mode="colocate"`, importance-sampling correction on, `dynamic_sampling=True`) on a tiny Qwen3, with a reward
that is equal inside the groups of prompts starting with "=" and varied in the others, and writes
OUT_DIR/result.json with, per trained batch (what `_prepare_inputs` splits into micro-batches): each row's prompt,
the engine's log-probs of its sampled tokens, TRL's old log-probs (the trainer's, at sampling time), a plain forward's
log-probs of the same tokens with the weights that sampled them, and TRL's importance-sampling ratio; the gathered
rewards of the trained groups and the dynamic-sampling counts.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPTS = ["=a", "xyz", "=bbb", "zz", "=d", "p", "=cc", "wwwww"]


def equal_or_varied_reward(prompts, completion_ids, **kwargs) -> list[float]:
    """1.0 for every completion of a "=" prompt (a uniform group); the row position mod 4 otherwise (varied)."""
    return [1.0 if p.startswith("=") else float(i % 4) for i, p in enumerate(prompts)]


def main(out_dir: Path, steps: int) -> None:
    from helpers import shadowed_methods
    from vllm_colocate import colocate_trainer

    trainer, records = colocate_trainer(
        out_dir, steps, PROMPTS, equal_or_varied_reward, dynamic_sampling=True, max_generation_batches=8
    )
    trainer.train()
    result = {
        "global_step": trainer.state.global_step,
        "clip_max": trainer.args.vllm_importance_sampling_clip_max,
        "batches": records,
        "shadowed": shadowed_methods(trainer),  # instance attributes over methods of library objects, after training
    }
    (out_dir / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":  # vLLM may spawn processes: they must not rerun this
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 3)
