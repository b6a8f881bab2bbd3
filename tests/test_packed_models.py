"""Which models `padding_free` packs, and the flash-attention varlen arguments it passes.

Which models: transformers keeps packed rows apart only where the model passes `position_ids` to its mask builder and
no `past_key_values` (trl_ext.preflight.packed_models). Every allow-listed model type is built tiny from its config
(random init, offline) and its packed logits compared with the padded forward's; Falcon and Bloom (masks built without
position_ids), GPT-2 (absolute positions) and prefix tuning on Qwen3 (PEFT's past_key_values) are shown to differ and
are refused by `packing_problem`, the trainer and the preflight.

The varlen arguments: with flash-attention, packing computes `cu_seq_lens_q/k` (int32) and `max_length_q/k` (ints) once
per chunk and passes them to the model, so transformers' `_flash_attention_forward` takes its
`is_fa_with_varlen_kwargs` branch instead of recomputing the boundaries in every layer. transformers' flash_attention_2
slot is taken, for one test at a time, by a function registered through `AttentionInterface` that records the arguments
each attention call receives and attends within each sequence by sdpa; the flash kernels themselves need a GPU.

Bugs caught: a model type allowed whose rows attend to each other (or refused when it need not be), a prefix-tuned
model packed, boundaries missing, off by one, int64 or recomputed per layer, a host read in `pack_rows`.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from helpers import ragged_rows
from test_trainer_helpers import make_trainer, one_torch_thread  # noqa: F401 (autouse fixture)
from transformers import AttentionInterface, AutoConfig, AutoModelForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from trl.trainer.utils import add_fused_lm_head

from trl_ext import AblationGRPOTrainer
from trl_ext.grpo.packing import pack_rows, packed_logps_and_entropies, packing_problem, row_spans, unpack_per_token
from trl_ext.preflight.packed_models import PACKED_MODEL_TYPES, padding_free_problems
from trl_ext.tiny import build_tiny_qwen3

VOCAB = 64
ALLOWED = sorted(PACKED_MODEL_TYPES)
# ragged_rows: rows of 15, 5, 6, 4 and 9 real tokens (prompts left-padded from columns 0, 3, 5, 2, 4 of 15).
LENGTHS, FIRSTS = [15, 5, 6, 4, 9], [0, 3, 5, 2, 4]
CU_SEQ_LENS = [0, 15, 20, 26, 30, 39]  # one packed row, rows in order: running totals of LENGTHS
_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
_EXTRA = {
    "qwen2_moe": {**_MOE, "shared_expert_intermediate_size": 16},
    "qwen3_moe": _MOE,
    "bloom": dict(n_layer=2, n_head=4),
    "gpt2": dict(n_layer=2, n_head=4, n_embd=32),
}
# Not allowed, with the attention they run: Bloom has no sdpa.
REFUSED = {"falcon": "sdpa", "bloom": "eager", "gpt2": "sdpa"}


def tiny(model_type: str, attention: str = "sdpa", vocab: int = VOCAB):
    """A 2-layer, 32-wide random model of `model_type` from its config (4 heads; 2 KV heads of 8 where it has them)."""
    kwargs = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  pad_token_id=0, bos_token_id=None, eos_token_id=1)  # fmt: skip
    if model_type not in REFUSED:
        kwargs.update(num_key_value_heads=2, head_dim=8)
    config = AutoConfig.for_model(model_type, **kwargs, **_EXTRA.get(model_type, {}))
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation=attention).eval()


@torch.no_grad()
def packed_and_padded(model, capacity: int | None = None, vocab: int = VOCAB):
    """Logits `(N, V)` at the real tokens of `ragged_rows`, packed (position_ids restarting, no mask) and padded."""
    input_ids, mask, t = ragged_rows(vocab)
    packed = pack_rows(input_ids, mask, t, capacity)
    real = packed.index >= 0
    padded = model(input_ids=input_ids, attention_mask=mask).logits.flatten(0, 1)[packed.index[real]]
    logits = model(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False).logits
    return logits[real], padded, packed


def _first_row(packed) -> torch.Tensor:
    """`(N,)` True at the tokens of padded row 0 (packed first: nothing before it to attend to)."""
    index = packed.index[packed.index >= 0]
    return index < packed.shape[1]


# Which models: the allow-list holds, the others mix rows and are refused.


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("model_type", ALLOWED)
def test_allow_listed_types_pack_like_the_padded_forward(model_type, attention):
    model = tiny(model_type, attention)
    assert model.config.model_type == model_type and packing_problem(model) is None
    for capacity in (None, 15):  # one packed row; rows of at most 15 tokens: [15], [9, 6], [5, 4]
        logits, padded, _ = packed_and_padded(model, capacity)
        assert (logits - padded).abs().max() < 1e-5


@pytest.mark.parametrize("model_type", list(REFUSED))
def test_types_whose_packed_rows_differ_are_refused(model_type, tmp_path):
    model = tiny(model_type, REFUSED[model_type])
    logits, padded, packed = packed_and_padded(model)
    first = _first_row(packed)
    # Row 0, packed first, sees only itself and matches; the rows after it see the rows packed before them (Falcon,
    # Bloom: no packed-sequence mask) or other positions (GPT-2's absolute embeddings against the left padding).
    assert (logits[first] - padded[first]).abs().max() < 1e-5
    print(f"\n[packed models] {model_type}: rows 1-4 logits max |diff| {(logits - padded).abs().max():.1e}")
    assert (logits[~first] - padded[~first]).abs().max() > 1e-3  # rounding: < 2e-7
    assert f"model type {model_type!r} is not known to keep packed rows apart" in packing_problem(model)
    model.config.save_pretrained(tmp_path)  # the preflight reads the config before any model loads
    (problem,) = padding_free_problems(str(tmp_path))
    assert problem.field == "padding_free" and f"{model_type!r}" in problem.message
    assert problem.fix == "set padding_free: false"


def test_falcon_refused_by_the_trainer_before_training(char_tokenizer, tmp_path):
    model = tiny("falcon", vocab=len(char_tokenizer))
    with pytest.raises(ValueError, match=r"cannot be used here: model type 'falcon' .*set padding_free=False"):
        make_trainer(char_tokenizer, tmp_path / "on", model=model, padding_free=True)
    make_trainer(char_tokenizer, tmp_path / "off", model=model, padding_free=False)  # padded: untouched


def test_preflight_refuses_padding_free_on_falcon_before_it_loads(tmp_path):
    """`check_recipe` reads the model's config.json (no weights) and refuses a type off the allow-list."""
    from trl_ext.preflight import PreflightError
    from trl_ext.preflight.plan import RunContext, check_recipe
    from trl_ext.recipes import parse_recipe_args, stated_values

    recipe = Path(__file__).resolve().parents[1] / "recipes" / "countdown" / "qwen3_1.7b_grpo_l512.yaml"
    tiny("falcon").config.save_pretrained(tmp_path / "falcon")
    context = RunContext(check_packages=False)
    for model_path, flag, refused in ((tmp_path / "falcon", "true", True), (tmp_path / "falcon", "false", False),
                                      ("Qwen/Qwen3-1.7B", "true", False)):  # fmt: skip
        argv = ["--config", str(recipe), "--use_cpu", "true", "--output_dir", str(tmp_path / "run"),
                "--model_name_or_path", str(model_path), "--padding_free", flag]  # fmt: skip
        parsed = parse_recipe_args("countdown", argv)
        report = check_recipe("countdown", recipe, argv, parsed, context, stated_values(recipe))
        problems = [p for p in report.problems if p.field == "padding_free"]
        assert len(problems) == refused, (model_path, flag)
        if refused:
            assert "model type 'falcon' is not known to keep packed rows apart" in problems[0].message
            with pytest.raises(PreflightError, match=r"padding_free: .*'falcon'.*\n +fix: set padding_free"):
                report.raise_if_failed()


def test_prefix_tuning_rows_attend_to_each_other_and_are_refused(char_tokenizer, tmp_path):
    from peft import LoraConfig, PrefixTuningConfig, PromptTuningConfig, get_peft_model

    prefix = PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4)
    model = get_peft_model(build_tiny_qwen3(char_tokenizer, seed=0), prefix)  # qwen3: allowed without the adapter
    logits, padded, packed = packed_and_padded(model, vocab=len(char_tokenizer))
    first = _first_row(packed)
    # PEFT passes the prefix as past_key_values: transformers skips find_packed_sequence_indices, every row sees the
    # rows packed before it (row 0 sees the prefix and itself in both layouts).
    assert (logits[first] - padded[first]).abs().max() < 1e-5
    print(f"\n[packed models] prefix tuning: rows 1-4 logits max |diff| {(logits - padded).abs().max():.1e}")
    assert (logits[~first] - padded[~first]).abs().max() > 1e-3  # rounding: < 2e-7
    assert "PEFT PREFIX_TUNING is prompt learning" in packing_problem(model)
    virtual = PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4)
    prompt = get_peft_model(build_tiny_qwen3(char_tokenizer, seed=0), virtual)
    assert "PEFT PROMPT_TUNING" in packing_problem(prompt)  # virtual tokens prepended, position_ids dropped
    lora = get_peft_model(build_tiny_qwen3(char_tokenizer, seed=0), LoraConfig(r=2, target_modules=["q_proj"]))
    assert packing_problem(lora) is None  # LoRA changes weights only

    trainer_cls = functools.partial(AblationGRPOTrainer, peft_config=prefix)
    with pytest.raises(ValueError, match=r"padding_free=True cannot be used here: PEFT PREFIX_TUNING"):
        make_trainer(char_tokenizer, tmp_path / "on", trainer_cls=trainer_cls, padding_free=True)
    make_trainer(char_tokenizer, tmp_path / "off", trainer_cls=trainer_cls, padding_free=False)


# The varlen arguments, computed once, reach every attention call.

_VARLEN = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


@pytest.fixture
def flash_recorder():
    """transformers' `flash_attention_2` replaced, for this test, by a function registered through `AttentionInterface`
    that records the varlen arguments of each call and attends causally within each sequence (sdpa on each slice).

    Without the arguments it finds the sequences where position_ids restart, as transformers would, so the forward
    completes and the test's assertions on the record say what is missing."""
    calls: list[dict] = []

    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        calls.append({name: kwargs.get(name) for name in _VARLEN})
        if kwargs.get("cu_seq_lens_q") is not None:
            bounds = kwargs["cu_seq_lens_q"].tolist()
        else:
            starts = (kwargs["position_ids"][0] == 0).nonzero().flatten().tolist()
            bounds = [*starts, query.size(2)]
        out = [
            sdpa_attention_forward(module, query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], None,
                                   dropout=dropout, scaling=scaling, is_causal=True)[0]
            for a, b in zip(bounds[:-1], bounds[1:], strict=True)
        ]  # fmt: skip
        return torch.cat(out, dim=1), None  # (1, N, heads, head_dim)

    saved = AttentionInterface._global_mapping["flash_attention_2"]
    AttentionInterface.register("flash_attention_2", attention)
    try:
        yield calls
    finally:
        AttentionInterface.register("flash_attention_2", saved)


def _check_calls(calls: list[dict], layers: int, chunks: list[list[int]]) -> None:
    """Each chunk's forward: `layers` calls, all given the same int32 boundaries tensor (computed once) and ints."""
    assert len(calls) == layers * len(chunks)
    for chunk, lengths in enumerate(chunks):
        layer_calls = calls[chunk * layers : (chunk + 1) * layers]
        cu = layer_calls[0]["cu_seq_lens_q"]
        assert cu is not None, "no cu_seq_lens_q reached the attention call"
        assert cu.dtype == torch.int32 and cu.tolist() == [sum(lengths[:i]) for i in range(len(lengths) + 1)]
        for call in layer_calls:
            assert call["cu_seq_lens_q"] is cu and call["cu_seq_lens_k"] is cu
            assert call["max_length_q"] == call["max_length_k"] == max(lengths)
            assert type(call["max_length_q"]) is int  # no .item() (a host sync) in any layer


def test_trainer_passes_varlen_arguments_once_per_chunk(char_tokenizer, tmp_path, flash_recorder):
    """The trainer's packed path with flash_attention_2: chunks of 3 rows ([15, 5, 6], then [4, 9]); log-probs equal
    TRL's padded ones (the trainer with `padding_free` off, sdpa)."""
    input_ids, mask, t = ragged_rows(len(char_tokenizer))
    trainers = [
        make_trainer(char_tokenizer, tmp_path / str(flag), model=build_tiny_qwen3(char_tokenizer), padding_free=flag)
        for flag in (False, True)
    ]
    with torch.no_grad():
        expected, _, _ = trainers[0]._get_per_token_logps_and_entropies(trainers[0].model, input_ids, mask, t, 3)
        on = trainers[1]
        on.model.config._attn_implementation = "flash_attention_2"
        logps, _, _ = on._get_per_token_logps_and_entropies(on.model, input_ids, mask, t, 3)
    _check_calls(flash_recorder, layers=2, chunks=[LENGTHS[:3], LENGTHS[3:]])
    torch.testing.assert_close(logps, expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("model_type", ALLOWED)
def test_varlen_arguments_reach_every_layer(model_type, flash_recorder):
    """Each allow-listed model hands the arguments on to every layer's attention; log-probs equal the padded sdpa
    forward's full log_softmax."""
    model = tiny(model_type)
    input_ids, mask, t = ragged_rows(VOCAB)
    with torch.no_grad():
        full = torch.log_softmax(model(input_ids=input_ids, attention_mask=mask).logits[:, -t - 1 : -1], dim=-1)
        expected = full.gather(-1, input_ids[:, -t:].unsqueeze(-1)).squeeze(-1) * mask[:, -t:]
        add_fused_lm_head(model)
        model.config._attn_implementation = "flash_attention_2"
        logps, _, _ = packed_logps_and_entropies(model, model, input_ids, mask, t)
    _check_calls(flash_recorder, layers=2, chunks=[LENGTHS])
    torch.testing.assert_close(logps, expected, atol=1e-5, rtol=0)


def test_pack_rows_reads_nothing_back_from_the_device():
    """Given `row_spans` (the one host read), `pack_rows` and `unpack_per_token` run on meta tensors, which hold no
    data: any per-row boolean selection, `.item()` or `.tolist()` of a device tensor would raise."""
    input_ids, mask, t = ragged_rows(VOCAB)
    spans = row_spans(mask)
    assert spans == (LENGTHS, FIRSTS)
    one = pack_rows(input_ids, mask, t, spans=spans)
    assert one.cu_seq_lens.tolist() == CU_SEQ_LENS and one.cu_seq_lens.dtype == torch.int32 and one.max_length == 15
    for capacity, shape in ((None, (1, 39)), (15, (3, 15))):
        meta = pack_rows(input_ids.to("meta"), mask.to("meta"), t, capacity, spans)
        assert meta.input_ids.shape == meta.labels.shape == meta.position_ids.shape == shape
        assert meta.input_ids.is_meta and meta.index.is_meta
        values = torch.zeros(shape[0], shape[1] - 1, device="meta")
        assert unpack_per_token(values, meta, t).shape == (5, t)
    assert meta.cu_seq_lens is None  # three packed rows: no varlen arguments (flash packs one row)


def test_row_spans_refuses_a_row_with_a_hole():
    mask = torch.tensor([[1, 1, 1], [1, 0, 1]])
    with pytest.raises(ValueError, match=r"row 1's attention mask has 2 ones between columns 0 and 2"):
        row_spans(mask)
