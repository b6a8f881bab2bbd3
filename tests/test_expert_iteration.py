"""Expert iteration without an engine: the config's refusals, the pure pieces (kept mask, question sampler, SFT
batches, SFT micro-step), the shipped EI recipes against their GRPO twins, errors before any model loads, and a short
in-process run on the transformers backend (the vLLM path is tests/vllm_expert_iteration_checks.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import shared_path

from trl_ext.expert_iteration import ExpertIterationConfig, QuestionSampler, kept_mask, sft_batches
from trl_ext.expert_iteration.sft import sft_micro_step

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "recipes"
CPU = ["--use_cpu", "true"]


def _config(tmp_path, **overrides) -> ExpertIterationConfig:
    values = dict(output_dir=str(tmp_path), report_to="none", use_cpu=True, questions_per_step=4, num_generations=4)
    return ExpertIterationConfig(**{**values, **overrides})


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"loss_type": "grpo"}, "loss_type"),  # GRPO loss settings EI does not use
        ({"beta": 0.04}, "beta"),
        ({"epsilon": 0.3}, "epsilon"),
        ({"scale_rewards": "batch"}, "scale_rewards"),
        ({"vllm_importance_sampling_correction": True}, "vllm_importance_sampling_correction"),
        ({"max_steps": 10}, "max_steps"),  # EI counts n_ei_steps
        ({"num_iterations": 2}, "num_iterations"),  # EI's epochs are sft_epochs
        ({"lr_scheduler_type": "cosine"}, "lr_scheduler_type"),  # needs a total EI cannot know
        ({"lr_scheduler_type": "constant_with_warmup", "warmup_steps": 0.1}, "warmup_steps"),
        ({"generation_batch_size": 12}, "generation_batch_size"),  # must divide 4 x 4 = 16
        ({"per_device_train_batch_size": 3}, "generation_batch_size"),  # 16 rollouts in micro-batches of 3
        ({"eval_strategy": "epoch"}, "eval_strategy"),
        ({"save_strategy": "epoch"}, "save_strategy"),
        ({"n_ei_steps": 0}, "n_ei_steps"),
        ({"sft_epochs": 1.5}, "sft_epochs"),
        ({"eval_strategy": "steps", "eval_steps": 1.5}, "eval_steps"),
        ({"logging_steps": 0.5}, "logging_steps"),  # no total to take a fraction of
    ],
)
def test_config_refuses_what_expert_iteration_would_ignore(tmp_path, overrides, field):
    with pytest.raises(ValueError, match=field):
        _config(tmp_path, **overrides)


def test_config_defaults_are_cs336_and_map_onto_trl(tmp_path):
    args = ExpertIterationConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    assert (args.n_ei_steps, args.questions_per_step, args.num_generations, args.sft_epochs) == (5, 512, 8, 1)
    assert args.generation_batch_size == 512 * 8 == args.rollouts_per_step  # one generation call per EI step
    assert str(getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)) == "constant"
    assert args.vllm_importance_sampling_correction is False and args.keep_min_reward == 1.0
    small = _config(tmp_path, per_device_train_batch_size=2, gradient_accumulation_steps=3, generation_batch_size=8)
    assert small.sft_batch_size == 6 and small.generation_batch_size == 8


def test_kept_mask_is_the_weighted_reward_threshold():
    rewards = torch.tensor(
        [
            [1.0, 0.0],  # 1.0 x 1 + 0 x 0.5 = 1.0: kept (>=)
            [0.1, 1.0],  # 0.1 + 0.5 = 0.6
            [float("nan"), 1.0],  # 0.5: NaN skipped as TRL sums
            [float("nan"), float("nan")],  # nobody scored it: never kept
            [0.0, 2.0],  # 1.0: kept through the second function
        ]
    )
    assert kept_mask(rewards, torch.tensor([1.0, 0.5]), 1.0).tolist() == [True, False, False, False, True]
    assert kept_mask(rewards, torch.tensor([1.0, 0.5]), 0.5).tolist() == [True, True, True, False, True]


def test_question_sampler_draws_without_replacement_across_permutations():
    sampler = QuestionSampler(5, seed=3)
    first, second, third = sampler.draw(3), sampler.draw(3), sampler.draw(4)
    assert sorted(first + second[:2]) == [0, 1, 2, 3, 4]  # the first permutation, used up
    assert len(set(second[2:] + third)) == 5  # the second permutation: 1 + 4 distinct
    assert QuestionSampler(5, seed=3).draw(10) == first + second + third  # the same seed, the same sequence
    with pytest.raises(ValueError, match="no questions"):
        QuestionSampler(0, seed=0)


def test_sft_batches_cover_each_kept_completion_once_per_epoch():
    generator = torch.Generator().manual_seed(0)
    batches = sft_batches(7, 3, 2, generator)
    assert [len(b) for b in batches] == [3, 3, 1, 3, 3, 1]  # ceil(7 / 3) = 3 steps per epoch
    first, second = batches[0] + batches[1] + batches[2], batches[3] + batches[4] + batches[5]
    assert sorted(first) == sorted(second) == list(range(7))
    assert batches[:3] != batches[3:]  # reshuffled each epoch
    assert sft_batches(0, 3, 2, generator) == []


def test_sft_micro_steps_sum_to_the_token_mean_nll_and_its_gradient(char_tokenizer):
    """Two micro-batches of unequal length: the micro losses add up to the token-mean NLL over both (not the mean of
    the two means), and the accumulated gradient equals autograd of that loss from a plain per-row forward."""
    from trl_ext.tiny import build_tiny_qwen3

    torch.manual_seed(0)
    model = build_tiny_qwen3(char_tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, seed=0)
    pad = char_tokenizer.pad_token_id
    rows = [([5, 6, 7], [8, 9]), ([5, 6], [10, 11, 12, 13]), ([7], [14])]

    def batch(pairs):
        width_p, width_c = max(len(p) for p, _ in pairs), max(len(c) for _, c in pairs)
        return {
            "prompt_ids": torch.tensor([[pad] * (width_p - len(p)) + p for p, _ in pairs]),
            "prompt_mask": torch.tensor([[0] * (width_p - len(p)) + [1] * len(p) for p, _ in pairs]),
            "completion_ids": torch.tensor([c + [pad] * (width_c - len(c)) for _, c in pairs]),
            "completion_mask": torch.tensor([[1] * len(c) + [0] * (width_c - len(c)) for _, c in pairs]),
        }

    tokens = sum(len(c) for _, c in rows)
    outs = [sft_micro_step(model, batch(rows[:2]), tokens, 2), sft_micro_step(model, batch(rows[2:]), tokens, 2)]
    ours = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    reference = 0.0
    for p, c in rows:  # no padding at all
        logits = model(input_ids=torch.tensor([p + c])).logits[0, len(p) - 1 : -1]
        reference = reference - torch.log_softmax(logits, -1).gather(-1, torch.tensor(c)[:, None]).sum()
    (reference / tokens).backward()
    assert sum(o["loss"] for o in outs) == pytest.approx((reference / tokens).item(), rel=1e-5)
    assert sum(o["tokens"] for o in outs) == tokens
    for name, param in model.named_parameters():
        torch.testing.assert_close(ours[name], param.grad, rtol=1e-4, atol=1e-6, msg=name)


# The fields that decide what and how a run validates; an EI recipe must agree with its GRPO twin on every one.
VALIDATION_SCRIPT_FIELDS = (
    "dataset_source", "dataset_split", "eval_source", "eval_split", "eval_limit", "prompt", "chat_template",
    "reward_funcs",
)  # fmt: skip
VALIDATION_CONFIG_FIELDS = (
    "temperature", "top_p", "max_completion_length", "generation_kwargs", "num_generations_eval",
    "per_device_eval_batch_size", "chat_template_kwargs", "seed", "bf16", "use_vllm", "vllm_mode", "eval_strategy",
    "report_to", "logging_steps",
)  # fmt: skip


@pytest.mark.parametrize("task", ["gsm8k", "math"])
def test_ei_recipe_validates_like_its_grpo_recipe(task):
    from trl_ext.recipes import parse_ei_args, parse_recipe_args

    ei_script, ei_args, ei_model = parse_ei_args(["--config", str(RECIPES / task / "expert_iteration.yaml"), *CPU])
    script, args, model = parse_recipe_args(task, ["--config", str(RECIPES / task / "r1_zero.yaml"), *CPU])
    assert ei_script.task == task and ei_args.output_dir == f"runs/{task}/expert_iteration"
    for name in VALIDATION_SCRIPT_FIELDS:
        assert getattr(ei_script, name) == getattr(script, name), name
    for name in VALIDATION_CONFIG_FIELDS:
        assert getattr(ei_args, name) == getattr(args, name), name
    assert (ei_model.model_name_or_path, ei_model.dtype) == (model.model_name_or_path, model.dtype)
    assert ei_args.num_generations == args.num_generations == 8  # G: the courses' group size
    # cadence: GRPO every 10 of 200 GRPO steps, EI after each of its 5 steps
    assert (ei_args.eval_steps, ei_args.n_ei_steps, ei_args.questions_per_step) == (1, 5, 512)
    assert ei_args.sft_batch_size == 32 and ei_args.learning_rate == parse_sft_lr()


def parse_sft_lr() -> float:
    from trl_ext.recipes import parse_recipe_args

    return parse_recipe_args("sft", ["--config", str(RECIPES / "sft" / "base.yaml"), *CPU])[1].learning_rate


def _ei_yaml(tmp_path, *lines: str) -> list[str]:
    path = tmp_path / "ei.yaml"
    base = [f"base: {RECIPES / 'gsm8k' / 'expert_iteration.yaml'}", f"model_name_or_path: {tmp_path / 'no_model'}"]
    path.write_text("\n".join([*base, f"output_dir: {tmp_path / 'run'}", "report_to: none", *lines]) + "\n")
    return ["--config", str(path), *CPU]


@pytest.mark.parametrize(
    ("lines", "error"),
    [
        (["max_steps: 10"], "max_steps=10"),
        (["task: chess"], "unknown task 'chess'"),
        (["task: null"], "task is not set"),
        (["n_grpo_steps: 3"], "n_grpo_steps=3"),
        (["pg_loss_type: grpo_clip"], "unknown key 'pg_loss_type'"),
        (["reward_funcs: [no_such_reward]"], "no_such_reward"),
    ],
)
def test_bad_ei_recipe_fails_before_any_model_loads(tmp_path, lines, error):
    """The model folder does not exist: each error must come from the recipe, before anything tries to load it."""
    from trl_ext.recipes import run_expert_iteration_recipe

    with pytest.raises(ValueError, match=error):
        run_expert_iteration_recipe(_ei_yaml(tmp_path, *lines))


def test_ei_preflight_lists_every_problem(tmp_path):
    from trl_ext.preflight.problems import PreflightError
    from trl_ext.recipes import parse_ei_args, run_expert_iteration_recipe
    from trl_ext.recipes.expert_iteration import ei_preflight

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "old.txt").write_text("x")
    argv = _ei_yaml(tmp_path, "use_vllm: false", f"dataset_source: {tmp_path / 'none.jsonl'}")
    _, _, problems = ei_preflight(argv, parse_ei_args(argv), environ={"WORLD_SIZE": "2"})
    assert [p.field for p in problems] == ["num_processes", "output_dir", "model_name_or_path", "dataset_source"]
    with pytest.raises(PreflightError, match="output_dir"):  # the entry point raises them before loading anything
        run_expert_iteration_recipe(argv)


def test_ei_preflight_refuses_deepspeed(tmp_path):
    """Expert iteration's SFT is a plain loop of its own; under a DeepSpeed launch (accelerate exports
    ACCELERATE_USE_DEEPSPEED) with one process nothing refused it, and the engine would not drive its steps."""
    from trl_ext.recipes import parse_ei_args
    from trl_ext.recipes.expert_iteration import ei_preflight

    argv = _ei_yaml(tmp_path, "use_vllm: false")
    environ = {"WORLD_SIZE": "1", "ACCELERATE_USE_DEEPSPEED": "true"}
    refused = [p for p in ei_preflight(argv, parse_ei_args(argv), environ=environ)[2] if p.field == "distributed_type"]
    assert len(refused) == 1 and "single_gpu.yaml" in refused[0].fix
    environ["ACCELERATE_USE_DEEPSPEED"] = "false"
    assert "distributed_type" not in [p.field for p in ei_preflight(argv, parse_ei_args(argv), environ=environ)[2]]


def digit_first(completions, **kwargs) -> list[float]:
    return [float(text[:1].isdigit()) for text in completions]


def test_short_ei_run_on_transformers_counts_sft_steps_validates_and_saves(tmp_path, char_tokenizer):
    """4 EI steps of 4 questions x 4 completions, 2 SFT epochs in batches of 2: each EI step takes exactly
    2 x ceil(kept / 2) SFT steps; logging every 2 SFT steps averages their losses; validation after EI steps 2 and
    4; a checkpoint after EI steps 2 and 4 (the last two kept, save_total_limit 2) with the state at that point."""
    from trl_ext.expert_iteration import ExpertIterationTrainer
    from trl_ext.tasks import load_task
    from trl_ext.tiny import build_tiny_qwen3

    data = shared_path("countdown", "dev.parquet")
    train = load_task("countdown", source=str(data), split="train[:16]", prompt="compact")
    valid = load_task("countdown", source=str(data), split="train[16:20]", prompt="compact")
    model = build_tiny_qwen3(char_tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, seed=0)
    args = _config(
        tmp_path, n_ei_steps=4, sft_epochs=2, per_device_train_batch_size=2, gradient_accumulation_steps=1,
        max_completion_length=6, learning_rate=1e-2, eval_strategy="steps", eval_steps=0.5, num_generations_eval=1,
        per_device_eval_batch_size=4, save_strategy="steps", save_steps=2, save_total_limit=2, bf16=False, seed=0,
        logging_steps=2,
    )  # fmt: skip

    class Recording(ExpertIterationTrainer):
        losses: list = []

        def _sft_step(self, step_batch, carried_time):
            loss = super()._sft_step(step_batch, carried_time)
            self.losses.append((self.state.global_step, loss))
            return loss

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        trainer = Recording(
            model, [digit_first], args=args, train_dataset=train, eval_dataset=valid, processing_class=char_tokenizer
        )
        result = trainer.train()
    finally:
        torch.set_num_threads(threads)
    history = trainer.state.log_history
    kept = {e["ei_step"]: e["ei/kept"] for e in history if "ei/kept" in e}
    assert sorted(kept) == [1, 2, 3, 4]
    assert result.global_step == sum(2 * math.ceil(n / 2) for n in kept.values()) == trainer.state.global_step
    by_step = dict(trainer.losses)
    for entry in (e for e in history if "loss" in e):  # each entry: the mean of the steps since the previous one
        covered = [s for s in by_step if entry["step"] - 2 < s <= entry["step"]]
        assert entry["loss"] == pytest.approx(sum(by_step[s] for s in covered) / len(covered))
    assert [e["ei_step"] for e in history if "eval_reward" in e] == [2, 4]
    assert result.metrics["ei_kept_total"] == sum(kept.values())
    checkpoints = sorted(p.name for p in tmp_path.glob("checkpoint-*"))
    evals_at = [e["step"] for e in history if "eval_reward" in e]
    assert checkpoints == sorted(f"checkpoint-{s}" for s in set(evals_at))
    saved = json.loads((tmp_path / f"checkpoint-{evals_at[0]}" / "trainer_state.json").read_text())
    assert saved["global_step"] == evals_at[0]
