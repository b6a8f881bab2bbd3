"""Asynchronous rollouts with the real CPU engine, against the server of tests/test_vllm_server_sync.py.

Starting `trl vllm-serve` costs 30-100 s here, so these checks share that module's server: the module's launches
run tests/scripts/vllm_async.py's runs in their own processes (runs `async` and `async_ddp` of
tests/scripts/vllm_server_sync.py: no process start of their own), its fixture reads them with `read_async`, and the
module imports the tests below (pytest collects them there, with its fixture). Four trainers, one after another,
4 optimizer steps each on 32 completions of the 8 training prompts (learning rate 5e-2, so each step moves the
log-probs by nats), TRL's `token_truncate` importance-sampling correction, vLLM seed 3 on every request; then in
the module's two-process launch (DDP over gloo), a synchronous and an async run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

LOGP_TOL = 1e-4  # the server's float32 log-probs vs a float32 forward of the weights that sampled (measured <= 5e-6)
STALE_GAP = 1.0  # the same tokens under the scoring weights differ by more (measured 7 to 14 nats at lr 5e-2)
RATIO_TOL = 1e-4  # TRL's importance ratio vs exp(scorer - sampler) of the plain forwards, clipped (measured 4e-6)


def read_async(out: Path) -> dict:
    """The records the runs `async` (OUT/async/result.json) and `async_ddp` (OUT/async_ddp/result_rank<R>.json) of
    tests/scripts/vllm_server_sync.py wrote, or `{"error": ...}` with the first failure's traceback."""
    for run in ("async", "async_ddp"):
        error = out / f"{run}.error"
        if error.exists():
            return {"error": f"{run}: {error.read_text()}"}
    try:
        result = json.loads((out / "async" / "result.json").read_text())
        result["ddp"] = [json.loads((out / "async_ddp" / f"result_rank{rank}.json").read_text()) for rank in (0, 1)]
    except OSError as exc:
        return {"error": f"a record is missing: {exc}"}
    return result


def _async(runs: dict) -> dict:
    result = runs.get("async")
    assert result is not None, "the server module's fixture did not run the async rollouts"
    assert "error" not in result, result["error"]
    return result


def _prompts(run: dict) -> list[list[str]]:
    return [[row["prompt"] for row in batch["rows"]] for batch in run["batches"]]


def test_async_staleness_zero_is_the_synchronous_path(runs):
    """`async_rollouts` with `max_staleness: 0` against `async_rollouts: false`, same seed and server: the same
    prompts at every step, the same losses and grad norms, bit for bit, and the same weights after 4 steps (so the
    same gradients at every step); nothing requested ahead, every row tagged with the step that scores it. Catches
    a hook of the async path that changes anything when it should be idle (the dataloader read ahead, an extra
    request, a different RNG draw, a version bookkeeping that shifts a push)."""
    result = _async(runs)
    sync, zero = result["sync"], result["staleness0"]
    assert sync["global_step"] == zero["global_step"] == 4
    assert _prompts(zero) == _prompts(sync)
    assert zero["losses"] == sync["losses"] and zero["grad_norms"] == sync["grad_norms"]
    assert zero["param_diff_vs_sync"] == 0.0
    assert zero["pushes"] == sync["pushes"] == {"count": 4, "during_generation": 0}
    assert zero["metrics"]["async/prefetched"] == [0.0] * 4
    assert zero["metrics"]["async/staleness"] == [0.0] * 4
    assert all(row["version"] == batch["step"] for batch in zero["batches"] for row in batch["rows"])


def test_async_one_batch_ahead_keeps_the_prompts_and_tags_each_row_with_its_sampler(runs):
    """`max_staleness: 1` with one optimizer step per generation batch: the same prompts in the same order as the
    synchronous run (the dataloader is read one batch ahead, not skipped or reordered); step 0 is generated on
    demand (version 0), every later batch was requested ahead during the previous step and sampled by the policy of
    that step (version = step - 1): never older than the bound; vLLM's finish reasons are recorded for the replayed
    answers. Training differs from the synchronous run (the samples are one step stale), so the weights do: the runs
    are not accidentally the same."""
    result = _async(runs)
    sync, ahead = result["sync"], result["staleness1"]
    assert ahead["global_step"] == 4
    assert _prompts(ahead) == _prompts(sync)
    assert ahead["metrics"]["async/prefetched"] == [0.0, 1.0, 1.0, 1.0]
    assert ahead["metrics"]["async/staleness"] == [0.0, 1.0, 1.0, 1.0]
    for batch in ahead["batches"]:
        # vLLM's finish reasons reach trl_ext.grpo.vllm.finish_reasons for a replayed answer as for a direct one
        assert batch["finish_reasons"] is not None and len(batch["finish_reasons"]) == len(batch["rows"])
        expected = max(batch["step"] - 1, 0)
        assert {row["version"] for row in batch["rows"]} == {expected}, batch["step"]
        assert all(batch["step"] - row["version"] <= 1 for row in batch["rows"])
    assert ahead["param_diff_vs_sync"] > 1e-3
    # One push per step, none while the server was still generating a batch requested ahead (it would fail on the
    # half-reloaded layers), although the server is the slow side here; nothing was dropped.
    assert ahead["pushes"] == {"count": 4, "during_generation": 0}
    assert ahead["metrics"]["async/dropped"] == [0.0] * 4


def test_async_importance_ratio_is_against_the_samplers_log_probs(runs):
    """For every row of the one-batch-ahead run: the log-probs the server returned equal a plain float32 forward
    (no TRL code) with the weights of the version that sampled the row within 1e-4, and differ from the forward with
    the weights that score it by more than 1 nat somewhere in every stale batch (so the server sampled from the old
    policy, and this check can fail); TRL's old log-probs equal the scoring forward; TRL's importance ratio equals
    min(exp(scorer - sampler), clip_max) of the plain forwards, token by token (`token_truncate`), within 1e-4."""
    run = _async(runs)["staleness1"]
    clip = run["clip_max"]
    for batch in run["batches"]:
        stale_gap = 0.0
        for row in batch["rows"]:
            sampler, scorer = row["sampler_forward"], row["scorer_forward"]
            assert max(abs(e - s) for e, s in zip(row["engine"], sampler, strict=True)) < LOGP_TOL
            assert max(abs(o - c) for o, c in zip(row["old"], scorer, strict=True)) < LOGP_TOL
            expected = [min(math.exp(c - s), clip) for c, s in zip(scorer, sampler, strict=True)]
            assert max(abs(r - x) for r, x in zip(row["is_ratio"], expected, strict=True)) < RATIO_TOL
            stale_gap = max(stale_gap, max(abs(e - c) for e, c in zip(row["engine"], scorer, strict=True)))
        if batch["step"] > 0:
            assert stale_gap > STALE_GAP, batch["step"]


def test_async_mid_batch_request_with_dynamic_sampling_padding_free_and_dr_grpo(runs):
    """Two optimizer steps per generation batch with `max_staleness: 1`: the next batch is requested after the
    first step of the current one (the weights pushed then), so its rows are exactly 1 step old when scored at step
    2; dynamic sampling, `padding_free` and the Dr. GRPO axes (group_mean, masked_normalize) run unchanged: the
    packed loss equals the padded one on the async batch, dynamic sampling logs its counts, every step trains."""
    run = _async(runs)["midbatch"]
    assert run["global_step"] == 4
    assert [batch["step"] for batch in run["batches"]] == [0, 2]
    assert {row["version"] for row in run["batches"][0]["rows"]} == {0}
    assert {row["version"] for row in run["batches"][1]["rows"]} == {1}
    assert run["metrics"]["async/prefetched"] == [0.0, 1.0]
    assert run["metrics"]["async/staleness"] == [0.0, 1.0]
    assert len(run["metrics"]["dynamic_sampling/groups_kept"]) == 2
    # Pushes at steps 0, 1 (before the request ahead) and 2; none at step 3, whose request would come too late.
    assert run["pushes"] == {"count": 3, "during_generation": 0}
    assert len(run["losses"]) == 4 and all(math.isfinite(loss) for loss in run["losses"])
    for batch in run["batches"]:
        assert batch["padding_free_loss_diff"] < 1e-5
        for row in batch["rows"]:
            assert max(abs(e - s) for e, s in zip(row["engine"], row["sampler_forward"], strict=True)) < LOGP_TOL


def test_async_under_ddp_two_processes_and_across_an_epoch(runs):
    """Two training processes (the module's two-process launch, DDP over gloo), 4 prompts a step from 8 (a new epoch at
    step 2): every rank gets the prompts of the synchronous DDP run in the same order; versions 0, 0, then 2 (the first
    batch of an epoch is generated on demand: the next epoch's dataloader does not exist yet), then 2 (requested
    ahead); both ranks log the same losses and staleness (the collectives of the async path, gathering the prompts and
    broadcasting the answer and its version, run in the same order on both), and no push met a running request."""
    ranks = _async(runs)["ddp"]
    assert ranks[0]["ddp_staleness1"]["losses"] == ranks[1]["ddp_staleness1"]["losses"]
    for rank in ranks:
        sync, ahead = rank["ddp_sync"], rank["ddp_staleness1"]
        assert ahead["global_step"] == 4
        assert _prompts(ahead) == _prompts(sync)
        assert [sorted({row["version"] for row in b["rows"]}) for b in ahead["batches"]] == [[0], [0], [2], [2]]
        assert ahead["metrics"]["async/staleness"] == [0.0, 1.0, 0.0, 1.0]
        assert ahead["metrics"]["async/prefetched"] == [0.0, 1.0, 0.0, 1.0]
        assert ahead["pushes"] == {"count": 4, "during_generation": 0}
    assert _prompts(ranks[0]["ddp_sync"]) != _prompts(ranks[1]["ddp_sync"])  # each rank trains its own rows
