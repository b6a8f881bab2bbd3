"""The kissing reward: code-block extraction, completion scoring through the sandbox, TRL's protocol and logging."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from trl_ext.rewards import REWARD_FUNCS, KissingReward, get_reward_funcs
from trl_ext.rewards.kissing import extract_program, score_kissing_completion
from trl_ext.rewards.kissing_constructions import configuration_program, root_system_dn

D11 = configuration_program(root_system_dn(11))
TOO_LONG = D11 + "points.append([3] + [0] * 10)\n"  # norm^2 9 against distance^2 >= 2 ... breaks validity


@pytest.mark.parametrize(
    ("text", "program"),
    [
        ("no code here", None),
        ("```python\npoints = [[1]]\n```", "points = [[1]]\n"),
        ("```\npoints = [[1]]\n```", "points = [[1]]\n"),  # unlabeled fence
        ("```py\na = 1\n```", "a = 1\n"),
        ("```python\nfirst\n```\ntext\n```python\nsecond\n```", "second\n"),  # the last block is the answer
        ("<think>```python\ndraft\n```</think>\n```python\nfinal\n```", "final\n"),  # thinking is not the answer
        ("<think>```python\ndraft\n```", None),  # unfinished thinking: no answer yet
        ("```python\n   \n```", None),  # empty block
        ("```python\npoints = [[1]]", None),  # unclosed fence
        (None, None),
    ],
)
def test_extract_program(text, program):
    assert extract_program(text) == program


def test_score_of_a_valid_program_is_size_over_595_plus_format():
    result = score_kissing_completion(f"Here:\n```python\n{D11}```")
    assert result["validity"] == 1.0 and result["num_points"] == 220
    assert result["reward"] == pytest.approx(0.1 + 220 / 595)
    assert result["format_reward"] == 0.1 and result["answer_reward"] == pytest.approx(220 / 595)
    assert result["program"] == D11  # the discovery loop saves this program: it must be the one that ran


def test_score_of_an_invalid_program_is_the_format_reward_with_the_verifier_message():
    result = score_kissing_completion(f"```python\n{TOO_LONG}```")
    # (3, 0, ..., 0) has norm^2 9; its distance^2 to (1, 1, 0, ...) is 4 + 1 = 5 < 9
    assert result["reward"] == 0.1 and result["validity"] == 0.0 and result["num_points"] == 221
    assert result["message"].startswith("Minimum squared distance ")
    assert result["message"].endswith("point 220 has squared norm 9")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("just words", "no ```python code block found in the answer"),
        ("```python\npoints = [[1] * 11,", "the ```python code block is never closed (cut at the token limit?)"),
        ("<think>let me see", "the reply ends inside <think>: no answer after </think> (cut at the token limit?)"),
        ("```python\n1/0\n```", "the program raised ZeroDivisionError: division by zero"),
        ("```python\npoints = 'abc'\n```", "`points` must be a list of vectors, got str"),
    ],
)
def test_failures_score_zero_and_say_why(text, message):
    result = score_kissing_completion(text)
    assert result["reward"] == 0.0 and result["format_reward"] == 0.0
    assert result["message"].startswith(message)
    assert result["program"] == (text[len("```python\n") : -len("```")] if text.endswith("\n```") else None)


def test_trl_protocol_logs_validity_and_size():
    completions = [
        f"```python\n{D11}```",  # valid, 220
        [{"role": "assistant", "content": "```python\npoints = [[1] + [0] * 10, [0, 1] + [0] * 9]\n```"}],  # valid, 2
        f"```python\n{TOO_LONG}```",  # ran, invalid
        "no program",
    ]
    metrics, extra = {}, {}
    reward = KissingReward(workers=2)
    values = reward(completions, log_metric=metrics.__setitem__, log_extra=extra.__setitem__, prompt=["p"] * 4)
    assert values == pytest.approx([0.1 + 220 / 595, 0.1 + 2 / 595, 0.1, 0.0])
    assert metrics == pytest.approx(
        {
            "rewards/kissing_reward/validity": 0.5,
            "rewards/kissing_reward/num_points": (220 + 2) / 4,
            "rewards/kissing_reward/best_num_points": 220.0,
            "rewards/kissing_reward/format_reward": 0.3 / 4,
        }
    )
    assert extra["kissing_reward/validity"] == [1.0, 1.0, 0.0, 0.0]
    assert extra["kissing_reward/num_points"] == [220, 2, 0, 0]
    assert extra["kissing_reward/message"][3] == "no ```python code block found in the answer"


def test_dimension_column_sets_the_dimension_per_row():
    program = "```python\npoints = [[1, 0, 0], [-1, 0, 0], [0, 1, 0], [0, -1, 0], [0, 0, 1], [0, 0, -1]]\n```"
    # the same 3-D program is valid when the row asks for dimension 3, wrong-dimensional for 11
    values = KissingReward()([program, program], dimension=[3, 11])
    assert values == pytest.approx([0.1 + 6 / 595, 0.1])
    with pytest.raises(ValueError, match="column 'dimension' has 1 values for 2 completions"):
        KissingReward()([program, program], dimension=[3])


def test_registry_and_pickle_round_trip():
    (reward,) = get_reward_funcs("kissing")
    assert reward is REWARD_FUNCS["kissing"] and reward.__name__ == "kissing_reward"
    clone = pickle.loads(pickle.dumps(reward))
    assert clone.__name__ == "kissing_reward" and repr(clone) == repr(reward)
    texts = ["```python\npoints = [[2] + [0] * 10]\n```", "nothing"]
    assert clone(texts) == reward(texts) == pytest.approx([0.1 + 1 / 595, 0.0])
    with pytest.raises(ValueError, match="must be positive"):
        KissingReward(workers=0)


@pytest.mark.slow
def test_stock_grpo_trainer_logs_the_kissing_metrics(char_tokenizer, tmp_path):
    """A stock `trl.GRPOTrainer` with the kissing reward: the logged means equal the reward recomputed on the
    logged completions. Three whole programs are single added tokens, favoured by a bias, so the tiny random model
    writes a valid program, an invalid one and a crashing one among its random characters."""
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from trl_ext.tiny import build_tiny_qwen3

    programs = [
        "```python\npoints = [[1] * 11, [-1] * 11]\n```",  # valid, |C| = 2
        "```python\npoints = [[1] * 11, [1] * 11]\n```",  # duplicate: invalid
        "```python\npoints = 1 / 0\n```",  # raises
    ]
    tokenizer = char_tokenizer.__class__.from_pretrained(_save(char_tokenizer, tmp_path / "tok"))
    tokenizer.add_tokens(programs)
    model = build_tiny_qwen3(tokenizer, seed=0)
    bias = [[[tokenizer.convert_tokens_to_ids(p)], 5.0] for p in programs]
    args = GRPOConfig(
        output_dir=str(tmp_path / "run"),
        per_device_train_batch_size=16,
        num_generations=4,
        max_completion_length=4,
        max_steps=1,
        learning_rate=1e-2,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        seed=0,
        save_strategy="no",
        generation_kwargs={"sequence_bias": bias},
    )
    dataset = Dataset.from_dict({"prompt": ["kiss :"] * 4})
    reward = KissingReward()
    trainer = GRPOTrainer(
        model=model, reward_funcs=[reward], args=args, train_dataset=dataset, processing_class=tokenizer
    )
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()

    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())
    logged = trainer.state.log_history[0]
    results = reward.score(list(trainer._logs["completion"]))
    assert len(results) == 16
    valid = [r["num_points"] if r["validity"] == 1.0 else 0 for r in results]
    expected = {
        "rewards/kissing_reward/mean": np.mean([r["reward"] for r in results]),
        "rewards/kissing_reward/validity": np.mean([r["validity"] for r in results]),
        "rewards/kissing_reward/num_points": np.mean(valid),
        "rewards/kissing_reward/format_reward": np.mean([r["format_reward"] for r in results]),
    }
    for key, value in expected.items():
        assert logged[key] == pytest.approx(value, abs=1e-6), key
    # the batch mixes outcomes, so the group advantages are not all zero
    assert len({round(r["reward"], 6) for r in results}) >= 2


def _save(tokenizer, path) -> str:
    tokenizer.save_pretrained(path)
    return str(path)
