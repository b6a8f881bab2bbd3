"""Asynchronous rollouts against a running CPU `trl vllm-serve` (gloo weight transfer), with records for
tests/vllm_async_checks.py.

Usage: vllm_async.py URL MODEL_DIR OUT_DIR GROUP_PORT. Trains `AblationGRPOTrainer` in server mode from MODEL_DIR
(the model the server serves) four times, one after another against the same server (each run pushes its initial
weights first):

- `sync`: `async_rollouts` off; `staleness0`: on with `max_staleness=0`;
- `staleness1`: on, one optimizer step per generation batch, `max_staleness=1` (one batch requested ahead), with
  completions of up to 64 tokens, so that generating a batch takes the server longer than the trainer's step;
- `midbatch`: 2 optimizer steps per generation batch, `max_staleness=1` (the next batch requested after the first
  step), with dynamic sampling, `padding_free` and the Dr. GRPO axes.

With a fifth argument `ddp` (2 processes: torchrun's or accelerate's) it trains `ddp_sync` and `ddp_staleness1`
instead, on the 8 prompts once per epoch (a new epoch at step 2), and each rank writes OUT_DIR/result_rank<R>.json.

Each run records per generation batch: the step it was scored at, its rows' `policy_version`, prompts, the server's
log-probs of the sampled tokens, TRL's old log-probs and importance ratio (`token_truncate`), and two plain forwards
(no TRL code) of the same tokens: with the weights of the version that sampled them and with the weights that
scored them (snapshots taken at every optimizer step, forwards run after training); per step the loss and grad
norm; how many weight pushes found a generation request still running on the server; and the largest parameter
difference from the `sync` run after training. Writes OUT_DIR/result.json.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vllm_helpers import forward_logps, id_reward  # noqa: E402

PROMPTS = ["abc", "hello", "12+3", "xyz", "qq", "Zeta", "R1", "w"]
STEPS = 4


def padding_free_loss_diff(trainer, batch) -> float:
    """|loss(padding_free on) - loss(off)| of `batch` with the trainer's current weights (metrics restored)."""
    metrics, flag = copy.deepcopy(trainer._metrics), trainer.args.padding_free
    losses = []
    try:
        for padding_free in (False, True):
            trainer.args.padding_free = padding_free
            losses.append(trainer._compute_loss(trainer.model, batch).item())
    finally:
        trainer.args.padding_free, trainer._metrics = flag, metrics
    return abs(losses[1] - losses[0])


def run(
    url: str, model_dir: str, out_dir: Path, group_port: int, name: str, epoch_prompts: int = 4, **config
) -> tuple[dict, dict]:
    import torch
    from datasets import Dataset
    from helpers import shadowed_methods
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    from trl_ext import AblationGRPOConfig, AblationGRPOTrainer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    shadow = copy.deepcopy(model).eval()  # loads snapshots for the plain forwards
    snapshots: dict[int, dict] = {}
    batches: list[dict] = []

    class Snapshots(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            snapshots[state.global_step] = copy.deepcopy(model.state_dict())

        def on_step_end(self, args, state, control, model=None, **kwargs):
            snapshots[state.global_step] = copy.deepcopy(model.state_dict())

    def plain(version: int, prompt: list[int], completion: list[int]) -> list[float]:
        shadow.load_state_dict(snapshots[version])
        return forward_logps(shadow, prompt, completion)

    class RecordingTrainer(AblationGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            batch = super()._generate_and_score_completions(inputs)
            step, mask = self.state.global_step, batch["completion_mask"].bool()
            versions = batch["policy_version"].tolist() if "policy_version" in batch else [step] * mask.size(0)
            rows = []
            for i in range(mask.size(0)):
                prompt = batch["prompt_ids"][i][batch["prompt_mask"][i].bool()].tolist()
                completion = batch["completion_ids"][i][mask[i]].tolist()
                rows.append(
                    {
                        "prompt": tokenizer.decode(prompt),
                        "ids": (prompt, completion),  # the plain forwards run after training (a lean step)
                        "version": versions[i],
                        "engine": batch["sampling_per_token_logps"][i][mask[i]].tolist(),
                        "old": batch["old_per_token_logps"][i][mask[i]].tolist(),
                        "is_ratio": batch["importance_sampling_ratio"][i][mask[i]].tolist(),
                    }
                )
            reasons = getattr(self.vllm_generation, "finish_reasons", None)  # vLLM's word on this batch, if any
            record = {"step": step, "rows": rows, "finish_reasons": None if reasons is None else reasons.finish_reason}
            if self.args.padding_free:
                record["padding_free_loss_diff"] = padding_free_loss_diff(self, batch)
            batches.append(record)
            return batch

    settings = dict(
        output_dir=str(out_dir / name),
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        logging_steps=1,
        max_steps=STEPS,
        max_completion_length=8,
        num_generations=4,
        per_device_train_batch_size=8,
        learning_rate=5e-2,
        seed=0,
        bf16=False,
        disable_dropout=True,
        use_vllm=True,
        vllm_mode="server",
        vllm_server_base_url=url,
        vllm_group_port=group_port,
        vllm_server_timeout=300,
        vllm_importance_sampling_correction=True,
        vllm_importance_sampling_mode="token_truncate",
        generation_kwargs={"seed": 3},
    )
    args = AblationGRPOConfig(**{**settings, **config})
    trainer = RecordingTrainer(
        model,
        id_reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS * epoch_prompts}),
        processing_class=tokenizer,
        callbacks=[Snapshots()],
    )
    shadowed = shadowed_methods(trainer)  # as built (with the replay in place), before this script's own wrapper below
    # Every weight push is checked for a generation request still running on the server (there must be none).
    generation, pushes = trainer.vllm_generation, {"count": 0, "during_generation": 0}
    sync_weights = generation.sync_weights

    def checked_sync_weights():
        rollouts = trainer._rollouts
        pending = rollouts.replay.worker.pending if rollouts is not None and rollouts.replay is not None else None
        pushes["count"] += 1
        pushes["during_generation"] += int(pending is not None and not pending.future.done())
        return sync_weights()

    generation.sync_weights = checked_sync_weights
    try:
        trainer.train()
    finally:
        if getattr(generation, "vllm_client", None) is not None:  # the main process's
            generation.vllm_client.close_communicator()  # the next run joins the server's group anew
    for batch in batches:
        for row in batch["rows"]:
            prompt, completion = row.pop("ids")
            row["sampler_forward"] = plain(row["version"], prompt, completion)
            row["scorer_forward"] = plain(batch["step"], prompt, completion)
    history = trainer.state.log_history
    result = {
        "global_step": trainer.state.global_step,
        "losses": [h["loss"] for h in history if "loss" in h],
        "grad_norms": [h["grad_norm"] for h in history if "grad_norm" in h],
        "metrics": {k: [h[k] for h in history if k in h] for k in sorted({k for h in history for k in h})},
        "batches": batches,
        "pushes": pushes,
        "clip_max": args.vllm_importance_sampling_clip_max,
        "shadowed": shadowed,
    }
    return result, {k: v.detach().clone() for k, v in model.state_dict().items()}


def main(url: str, model_dir: str, out_dir: Path, group_port: int, ddp: bool = False) -> None:
    import os

    import torch

    torch.set_num_threads(1)
    if ddp:  # 2 processes: the collectives of the async path in the same order on both
        # The 8 prompts once: 4 prompts (16 completions) a step, so a new epoch starts at step 2.
        once = dict(epoch_prompts=1)
        runs = {"ddp_sync": once, "ddp_staleness1": dict(async_rollouts=True, max_staleness=1, **once)}
    else:
        runs = SINGLE_PROCESS_RUNS
    results, reference = {}, None
    for name, config in runs.items():
        results[name], params = run(url, model_dir, out_dir, group_port, name, **config)
        if reference is None:
            reference = params
        results[name]["param_diff_vs_sync"] = max((params[k] - reference[k]).abs().max().item() for k in params)
    name = f"result_rank{os.environ['RANK']}.json" if ddp else "result.json"
    (out_dir / name).write_text(json.dumps(results))


SINGLE_PROCESS_RUNS = {
    "sync": {},
    "staleness0": dict(async_rollouts=True, max_staleness=0),
    # Up to 64 tokens per completion (the engine model rarely samples EOS): the server takes longer than a
    # training step, so the trainer waits for the batches requested ahead, and a weight push that did not wait
    # would land mid-generation (vLLM's CPU worker then fails on the half-reloaded layers).
    "staleness1": dict(async_rollouts=True, max_staleness=1, max_completion_length=64),
    # 16 completions per generation batch, 2 optimizer steps of 8; the next batch is asked for after step 1.
    "midbatch": dict(
        async_rollouts=True,
        max_staleness=1,
        steps_per_generation=2,
        dynamic_sampling=True,
        padding_free=True,
        pg_loss_type="grpo_clip",
        epsilon=0.2,
        advantage_type="group_mean",
        length_normalization="masked_normalize",
    ),
}


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]), ddp=sys.argv[5:] == ["ddp"])
