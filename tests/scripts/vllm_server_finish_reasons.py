"""vLLM's finish reasons through a real server: `AblationGRPOTrainer` in server mode on the CPU.

Usage: vllm_server_finish_reasons.py OUT_FILE --port P --model DIR [--group-port G]. Against the `trl vllm-serve` on
127.0.0.1:P (serving DIR with the gloo weight transfer, `trl_ext.grpo.weight_sync.plugin.server_args()`), builds the
trainer (`use_vllm=True, vllm_mode="server"`, `mask_truncated_completions=True`, n=4, its tokenizer with the tags
special) and runs one `_generate_and_score_completions` per case of tests/scripts/record_vllm_completions.py (seeded
sampling; at most 4 stop strings), TRL's weight sync first as in training; then posts the same body straight to
`/v1/completions` as the reference. Writes OUT_FILE: per case and row, the reference's ids and finish / stop reason,
the trainer's ids, `_finished`, loss-mask row sum, and the token-tail rule's answer.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

N_PROMPTS = 6


def length_reward(completion_ids, **kwargs) -> list[float]:
    return [float(len(ids)) for ids in completion_ids]


def main(argv: list[str] | None = None) -> None:
    """Reads the arguments from `argv` (default: the command line); tests/scripts/vllm_server_sync.py calls it in its
    own process as its run `finish_reasons`."""
    parser = argparse.ArgumentParser()
    parser.add_argument("out_file")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--group-port", type=int)
    args = parser.parse_args(argv)
    import torch
    from datasets import Dataset
    from helpers import free_port
    from record_vllm_completions import SAMPLING, N, _post, request_body
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm_finish_reasons import MAX_TOKENS, PROMPTS

    from trl_ext import AblationGRPOConfig, AblationGRPOTrainer
    from trl_ext.grpo.rollouts.finished import finished_completions
    from trl_ext.tiny import TAG_TOKENS

    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    # The tags are special to the trainer (same ids; only its decoding drops them), as a special-token stop string
    # is; with `skip_special_tokens: false` the server's text holds them either way.
    tokenizer.add_special_tokens({"additional_special_tokens": TAG_TOKENS})
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    config = AblationGRPOConfig(
        output_dir=str(Path(args.out_file).parent / "run"),
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        max_completion_length=MAX_TOKENS,
        num_generations=N,
        per_device_train_batch_size=N_PROMPTS * N,
        bf16=False,
        use_vllm=True,
        vllm_mode="server",
        vllm_server_base_url=f"http://127.0.0.1:{args.port}",
        vllm_group_port=args.group_port or free_port(),
        vllm_server_timeout=300,
        mask_truncated_completions=True,
    )
    prompts = PROMPTS[:N_PROMPTS]
    trainer = AblationGRPOTrainer(
        model,
        length_reward,
        args=config,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=tokenizer,
    )
    trainer.model.train()
    prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    eos_and_pad = [*trainer.eos_token_ids, tokenizer.pad_token_id]
    decode = lambda ids: tokenizer.batch_decode(ids, skip_special_tokens=True)  # noqa: E731
    cases = {
        "special_stop": {**SAMPLING, "stop": TAG_TOKENS, "skip_special_tokens": False},
        "min_tokens": {**SAMPLING, "stop": ["xx", "yy", "!!", "||"], "min_tokens": 6},
    }
    result = {}
    try:
        for name, kwargs in cases.items():
            trainer.args.generation_kwargs = trainer.vllm_generation.generation_kwargs = kwargs
            batch = trainer._generate_and_score_completions([{"prompt": p} for p in prompts for _ in range(N)])
            model_id = trainer.vllm_generation.vllm_client.model
            body = request_body(model_id, prompt_ids, kwargs, MAX_TOKENS)
            choices = _post(f"http://127.0.0.1:{args.port}/v1/completions", body)["choices"]
            mask_sums = batch["completion_mask"].sum(dim=1).tolist()
            rows = []
            for i, choice in enumerate(choices):
                ids = choice["token_ids"]
                rows.append(
                    {
                        "ids": ids,
                        "reason": choice["finish_reason"],
                        "stop_reason": choice["stop_reason"],
                        "trainer_ids": batch["completion_ids"][i].tolist(),
                        "finished": bool(trainer._finished[i]),
                        "mask_sum": mask_sums[i],
                        "tail_rule": finished_completions([ids], eos_and_pad, decode, kwargs["stop"])[0],
                    }
                )
            result[name] = {"kwargs": kwargs, "rows": rows}
    finally:
        trainer.vllm_generation.vllm_client.close_communicator()
    result["pad"] = tokenizer.pad_token_id
    Path(args.out_file).write_text(json.dumps(result))


if __name__ == "__main__":  # vLLM may spawn processes: they must not rerun this
    main()
