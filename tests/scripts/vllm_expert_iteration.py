"""Expert iteration through the real recipe path on the CPU vLLM engine (colocate mode), with records for
tests/vllm_expert_iteration_checks.py.

Usage: vllm_expert_iteration.py OUT_DIR. Writes OUT_DIR/ei.yaml, whose `base:` is the shipped
recipes/gsm8k/expert_iteration.yaml with the model, data, reward and sizes of a tiny CPU run (2 EI steps of 4
questions x 4 completions, 8 new tokens, validation on 4 questions at the start and after each EI step), runs
`trl_ext.recipes.run_expert_iteration_recipe` on it with a recording subclass of `ExpertIterationTrainer`, and writes
OUT_DIR/result.json: per rollout batch (train and eval) each row's prompt and completion token ids, completion text,
the kept flag, the reward, the engine's log-probs of the sampled tokens and a plain forward's with the weights that
sampled them and with the initial weights; per SFT step the kept rows it trained on, the loss it logged, and the
token-mean NLL and entropy of those rows from a plain per-row forward before the step (and the NLL after it); per
validation, a plain forward's mean token entropy over its completions with the weights it validated. The forwards
here use no TRL or trl_ext code.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
REPO = Path(__file__).resolve().parents[2]


def row_tokens(batch: dict, i: int) -> tuple[list[int], list[int]]:
    """Row i's prompt ids (left padding removed) and completion ids (right padding removed)."""
    prompt = batch["prompt_ids"][i][batch["prompt_mask"][i].bool()].tolist()
    completion = batch["completion_ids"][i][batch["completion_mask"][i].bool()].tolist()
    return prompt, completion


def forward(model, prompt: list[int], completion: list[int]):
    """`(log-probs (T,), entropies (T,))` of `completion` after `prompt`, from one plain float64 forward."""
    import torch

    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1].double()
    logp = torch.log_softmax(logits, dim=-1)
    token_logp = logp.gather(-1, torch.tensor(completion)[:, None])[:, 0]
    return token_logp, -(logp.exp() * logp).sum(-1)


def recording_trainer(initial_model_dir: str):
    from transformers import AutoModelForCausalLM

    from trl_ext.expert_iteration import ExpertIterationTrainer

    initial = AutoModelForCausalLM.from_pretrained(initial_model_dir).eval()

    class RecordingEITrainer(ExpertIterationTrainer):
        records: dict = {"batches": [], "sft_steps": [], "evaluations": []}
        instance = None

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            type(self).instance = self

        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            n = out["completion_ids"].size(0)
            texts = list(self._logs["completion"])[-n:]
            rewards = (self._gathered_rewards * self.reward_weights).nansum(dim=1).tolist()
            rows = []
            for i in range(n):
                prompt, completion = row_tokens(out, i)
                mask = out["completion_mask"][i].bool()
                rows.append(
                    {
                        "prompt_ids": prompt,
                        "completion_ids": completion,
                        "text": texts[i],
                        "kept": bool(out["ei_keep"][i]),
                        "reward": rewards[i],
                        "engine": out["sampling_per_token_logps"][i][mask].tolist(),
                        "forward": forward(self.model, prompt, completion)[0].tolist(),
                        "initial": forward(initial, prompt, completion)[0].tolist(),
                    }
                )
            mode = "train" if self.model.training else "eval"
            self.records["batches"].append({"mode": mode, "ei_step": self._ei_step, "rows": rows})
            return out

        def _sft_step(self, step_batch, carried_time):
            rows = [row_tokens(step_batch, i) for i in range(step_batch["completion_ids"].size(0))]
            before = [forward(self.model, p, c) for p, c in rows]
            tokens = sum(len(c) for _, c in rows)
            loss = super()._sft_step(step_batch, carried_time)
            after = [forward(self.model, p, c)[0] for p, c in rows]
            self.records["sft_steps"].append(
                {
                    "ei_step": self._ei_step,
                    "rows": [{"prompt_ids": p, "completion_ids": c} for p, c in rows],
                    "logged_loss": self.state.log_history[-1]["loss"],
                    "returned_loss": loss,
                    "reference_nll": -sum(float(lp.sum()) for lp, _ in before) / tokens,
                    "reference_entropy": sum(float(h.sum()) for _, h in before) / tokens,
                    "nll_after": -sum(float(lp.sum()) for lp in after) / tokens,
                }
            )
            return loss

        def evaluate(self, *args, **kwargs):
            metrics = super().evaluate(*args, **kwargs)
            rows = [r for r in self.records["batches"][-1]["rows"]]
            entropies = [forward(self.model, r["prompt_ids"], r["completion_ids"])[1] for r in rows]
            mean = sum(float(h.sum()) for h in entropies) / sum(h.numel() for h in entropies)
            self.records["evaluations"].append({"step": self.state.global_step, "metrics": metrics, "entropy": mean})
            return metrics

    return RecordingEITrainer


def sft_accuracy_on_the_engine(trainer, data, out_dir: Path) -> dict:
    """`ValidatingSFTTrainer`'s vLLM measurement, greedy, on the EI run's engine and model (a second engine would
    cost another start): the samples it generated, a plain forward's log-probs, argmax and top-2 margin at each of
    their tokens, and the metrics it logged."""
    from datasets import Dataset
    from trl import SFTConfig

    from trl_ext.evaluation import EvalConfig, ground_truth_of, load_problems
    from trl_ext.expert_iteration.sft_validation import ValidatingSFTTrainer, ValidationAccuracy

    config = EvalConfig(
        model="(the policy)", task="countdown", data_file=str(data), split="train[20:24]", prompt="compact",
        max_tokens=(8,), temperature=0.0, backend="vllm", ns=(1,),
    )  # fmt: skip
    prompts, rows = load_problems(config)
    truths = [ground_truth_of("countdown", row) for row in rows]
    accuracy = ValidationAccuracy(config=config, prompts=prompts, ground_truths=truths, reward="countdown")
    sft = ValidatingSFTTrainer(
        model=trainer.model,
        args=SFTConfig(output_dir=str(out_dir / "sft"), report_to="none", use_cpu=True, max_steps=1),
        train_dataset=Dataset.from_dict({"prompt": ["a"], "completion": ["b"]}),
        processing_class=trainer.processing_class,
        accuracy=accuracy,
    )
    sft.vllm_generation = trainer.vllm_generation  # the engine holds the same model object
    samples = sft._generate_vllm(prompts)
    rows_out = []
    tokenizer = trainer.processing_class
    for prompt, (sample,) in zip(prompts, samples, strict=True):
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        logp, _ = forward(trainer.model, ids, sample.token_ids)
        argmax, margin = top2(trainer.model, ids, sample.token_ids)
        rows_out.append({"token_ids": sample.token_ids, "engine": sample.logprobs, "forward": logp.tolist(),
                         "argmax": argmax, "margin": margin})  # fmt: skip
    return {"samples": rows_out, "metrics": sft.measure_accuracy(), "eos": tokenizer.eos_token_id}


def top2(model, prompt: list[int], completion: list[int]) -> tuple[list[int], list[float]]:
    """At each completion position, a plain forward's argmax token and the gap between its top two logits."""
    import torch

    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]
    top = logits.topk(2, dim=-1)
    return top.indices[:, 0].tolist(), (top.values[:, 0] - top.values[:, 1]).tolist()


def main(out_dir: Path) -> None:
    import torch
    from conftest import shared_path
    from helpers import shadowed_methods
    from vllm_helpers import save_engine_model

    from trl_ext.grpo.vllm.cpu_sampler import engine_sampler
    from trl_ext.recipes import run_expert_iteration_recipe

    torch.set_num_threads(1)
    model = save_engine_model(out_dir / "model")
    data = shared_path("countdown", "dev.parquet")
    config = out_dir / "ei.yaml"
    lines = [
        f"base: {REPO / 'recipes' / 'gsm8k' / 'expert_iteration.yaml'}",
        f"model_name_or_path: {model}",
        "task: countdown  # the compact Countdown prompt fits the char model; the reward is a toy one",
        f"dataset_source: {data}",
        "dataset_split: train[:16]",
        f"eval_source: {data}",
        "eval_split: train[16:20]",
        "prompt: compact",
        "reward_funcs: ['toy_rewards:DigitReward(where=\"any\")']",
        "n_ei_steps: 2",
        "questions_per_step: 4",
        "num_generations: 4",
        "sft_epochs: 1",
        "per_device_train_batch_size: 4",
        "gradient_accumulation_steps: 4  # 16 completions per SFT step: every kept one in one step",
        "learning_rate: 2.0e-3",
        "max_completion_length: 8",
        "per_device_eval_batch_size: 4  # the 4 validation questions in one batch",
        "eval_on_start: true",
        "use_vllm: true",
        "vllm_mode: colocate",
        "vllm_max_model_length: 64",
        "bf16: false",
        "use_cpu: true",
        "gradient_checkpointing: false",
        "report_to: none",
        "log_completions: false",
        "rollout_log_steps: 1",
        "seed: 0",
        f"output_dir: {out_dir / 'run'}",
    ]
    config.write_text("\n".join(lines) + "\n")
    trainer_class = recording_trainer(model)
    final = run_expert_iteration_recipe(["--config", str(config)], trainer_class=trainer_class)
    state = json.loads((out_dir / "run" / "trainer_state.json").read_text())
    sft = sft_accuracy_on_the_engine(trainer_class.instance, data, out_dir)
    result = {**trainer_class.records, "final_eval": final, "log_history": state["log_history"], "sft": sft}
    # trl_ext.grpo.vllm.cpu_sampler's fix, read back from the sampler of the engine TRL built for the EI trainer
    result["sampler_fixed"] = engine_sampler(trainer_class.instance.vllm_generation.llm).use_fp64_gumbel
    result["shadowed"] = shadowed_methods(trainer_class.instance)  # after training and SFT validation on its engine
    (out_dir / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":  # vLLM may spawn processes: they must not rerun this
    main(Path(sys.argv[1]))
