"""The TRL-protocol rewards: columns, chat completions, log_metric, pickling, the registry, a real GRPOTrainer step."""

from __future__ import annotations

import itertools
import pickle
import subprocess
import sys

import numpy as np
import pytest

from trl_ext.rewards import (
    REWARD_FUNCS,
    CountdownReward,
    MathReward,
    countdown_reward,
    countdown_reward_components,
    get_reward_funcs,
    question_only_reward,
    r1_zero_reward,
    r1_zero_reward_fn,
)

COUNTDOWN_TEXTS = [
    "<answer>(1 + 2) * 3</answer>",  # 9: correct for the first row
    "<answer>1 + 2</answer>",  # 3: wrong for the first row (target 9)
    "no tag",
    "<answer>\nStep 1: 4 * 5 = 20\nStep 2: 20 - 6 = 14\n</answer>",  # correct for the second row
]


def test_countdown_reward_reads_target_and_nums_columns():
    rewards = countdown_reward(COUNTDOWN_TEXTS, target=[9, 9, 9, 14], nums=[[1, 2, 3]] * 3 + [[4, 5, 6]])
    assert rewards == [1.0, 0.1, 0.0, 1.0]


def test_countdown_reward_column_layouts_agree():
    nums = [np.array([1, 2, 3])] * 3 + [np.array([4, 5, 6])]  # parquet gives numpy arrays
    targets = [9, 9, 9, 14]
    expected = [1.0, 0.1, 0.0, 1.0]
    truths = [{"numbers": n, "target": t} for n, t in zip(nums, targets, strict=True)]
    assert countdown_reward(COUNTDOWN_TEXTS, target=targets, numbers=nums) == expected
    assert countdown_reward(COUNTDOWN_TEXTS, ground_truth=truths) == expected
    assert countdown_reward(COUNTDOWN_TEXTS, reward_model=[{"ground_truth": t} for t in truths]) == expected


def test_chat_completions_equal_plain_strings():
    chat = [[{"role": "assistant", "content": text}] for text in COUNTDOWN_TEXTS]
    blocks = [[{"role": "assistant", "content": [{"type": "text", "text": text}]}] for text in COUNTDOWN_TEXTS]
    columns = dict(target=[9, 9, 9, 14], nums=[[1, 2, 3]] * 3 + [[4, 5, 6]])
    plain = countdown_reward(COUNTDOWN_TEXTS, **columns)
    assert countdown_reward(chat, **columns) == plain == countdown_reward(blocks, **columns)
    # tool / user turns and odd values carry no answer
    odd = [[{"role": "tool", "content": COUNTDOWN_TEXTS[0]}], None]
    assert countdown_reward(odd, target=[9, 9], nums=[[1, 2, 3]] * 2) == [0.0, 0.0]


def test_number_rules():
    """Default: every number exactly once; `require_all=False` (Assignment 2) lets numbers go unused."""
    texts = ["<answer>4 * 5</answer>", "<answer>4 * 5 - 6</answer>"]
    columns = dict(target=[20, 14], nums=[[4, 5, 6]] * 2)
    assert countdown_reward.__name__ == "countdown_reward" and countdown_reward.require_all is True
    assert countdown_reward(texts, **columns) == [0.1, 1.0]
    at_most_once = CountdownReward(require_all=False)
    assert at_most_once.__name__ == "countdown_reward_at_most_once"
    assert at_most_once(texts, **columns) == [1.0, 1.0]
    assert REWARD_FUNCS["countdown_at_most_once"](texts, **columns) == [1.0, 1.0]
    assert REWARD_FUNCS["countdown_all_numbers"] is countdown_reward
    with pytest.raises(ValueError, match="require_all must be True or False"):
        CountdownReward(require_all="yes")


def test_missing_columns_are_named():
    with pytest.raises(ValueError, match=r"\['nums', 'numbers'\].*\['target'\]"):
        countdown_reward(["x"], target=[3])
    with pytest.raises(ValueError, match=r"\['ground_truth', 'answer'\].*\['solution'\]"):
        r1_zero_reward(["x"], solution=["3"], log_metric=None, trainer_state=None)
    with pytest.raises(ValueError, match="'numbers' must hold integers, got 1.5"):
        countdown_reward(["x"], target=[3], nums=[[1.5, 2]])
    with pytest.raises(ValueError, match="'target' must hold integers"):
        countdown_reward(["x"], target=["three"], nums=[[1, 2]])
    with pytest.raises(ValueError, match="2 values for 1 completions"):
        r1_zero_reward(["x"], ground_truth=["1", "2"])


def test_math_rewards_columns_and_gsm8k_solutions():
    completions = ["r </think> <answer> 18 </answer>", "r </think> <answer> 17 </answer>", "\\boxed{18}"]
    assert r1_zero_reward(completions, ground_truth=["18", "18", "18"]) == [1.0, 0.0, 0.0]
    # the raw `answer` column of openai/gsm8k: a solution ending in `#### N`
    assert r1_zero_reward(completions, answer=["so\n#### 18"] * 3) == [1.0, 0.0, 0.0]
    assert question_only_reward(completions, ground_truth=[18, 18, 18]) == [0.0, 0.0, 1.0]
    assert r1_zero_reward(completions[:1], ground_truth=[["17", "18"]]) == [1.0]  # list of acceptable answers


def test_log_metric_and_log_extra_receive_component_means():
    metrics, extra = {}, {}
    completions = ["r </think> <answer> 1 </answer>", "r </think> <answer> 2 </answer>", "no format", "r"]
    rewards = r1_zero_reward(
        completions,
        ground_truth=["1"] * 4,
        log_metric=lambda name, value: metrics.setdefault(name, []).append(value),
        log_extra=lambda column, values: extra.setdefault(column, []).extend(values),
    )
    components = [r1_zero_reward_fn(c, "1") for c in completions]
    assert rewards == [1.0, 0.0, 0.0, 0.0]
    assert metrics == {
        "rewards/r1_zero_reward/format_reward": [0.5],
        "rewards/r1_zero_reward/answer_reward": [0.25],
        "rewards/r1_zero_reward/grading_timeouts": [0],
        "rewards/r1_zero_reward/grading_rejected": [0],
    }
    assert extra["r1_zero_reward/format_reward"] == [c["format_reward"] for c in components] == [1.0, 1.0, 0.0, 0.0]


@pytest.mark.parametrize("name", sorted(REWARD_FUNCS))
def test_pickle_round_trip_keeps_name_and_values(name):
    reward = REWARD_FUNCS[name]
    clone = pickle.loads(pickle.dumps(reward))
    assert clone.__name__ == reward.__name__
    columns = {"target": [9, 9], "nums": [[1, 2, 3]] * 2, "ground_truth": ["9", "9"]}
    texts = ["r </think> <answer> (1 + 2) * 3 </answer>", "\\boxed{9}"]
    assert clone(texts, **columns) == reward(texts, **columns)


def test_registry():
    assert get_reward_funcs(["countdown", "r1_zero"]) == [countdown_reward, r1_zero_reward]
    assert get_reward_funcs("r1_zero, question_only") == [r1_zero_reward, question_only_reward]
    assert {f.__name__ for f in REWARD_FUNCS.values()} == {
        "countdown_reward",
        "countdown_reward_at_most_once",
        "countdown_reward_single_equation",
        "countdown_reward_binary",
        "r1_zero_reward",
        "question_only_reward",
        "kissing_reward",
    }
    with pytest.raises(ValueError, match=r"\['nope'\].*valid: \['countdown', 'countdown_all_numbers', 'countdown_at_"):
        get_reward_funcs(["countdown", "nope"])
    with pytest.raises(ValueError, match="unknown math reward style"):
        MathReward("bogus")


def test_import_is_light():
    heavy = "{'torch', 'trl', 'transformers', 'math_verify'}"
    code = f"import sys, trl_ext.rewards; print(sorted({heavy} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_stock_grpo_trainer_trains_one_step(tiny_model, char_tokenizer, tmp_path):
    """A stock `trl.GRPOTrainer` with all three rewards: logged means equal the rewards recomputed here."""
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    rows = [([1, 2, 3], 6), ([2, 3, 4], 9), ([4, 5], 9), ([2, 2, 5], 9)]
    dataset = Dataset.from_dict(
        {
            "prompt": [f"{nums} -> {target} :" for nums, target in rows],
            "nums": [nums for nums, _ in rows],
            "target": [target for _, target in rows],
            "ground_truth": [str(target) for _, target in rows],
        }
    )
    vocab = char_tokenizer.get_vocab()
    # Random weights never write a tagged answer; a bias on the token pairs of `</think> <answer>4+5</answer>`
    # makes the completions mix no tag, broken tags, wrong and right answers (4+5 = 9 with [4, 5] only).
    chain = ["</think>", " ", "<answer>", "4", "+", "5", "</answer>"]
    bias = [[[vocab["</think>"]], 6.0]] + [[[vocab[a], vocab[b]], 8.0] for a, b in itertools.pairwise(chain)]
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=16,
        num_generations=4,
        max_completion_length=8,
        max_steps=1,
        learning_rate=1e-2,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        seed=0,
        save_strategy="no",
        generation_kwargs={"sequence_bias": bias},
    )
    funcs = get_reward_funcs(["countdown", "r1_zero", "question_only"])
    trainer = GRPOTrainer(
        model=tiny_model, reward_funcs=funcs, args=args, train_dataset=dataset, processing_class=char_tokenizer
    )
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()

    assert trainer.state.global_step == 1
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())
    logged = trainer.state.log_history[0]
    truth = {f"{nums} -> {target} :": {"numbers": nums, "target": target} for nums, target in rows}
    prompts, completions = list(trainer._logs["prompt"]), list(trainer._logs["completion"])
    assert len(completions) == 16
    countdown = [countdown_reward_components(c, truth[p]) for p, c in zip(prompts, completions, strict=True)]
    math = [r1_zero_reward_fn(c, str(truth[p]["target"])) for p, c in zip(prompts, completions, strict=True)]
    expected = {
        "rewards/countdown_reward/mean": np.mean([c["reward"] for c in countdown]),
        "rewards/countdown_reward/format_reward": np.mean([c["format_reward"] for c in countdown]),
        "rewards/countdown_reward/answer_reward": np.mean([c["answer_reward"] for c in countdown]),
        "rewards/r1_zero_reward/mean": np.mean([c["reward"] for c in math]),
        "rewards/r1_zero_reward/format_reward": np.mean([c["format_reward"] for c in math]),
        "rewards/r1_zero_reward/answer_reward": np.mean([c["answer_reward"] for c in math]),
    }
    for key, value in expected.items():
        assert logged[key] == pytest.approx(value, abs=1e-6), key
    assert list(trainer._logs["rewards"]["countdown_reward"]) == pytest.approx([c["reward"] for c in countdown])
    assert {c["reward"] for c in countdown} == {0.0, 0.1, 1.0}  # all three levels occur
    assert 0 < expected["rewards/r1_zero_reward/answer_reward"] < 1
