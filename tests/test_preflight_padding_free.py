"""trl_ext.preflight with `padding_free`: the estimate follows a micro-batch's expected tokens, the log-prob
head its tiles, and the plan picks the micro-batch / GA that fits; every number computed by hand.

Qwen/Qwen3-1.7B (recipes/countdown/qwen3_1.7b_grpo_l512.yaml, one GPU, server mode, fp32 master weights, torch AdamW):
P = 1,720,574,976, H = 2048, L = 28, I = 6144, q = 2048, kv = 1024, V = 151,936. Checkpointed activations keep
471,040 bytes per token (L x H x 4 = 229,376 plus two layers' internals 2 x 120,832; see test_preflight_memory.py).
The log-prob head of s scored tokens: TRL's fp32 LM-head gradient V x H x 4 = 1,244,659,712, plus s x H x (4 + 4),
plus one bf16 tile min(s, 4096) x 32768 x 2.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from trl_ext.preflight import estimate_memory, load_model_shape, plan_batches
from trl_ext.preflight.batch import micro_batch_choices
from trl_ext.preflight.fit import largest_fitting_micro_batch
from trl_ext.preflight.memory import GIB, RUNTIME_OVERHEAD_GIB
from trl_ext.preflight.plan import RunContext, check_recipe
from trl_ext.preflight.setup import EXPECTED_COMPLETION_FRACTION, TrainingSetup, training_setup
from trl_ext.recipes import parse_recipe_args, stated_values

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "countdown" / "qwen3_1.7b_grpo_l512.yaml"
P = 1_720_574_976
PER_TOKEN = 471_040
HEAD_GRAD = 1_244_659_712


def head(scored: int, tile_tokens: int = 4096) -> int:
    return HEAD_GRAD + scored * 2048 * 8 + min(scored, tile_tokens) * 32768 * 2


def _parse(*extra: str):
    return parse_recipe_args("countdown", ["--config", str(RECIPE), "--use_cpu", "true", *extra])


def _setup(padding_free: bool, **fields) -> TrainingSetup:
    """The recipe's setup, with `padding_free` (a config field) and `fields` set on the parsed arguments."""
    script, args, model = _parse()
    args.padding_free = padding_free
    for name, value in fields.items():
        setattr(script if name == "expected_completion_tokens" else args, name, value)
    layout = plan_batches(stated_values(RECIPE), 1)
    return training_setup("countdown", script, args, model, layout, RunContext(check_packages=False))


@pytest.fixture(scope="module")
def shape():
    return load_model_shape("Qwen/Qwen3-1.7B")[0]


def test_padded_l512_by_hand(shape):
    # 2 x (266 + 512) = 1556 tokens; 2 x 512 = 1024 scored
    train = estimate_memory(shape, _setup(False)).phases["train"]
    assert train["activations"] == 1556 * PER_TOKEN == 732_938_240
    assert train["log-prob head"] == head(1024) == 1_328_545_792


def test_padding_free_uses_the_expected_completion_tokens(shape):
    # Default: half of 512 = 256 per row, so 2 x (266 + 256) = 1044 tokens and 512 scored: the same train phase as
    # the padded L256 recipe (test_preflight_memory.test_qwen3_countdown_drgrpo_l256_by_hand).
    setup = _setup(True)
    assert EXPECTED_COMPLETION_FRACTION == 0.5 and setup.row_completion_tokens == 256
    estimate = estimate_memory(shape, setup)
    train = estimate.phases["train"]
    assert train["activations"] == 1044 * PER_TOKEN == 491_765_760
    assert train["log-prob head"] == head(512) == 1_286_602_752
    # validation: 128 rows x (266 + 256) tokens x 65,536 + 32,768 scored x H x 4 + one 4096-token tile
    assert estimate.phases["eval"]["validation forward"] == 66_816 * 65_536 + 32_768 * 2048 * 4 + 4096 * 32768 * 2
    # the worst case (every completion at 512) is the padded estimate, and the plan says so
    padded = estimate_memory(shape, _setup(False))
    assert any(f"{padded.peak_gib:.1f} GiB if every completion" in note for note in estimate.notes)


def test_stated_expected_completion_tokens_and_its_cap(shape):
    # 100 tokens per row: 2 x 366 = 732 tokens, 200 scored
    train = estimate_memory(shape, _setup(True, expected_completion_tokens=100)).phases["train"]
    assert train["activations"] == 732 * PER_TOKEN == 344_801_280
    assert train["log-prob head"] == head(200) == 1_261_043_712
    # more than max_completion_length is capped at it: the padded numbers
    capped = estimate_memory(shape, _setup(True, expected_completion_tokens=4000)).phases["train"]
    assert capped == estimate_memory(shape, _setup(False)).phases["train"]
    # ignored without padding_free
    assert _setup(False, expected_completion_tokens=100).row_completion_tokens == 512


def test_logprob_chunk_and_unchunked_head(shape):
    # a 256-token tile (TRL's is a fixed 4096; the estimate takes the tile as a parameter)
    train = estimate_memory(shape, replace(_setup(False), logprob_token_chunk=256)).phases["train"]
    assert train["log-prob head"] == head(1024, tile_tokens=256) == 1_278_214_144
    # materialised fp32 logits instead of tiles: 1024 x V x 4 and no fp32 head-gradient accumulator
    unchunked = replace(_setup(False), chunked_logprobs=False)
    assert estimate_memory(shape, unchunked).phases["train"]["log-prob head"] == 1024 * 151_936 * 4 + 1024 * 2048 * 8


def test_micro_batch_choices_keep_the_completions_per_step():
    assert micro_batch_choices(stated_values(RECIPE), 1) == {2**k: 256 // 2**k for k in range(9)}
    assert micro_batch_choices(stated_values(RECIPE), 2) == {2**k: 128 // 2**k for k in range(8)}


def test_largest_fitting_micro_batch_by_hand(shape):
    """Padding-free, 256 expected completion tokens. Train phase = 16 P + activations + head + the autocast cache
    C = 2 x 28 x 50,331,648 = 2,818,572,288 (bf16 copies of the decoder's linear weights); the optimizer step,
    20 P = 34,411,499,520, is the peak below micro-batch 16.
        256: 133,632 tokens -> 16 P + 62,946,017,280 + head(65,536) 2,586,836,992 + C = 95,880,626,176 (89.30 GiB)
        128: 66,816 tokens -> 16 P + 31,473,008,640 + head(32,768) 2,049,966,080 + C = 63,870,746,624 (59.48 GiB)
         64: 33,408 tokens -> 16 P + 15,736,504,320 + head(16,384) 1,781,530,624 + C = 47,865,806,848 (44.58 GiB)
         32: 16,704 tokens -> 16 P + 7,868,252,160 + head(8,192) 1,647,312,896 + C = 39,863,336,960 (37.13 GiB)
         16: 8,352 tokens -> 16 P + 3,934,126,080 + head(4,096) 1,580,204,032 + C = 35,862,102,016 (33.40 GiB)
    Padded (778 tokens a row), 32: 24,896 tokens -> 16 P + 11,727,011,840 + head(16,384) + C = 43,856,314,368 (40.84);
    16: 12,448 tokens -> 16 P + 5,863,505,920 + head(8,192) + C = 37,858,590,720 (35.26); 8: 6,224 tokens ->
    16 P + 2,931,752,960 + head(4,096) + C = 34,859,728,896 (32.47 GiB).
    """
    overhead = RUNTIME_OVERHEAD_GIB * GIB
    choices = list(micro_batch_choices(stated_values(RECIPE), 1))
    setup = _setup(True)
    micro_batch, estimate = largest_fitting_micro_batch(shape, setup, 79.6, choices)
    assert micro_batch == 128 and estimate.peak_bytes == 63_870_746_624 + overhead
    assert estimate_memory(shape, replace(setup, micro_batch=256)).peak_bytes == 95_880_626_176 + overhead
    micro_batch, estimate = largest_fitting_micro_batch(shape, setup, 40, choices)
    assert micro_batch == 32 and estimate.peak_bytes == 39_863_336_960 + overhead  # 64: 46.08 GiB
    padded = largest_fitting_micro_batch(shape, _setup(False), 40, choices)
    assert padded[0] == 16 and padded[1].peak_bytes == 37_858_590_720 + overhead
    assert estimate_memory(shape, replace(_setup(False), micro_batch=32)).peak_bytes == 43_856_314_368 + overhead
    # 36.5 GiB: padding-free fits 16 (34.9 GiB), not 32 (38.6 GiB); padded fits 8 (34.0 GiB), not 16 (36.8 GiB)
    micro_batch, estimate = largest_fitting_micro_batch(shape, setup, 36.5, choices)
    assert micro_batch == 16 and estimate.peak_bytes == 35_862_102_016 + overhead
    padded = largest_fitting_micro_batch(shape, _setup(False), 36.5, choices)
    assert padded[0] == 8 and padded[1].peak_bytes == 34_859_728_896 + overhead
    # nothing fits under the optimizer step's 20 P
    assert largest_fitting_micro_batch(shape, setup, 24, choices) is None


def test_plan_prints_the_assumption_and_the_pick(tmp_path):
    script, args, model = _parse("--output_dir", str(tmp_path / "run"))
    args.padding_free = True
    context = RunContext(check_packages=False, gpu_memory_gib=40, memory_limit_gib=40)
    report = check_recipe("countdown", RECIPE, [], (script, args, model), context, stated_values(RECIPE))
    text = report.render()
    assert "micro-batch 2 x (266 + 256 expected of 512, padding-free: default half of it" in text
    assert "--per_device_train_batch_size 32 --gradient_accumulation_steps 8" in text
    assert "padded, the largest that fits is 16" in text
    args.padding_free = False
    padded = check_recipe("countdown", RECIPE, [], (script, args, model), context, stated_values(RECIPE)).render()
    assert "micro-batch 2 x (266 + 512) tokens" in padded and "pick:" not in padded


def test_expected_completion_tokens_on_a_padded_run_is_refused(tmp_path):
    """The assumption only shapes a padding-free estimate; on a padded run it would be silently ignored."""
    script, args, model = _parse("--output_dir", str(tmp_path / "run"), "--expected_completion_tokens", "100")
    args.padding_free = False
    context = RunContext(check_packages=False, gpu_memory_gib=80, memory_limit_gib=80)
    report = check_recipe("countdown", RECIPE, [], (script, args, model), context, stated_values(RECIPE))
    [problem] = [p for p in report.problems if p.field == "expected_completion_tokens"]
    assert "pads every row to max_completion_length (512)" in problem.message
    assert problem.fix == "unset --expected_completion_tokens, or add --padding_free true"
    args.padding_free = True
    report = check_recipe("countdown", RECIPE, [], (script, args, model), context, stated_values(RECIPE))
    assert not [p for p in report.problems if p.field == "expected_completion_tokens"]
    assert "100 expected of 512, padding-free: --expected_completion_tokens" in report.render()
