"""GRPO with dynamic sampling in vLLM colocate mode on the CPU engine, with records for tests/test_sampling_vllm.py.

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
import os
import socket
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPTS = ["=a", "xyz", "=bbb", "zz", "=d", "p", "=cc", "wwwww"]


def equal_or_varied_reward(prompts, completion_ids, **kwargs) -> list[float]:
    """1.0 for every completion of a "=" prompt (a uniform group); the row position mod 4 otherwise (varied)."""
    return [1.0 if p.startswith("=") else float(i % 4) for i, p in enumerate(prompts)]


def main(out_dir: Path, steps: int) -> None:
    with socket.socket() as probe:  # a free rendezvous port: other runs may be training beside this one
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm_colocate import forward_logps
    from vllm_helpers import save_engine_model

    from trl_ext import AblationGRPOConfig, AblationGRPOTrainer

    torch.set_num_threads(1)
    path = save_engine_model(out_dir / "model")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    records: list[dict] = []

    class RecordingTrainer(AblationGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            batch = super()._generate_and_score_completions(inputs)
            mask = batch["completion_mask"].bool()
            rows = []
            for i in range(mask.size(0)):
                prompt = batch["prompt_ids"][i][batch["prompt_mask"][i].bool()].tolist()
                completion = batch["completion_ids"][i][mask[i]].tolist()
                rows.append(
                    {
                        "prompt": tokenizer.decode(prompt),
                        "engine": batch["sampling_per_token_logps"][i][mask[i]].tolist(),
                        "old": batch["old_per_token_logps"][i][mask[i]].tolist(),
                        "forward": forward_logps(self.model, prompt, completion),
                        "is_ratio": batch["importance_sampling_ratio"][i].flatten().tolist(),
                    }
                )
            metrics = {k: v[-1] for k, v in self._metrics["train"].items() if k.startswith("dynamic_sampling/")}
            rewards = self._gathered_rewards[:, 0].tolist()
            records.append({"step": self.state.global_step, "rows": rows, "rewards": rewards, "metrics": metrics})
            return batch

    args = AblationGRPOConfig(
        output_dir=str(out_dir / "run"),
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        logging_steps=1,
        max_steps=steps,
        max_completion_length=8,
        num_generations=4,
        per_device_train_batch_size=8,
        learning_rate=5e-2,
        seed=0,
        bf16=False,
        disable_dropout=True,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_max_model_length=64,
        vllm_importance_sampling_correction=True,
        vllm_importance_sampling_mode="sequence_mask",
        dynamic_sampling=True,
        max_generation_batches=8,
    )
    trainer = RecordingTrainer(
        model,
        equal_or_varied_reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS * 4}),
        processing_class=tokenizer,
    )
    trainer.train()
    result = {
        "global_step": trainer.state.global_step,
        "clip_max": args.vllm_importance_sampling_clip_max,
        "batches": records,
    }
    (out_dir / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":  # vLLM may spawn processes: they must not rerun this
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 3)
