"""trl_ext.grpo.finished: a completion that ended at a stop string is finished, not truncated (issue #23 item 4).

TRL 1.16 calls every completion without a final EOS truncated, so with `stop: ["</answer>"]` each answered
completion counted in `completions/clipped_ratio` and `mask_truncated_completions` dropped it from the loss. The
trainer test feeds fixed completions through TRL's own `rollout_func` hook (the rest is TRL's and our code, run for
real) and compares the metrics and masks with values counted by hand. The real vLLM engine's stop strings are
checked in tests/test_vllm_colocate.py.
"""

from __future__ import annotations

import pytest
from test_trainer_helpers import COMMON, group_inputs, one_torch_thread, prompt_dataset, tiny_model  # noqa: F401

from trl_ext.grpo.finished import finished_completions, stop_strings

STOP = "</answer>"


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_finished_rule_by_table(char_tokenizer):
    tok = char_tokenizer
    eos, pad = tok.eos_token_id, tok.pad_token_id
    rows = [
        (_ids(tok, "12" + STOP), [STOP], True),  # stopped at the tag (one added token here)
        (_ids(tok, "12") + [eos], [STOP], True),  # ended with EOS
        (_ids(tok, "12") + [pad], [STOP], True),  # padded after the end (TRL's rule counts pad too)
        (_ids(tok, "1234"), [STOP], False),  # cut at max_completion_length
        (_ids(tok, "x" + STOP + "y"), [STOP], False),  # the tag earlier, not where the completion ended
        (_ids(tok, "ok!?"), ["!?"], True),  # a two-token stop string completed by the last token
        (_ids(tok, "ok!"), ["!?"], False),  # half of it
        (_ids(tok, "ok!?"), [], False),  # no stop strings: TRL's rule
        ([], ["!?"], False),
    ]
    decode = lambda ids: tok.batch_decode(ids, skip_special_tokens=True)  # noqa: E731
    for ids, stops, finished in rows:
        assert finished_completions([ids], [eos, pad], decode, stops) == [finished], (tok.decode(ids), stops)
    assert stop_strings({"stop": STOP}) == (STOP,) and stop_strings({"stop_strings": ["a", ""]}) == ("a",)
    assert stop_strings(None) == () and stop_strings({"min_tokens": 4}) == ()


# Two prompts x 4 completions (max_completion_length 8): lengths and how each ended.
COMPLETIONS = [
    ("7" + STOP, "stop"),  # 2 tokens
    ("1+2" + STOP, "stop"),  # 4
    ("12345678", "cut"),  # 8
    ("3*4", "eos"),  # 3 + EOS = 4
    ("99" + STOP, "stop"),  # 3
    ("abcdefgh", "cut"),  # 8
    ("4-1=3", "eos"),  # 5 + EOS = 6
    ("qwertyui", "cut"),  # 8
]


def _rollout(tokenizer):
    def rollout(prompts, trainer):
        prompt_ids = [_ids(tokenizer, p) for p in prompts]
        completion_ids = [
            _ids(tokenizer, text) + ([tokenizer.eos_token_id] if end == "eos" else []) for text, end in COMPLETIONS
        ]
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": [[0.0] * 8] * len(prompts)}

    return rollout


@pytest.mark.parametrize("mask_truncated", [False, True])
def test_stop_string_completions_are_finished_in_metrics_and_masks(char_tokenizer, tmp_path, mask_truncated):
    """By hand: 3 completions stopped at </answer> (2, 4, 3 tokens), 2 ended with EOS (4, 6), 3 were cut at 8.
    clipped_ratio 3/8 (TRL's rule: 6/8); terminated lengths over the 5 finished ones: mean 19/5 = 3.8, min 2,
    max 6 (TRL's: EOS only, mean 5). With mask_truncated_completions only the 3 cut rows lose their loss tokens:
    num_items_in_batch = 2 + 4 + 4 + 3 + 6 = 19 (TRL's: 10)."""
    from trl_ext import AblationGRPOConfig, AblationGRPOTrainer

    config = AblationGRPOConfig(
        **{**COMMON, "output_dir": str(tmp_path)},
        generation_kwargs={"stop": [STOP], "include_stop_str_in_output": True},
        mask_truncated_completions=mask_truncated,
    )
    trainer = AblationGRPOTrainer(
        tiny_model(char_tokenizer),
        lambda completions, **kw: [float(len(c)) for c in completions],
        args=config,
        train_dataset=prompt_dataset(),
        processing_class=char_tokenizer,
        rollout_func=_rollout(char_tokenizer),
    )
    trainer.model.train()
    batch = trainer._generate_and_score_completions(group_inputs())
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items() if k.startswith("completions/")}
    assert metrics["completions/clipped_ratio"] == pytest.approx(3 / 8)
    assert metrics["completions/mean_terminated_length"] == pytest.approx(19 / 5)
    assert (metrics["completions/min_terminated_length"], metrics["completions/max_terminated_length"]) == (2, 6)
    lengths = [2, 4, 8, 4, 3, 8, 6, 8]
    kept = [n if (not mask_truncated or end != "cut") else 0 for n, (_, end) in zip(lengths, COMPLETIONS, strict=True)]
    assert batch["completion_mask"].sum(dim=1).tolist() == kept
    assert batch["num_items_in_batch"].item() == sum(kept)
