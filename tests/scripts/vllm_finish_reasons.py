"""Truncation from vLLM's own word, on the CPU engine in colocate mode: records for
tests/vllm_finish_reasons_checks.py.

Usage: vllm_finish_reasons.py OUT_DIR. Builds `AblationGRPOTrainer` (`use_vllm=True, vllm_mode="colocate"`,
`mask_truncated_completions=True`) on the tiny engine Qwen3 whose tokenizer marks the tags (`</answer>`, ...) special,
with an engine that decodes speculatively (vLLM's n-gram proposer; TRL builds the `LLM` without a
`speculative_config`, so this script hands it one by wrapping the `LLM` TRL's module calls). Then, per case, one
`trainer._generate_and_score_completions` on PROMPTS x 2 with the case's `generation_kwargs` (greedy), and the
same requests straight to `llm.generate` as the reference. Writes OUT_DIR/result.json: per case and row, the
completion ids and text, vLLM's finish / stop reason (reference call), the trainer's `_finished`, its loss mask
row sum, the token-tail rule's answer, and the logged `completions/clipped_ratio`.

Cases (each a way the token tail misreads a finished completion):
- `speculative`: stop at any tripled character; the proposer's accepted tokens run past the stop string;
- `special_stop`: stop at the special tags with `skip_special_tokens: false` (the tail decodes them away);
- `min_tokens`: stop at any doubled character with `min_tokens: 9` (vLLM skipped the earlier matches, which the
  tail still sees).
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPTS = ["abc", "hello", "12+3", "xyz", "qq", "Zeta", "R1", "w", "1212", "abcabc", "xxyyxxyy", "hello hello"]
SPECULATIVE = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
MAX_TOKENS = 24
MIN_TOKENS = 9  # of 3 to 9, the one where most greedy outputs of the engine model end by a skipped match


def cases(tags: list[str]) -> dict[str, dict]:
    from trl_ext.tiny import CHARS

    greedy = {"temperature": 0.0, "include_stop_str_in_output": True}
    return {
        "speculative": {**greedy, "stop": [c * 3 for c in CHARS if c.strip()]},
        "special_stop": {**greedy, "stop": tags, "skip_special_tokens": False},
        "min_tokens": {**greedy, "stop": [c * 2 for c in CHARS if c.strip()], "min_tokens": MIN_TOKENS},
    }


def length_reward(completion_ids, **kwargs) -> list[float]:
    return [float(len(ids)) for ids in completion_ids]


def main(out_dir: Path) -> None:
    from helpers import free_port

    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; TRL passes no KV size, 1 is the variable's least
    import torch
    import trl.generation.vllm_generation as trl_vllm
    from vllm_helpers import build_engine_model

    from trl_ext.tiny import TAG_TOKENS

    torch.set_num_threads(1)
    model, tokenizer = build_engine_model()
    tokenizer.add_special_tokens({"additional_special_tokens": TAG_TOKENS})  # same ids: only decoding changes
    path = out_dir / "model"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    model.name_or_path = str(path)  # the engine loads the same checkpoint
    plain_llm = trl_vllm.LLM
    trl_vllm.LLM = functools.partial(plain_llm, speculative_config=SPECULATIVE)
    try:
        run_cases(out_dir, model, tokenizer)
    finally:
        trl_vllm.LLM = plain_llm  # a later run in this process builds its own engine


def run_cases(out_dir: Path, model, tokenizer) -> None:
    """The trainer and its speculative engine, then every case (see the module docstring)."""
    from datasets import Dataset
    from helpers import shadowed_methods
    from vllm import SamplingParams

    from trl_ext import AblationGRPOConfig, AblationGRPOTrainer
    from trl_ext.grpo.rollouts.finished import finished_completions
    from trl_ext.tiny import TAG_TOKENS

    args = AblationGRPOConfig(
        output_dir=str(out_dir / "run"),
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        max_completion_length=MAX_TOKENS,
        num_generations=2,
        per_device_train_batch_size=8,
        bf16=False,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_max_model_length=64,
        mask_truncated_completions=True,
    )
    dataset = Dataset.from_dict({"prompt": PROMPTS})
    trainer = AblationGRPOTrainer(model, length_reward, args=args, train_dataset=dataset, processing_class=tokenizer)
    trainer.model.train()
    llm = trainer.vllm_generation.llm
    eos_and_pad = [*trainer.eos_token_ids, tokenizer.pad_token_id]
    decode = lambda ids: tokenizer.batch_decode(ids, skip_special_tokens=True)  # noqa: E731
    result = {"spec_config": str(llm.llm_engine.vllm_config.speculative_config), "cases": {}}
    for name, kwargs in cases(TAG_TOKENS).items():
        trainer.args.generation_kwargs = trainer.vllm_generation.generation_kwargs = kwargs
        inputs = [{"prompt": p} for p in PROMPTS for _ in range(args.num_generations)]
        batch = trainer._generate_and_score_completions(inputs)
        requests = [{"prompt_token_ids": tokenizer(p, add_special_tokens=False)["input_ids"]} for p in PROMPTS]
        params = SamplingParams(max_tokens=MAX_TOKENS, **kwargs)
        outputs = llm.generate(requests, params, use_tqdm=False)
        reference = [r.outputs[0] for r in outputs for _ in range(args.num_generations)]
        mask_sums = batch["completion_mask"].sum(dim=1).tolist()
        all_ids = [list(out.token_ids) for out in reference]
        rows = []
        for i, out in enumerate(reference):
            rows.append(
                {
                    "prompt": inputs[i]["prompt"],
                    "ids": all_ids[i],
                    "text": out.text,
                    "reason": out.finish_reason,
                    "stop_reason": out.stop_reason,
                    "finished": bool(trainer._finished[i]),
                    "mask_sum": mask_sums[i],
                    "tail_rule": finished_completions([all_ids[i]], eos_and_pad, decode, kwargs["stop"])[0],
                }
            )
        recorded = getattr(trainer.vllm_generation, "finish_reasons", None)
        result["cases"][name] = {
            "kwargs": kwargs,
            "rows": rows,
            "trainer_ids": batch["completion_ids"].tolist(),
            "recorded_reasons": None if recorded is None else recorded.finish_reason,
            "clipped_ratio": trainer._metrics["train"]["completions/clipped_ratio"][-1],
        }
    result["shadowed"] = shadowed_methods(trainer)  # instance attributes over methods of library objects
    result["tags"] = {tag: tokenizer.convert_tokens_to_ids(tag) for tag in TAG_TOKENS}
    result["eos_and_pad"] = eos_and_pad
    (out_dir / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":  # vLLM may spawn processes: they must not rerun this
    main(Path(sys.argv[1]))
