"""Truncation from vLLM's own word, colocate mode on the real CPU engine.

Collected by tests/test_vllm_colocate.py, whose one child process (tests/scripts/vllm_colocated_runs.py) runs these
records' script, tests/scripts/vllm_finish_reasons.py, in turn with the other colocated runs: its own trainer and
engine, the imports shared. The engine decodes speculatively (vLLM's n-gram proposer runs on the CPU build): the script
runs `AblationGRPOTrainer._generate_and_score_completions` (TRL's vLLM path and our mixin, `mask_truncated_completions`
on) once per case, and the same requests straight to `llm.generate`, whose `finish_reason` is the reference. Each case
is a way the token-tail rule (`finished_completions`, still the transformers backend's rule) misreads a completion vLLM
finished; each test first shows the case occurred (rows where that rule disagrees with vLLM, for the case's reason),
then that the trainer followed vLLM on every row. The engine runs its traced graph eagerly (`vllm_helpers.EAGER_GRAPH`:
90 CPU s for the run in a process of its own on a 2-core CPU, 123 with inductor)."""

from __future__ import annotations

import pytest

MIN_TOKENS = 9  # tests/scripts/vllm_finish_reasons.py


def _trainer_followed_vllm(case: dict, pad: int) -> None:
    """On every row: the trainer generated what `llm.generate` did, called it finished exactly when vLLM's
    `finish_reason` is "stop", kept its whole loss mask then and none otherwise; the logged clipped ratio is the share
    of rows vLLM did not stop."""
    rows = case["rows"]
    for row, trainer_ids in zip(rows, case["trainer_ids"], strict=True):
        n = len(row["ids"])
        assert trainer_ids[:n] == row["ids"] and set(trainer_ids[n:]) <= {pad}, row
        stopped = row["reason"] == "stop"
        assert row["finished"] == stopped, row
        assert row["mask_sum"] == (n if stopped else 0), row
    assert case["recorded_reasons"] == [row["reason"] for row in rows]
    assert case["clipped_ratio"] == pytest.approx(sum(r["reason"] != "stop" for r in rows) / len(rows))


def test_speculative_tokens_past_the_stop_string_are_finished(finish_reasons):
    """With speculative decoding vLLM accepts several tokens a step and keeps them all in the ids, so a completion
    stopped at "yyy" can end "yyyy": the tail rule, which wants the stop string completed by the last token, calls
    it truncated (and `mask_truncated_completions` would drop it). Catches a trainer that guesses from the ids."""
    assert "ngram" in finish_reasons["spec_config"]
    case, tok = finish_reasons["cases"]["speculative"], finish_reasons["tokenizer"]
    past = [
        r
        for r in case["rows"]
        if r["reason"] == "stop" and r["stop_reason"] in tok.decode(r["ids"][:-1], skip_special_tokens=True)
    ]
    assert len(past) >= 4 and not any(r["tail_rule"] for r in past)  # the case occurred, and the tail misread it
    assert sum(r["reason"] == "length" for r in case["rows"]) >= 2  # cut ones too
    _trainer_followed_vllm(case, tok.pad_token_id)


def test_special_token_stop_string_with_special_tokens_kept_is_finished(finish_reasons):
    """A stop string that is a special token (`</answer>` here), with `skip_special_tokens: false`: vLLM's text holds
    it and stops there; the tail rule decodes with `skip_special_tokens=True`, loses it, and calls the completion
    truncated. Catches a trainer that guesses from the decoded tail."""
    case, tok = finish_reasons["cases"]["special_stop"], finish_reasons["tokenizer"]
    assert case["kwargs"]["skip_special_tokens"] is False
    hit = [r for r in case["rows"] if r["reason"] == "stop" and r["stop_reason"] in finish_reasons["tags"]]
    assert len(hit) >= 4 and not any(r["tail_rule"] for r in hit)
    for row in hit:
        assert row["ids"][-1] == finish_reasons["tags"][row["stop_reason"]]
        assert row["stop_reason"] in tok.all_special_tokens
    _trainer_followed_vllm(case, tok.pad_token_id)


def test_stop_string_matched_inside_min_tokens_does_not_hide_the_real_stop(finish_reasons):
    """With `min_tokens`, vLLM skips the stop strings the first tokens complete; when it then stops at the same string
    a little later, the tail can still hold the skipped match, and the tail rule (the stop string must first appear
    with the last token) calls the completion truncated. Catches a trainer that guesses from the tail."""
    case, tok = finish_reasons["cases"]["min_tokens"], finish_reasons["tokenizer"]
    assert case["kwargs"]["min_tokens"] == MIN_TOKENS
    skipped = []
    for row in case["rows"]:
        stop, ids = row["stop_reason"], row["ids"]
        # stopped by the last token (no speculative tokens past it: vLLM's text, cut after the stop string, is the
        # whole decode) with the stop string also earlier
        if row["reason"] == "stop" and row["text"] == tok.decode(ids) and stop in tok.decode(ids[:-1]):
            assert stop in tok.decode(ids[:MIN_TOKENS]), row  # the earlier match: one vLLM skipped for min_tokens
            skipped.append(row)
    assert sum(not r["tail_rule"] for r in skipped) >= 4  # misread where the skipped match is in the tail
    _trainer_followed_vllm(case, tok.pad_token_id)
