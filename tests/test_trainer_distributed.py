"""Two CPU processes (one gloo group, started by tests/helpers.py `run_ranks`): advantages from the rewards gathered
across ranks, sliced per rank, and identical parameters on both ranks after the optimizer steps.

The estimator is reinforce_pp: a group baseline, then whitening over every completion of the step weighted by its
length, so an advantage is right only if both ranks' rewards and lengths were gathered, in rank order, before the
slice. The expectation is a plain-Python loop (verl's formula), not the function under test.
Bugs caught: statistics over the local rank only, lengths not gathered, a slice off by a rank.
After training, one more batch per rank with `padding_free` off and on: the same loss, all-reduced
gradients and reduced entropy through the DDP-wrapped model.
Then, in the same two processes (one process start for both runs), dynamic sampling with groups that span the two
ranks: both ranks keep the same groups, decided on gathered rewards, and train on the same number of rows."""

from __future__ import annotations

import json
import math
import statistics
import textwrap
from pathlib import Path

import pytest
import torch
from helpers import run_ranks

from trl_ext.objectives import group_normalize

TESTS = Path(__file__).resolve().parent
GROUP, PER_RANK = 4, 8
# dynamic sampling: 12 completions = 3 groups per generation batch; the middle group spans both ranks
DS_GROUP, DS_PER_RANK = 4, 6

WORKER = textwrap.dedent(
    """
    import gc, json, os, sys
    sys.modules["vllm"] = None  # nothing generates with vLLM here: TRL's GRPO module would import it (CPU seconds)
    import torch
    sys.path.insert(0, {tests!r})
    from test_trainer_helpers import make_trainer
    from trl_ext import AblationGRPOTrainer
    from trl_ext.tiny import build_char_tokenizer
    gc.freeze()  # imported objects out of the full collection every `train()` ends with (0.4 CPU s)

    class Recording(AblationGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            self.records.append({{
                "inputs": inputs,
                "prompts": [x["prompt"] for x in inputs],
                "gathered": self._gathered_rewards[:, 0].tolist(),
                "advantages": out["advantages"].tolist(),
                "lengths": out["completion_mask"].sum(dim=1).tolist(),
            }})
            return out

    out_dir = sys.argv[1]
    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    trainer = make_trainer(
        build_char_tokenizer(), os.path.join(out_dir, "run"), trainer_cls=Recording,
        group_size={group}, rollout_batch_size={rollout}, train_batch_size={rollout}, max_steps=2,
        ddp_backend="gloo", learning_rate=5e-2, advantage_type="reinforce_pp", advantage_eps=1e-8,
    )
    trainer.records = []
    initial = {{n: p.detach().clone() for n, p in trainer.model.named_parameters()}}
    trainer.train()
    params = {{n: p.detach().tolist() for n, p in trainer.model.named_parameters()}}
    moved = max((p.detach() - initial[n]).abs().max().item() for n, p in trainer.model.named_parameters())

    # padding_free off vs on: one more batch per rank, completions cut to ragged lengths, the loss through the
    # DDP-wrapped model (gradients all-reduced, the entropy metric and token counts reduced over both ranks).
    trainer.model.train()
    torch.manual_seed(3)
    batch = AblationGRPOTrainer._generate_and_score_completions(trainer, trainer.records[-1]["inputs"])
    mask = batch["completion_mask"]
    cut = torch.arange(mask.size(1)) < torch.tensor([8, 1, 5, 0, 3, 8, 2, 6][: mask.size(0)]).unsqueeze(1)
    batch["completion_mask"] = mask * cut
    padded = {{}}
    for flag in (False, True):
        trainer.args.padding_free = flag
        trainer.model_wrapped.zero_grad(set_to_none=True)
        trainer.current_gradient_accumulation_steps = 1
        loss = trainer._compute_loss(trainer.model_wrapped, batch)
        loss.backward()
        grads = {{n: p.grad.clone() for n, p in trainer.model.named_parameters()}}
        padded[flag] = (loss.item(), grads, trainer._metrics["train"]["entropy"][-1])
    (loss_off, grads_off, ent_off), (loss_on, grads_on, ent_on) = padded[False], padded[True]
    padding_free = {{
        "wrapped": type(trainer.model_wrapped).__name__, "loss": loss_off, "loss_diff": abs(loss_on - loss_off),
        "grad_max": max(g.abs().max().item() for g in grads_off.values()),
        "grad_rel": max(((grads_on[n] - g).abs().max() / g.abs().max().clamp(min=1e-12)).item()
                        for n, g in grads_off.items()),
        "entropy": [ent_off, ent_on],
    }}
    with open(os.path.join(out_dir, f"rank{{rank}}.json"), "w") as f:
        json.dump({{"records": trainer.records, "params": params, "moved": moved,
                   "num_processes": trainer.accelerator.num_processes, "padding_free": padding_free}}, f)

    # Dynamic sampling, in the same two processes after the run above.
    from test_sampling import equal_or_varied_reward, _dataset

    class SamplingRecording(AblationGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            mask = out["prompt_mask"].bool()
            self.records.append({{
                "local_prompts": [self.processing_class.decode(ids[m]) for ids, m in zip(out["prompt_ids"], mask)],
                "rows": out["completion_ids"].size(0),
                "gathered": self._gathered_rewards[:, 0].tolist(),
                "logged_prompts": list(self._logs["prompt"]),
                "advantages": out["advantages"].tolist(),
                "metrics": {{k: v[-1] for k, v in self._metrics["train"].items() if k.startswith("dynamic")}},
            }})
            return out

    trainer = make_trainer(
        build_char_tokenizer(), os.path.join(out_dir, "sampling_run"), trainer_cls=SamplingRecording,
        reward=equal_or_varied_reward, dataset=_dataset(), num_generations={ds_group},
        per_device_train_batch_size={ds_per_rank}, max_steps=3, ddp_backend="gloo", dynamic_sampling=True,
        max_generation_batches=8, advantage_eps=1e-6,
    )
    trainer.records = []
    trainer.train()
    params = {{n: p.detach().tolist() for n, p in trainer.model.named_parameters()}}
    with open(os.path.join(out_dir, f"sampling_rank{{rank}}.json"), "w") as f:
        json.dump({{"records": trainer.records, "params": params}}, f)
    """
)


def loop_reinforce_pp(rewards: list[float], lengths: list[int], group: int, eps: float) -> list[float]:
    """verl's REINFORCE++-baseline: r - group mean, then whitened over tokens (each completion weighs its length)."""
    centred = []
    for start in range(0, len(rewards), group):
        members = rewards[start : start + group]
        mean = statistics.fmean(members)
        centred += [0.0 if max(members) == min(members) else r - mean for r in members]
    tokens = [c for c, n in zip(centred, lengths, strict=True) for _ in range(n)]
    mean, var = statistics.fmean(tokens), statistics.variance(tokens)
    return [(c - mean) / math.sqrt(var + eps) for c in centred]


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory):
    """Both runs' records: one start of the two ranks."""
    out = tmp_path_factory.mktemp("distributed")
    script = out / "worker.py"
    script.write_text(
        WORKER.format(tests=str(TESTS), group=GROUP, rollout=2 * PER_RANK, ds_group=DS_GROUP, ds_per_rank=DS_PER_RANK)
    )
    run_ranks(script, str(out))
    return out


@pytest.mark.slow
def test_two_processes_slice_gathered_advantages_and_stay_in_sync(out_dir):
    ranks = [json.loads((out_dir / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["num_processes"] for r in ranks] == [2, 2]
    assert len(ranks[0]["records"]) == len(ranks[1]["records"]) == 2  # one rollout per optimizer step
    for step, (rec0, rec1) in enumerate(zip(ranks[0]["records"], ranks[1]["records"], strict=True)):
        assert rec0["gathered"] == rec1["gathered"], step  # both ranks see every rank's rewards
        assert rec0["prompts"] != rec1["prompts"], step  # and the ranks sampled different prompts
        gathered = torch.tensor(rec0["gathered"])
        assert gathered.numel() == 2 * PER_RANK and gathered.std() > 0
        lengths = rec0["lengths"] + rec1["lengths"]  # gathered in rank order
        expected = torch.tensor(loop_reinforce_pp(rec0["gathered"], lengths, GROUP, 1e-8))
        for rank, rec in enumerate((rec0, rec1)):
            torch.testing.assert_close(
                torch.tensor(rec["advantages"]),
                expected[rank * PER_RANK : (rank + 1) * PER_RANK],
                rtol=1e-6,
                atol=1e-6,
            )
    assert ranks[0]["moved"] > 1e-3  # the optimizer did move the weights
    for name, value in ranks[0]["params"].items():
        assert value == ranks[1]["params"][name], name  # DDP kept the replicas bit-identical

    # padding_free under DDP: the same loss, all-reduced gradients and reduced entropy as padded.
    for rank in ranks:
        pf = rank["padding_free"]
        print(f"\n[padding_free] 2 processes: loss {pf['loss']:+.6f} |dloss| {pf['loss_diff']:.1e} "
              f"max rel grad {pf['grad_rel']:.1e}")  # fmt: skip
        assert pf["wrapped"] == "DistributedDataParallel"
        assert pf["grad_max"] > 1e-3 and pf["loss_diff"] <= 1e-6 and pf["grad_rel"] <= 1e-5
        assert pf["entropy"][1] == pytest.approx(pf["entropy"][0], rel=1e-5)
    assert ranks[0]["padding_free"]["entropy"] == ranks[1]["padding_free"]["entropy"]  # reduced over both ranks


@pytest.mark.slow
def test_two_processes_keep_the_same_groups_and_equal_row_counts(out_dir):
    """Dynamic sampling (tests/test_sampling.py's reward and data), with groups that span the two ranks: both ranks
    keep the same groups (decided on gathered rewards), train on the same number of rows, each on its contiguous
    slice of the built batch, and stay in sync."""
    ranks = [json.loads((out_dir / f"sampling_rank{r}.json").read_text()) for r in (0, 1)]
    assert len(ranks[0]["records"]) == len(ranks[1]["records"]) == 3
    extra_batches = 0
    for step, (rec0, rec1) in enumerate(zip(ranks[0]["records"], ranks[1]["records"], strict=True)):
        assert rec0["gathered"] == rec1["gathered"], step  # the same groups on both ranks
        assert rec0["logged_prompts"] == rec1["logged_prompts"] and rec0["metrics"] == rec1["metrics"], step
        assert rec0["metrics"]["dynamic_sampling/groups_kept"] == 3, step
        extra_batches += rec0["metrics"]["dynamic_sampling/generation_batches"] - 1
        gathered = torch.tensor(rec0["gathered"]).view(-1, DS_GROUP)
        assert gathered.shape == (3, DS_GROUP) and (gathered.amax(dim=1) > gathered.amin(dim=1)).all(), step
        assert not any(p.startswith("=") for p in rec0["logged_prompts"]), step
        expected = group_normalize(gathered.flatten(), DS_GROUP, advantage_eps=1e-6, normalize_by_std=True)
        for rank, rec in enumerate((rec0, rec1)):
            # each rank holds its contiguous slice of the built batch, with the advantages of those rows
            assert rec["rows"] == DS_PER_RANK
            assert rec["local_prompts"] == rec0["logged_prompts"][rank * DS_PER_RANK : (rank + 1) * DS_PER_RANK]
            torch.testing.assert_close(
                torch.tensor(rec["advantages"]), expected[rank * DS_PER_RANK : (rank + 1) * DS_PER_RANK]
            )
    assert extra_batches > 0  # equal-reward groups were dropped and replaced at some step
    for name, value in ranks[0]["params"].items():
        assert value == ranks[1]["params"][name], name
