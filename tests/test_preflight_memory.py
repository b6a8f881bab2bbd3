"""trl_ext.preflight.models / memory: parameter counts against transformers' own models, the estimate of one recipe
against numbers computed by hand, its arithmetic on every shipped GPU recipe, and knobs that really fit."""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path

import pytest

from trl_ext.launch.table import grpo_recipes
from trl_ext.preflight import KNOWN_CONFIGS, ModelShape, estimate_memory, knobs_to_fit, load_model_shape
from trl_ext.preflight.memory import GIB, RUNTIME_OVERHEAD_GIB, SLEEPING_VLLM_GIB
from trl_ext.preflight.plan import RunContext, check_recipe
from trl_ext.preflight.setup import PROMPT_TOKENS, TrainingSetup, training_setup
from trl_ext.recipes import stated_values

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "recipes"
QWEN3_1_7B_PARAMS = 1_720_574_976  # published: 1.72 B; checked against transformers below


def _transformers_param_count(config: dict) -> int:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(config)
    model_type = fields.pop("model_type")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **fields))
    return sum(p.numel() for p in model.parameters())


@functools.cache
def _known_param_count(name: str) -> int:
    """`_transformers_param_count` of a known model, built once per model: the recipes share a few."""
    return _transformers_param_count(KNOWN_CONFIGS[name])


@pytest.mark.parametrize("name", sorted(KNOWN_CONFIGS))
def test_parameter_count_equals_transformers_model(name):
    """Independent reference: the model transformers builds from the same config (on the meta device, no memory).
    Bug caught: a forgotten tensor (Qwen2's q/k/v biases, Qwen3's q/k norms, an untied LM head)."""
    shape = ModelShape.from_config(KNOWN_CONFIGS[name], name)
    assert shape.params == _transformers_param_count(KNOWN_CONFIGS[name])


def test_untied_head_and_qkv_bias_are_counted():
    config = {**KNOWN_CONFIGS["Qwen/Qwen2.5-1.5B-Instruct"], "tie_word_embeddings": False, "num_hidden_layers": 2}
    assert ModelShape.from_config(config).params == _transformers_param_count(config)
    assert ModelShape.from_config(KNOWN_CONFIGS["Qwen/Qwen3-1.7B"]).params == QWEN3_1_7B_PARAMS


def test_missing_architecture_field_is_named():
    with pytest.raises(ValueError, match=r"m: config.json lacks \['intermediate_size'\]"):
        ModelShape.from_config(
            {k: v for k, v in KNOWN_CONFIGS["Qwen/Qwen3-0.6B"].items() if k != "intermediate_size"}, "m"
        )
    shape, source = load_model_shape("nobody/unknown-model")
    assert shape is None and "not a shipped model" in source


def test_qwen3_countdown_drgrpo_l256_by_hand():
    """recipes/countdown/qwen3_1.7b_drgrpo_l256.yaml on one GPU, server mode: every component computed by hand.

    P = 1,720,574,976; fp32 master weights with torch AdamW (foreach): weights 4P, gradients 4P, states 8P, the
    step's foreach temporary 4P. H = 2048, L = 28, I = 6144, q = 2048, kv = 1024, V = 151,936.
    Micro-batch 2 x (266 prompt + 256 completion) = 1044 tokens; checkpointed: per token L x H x 4 = 229,376 plus
    two layers' internals 2 x (4 H x 4 + 2 (3 q + 3 kv + 2 H + 5 I)) = 2 x 120,832 -> 471,040 x 1044 = 491,765,760.
    Log-prob head: fp32 head gradient V H 4 = 1,244,659,712 + 512 scored tokens x H x (4 + 4) = 8,388,608 + one
    512 x 32768 bf16 tile 33,554,432 = 1,286,602,752. Validation: 128 prompts x 522 tokens = 66,816 x
    (2 H 4 + 2 (2 q + 2 kv + 3 I)) = 66,816 x 65,536 = 4,378,853,376, plus 32,768 scored x H x 4 = 268,435,456 and
    a 4096 x 32768 tile 268,435,456. bf16 autocast keeps a copy of each decoder linear weight through a forward
    (train and validation): 2 x L x (2048 x (2048 + 1024 + 1024) + 2048 x 2048 + 3 x 2048 x 6144) = 2,818,572,288.
    """
    script, args, model = _parse("countdown/qwen3_1.7b_drgrpo_l256.yaml")
    recipe = RECIPES / "countdown/qwen3_1.7b_drgrpo_l256.yaml"
    report = check_recipe("countdown", recipe, [], (script, args, model), _ctx(), stated_values(recipe))
    phases = report.estimate.phases
    p = QWEN3_1_7B_PARAMS
    assert phases["train"] == {
        "weights": 4 * p,
        "optimizer states": 8 * p,
        "gradients": 4 * p,
        "activations": 491_765_760,
        "log-prob head": 1_286_602_752,
        "autocast weight cache": 2_818_572_288,
    }
    assert phases["optimizer step"] == {
        "weights": 4 * p,
        "optimizer states": 8 * p,
        "gradients": 4 * p,
        "optimizer step temporaries": 4 * p,
    }
    assert phases["generation"] == {"weights": 4 * p, "optimizer states": 8 * p}  # the server holds the generator
    assert phases["eval"]["validation forward"] == 4_378_853_376 + 268_435_456 + 268_435_456
    assert phases["eval"]["autocast weight cache"] == 2_818_572_288
    assert report.estimate.peak_phase == "optimizer step"
    assert report.estimate.peak_bytes == 20 * p + RUNTIME_OVERHEAD_GIB * GIB  # 32.05 GiB + 1.5
    assert round(report.estimate.peak_gib, 2) == 33.55


def _parse(recipe: str, *extra: str):
    from trl_ext.recipes import parse_recipe_args

    return parse_recipe_args(recipe.split("/")[0], ["--config", str(RECIPES / recipe), "--use_cpu", "true", *extra])


def _ctx(**kwargs) -> RunContext:
    return RunContext(check_packages=False, **kwargs)


@pytest.mark.parametrize("recipe", grpo_recipes())
def test_estimate_arithmetic_on_every_gpu_recipe(recipe, tmp_path):
    """For each shipped GPU recipe, on one GPU and on ZeRO-3 over 4: the weights are the right bytes times the
    transformers parameter count, ZeRO-3 shards them by 4, each phase is the sum of its parts, the peak is the
    largest phase plus the runtime allowance, and a longer completion costs more in the training phase."""
    task = recipe.split("/")[0]
    parsed = _parse(recipe, "--output_dir", str(tmp_path / "run"))
    stated = stated_values(RECIPES / recipe)
    single = check_recipe(task, RECIPES / recipe, [], parsed, _ctx(), stated).estimate
    zero3 = check_recipe(task, RECIPES / recipe, [], parsed, _ctx(world_size=4, zero_stage=3), stated).estimate
    model = parsed[2]
    params = _known_param_count(model.model_name_or_path)
    weight_bytes = 2 if str(model.dtype) == "bfloat16" else 4
    assert single.phases["train"]["weights"] == weight_bytes * params
    assert zero3.phases["train"]["weights"] * 4 == 2 * params  # DeepSpeed: bf16 weights, sharded over 4
    for estimate in (single, zero3):
        totals = {name: sum(parts.values()) for name, parts in estimate.phases.items()}
        assert estimate.peak_bytes == max(totals.values()) + RUNTIME_OVERHEAD_GIB * GIB
    setup = training_setup(task, parsed[0], parsed[1], model, _layout(stated), _ctx())
    assert setup.prompt_tokens == PROMPT_TOKENS[task] and setup.completion_tokens == parsed[1].max_completion_length
    shape, _ = load_model_shape(model.model_name_or_path)
    longer = estimate_memory(shape, replace(setup, completion_tokens=2 * setup.completion_tokens))
    assert longer.phase_total("train") > single.phase_total("train") and longer.peak_bytes >= single.peak_bytes


def _layout(stated):
    from trl_ext.preflight import plan_batches

    return plan_batches(stated, 1)


def test_pure_bf16_variant_halves_weights_and_states():
    fp32 = check_recipe("countdown", None, [], _parse("countdown/qwen3_1.7b_grpo_l256.yaml"), _ctx(), {}).estimate
    bf16 = check_recipe("countdown", None, [], _parse("countdown/qwen3_1.7b_grpo_l256_pure_bf16.yaml"), _ctx(), {})
    bf16 = bf16.estimate
    for part in ("weights", "gradients", "optimizer states"):
        assert bf16.phases["train"][part] * 2 == fp32.phases["train"][part]


def test_gsm8k_report_recipe_fits_24_gib_and_each_knob_really_fits():
    """The GSM8K report's recipe fits one 24 GiB GPU; with fp32 AdamW instead of 8-bit it does not, and every knob the
    preflight offers brings its own re-estimate under the limit. Bug caught: a knob list that does not fit."""
    shape, _ = load_model_shape("Qwen/Qwen2.5-1.5B-Instruct")
    recipe = RECIPES / "gsm8k/qwen2.5_1.5b_instruct_grpo_24gb.yaml"
    parsed = _parse("gsm8k/qwen2.5_1.5b_instruct_grpo_24gb.yaml")
    report = check_recipe(
        "gsm8k", recipe, [], parsed, _ctx(gpu_memory_gib=24, memory_limit_gib=24), stated_values(recipe)
    )
    assert report.estimate.peak_gib < 24 and not [p for p in report.problems if p.field == "gpu memory"]
    setup = replace(training_setup("gsm8k", *parsed, report.layout, _ctx(gpu_memory_gib=24)), optim="adamw_torch")
    assert estimate_memory(shape, setup).peak_gib > 24
    knobs = knobs_to_fit(shape, setup, 24)
    assert [k.flags.split()[0] for k in knobs] == ["--optim", "--use_peft", "--dtype"]
    assert knobs[0].flags == "--optim adamw_bnb_8bit"
    for knob in knobs:
        assert knob.estimate.peak_gib <= 24
    refused = check_recipe(
        "gsm8k",
        recipe,
        ["--optim", "adamw_torch"],
        _parse("gsm8k/qwen2.5_1.5b_instruct_grpo_24gb.yaml", "--optim", "adamw_torch"),
        _ctx(memory_limit_gib=24, gpu_memory_gib=24),
        stated_values(recipe, ["--optim", "adamw_torch"]),
    )
    [problem] = [p for p in refused.problems if p.field == "gpu memory"]
    assert "exceeds the 24 GiB limit" in problem.message and "--optim adamw_bnb_8bit ->" in problem.fix


@pytest.mark.parametrize(("name", "extra_gib"), [("Qwen/Qwen2.5-1.5B-Instruct", 1.30), ("Qwen/Qwen3-1.7B", 1.74)])
def test_8bit_adamw_keeps_32bit_states_for_the_embedding(name, extra_gib):
    """Bug caught: the estimate counted 2 bytes of 8-bit AdamW state per parameter everywhere, but the HF
    Trainer registers 32-bit states for every nn.Embedding when it builds a bitsandbytes 8-bit optimizer (checked in
    transformers' own source below). States: 2 (P - E) + 8 E bytes, E = V x H; torchao's 8-bit AdamW has no such
    override; Lion keeps one state (1 / 4 bytes); LoRA freezes the embedding; ZeRO shards it with the fp32 copy."""
    import inspect

    from transformers import Trainer

    source = inspect.getsource(Trainer.create_optimizer)
    assert "isinstance(module, nn.Embedding)" in source
    assert 'manager.register_module_override(module, "weight", {"optim_bits": 32})' in source
    shape, _ = load_model_shape(name)
    p, e = shape.params, 151_936 * shape.hidden_size

    def states(**kwargs):
        return estimate_memory(shape, TrainingSetup(**kwargs)).phases["train"]["optimizer states"]

    assert states(optim="adamw_bnb_8bit") == 2 * (p - e) + 8 * e
    assert round(6 * e / GIB, 2) == extra_gib  # 6 more bytes per embedding entry: +1.30 / +1.74 GiB
    assert states(optim="paged_adamw_8bit") == states(optim="adamw_8bit") == 2 * (p - e) + 8 * e
    assert states(optim="adamw_torch_8bit") == 2 * p
    assert states(optim="lion_8bit") == (p - e) + 4 * e
    assert states(optim="adamw_bnb_8bit", lora_rank=8) == 2 * shape.lora_params(8)
    assert states(optim="adamw_bnb_8bit", zero_stage=2, world_size=4) == (4 * p + 2 * (p - e) + 8 * e) / 4


def test_sleeping_colocated_vllm_keeps_its_allowance_while_training():
    """Bug caught: a colocated vLLM asleep was counted as nothing while the trainer steps; it keeps its CUDA
    graphs (`SLEEPING_VLLM_GIB`). Awake it holds its whole share (0.3 x 24 GiB) in every phase."""
    shape, _ = load_model_shape("Qwen/Qwen2.5-1.5B-Instruct")
    colocate = TrainingSetup(generator="colocate", vllm_gpu_memory_utilization=0.3, gpu_memory_gib=24)
    asleep = estimate_memory(shape, replace(colocate, vllm_sleep=True)).phases
    awake = estimate_memory(shape, colocate).phases
    assert asleep["train"]["sleeping vLLM"] == asleep["optimizer step"]["sleeping vLLM"] == SLEEPING_VLLM_GIB * GIB
    assert asleep["generation"]["colocated vLLM"] == 0.3 * 24 * GIB and "sleeping vLLM" not in asleep["generation"]
    assert awake["train"]["colocated vLLM"] == 0.3 * 24 * GIB and "sleeping vLLM" not in awake["train"]


def test_checkpoint_sizes_and_the_weight_pushes_of_a_validation_are_stated():
    """Qwen3-1.7B with fp32 master weights and AdamW: a checkpoint is 4P + 8P bytes
    (20.6 GB), two exist while a save rotates the old one out (save_total_limit 1; 4 saves in 200 steps at 0.25),
    the final model is 4P (fp32, kept on purpose: preflight.disk). The GSM8K report's sleeping vLLM re-pushes every
    weight at each generation call: 1024 validation problems in batches of 32 are 32 pushes per validation."""
    recipe = RECIPES / "countdown/qwen3_1.7b_drgrpo_l256.yaml"
    report = check_recipe("countdown", recipe, [], _parse(recipe.relative_to(RECIPES).as_posix()), _ctx(),
                          stated_values(recipe))  # fmt: skip
    p = QWEN3_1_7B_PARAMS
    disk = report.disk
    assert (disk.checkpoint_weights, disk.checkpoint_optimizer, disk.final_model) == (4 * p, 8 * p, 4 * p)
    assert disk.checkpoints_at_once == 2 and disk.peak == 28 * p
    line = "disk:    checkpoint 20.6 GB each (weights 6.9 fp32 + optimizer states 13.8), 2 at once while saving"
    assert f"  {line}; final model 6.9 GB (fp32): up to 48.2 GB in output_dir" in report.render()
    gsm8k_24gb = RECIPES / "gsm8k/qwen2.5_1.5b_instruct_grpo_24gb.yaml"
    context = _ctx(gpu_memory_gib=24, memory_limit_gib=24)
    small = check_recipe(
        "gsm8k",
        gsm8k_24gb,
        [],
        _parse("gsm8k/qwen2.5_1.5b_instruct_grpo_24gb.yaml"),
        context,
        stated_values(gsm8k_24gb),
    )
    assert "re-pushes all weights (32 per validation, 32 prompts each" in small.render()
    p4, e4 = small.shape.params, small.shape.embedding_params  # 8-bit AdamW checkpoints its 32-bit embedding states
    assert (small.disk.checkpoint_weights, small.disk.checkpoint_optimizer) == (4 * p4, 2 * (p4 - e4) + 8 * e4)
    assert small.estimate.peak_gib <= 24 and small.layout.eval_requests == 32
