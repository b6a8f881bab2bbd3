"""Dynamic sampling with generation on the real vLLM CPU engine (colocate mode, importance-sampling correction on):
the batches TRL's vLLM path produced are rebuilt with every vLLM entry still on its own row.

Collected by tests/test_vllm_colocate.py, whose one child process (tests/scripts/vllm_colocated_runs.py) runs these
records' script, tests/scripts/vllm_dynamic_sampling.py (3 steps), in turn with the other colocated runs: its own
trainer and engine, the imports shared. The engine runs its traced graph eagerly (`vllm_helpers.EAGER_GRAPH`: 45 CPU s
for the run in a process of its own on a 2-core CPU, 79 with inductor; a run measured |engine - forward| up
to 0.054, LOGP_TOL 0.1)."""

from __future__ import annotations

import math

import pytest

LOGP_TOL = 0.1  # bfloat16 engine vs float32 trainer, 192 tokens at most: derived in tests/test_vllm_colocate.py
GROUP = 4


def test_trained_batches_hold_only_varied_groups(dynamic_sampling):
    assert dynamic_sampling["global_step"] == 3 and len(dynamic_sampling["batches"]) == 3
    extra = 0
    for batch in dynamic_sampling["batches"]:
        rewards = [batch["rewards"][i : i + GROUP] for i in range(0, len(batch["rewards"]), GROUP)]
        assert len(rewards) == 2 and all(max(g) > min(g) for g in rewards)
        assert not any(row["prompt"].startswith("=") for row in batch["rows"])
        assert batch["metrics"]["dynamic_sampling/groups_kept"] == 2
        extra += batch["metrics"]["dynamic_sampling/generation_batches"] - 1
    assert extra > 0  # some step dropped equal-reward groups and generated again on the engine


def test_vllm_entries_stay_on_their_rows(dynamic_sampling):
    """Each rebuilt row's engine log-probs are those of its own tokens (a plain forward of the sampling weights
    agrees within the bfloat16 tolerance), and TRL's sequence-level ratio is exp(sum(old - engine)) of that row.
    Catches log-probs or ratios taken from another row or another generation batch than the completion."""
    ratios = []
    for batch in dynamic_sampling["batches"]:
        for row in batch["rows"]:
            assert len(row["engine"]) == len(row["forward"]) == len(row["old"]) > 0
            assert max(abs(a - b) for a, b in zip(row["engine"], row["forward"], strict=True)) < LOGP_TOL
            expected = math.exp(sum(o - e for o, e in zip(row["old"], row["engine"], strict=True)))
            assert expected < dynamic_sampling["clip_max"]
            assert row["is_ratio"] == [pytest.approx(expected, rel=1e-4)]
            ratios.append(expected)
    assert max(abs(r - 1) for r in ratios) > 1e-3  # engine and trainer differ a little: the check has teeth
