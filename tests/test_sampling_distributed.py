"""Dynamic sampling on two CPU processes (one gloo group, started by tests/helpers.py `run_ranks`), with groups that
span the two ranks: both ranks keep the same groups (decided on gathered rewards), train on the same number of rows,
each on its contiguous slice of the built batch, and stay in sync."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
from helpers import run_ranks

from trl_ext.objectives import group_normalize

TESTS = Path(__file__).resolve().parent
GROUP, PER_RANK = 4, 6  # 12 completions = 3 groups per generation batch; the middle group spans both ranks

WORKER = textwrap.dedent(
    """
    import gc, json, os, sys
    sys.modules["vllm"] = None  # nothing generates with vLLM here: TRL's GRPO module would import it (CPU seconds)
    import torch
    sys.path.insert(0, {tests!r})
    from test_sampling import DATA, equal_or_varied_reward, _dataset
    from test_trainer_helpers import make_trainer
    from trl_ext import AblationGRPOTrainer
    from trl_ext.tiny import build_char_tokenizer
    gc.freeze()  # imported objects out of the full collection every `train()` ends with (0.4 CPU s)

    class Recording(AblationGRPOTrainer):
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

    out_dir = sys.argv[1]
    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    trainer = make_trainer(
        build_char_tokenizer(), os.path.join(out_dir, "run"), trainer_cls=Recording, reward=equal_or_varied_reward,
        dataset=_dataset(), num_generations={group}, per_device_train_batch_size={per_rank}, max_steps=3,
        ddp_backend="gloo", dynamic_sampling=True, max_generation_batches=8, advantage_eps=1e-6,
    )
    trainer.records = []
    trainer.train()
    params = {{n: p.detach().tolist() for n, p in trainer.model.named_parameters()}}
    with open(os.path.join(out_dir, f"rank{{rank}}.json"), "w") as f:
        json.dump({{"records": trainer.records, "params": params}}, f)
    """
)


@pytest.mark.slow
def test_two_processes_keep_the_same_groups_and_equal_row_counts(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(tests=str(TESTS), group=GROUP, per_rank=PER_RANK))
    run_ranks(script, str(tmp_path))

    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert len(ranks[0]["records"]) == len(ranks[1]["records"]) == 3
    extra_batches = 0
    for step, (rec0, rec1) in enumerate(zip(ranks[0]["records"], ranks[1]["records"], strict=True)):
        assert rec0["gathered"] == rec1["gathered"], step  # the same groups on both ranks
        assert rec0["logged_prompts"] == rec1["logged_prompts"] and rec0["metrics"] == rec1["metrics"], step
        assert rec0["metrics"]["dynamic_sampling/groups_kept"] == 3, step
        extra_batches += rec0["metrics"]["dynamic_sampling/generation_batches"] - 1
        gathered = torch.tensor(rec0["gathered"]).view(-1, GROUP)
        assert gathered.shape == (3, GROUP) and (gathered.amax(dim=1) > gathered.amin(dim=1)).all(), step
        assert not any(p.startswith("=") for p in rec0["logged_prompts"]), step
        expected = group_normalize(gathered.flatten(), GROUP, advantage_eps=1e-6, normalize_by_std=True)
        for rank, rec in enumerate((rec0, rec1)):
            # each rank holds its contiguous slice of the built batch, with the advantages of those rows
            assert rec["rows"] == PER_RANK
            assert rec["local_prompts"] == rec0["logged_prompts"][rank * PER_RANK : (rank + 1) * PER_RANK]
            torch.testing.assert_close(
                torch.tensor(rec["advantages"]), expected[rank * PER_RANK : (rank + 1) * PER_RANK]
            )
    assert extra_batches > 0  # equal-reward groups were dropped and replaced at some step
    for name, value in ranks[0]["params"].items():
        assert value == ranks[1]["params"][name], name
