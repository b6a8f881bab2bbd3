"""GRPO in vLLM colocate mode on the CPU engine, with records for tests/test_vllm_colocate.py.

Usage: vllm_colocate.py OUT_DIR [STEPS]. Trains `AblationGRPOTrainer` (`use_vllm=True, vllm_mode="colocate"`,
importance-sampling correction on) on a tiny Qwen3 and writes OUT_DIR/result.json with, per generation: the
log-probs the engine returned for the sampled tokens, a plain forward's log-probs of the same tokens with the
weights that sampled them, and TRL's importance-sampling ratio; and, before training and after the last step's
weights were synced, the log-probs of one fixed completion from the engine and from the trainer's model; and, for
tests/test_finished.py's rule, completions the engine stopped with stop strings (with and without the stop string
in the text) with vLLM's own finish reasons; and per generation, the loss and gradients of the batch with
`padding_free` off and on; and whether the engine's sampler has `trl_ext.grpo.vllm.cpu_sampler`'s fix on.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vllm_helpers import forward_logps, id_reward  # noqa: E402

PROMPTS = ["abc", "hello", "12+3", "xyz", "qq", "Zeta", "R1", "w"]
FIXED_PROMPT, FIXED_COMPLETION = "12+3=", "15 fifteen"
# Stop strings the random engine model hits in about half of 8-token completions: single characters, a tag token,
# and two-character strings that span two tokens.
STOPS = ["</answer>", "e", "a", "o", "1", "2", " ", "x", "y", "!?", "ab", "Z"]


def engine_logps(llm, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
    """Log-probs of `completion_ids` after `prompt_ids` from the engine (its prompt log-probs, temperature 1)."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0)
    out = llm.generate([{"prompt_token_ids": prompt_ids + completion_ids}], params, use_tqdm=False)[0]
    positions = out.prompt_logprobs[len(prompt_ids) :]
    return [pos[tok].logprob for pos, tok in zip(positions, completion_ids, strict=True)]


def padding_free_check(trainer, batch) -> dict:
    """`trainer._compute_loss` of `batch` (the engine's completions, with TRL's importance-sampling ratio) and its
    gradients with `padding_free` off and on. `torch.autograd.grad` and restored metrics leave the training
    step's gradients and logs as they were."""
    import copy

    import torch

    metrics, flag = copy.deepcopy(trainer._metrics), trainer.args.padding_free
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    results = []
    try:
        for padding_free in (False, True):
            trainer.args.padding_free = padding_free
            loss = trainer._compute_loss(trainer.model, batch)
            results.append((loss.item(), torch.autograd.grad(loss, params)))
    finally:
        trainer.args.padding_free, trainer._metrics = flag, metrics
    (loss_off, grads_off), (loss_on, grads_on) = results
    return {
        "loss": loss_off,
        "loss_diff": abs(loss_on - loss_off),
        "grad_max": max(g.abs().max().item() for g in grads_off),
        "grad_rel": max(
            ((on - off).abs().max() / off.abs().max().clamp(min=1e-12)).item()
            for on, off in zip(grads_on, grads_off, strict=True)
        ),
        "tokens": (batch["prompt_mask"].sum(dim=1) + batch["completion_mask"].sum(dim=1)).tolist(),
    }


def colocate_trainer(out_dir: Path, steps: int, prompts: list[str], reward, check_padding_free=False, **config):
    """An `AblationGRPOTrainer` in vLLM colocate mode (importance-sampling correction on) on a tiny Qwen3 saved under
    `out_dir`, `prompts * 4` as its dataset and `config` on top of the shared settings, that records every batch it
    generates.

    Returns:
        (trainer, records): per batch, `step`, the gathered `rewards` of its groups, the `dynamic_sampling/*` metrics
        (empty when off) and per row the `prompt` text, the `engine`'s log-probs of the sampled tokens, TRL's `old`
        log-probs, a plain `forward`'s log-probs with the weights that sampled them, and the `is_ratio`.
    """
    from helpers import free_port

    # One process plays rank 0 of 1, as accelerate would set it; vLLM's colocate engine reads these.
    # A free rendezvous port: other runs may be training beside this one.
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; TRL passes no KV size, 1 is the variable's least
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm_helpers import save_engine_model

    from trl_ext import AblationGRPOConfig, AblationGRPOTrainer

    torch.set_num_threads(1)
    path = save_engine_model(out_dir / "model")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)  # name_or_path: the engine loads the same checkpoint
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
            record = {"step": self.state.global_step, "rows": rows, "rewards": rewards, "metrics": metrics}
            if check_padding_free:
                record["padding_free"] = padding_free_check(self, batch)
            records.append(record)
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
        learning_rate=1e-2,
        seed=0,
        bf16=False,
        disable_dropout=True,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_max_model_length=64,
        vllm_importance_sampling_correction=True,
        vllm_importance_sampling_mode="sequence_mask",
        **config,
    )
    trainer = RecordingTrainer(
        model,
        reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": prompts * 4}),
        processing_class=tokenizer,
    )
    return trainer, records


def stopped_completions(llm, tokenizer) -> list[dict]:
    """Completions of PROMPTS x 4 by the engine with `STOPS`, 8 tokens at most, as vLLM reports them: token ids and
    finish reason (`stop` for a stop string or EOS, `length` when cut), with the stop string's text kept and not."""
    from vllm import SamplingParams

    rows = []
    for keep in (True, False):
        params = SamplingParams(
            n=4, max_tokens=8, temperature=1.0, seed=7, stop=STOPS, include_stop_str_in_output=keep
        )
        requests = [{"prompt_token_ids": tokenizer(p, add_special_tokens=False)["input_ids"]} for p in PROMPTS]
        for request in llm.generate(requests, params, use_tqdm=False):
            for out in request.outputs:
                rows.append({"ids": list(out.token_ids), "reason": out.finish_reason, "text": out.text, "keep": keep})
    return rows


def main(out_dir: Path, steps: int) -> None:
    from helpers import shadowed_methods

    from trl_ext.grpo.vllm.cpu_sampler import engine_sampler

    trainer, records = colocate_trainer(out_dir, steps, PROMPTS, id_reward, check_padding_free=True)
    model, tokenizer, llm = trainer.model, trainer.processing_class, trainer.vllm_generation.llm
    fixed_prompt = tokenizer(FIXED_PROMPT, add_special_tokens=False)["input_ids"]
    fixed = tokenizer(FIXED_COMPLETION, add_special_tokens=False)["input_ids"]
    before = {"engine": engine_logps(llm, fixed_prompt, fixed), "trainer": forward_logps(model, fixed_prompt, fixed)}
    trainer.train()
    trainer.vllm_generation.sync_weights()  # the last step's weights; TRL syncs at the next generation
    after = {"engine": engine_logps(llm, fixed_prompt, fixed), "trainer": forward_logps(model, fixed_prompt, fixed)}
    result = {
        "global_step": trainer.state.global_step,
        "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
        "clip_max": trainer.args.vllm_importance_sampling_clip_max,
        "generations": records,
        "fixed_before": before,
        "fixed_after": after,
        "engine_dtype": str(llm.llm_engine.model_config.dtype),
        "graph_backend": llm.llm_engine.vllm_config.compilation_config.backend,  # inductor: the compiled graph
        "sampler_fixed": engine_sampler(llm).use_fp64_gumbel,  # read back from the engine's own sampler
        "model_path": str(out_dir / "model"),
        "stops": STOPS,
        "stopped": stopped_completions(llm, tokenizer),
        "eos_and_pad": [tokenizer.eos_token_id, tokenizer.pad_token_id],
        "shadowed": shadowed_methods(trainer),  # instance attributes over methods of library objects, after training
    }
    (out_dir / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":  # vLLM may spawn processes: they must not rerun this
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 3)
