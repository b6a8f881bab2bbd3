"""GRPO with vLLM in colocate mode on the real CPU engine: training steps, weight sync, importance sampling.

tests/scripts/vllm_colocate.py trains `AblationGRPOTrainer` for 3 steps and records what the engine and the trainer
computed (see its docstring). It is the first of the colocated runs that tests/scripts/vllm_colocated_runs.py runs
one after another in ONE child process (vLLM pins the threads of the process that hosts an engine and initialises
torch.distributed there): this run with vLLM's compiled graph (inductor, what users get: the suite's only colocated
engine with it), then, each with its own trainer and an engine run eagerly, the records of the checks this module
collects from tests/vllm_finish_reasons_checks.py, tests/vllm_dynamic_sampling_checks.py and
tests/vllm_expert_iteration_checks.py. The process pays the imports of torch, transformers, TRL and vLLM once instead
of four times. TRL's own sync cannot run on the
CPU engine (`AttributeError: 'Parameter' object has no attribute 'weight_loader'`, see
trl_ext/grpo/weight_sync/colocate.py); `AblationGRPOTrainer` installs
`trl_ext.grpo.weight_sync.colocate.sync_weights_cpu` there.

Tolerance: TRL builds the colocated engine without a dtype, so vLLM runs the float32 checkpoint in bfloat16
(`engine_dtype`) while the trainer computes in float32, and |engine - forward| log-prob of the same token is the
rounding noise of a whole bfloat16 forward (8 significant bits: 2^-8 = 0.0039 relative). Measured on the tiny model
after the 3 training steps, 4,088 tokens drawn by each sampler (the compiled one and the eager fix, same engine and
weights): per-token std 0.0102 and 0.0099, the largest 0.080 and 0.072, three tokens of 8,176 beyond 0.05; rounding
the float32 logits alone to bfloat16 accounts for std 0.0065 (max 0.025), the rest is the layers'. The differences
are the same for both samplers: the sampler only chooses which tokens are compared. A run compares at most 192
(3 steps x 8 completions x 8 tokens); resampling 192 of the 8,176, the largest exceeded 0.05 in 6.6% of the draws
(runs measured 0.016 and 0.038 with the compiled sampler, 0.056 with the fix, which draws other tokens and so
trains other weights), and an exponential tail fitted beyond 0.03 puts one of 192 beyond 0.1 at 5e-5. LOGP_TOL =
0.1, ten standard deviations, is still 18 times below the smallest failure the tests catch: a sync that misses the
tied LM head leaves 1.8 to 3.3; a missing sync, the weights of step 0 (the fixed completion's log-probs moved by
4.6).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from vllm_dynamic_sampling_checks import (  # noqa: F401 -- collected here to share this module's child process
    test_trained_batches_hold_only_varied_groups,
    test_vllm_entries_stay_on_their_rows,
)
from vllm_expert_iteration_checks import (  # noqa: F401 -- collected here to share this module's child process
    test_kept_completions_are_exactly_those_the_reward_marks_correct,
    test_rollouts_come_from_the_engine_with_the_trained_weights,
    test_sft_accuracy_generates_greedily_with_the_engine,
    test_sft_loss_and_entropy_equal_a_plain_forward,
    test_the_colocated_cpu_engine_of_expert_iteration_samples_with_the_sampler_fix,
    test_validation_logs_entropy_and_reward_as_grpo_does,
)
from vllm_finish_reasons_checks import (  # noqa: F401 -- collected here to share this module's child process
    test_special_token_stop_string_with_special_tokens_kept_is_finished,
    test_speculative_tokens_past_the_stop_string_are_finished,
    test_stop_string_matched_inside_min_tokens_does_not_hide_the_real_stop,
)
from vllm_helpers import SCRIPTS, child_env, require_vllm_cpu

LOGP_TOL = 0.1  # bfloat16 engine vs float32 trainer: 10 x the measured per-token std 0.010 (module docstring)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def colocated_runs(tmp_path_factory):
    """The output folder of tests/scripts/vllm_colocated_runs.py (every run; one that failed fails only its tests)."""
    require_vllm_cpu()
    out = tmp_path_factory.mktemp("colocated_runs")
    with open(out / "run.log", "w") as log:
        argv = [sys.executable, str(SCRIPTS / "vllm_colocated_runs.py"), str(out)]
        subprocess.run(argv, env=child_env(), stdout=log, stderr=subprocess.STDOUT, timeout=1800)
    return out


def _result(out, name: str) -> dict:
    """Run `name`'s result.json; fails with its traceback (or the log's tail when the process died) if it has none."""
    path = out / name / "result.json"
    if not path.exists():
        error = out / name / "error.txt"
        text = error.read_text() if error.exists() else (out / "run.log").read_text(errors="replace")
        pytest.fail(f"the colocated run {name!r} wrote no result; " + "\n".join(text.splitlines()[-40:]))
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def colocate(colocated_runs):
    return _result(colocated_runs, "colocate")


@pytest.fixture(scope="module")
def finish_reasons(colocated_runs):
    from transformers import AutoTokenizer

    result = _result(colocated_runs, "finish_reasons")
    result["tokenizer"] = AutoTokenizer.from_pretrained(str(colocated_runs / "finish_reasons" / "model"))
    return result


@pytest.fixture(scope="module")
def dynamic_sampling(colocated_runs):
    return _result(colocated_runs, "dynamic_sampling")


@pytest.fixture(scope="module")
def ei(colocated_runs):
    return _result(colocated_runs, "expert_iteration")


def test_three_training_steps_generate_with_the_synced_weights(colocate):
    """Every generation (step 0 with the checkpoint, steps 1 and 2 after a sync) sampled with the trainer's current
    weights: the log-prob the engine returned for each sampled token equals a plain forward of the trainer's model.
    Catches the TRL sync failing on CPU (the run dies), a sync that leaves layers stale (differences of 1 and more),
    and a sampled-token / log-prob misalignment."""
    assert colocate["global_step"] == 3 and len(colocate["losses"]) == 3
    assert [g["step"] for g in colocate["generations"]] == [0, 1, 2]
    assert colocate["engine_dtype"] == "torch.bfloat16"
    assert colocate["graph_backend"] == "inductor"  # the compiled graph users get (the other runs' is eager)
    for generation in colocate["generations"]:
        assert len(generation["rows"]) == 8
        for row in generation["rows"]:
            assert len(row["engine"]) == len(row["forward"]) > 0
            gap = max(abs(a - b) for a, b in zip(row["engine"], row["forward"], strict=True))
            assert gap < LOGP_TOL, (generation["step"], row)


def test_the_colocated_cpu_engine_samples_with_the_sampler_fix(colocate):
    """The engine TRL built for our trainer samples with `trl_ext.grpo.vllm.cpu_sampler`'s fix (`use_fp64_gumbel`, read
    back from the engine's own `TopKTopPSampler`): vLLM's compiled CPU sampler was measured skipping half a vocabulary
    on AVX2 kernels (tests/test_vllm_sampler.py). Catches the trainer leaving a colocated CPU engine on the compiled
    path."""
    assert colocate["sampler_fixed"] is True


def test_engine_log_probs_of_a_fixed_completion_follow_the_trainer(colocate):
    """After training and a sync, the engine scores a fixed completion as the trained model does, and no longer as
    the initial weights did. Catches a sync that pushes nothing (engine still at step 0) or the wrong tensors."""
    before, after = colocate["fixed_before"], colocate["fixed_after"]
    assert max(abs(a - b) for a, b in zip(before["engine"], before["trainer"], strict=True)) < LOGP_TOL
    assert max(abs(a - b) for a, b in zip(after["engine"], after["trainer"], strict=True)) < LOGP_TOL
    moved = max(abs(a - b) for a, b in zip(after["trainer"], before["trainer"], strict=True))
    print(f"fixed completion moved by {moved:.3f}")
    assert moved > 20 * LOGP_TOL  # training changed the model well beyond the tolerance
    assert max(abs(a - b) for a, b in zip(after["engine"], before["engine"], strict=True)) > 20 * LOGP_TOL


def test_importance_sampling_ratio_uses_the_engine_log_probs(colocate):
    """`vllm_importance_sampling_correction` ran with real engine log-probs: TRL's sequence-level ratio of every
    completion is `exp(sum_t (logp_trainer - logp_engine))` (not masked: all under `clip_max`), and the engine and
    trainer disagree a little (bfloat16), so the ratio is not trivially 1. Catches a correction fed with the
    trainer's own log-probs, or with log-probs of other tokens or other completions."""
    ratios = []
    for generation in colocate["generations"]:
        for row in generation["rows"]:
            expected = math.exp(sum(f - e for f, e in zip(row["forward"], row["engine"], strict=True)))
            assert expected < colocate["clip_max"]
            assert row["is_ratio"] == [pytest.approx(expected, rel=1e-4)]
            ratios.append(expected)
    assert max(abs(r - 1) for r in ratios) > 1e-3


def test_engine_stop_strings_are_finished_by_vllms_own_account(colocate):
    """Against vLLM itself: for completions the real engine generated with stop strings (one-token
    tags, characters, two-token strings; the stop string's text kept and dropped), `trl_ext.grpo.rollouts.finished`'s
    rule calls a completion finished exactly when vLLM's `finish_reason` is "stop" (stop string or EOS) and truncated
    when it is "length". TRL's rule (last token EOS or pad) called every stop-string completion truncated."""
    from transformers import AutoTokenizer

    from trl_ext.grpo.rollouts.finished import finished_completions

    tokenizer = AutoTokenizer.from_pretrained(colocate["model_path"])
    rows = colocate["stopped"]
    decode = lambda ids: tokenizer.batch_decode(ids, skip_special_tokens=True)  # noqa: E731
    ours = finished_completions([r["ids"] for r in rows], colocate["eos_and_pad"], decode, colocate["stops"])
    assert ours == [r["reason"] == "stop" for r in rows]
    stopped_by_string = [r for r in rows if r["reason"] == "stop" and r["ids"][-1] not in colocate["eos_and_pad"]]
    assert len(stopped_by_string) >= 4 and sum(r["reason"] == "length" for r in rows) >= 4  # both kinds occurred
    assert {r["keep"] for r in stopped_by_string} == {True, False}


def test_padding_free_gives_the_same_loss_and_gradients_on_engine_batches(colocate):
    """On every batch the real engine generated (with TRL's importance-sampling ratio from the engine's
    log-probs), the loss and its gradients with `padding_free` on equal the padded ones (loss 1e-6, gradients 1e-5
    relative). Catches a packed forward that mixes rows or scores the wrong tokens."""
    for generation in colocate["generations"]:
        check = generation["padding_free"]
        assert check["grad_max"] > 1e-4 and len(set(check["tokens"])) > 1  # a real gradient, rows of varied length
        assert check["loss_diff"] <= 1e-6 and check["grad_rel"] <= 1e-5, (generation["step"], check)


def test_no_method_is_replaced_on_a_library_object_in_colocate_mode(colocated_runs):
    """The colocated runs' trainers after training (GRPO, dynamic sampling, expert iteration with SFT validation on
    its engine, finish reasons with a speculative engine): no instance attribute of the trainer, its vLLM generation,
    the engine TRL built or that engine's `llm_engine` shadows a method of its class. The colocated CPU sync, the
    sampler fix and the finish reasons are overrides of `TrlExtVLLMGeneration`; catches a wrapper assigned onto a live
    object, as `llm.generate = ...` and `vllm_generation.sync_weights = ...` once were."""
    for name in ("colocate", "dynamic_sampling", "expert_iteration", "finish_reasons"):
        shadowed = _result(colocated_runs, name)["shadowed"]
        assert set(shadowed) == {"trainer", "vllm_generation", "llm", "llm_engine"}, (name, shadowed)
        assert not any(shadowed.values()), (name, shadowed)
