"""Expert iteration through the real recipe path (`run_expert_iteration_recipe` on a YAML whose `base:` is
recipes/gsm8k/expert_iteration.yaml) with vLLM colocated on the real CPU engine.

Collected by tests/test_vllm_colocate.py, whose one child process (tests/scripts/vllm_colocated_runs.py) runs these
records' script, tests/scripts/vllm_expert_iteration.py, in turn with the other colocated runs: its own trainer and
engine, the imports shared. It runs 2 EI steps (4 questions x 4 completions, 8 tokens, a toy reward of
tests/scripts/toy_rewards.py: 1.0 when the completion has a digit) with validation at the start and after each EI step,
and records what the engine sampled, what was kept, what each SFT step trained on and logged, and plain-forward
recomputations (no TRL or trl_ext code) of the same numbers.

Tolerances: the SFT loss and entropies are the trainer's float32 forward against a float64 plain forward of the same
weights (measured gaps <= 1e-6; tolerance 1e-4). TRL builds the colocated engine without a dtype, so vLLM samples
in bfloat16: the engine's log-probs of its sampled tokens differ from the float32 forward by up to 0.06 with this
model (std-0.1 weights; 0.01 on average), tolerance 0.15; one SFT step at lr 2e-3 moves them by 1.0 to 1.2 on
average. Measured under ATEN_CPU_CAPABILITY=default and avx2 (different samples, same margins), with vLLM's
inductor-compiled graph. The engine runs its traced graph eagerly (`vllm_helpers.EAGER_GRAPH`: 54 CPU s for the run
in a process of its own on a 2-core CPU, 83 with inductor); one such run measured up to 0.074 (0.012 on average),
moved by 0.71.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest

TOL = 1e-4
ENGINE_TOL = 0.15


def _train_batches(ei):
    return [b for b in ei["batches"] if b["mode"] == "train"]


def test_kept_completions_are_exactly_those_the_reward_marks_correct(ei):
    """Every rollout is kept iff its text has a digit (the toy reward, recomputed here from the text), and each EI
    step's SFT step trained on exactly its kept rollouts. Catches a filter on the wrong rows (an off-by-one slice),
    on the wrong reward (a format-only or GRPO-advantage filter) or SFT on all rollouts."""
    batches = _train_batches(ei)
    assert [b["ei_step"] for b in batches] == [1, 2] and all(len(b["rows"]) == 16 for b in batches)
    for batch in batches:
        for row in batch["rows"]:
            correct = any(ch.isdigit() for ch in row["text"])
            assert row["kept"] == correct and row["reward"] == float(correct), row
        kept = Counter((tuple(r["prompt_ids"]), tuple(r["completion_ids"])) for r in batch["rows"] if r["kept"])
        assert 0 < sum(kept.values()) < 16  # the filter had both kinds to separate
        (step,) = [s for s in ei["sft_steps"] if s["ei_step"] == batch["ei_step"]]  # 16 per step: one step
        trained = Counter((tuple(r["prompt_ids"]), tuple(r["completion_ids"])) for r in step["rows"])
        assert trained == kept
    history = [e for e in ei["log_history"] if "ei/kept" in e]
    assert [e["ei/kept"] for e in history] == [sum(r["kept"] for r in b["rows"]) for b in batches]
    assert [e["ei/kept_fraction"] for e in history] == [e["ei/kept"] / 16 for e in history]


def test_sft_loss_and_entropy_equal_a_plain_forward(ei):
    """The logged `loss` of each SFT step is the token-mean NLL of its kept completions under the weights before the
    step, and `entropy` their mean token entropy, both recomputed by a plain float64 forward of each unpadded row.
    Catches a loss normalised per sequence or per micro-batch, prompt tokens in the loss, padding counted, or
    log-probs shifted by one position."""
    steps = ei["sft_steps"]
    assert len(steps) == 2
    train_logs = [e for e in ei["log_history"] if "loss" in e]
    assert [e["step"] for e in train_logs] == [1, 2] and [e["ei_step"] for e in train_logs] == [1, 2]
    for step, entry in zip(steps, train_logs, strict=True):
        assert step["logged_loss"] == entry["loss"] == pytest.approx(step["reference_nll"], abs=TOL)
        assert entry["entropy"] == pytest.approx(step["reference_entropy"], abs=TOL)
        # the step trained on them: their NLL fell (Adam's first steps at lr 2e-3 on <= 16 short rows; measured
        # 1.1 to 1.4 nats per token under ATEN_CPU_CAPABILITY=default and avx2)
        assert step["nll_after"] < step["reference_nll"] - 0.3


def test_validation_logs_entropy_and_reward_as_grpo_does(ei):
    """Validation at the start (step 0) and after each EI step (steps 1, 2) in trainer_state.json (the recipe's final
    validation comes after the state is saved, as for GRPO): the logged `eval_entropy` equals a plain forward's mean
    token entropy over the validation completions, `eval_reward` and `eval_rewards/digit_any/answer_reward` the toy
    reward of the completions. Catches an EI that validates with other
    weights than it trained, or logs other names than GRPO's (the plot panels read these keys)."""
    evals = [e for e in ei["log_history"] if "eval_entropy" in e]
    assert [(e["step"], e["ei_step"]) for e in evals] == [(0, 0), (1, 1), (2, 2)]
    batches = [b for b in ei["batches"] if b["mode"] == "eval"]
    assert len(batches) == len(ei["evaluations"]) == 4  # and the final validation
    for entry, recorded, batch in zip(evals, ei["evaluations"][:3], batches[:3], strict=True):
        assert entry["eval_entropy"] == pytest.approx(recorded["entropy"], abs=TOL)
        rewards = [float(any(ch.isdigit() for ch in r["text"])) for r in batch["rows"]]
        assert entry["eval_reward"] == pytest.approx(sum(rewards) / len(rewards))
        assert entry["eval_rewards/digit_any/answer_reward"] == pytest.approx(sum(rewards) / len(rewards))
        lengths = [len(r["completion_ids"]) for r in batch["rows"]]
        assert entry["eval_completions/mean_length"] == pytest.approx(sum(lengths) / len(lengths))


def test_rollouts_come_from_the_engine_with_the_trained_weights(ei):
    """EI step 1 samples with the checkpoint's weights, step 2 with the weights after step 1's SFT: each sampled
    token's engine log-prob matches a forward of the weights at that moment, and in step 2 no longer the initial
    ones. Catches an EI that never syncs its SFT updates into vLLM (it would keep sampling the initial policy)."""
    for batch in ei["batches"]:
        for row in batch["rows"]:
            assert len(row["engine"]) == len(row["completion_ids"]) > 0
            gap = max(abs(a - b) for a, b in zip(row["engine"], row["forward"], strict=True))
            assert gap < ENGINE_TOL, (batch["mode"], batch["ei_step"], gap)
    second = _train_batches(ei)[1]["rows"]
    moved = [abs(a - b) for r in second for a, b in zip(r["engine"], r["initial"], strict=True)]
    noise = [abs(a - b) for r in second for a, b in zip(r["engine"], r["forward"], strict=True)]
    assert sum(moved) / len(moved) > 0.3 > 10 * sum(noise) / len(noise)  # measured 0.7-1.2 against 0.01
    assert all(math.isfinite(x) for r in second for x in r["engine"])


def test_the_colocated_cpu_engine_of_expert_iteration_samples_with_the_sampler_fix(ei):
    """The engine TRL built for the EI trainer samples with `trl_ext.grpo.vllm.cpu_sampler`'s fix (`use_fp64_gumbel`,
    read back from its `TopKTopPSampler`): vLLM's compiled CPU sampler was measured skipping half a vocabulary on
    AVX2."""
    assert ei["sampler_fixed"] is True


def test_sft_accuracy_generates_greedily_with_the_engine(ei):
    """`ValidatingSFTTrainer`'s vLLM path (`accuracy_backend: vllm`) on the same engine, greedy: every token the
    engine chose is the float32 model's argmax wherever its top-2 logits are further apart than bfloat16 can blur
    (0.1), its log-probs match the forward, and the logged mean length is that of the samples (cut at <eos>).
    Catches prompts sent without their token ids, sampling instead of greedy, or samples misaligned with prompts."""
    sft = ei["sft"]
    assert len(sft["samples"]) == 4
    clear = sum(m > 0.1 for row in sft["samples"] for m in row["margin"])
    assert clear >= 16  # most of the 4 x 8 positions are checked
    for row in sft["samples"]:
        assert 0 < len(row["token_ids"]) <= 8 and len(row["engine"]) == len(row["token_ids"])
        assert max(abs(a - b) for a, b in zip(row["engine"], row["forward"], strict=True)) < ENGINE_TOL
        clear = [(t, a) for t, a, m in zip(row["token_ids"], row["argmax"], row["margin"], strict=True) if m > 0.1]
        assert all(token == argmax for token, argmax in clear), row
    lengths = []
    for row in sft["samples"]:
        ids = row["token_ids"]
        lengths.append(ids.index(sft["eos"]) + 1 if sft["eos"] in ids else len(ids))
    assert sft["metrics"]["eval_completions/mean_length"] == pytest.approx(sum(lengths) / 4)
    assert sft["metrics"]["eval_rewards/countdown_reward/answer_reward"] == 0.0  # the tiny model solves none
