"""Dynamic sampling (`trl_ext.grpo.rollouts.dynamic_sampling`): the pure pieces by hand, then the trainer on a tiny
model with a reward whose uniform groups are known in advance (prompts starting with "=" score 1.0 for every
completion; the others score their row position mod 4, so every such group has varied rewards)."""

from __future__ import annotations

import copy
import statistics

import pytest
import torch
from test_trainer_helpers import (
    group_inputs,
    loss_and_grads,
    make_trainer,
    one_torch_thread,  # noqa: F401 (autouse fixture)
)
from trl import GRPOTrainer

from trl_ext import AblationGRPOConfig, AblationGRPOTrainer
from trl_ext.grpo.rollouts.dynamic_sampling import (
    DEFAULT_MAX_GENERATION_BATCHES,
    draw_prompt_indices,
    filter_signal,
    select_groups,
    uniform_groups,
)
from trl_ext.grpo.rows import pad_and_concat, trim_padding

GROUP = 4
# Half uniform, half varied prompts, of different lengths (so left padding differs between batches).
DATA = ["=a", "xyz", "=bbb", "zz", "=d", "p", "=cc", "wwwww"]
VARIED = [p for p in DATA if not p.startswith("=")]


def equal_or_varied_reward(prompts, completion_ids, **kwargs) -> list[float]:
    """1.0 for every completion of a "=" prompt (a uniform group); the row position mod 4 otherwise (varied)."""
    return [1.0 if p.startswith("=") else float(i % GROUP) for i, p in enumerate(prompts)]


def _dataset(prompts=DATA):
    from datasets import Dataset

    return Dataset.from_dict({"prompt": prompts * 4})


def _trainer(tokenizer, tmp_path, trainer_cls=None, prompts=DATA, **overrides):
    settings = dict(num_generations=GROUP, per_device_train_batch_size=2 * GROUP, dynamic_sampling=True)
    return make_trainer(
        tokenizer,
        tmp_path,
        reward=equal_or_varied_reward,
        dataset=_dataset(prompts),
        trainer_cls=trainer_cls,
        **{**settings, **overrides},
    )


def _generate(trainer, prompts, seed: int = 1) -> dict:
    trainer.model.train()
    torch.manual_seed(seed)
    return trainer._generate_and_score_completions(group_inputs(prompts, GROUP))


def _metrics(trainer) -> dict:
    return {k.split("/")[1]: v[-1] for k, v in trainer._metrics["train"].items() if k.startswith("dynamic_sampling/")}


# Pure pieces


def test_uniform_groups_by_hand():
    nan = float("nan")
    rewards = torch.tensor(
        [
            [1.0, 1.0, 1.0],  # all equal
            [0.0, 0.1, 0.0],  # one differs
            [nan, 0.5, 0.5],  # unscored member ignored: equal
            [nan, nan, 2.0],  # one scored member: nothing to compare
            [nan, 0.0, 1.0],  # varied among the scored
        ]
    ).flatten()
    assert uniform_groups(rewards, 3).tolist() == [True, False, True, True, False]


def test_filter_signal_leaves_shaping_rewards_out():
    nan = float("nan")
    # columns: task reward, a second task reward (weight 2), a shaping reward
    per_func = torch.tensor([[1.0, 0.5, -0.5], [0.0, nan, 0.0], [nan, nan, -1.0]])
    signal = filter_signal(per_func, torch.tensor([1.0, 2.0, 1.0]), [False, False, True])
    torch.testing.assert_close(signal, torch.tensor([2.0, 0.0, nan]), equal_nan=True)
    # every function a shaping one: all count
    torch.testing.assert_close(filter_signal(per_func[:, 2:], torch.tensor([1.0]), [True]), per_func[:, 2])


def test_select_groups_takes_varied_groups_first_then_fills_in_generation_order():
    batches = [torch.tensor([True, False, True]), torch.tensor([True, True, False])]  # True = uniform
    assert select_groups(batches, 2) == ([1, 5], 2, 0)
    assert select_groups(batches, 3) == ([1, 5, 0], 2, 1)
    assert select_groups(batches, 5) == ([1, 5, 0, 2, 3], 2, 3)


def test_pad_and_concat_and_trim_by_hand():
    a, b = torch.tensor([[1, 2]]), torch.tensor([[3, 4, 5], [6, 7, 8]])
    assert pad_and_concat([a, b], 0, left=True).tolist() == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert pad_and_concat([a, b], 9, left=False).tolist() == [[1, 2, 9], [3, 4, 5], [6, 7, 8]]
    assert pad_and_concat([torch.tensor([1.0]), torch.tensor([2.0, 3.0])], 0, left=False).tolist() == [1, 2, 3]

    batch = {
        "prompt_ids": torch.tensor([[0, 0, 5, 6], [0, 0, 0, 7]]),
        "prompt_mask": torch.tensor([[0, 0, 1, 1], [0, 0, 0, 1]]),
        "completion_ids": torch.tensor([[1, 2, 0, 0, 0], [3, 0, 0, 0, 0]]),
        "completion_mask": torch.tensor([[1, 1, 0, 0, 0], [1, 0, 0, 0, 0]]),
        "old_per_token_logps": torch.arange(10.0).view(2, 5),
        "importance_sampling_ratio": torch.tensor([[0.5], [2.0]]),  # sequence-level: no columns to cut
        "advantages": torch.tensor([1.0, -1.0]),
    }
    trimmed = trim_padding(batch)
    assert trimmed["prompt_ids"].tolist() == [[5, 6], [0, 7]]
    assert trimmed["prompt_mask"].tolist() == [[1, 1], [0, 1]]
    assert trimmed["completion_ids"].tolist() == [[1, 2], [3, 0]]
    assert trimmed["old_per_token_logps"].tolist() == [[0.0, 1.0], [5.0, 6.0]]
    assert trimmed["importance_sampling_ratio"].shape == (2, 1) and trimmed["advantages"].shape == (2,)
    # TRL's pad_to_multiple_of is kept: widths round up to multiples of 4
    padded = trim_padding(batch, multiple=4)
    assert padded["prompt_ids"].shape == (2, 4) and padded["completion_ids"].shape == (2, 4)


def test_drawn_prompts_follow_repeat_sampler_layout_and_the_seed():
    indices = draw_prompt_indices(num_rows=10, num_prompts=3, group_size=4, seed="0:7:1")
    prompts = indices[::4]
    assert len(indices) == 12 and len(set(prompts)) == 3  # distinct prompts, each repeated contiguously
    assert indices == [p for p in prompts for _ in range(4)]
    assert indices == draw_prompt_indices(10, 3, 4, "0:7:1")  # same on every rank and after a resume
    assert indices != draw_prompt_indices(10, 3, 4, "0:7:2")


def test_config_checks(tmp_path):
    common = dict(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    assert AblationGRPOConfig(**common, dynamic_sampling=True).max_generation_batches == DEFAULT_MAX_GENERATION_BATCHES
    assert AblationGRPOConfig(**common).max_generation_batches is None
    with pytest.raises(ValueError, match="max_generation_batches=3 has no effect without dynamic_sampling"):
        AblationGRPOConfig(**common, max_generation_batches=3)
    with pytest.raises(ValueError, match="max_generation_batches=0 must be an integer >= 1"):
        AblationGRPOConfig(**common, dynamic_sampling=True, max_generation_batches=0)


def test_iterable_dataset_is_refused_before_the_model_loads(tmp_path):
    from datasets import IterableDataset

    stream = IterableDataset.from_generator(lambda: iter([{"prompt": "a"}]))
    args = AblationGRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", dynamic_sampling=True)
    # the model path does not exist: reaching the model load would raise OSError instead
    with pytest.raises(ValueError, match="draws extra prompts by index"):
        AblationGRPOTrainer(str(tmp_path / "no_model"), equal_or_varied_reward, args=args, train_dataset=stream)


# The trainer


class RoundRecorder(GRPOTrainer):
    """Sits between `DynamicSamplingMixin` and TRL: records each generation batch TRL returns, with its prompts and
    gathered rewards, and adds the entries TRL's vLLM path would add (old / sampling log-probs, per-token
    importance ratios) so the rebuilt batch must carry them along, row by row."""

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        shape = output["completion_ids"].shape
        gen = torch.Generator().manual_seed(len(self.rounds))
        output["old_per_token_logps"] = -torch.rand(shape, generator=gen)
        output["sampling_per_token_logps"] = output["old_per_token_logps"] - 0.1 * torch.rand(shape, generator=gen)
        output["importance_sampling_ratio"] = 0.5 + torch.rand(shape, generator=gen)
        record = {"prompts": [x["prompt"] for x in inputs], "rewards": self._scored_rewards[:, 0].tolist()}
        self.rounds.append({**record, "output": copy.deepcopy(output)})
        return output


class RecordingTrainer(AblationGRPOTrainer, RoundRecorder):
    """MRO: AblationGRPOTrainer -> DynamicSamplingMixin -> RoundRecorder -> GRPOTrainer."""

    rounds: list


def _hand_built_batch(rounds: list[dict], target_groups: int, pad_id: int, eps: float) -> dict:
    """The first `target_groups` groups of non-"=" prompts over the recorded rounds, padded by hand (prompts on the
    left, completions on the right, to the longest kept row), with advantages (r - mean) / (stdev + eps)."""
    rows = []
    for record in rounds:
        out = record["output"]
        for g in range(len(record["prompts"]) // GROUP):
            if record["prompts"][g * GROUP].startswith("="):
                continue
            rewards = record["rewards"][g * GROUP : (g + 1) * GROUP]
            mean, std = statistics.mean(rewards), statistics.stdev(rewards)
            for i in range(g * GROUP, (g + 1) * GROUP):
                n = int(out["completion_mask"][i].sum())
                rows.append(
                    {
                        "prompt": out["prompt_ids"][i][out["prompt_mask"][i].bool()].tolist(),
                        "completion": out["completion_ids"][i][:n].tolist(),
                        "old": out["old_per_token_logps"][i][:n].tolist(),
                        "ratio": out["importance_sampling_ratio"][i][:n].tolist(),
                        "advantage": (record["rewards"][i] - mean) / (std + eps),
                    }
                )
    rows = rows[: target_groups * GROUP]
    p = max(len(r["prompt"]) for r in rows)
    t = max(len(r["completion"]) for r in rows)

    def right(values, fill):
        return values + [fill] * (t - len(values))

    return {
        "prompt_ids": torch.tensor([[pad_id] * (p - len(r["prompt"])) + r["prompt"] for r in rows]),
        "prompt_mask": torch.tensor([[0] * (p - len(r["prompt"])) + [1] * len(r["prompt"]) for r in rows]),
        "completion_ids": torch.tensor([right(r["completion"], pad_id) for r in rows]),
        "completion_mask": torch.tensor([right([1] * len(r["completion"]), 0) for r in rows]),
        "old_per_token_logps": torch.tensor([right(r["old"], 0.0) for r in rows]),
        "importance_sampling_ratio": torch.tensor([right(r["ratio"], 0.0) for r in rows]),
        "advantages": torch.tensor([r["advantage"] for r in rows]),
        "num_items_in_batch": torch.tensor(sum(len(r["completion"]) for r in rows)),
    }


@pytest.mark.parametrize(
    ("pg_loss_type", "length_normalization"),
    [("grpo_clip", "masked_mean"), ("reinforce_with_baseline", "masked_mean"), ("grpo_clip", "token_mean")],
)
def test_built_batch_equals_a_batch_built_by_hand_from_the_kept_groups(
    char_tokenizer, tmp_path, pg_loss_type, length_normalization
):
    """Catches rows taken from the wrong generation batch, padding on the wrong side or of the wrong width, vLLM
    entries or advantages misaligned with their rows, and a token count left at one generation batch's."""
    # Only varied prompts to draw from: the second generation batch overfills the batch (3 varied groups for 2).
    trainer = _trainer(
        char_tokenizer,
        tmp_path,
        RecordingTrainer,
        VARIED,
        pg_loss_type=pg_loss_type,
        max_generation_batches=8,
        length_normalization=length_normalization,  # token_mean divides by num_items_in_batch
    )
    trainer.rounds = []
    # The first batch keeps one group of two, so more must be drawn; its dropped prompt is the longest of all, so
    # the kept rows need less left padding than the generation batches had.
    built = _generate(trainer, ["=aaaaaaa", "xyz"])

    assert len(trainer.rounds) == 2 and trainer.rounds[0]["prompts"][::GROUP] == ["=aaaaaaa", "xyz"]
    kept = [p for r in trainer.rounds for p in r["prompts"][::GROUP] if not p.startswith("=")]
    assert len(kept) == 3  # more varied groups than the batch holds: the first ones in generation order are taken
    assert _metrics(trainer) == {
        "generation_batches": len(trainer.rounds),
        "groups_generated": 2 * len(trainer.rounds),
        "groups_kept": 2,
        "groups_filled": 0,
    }
    expected = _hand_built_batch(trainer.rounds, 2, char_tokenizer.pad_token_id, trainer.args.advantage_eps)
    for key in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "num_items_in_batch"):
        assert torch.equal(built[key], expected[key]), key
    mask = expected["completion_mask"]
    for key in ("old_per_token_logps", "importance_sampling_ratio"):  # padding positions hold anything (as TRL's)
        torch.testing.assert_close(built[key] * mask, expected[key] * mask, rtol=0, atol=0)
    torch.testing.assert_close(built["advantages"], expected["advantages"], rtol=1e-5, atol=1e-6)

    loss, _ = loss_and_grads(trainer, built)
    hand_loss, _ = loss_and_grads(trainer, expected)
    assert loss.abs() > 1e-4
    torch.testing.assert_close(loss, hand_loss, rtol=1e-5, atol=1e-7)

    # The completions table shows the trained rows with their advantages.
    logged = list(trainer._logs["prompt"])
    assert logged[::GROUP] == kept[:2] and len(logged) == 2 * GROUP
    torch.testing.assert_close(torch.tensor(list(trainer._logs["advantages"])), expected["advantages"])


def test_cap_is_respected_and_the_batch_filled_with_equal_reward_groups(char_tokenizer, tmp_path):
    """Every prompt gives a uniform group: exactly `max_generation_batches` generations, then a full batch."""

    class CountingTrainer(AblationGRPOTrainer):
        calls = 0

        def _generate(self, prompts):
            type(self).calls += 1
            return super()._generate(prompts)

    trainer = _trainer(char_tokenizer, tmp_path, CountingTrainer, prompts=["=a", "=b", "=c"], max_generation_batches=3)
    built = _generate(trainer, ["=a", "=b"])
    assert CountingTrainer.calls == 3
    assert _metrics(trainer) == {"generation_batches": 3, "groups_generated": 6, "groups_kept": 0, "groups_filled": 2}
    assert built["completion_ids"].size(0) == 2 * GROUP and built["advantages"].abs().sum() == 0
    # the filler are the first generation batch's groups, as a plain step would have trained
    assert list(trainer._logs["prompt"])[::GROUP] == ["=a", "=b"]


class ShapeRecordingTrainer(AblationGRPOTrainer):
    """Records the `(rows, columns)` of every log-prob forward of the loss."""

    def _get_per_token_logps_and_entropies(self, model, input_ids, *args, **kwargs):
        self.forward_shapes.append(tuple(input_ids.shape))
        return super()._get_per_token_logps_and_entropies(model, input_ids, *args, **kwargs)


def test_cap_of_one_keeps_the_varied_group_first_and_skip_drops_the_filler(char_tokenizer, tmp_path):
    """No second batch is drawn; the uniform group fills; `skip_zero_advantage_completions` then leaves exactly the
    filler out of the forward with the same loss."""
    trainer = _trainer(char_tokenizer, tmp_path, ShapeRecordingTrainer, max_generation_batches=1)
    trainer.forward_shapes = []
    built = _generate(trainer, ["=a", "xyz"])
    assert _metrics(trainer) == {"generation_batches": 1, "groups_generated": 2, "groups_kept": 1, "groups_filled": 1}
    assert list(trainer._logs["prompt"])[::GROUP] == ["xyz", "=a"]
    assert built["advantages"][:GROUP].abs().min() > 0 and built["advantages"][GROUP:].abs().max() == 0

    losses = []
    for skip in (False, True):
        trainer.args.skip_zero_advantage_completions = skip
        trainer.forward_shapes = []
        losses.append(loss_and_grads(trainer, built)[0])
        assert trainer.forward_shapes[0][0] == (GROUP if skip else 2 * GROUP)
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(("per_device", "accumulation"), [(2 * GROUP, 1), (GROUP, 2)])
def test_training_steps_see_no_equal_reward_group(char_tokenizer, tmp_path, per_device, accumulation):
    """Through `trainer.train()` (TRL's buffering and micro-batch split, one or two micro-batches per generation
    batch): every trained group has varied rewards, some steps needed extra generation batches, and the counts reach
    the logs."""

    class Final(AblationGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            self.trained.append(self._gathered_rewards[:, 0].view(-1, GROUP))
            return output

    trainer = _trainer(
        char_tokenizer,
        tmp_path,
        Final,
        max_steps=3,
        max_generation_batches=8,
        per_device_train_batch_size=per_device,
        gradient_accumulation_steps=accumulation,
    )
    assert trainer.args.steps_per_generation == accumulation
    trainer.trained = []
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert len(trainer.trained) == 3
    for groups in trainer.trained:
        assert groups.shape == (2, GROUP) and (groups.amax(dim=1) > groups.amin(dim=1)).all()
    logs = [log for log in trainer.state.log_history if "dynamic_sampling/groups_kept" in log]
    assert [log["dynamic_sampling/groups_kept"] for log in logs] == [2.0, 2.0, 2.0]
    assert max(log["dynamic_sampling/generation_batches"] for log in logs) > 1  # uniform groups were dropped
    moved = max((p.detach() - before[n]).abs().max().item() for n, p in trainer.model.named_parameters())
    assert moved > 0


class RowShaping:
    """A shaping reward (as `soft_overlong` is: `shaping = True`) that differs on every row: -0.1 x row index."""

    __name__ = "row_shaping"
    shaping = True

    def __call__(self, completions, **kwargs):
        return [-0.1 * i for i in range(len(completions))]


def test_shaping_reward_does_not_keep_an_equal_accuracy_group(char_tokenizer, tmp_path):
    """A shaping reward makes the "=" group's total rewards differ, yet the group is judged on the task reward
    alone, as DAPO filters on accuracy: it is dropped (here: it becomes the filler at a cap of 1)."""
    trainer = make_trainer(
        char_tokenizer,
        tmp_path,
        reward=[equal_or_varied_reward, RowShaping()],
        dataset=_dataset(),
        num_generations=GROUP,
        per_device_train_batch_size=2 * GROUP,
        dynamic_sampling=True,
        max_generation_batches=1,
    )
    _generate(trainer, ["=a", "xyz"])
    total = trainer._gathered_rewards.sum(dim=1).view(-1, GROUP)  # (groups, G), trained order
    assert list(trainer._logs["prompt"])[::GROUP] == ["xyz", "=a"]
    assert total[1].amax() > total[1].amin()  # the "=" group's total reward varies...
    assert _metrics(trainer)["groups_kept"] == 1  # ...but it was not kept
