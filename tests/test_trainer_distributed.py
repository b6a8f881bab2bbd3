"""Two CPU processes (torchrun, gloo): advantages from the rewards gathered across ranks, sliced per rank, and
identical parameters on both ranks after the optimizer steps.

The estimator is reinforce_pp: a group baseline, then whitening over every completion of the step weighted by its
length, so an advantage is right only if both ranks' rewards and lengths were gathered, in rank order, before the
slice. The expectation is a plain-Python loop (verl's formula), not the function under test.
Bugs caught: statistics over the local rank only, lengths not gathered, a slice off by a rank."""

from __future__ import annotations

import json
import math
import statistics
import textwrap
from pathlib import Path

import pytest
import torch
from helpers import run_torchrun

TESTS = Path(__file__).resolve().parent
GROUP, PER_RANK = 4, 8

WORKER = textwrap.dedent(
    """
    import json, os, sys
    import torch
    sys.path.insert(0, {tests!r})
    from test_trainer_helpers import make_trainer
    from trl_ext import AblationGRPOTrainer
    from trl_ext.tiny import build_char_tokenizer

    class Recording(AblationGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            self.records.append({{
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
    with open(os.path.join(out_dir, f"rank{{rank}}.json"), "w") as f:
        json.dump({{"records": trainer.records, "params": params, "moved": moved,
                   "num_processes": trainer.accelerator.num_processes}}, f)
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


@pytest.mark.slow
def test_two_processes_slice_gathered_advantages_and_stay_in_sync(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(tests=str(TESTS), group=GROUP, rollout=2 * PER_RANK))
    run_torchrun(script, str(tmp_path))

    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
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
