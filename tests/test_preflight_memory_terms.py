"""trl_ext.preflight.memory: memory terms an estimate can miss. DeepSpeed keeps AdamW's states in fp32,
TRL loads a reference copy when beta != 0, and bf16 autocast caches a bf16 copy of every fp32 weight that requires
grad until its region exits; each term checked by hand, against the upstream source it rests on, or measured.

Qwen/Qwen3-1.7B (recipes/countdown/base.yaml, fp32 master weights, torch AdamW): P = 1,720,574,976, H = 2048,
L = 28, I = 6144, q = 2048, kv = 1024, V = 151,936; one decoder layer's linear weights 2048 x (2048 + 1024 + 1024) +
2048 x 2048 + 3 x 2048 x 6144 = 50,331,648.
"""

from __future__ import annotations

import inspect
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from trl_ext.preflight import KNOWN_CONFIGS, ModelShape, estimate_memory, load_model_shape
from trl_ext.preflight.memory import GIB, SLEEPING_VLLM_GIB
from trl_ext.preflight.plan import RunContext, check_recipe
from trl_ext.preflight.setup import TrainingSetup
from trl_ext.recipes import parse_recipe_args, stated_values

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
BASE = RECIPES / "countdown" / "base.yaml"
P = 1_720_574_976
LAYER_LINEAR = 50_331_648
CACHE = 2 * 28 * LAYER_LINEAR  # 2,818,572,288 bytes = 2.62 GiB


def _report(*extra: str, recipe: Path = BASE, **context):
    task = recipe.parent.name
    parsed = parse_recipe_args(task, ["--config", str(recipe), "--use_cpu", "true", *extra])
    ctx = RunContext(check_packages=False, **context)
    return check_recipe(task, recipe, list(extra), parsed, ctx, stated_values(recipe, list(extra)))


@pytest.fixture(scope="module")
def shape():
    return load_model_shape("Qwen/Qwen3-1.7B")[0]


@pytest.mark.parametrize(("stage", "world"), [(1, 1), (2, 4), (3, 4)])
def test_zero_keeps_the_master_copy_and_adamw_states_in_fp32(stage, world):
    """DeepSpeed's states. Bug caught: under DeepSpeed the weights are bf16 (2 bytes), and the states were priced at
    the weights' dtype, (4 + 2 x 2) P / W. DeepSpeed's bf16 optimizer keeps the fp32 master copy and both AdamW moments
    in fp32: K = 12 bytes per parameter in the ZeRO paper's mixed-precision Adam (https://arxiv.org/abs/1910.02054,
    section 3.1: "an fp32 copy of the parameters, momentum and variance"), sharded over W."""
    estimate = _report(world_size=world, zero_stage=stage, distributed_type="DEEPSPEED").estimate
    states = estimate.phases["train"]["optimizer states"]
    assert states == 12 * P / world
    if world == 4:
        assert round(states / GIB, 2) == 4.81  # was 3.20


def test_reference_model_is_created_as_trl_1_16_creates_it():
    """The reference copy, the upstream facts the term rests on: GRPOTrainer builds a reference copy unless beta is 0
    or the policy is a PEFT model, in the policy's dtype; DeepSpeed prepares it at stage 0 (a full copy) unless
    ZeRO-3."""
    from trl import GRPOTrainer
    from trl.models.utils import prepare_deepspeed

    init = inspect.getsource(GRPOTrainer.__init__)
    branches = init[init.index("if self.beta == 0.0:") : init.index("# Disable dropout in the models")]
    assert "self.ref_model = None" in branches.split("elif is_peft_model(model):")[0]
    assert "self.ref_model = None" in branches.split("elif is_peft_model(model):")[1].split("else:")[0]
    assert 'model_init_kwargs.setdefault("dtype", self.model.dtype)' in branches
    deepspeed = inspect.getsource(prepare_deepspeed)
    assert 'if stage != 3:\n        config_kwargs["zero_optimization"]["stage"] = 0' in deepspeed


def test_reference_model_weights_and_forward_by_hand():
    """The reference copy. `--beta 0.04` on one GPU, fp32 master weights, server mode: a 4P fp32 copy in every phase,
    and a reference phase after generation: the copy's no-grad forward of one micro-batch, 2 x (266 + 1024) = 2580
    tokens x (2 H 4 + 2 (2 q + 2 kv + 3 I)) = 2580 x 65,536 + 2048 scored x H x 4 + one 2048 x 32768 bf16 tile, and its
    autocast cache (the copy's weights are fp32 leaves that require grad)."""
    estimate = _report("--beta", "0.04").estimate
    for phase in ("train", "optimizer step", "generation", "reference", "eval"):
        assert estimate.phases[phase]["reference model"] == 4 * P
    assert estimate.phases["reference"] == {
        "weights": 4 * P,
        "optimizer states": 8 * P,
        "reference model": 4 * P,
        "reference forward": 2580 * 65_536 + 2048 * 2048 * 4 + 2048 * 32768 * 2,
        "autocast weight cache": CACHE,
    }
    assert "reference" not in _report().estimate.phases
    assert round(estimate.phases["train"]["reference model"] / GIB, 2) == 6.41


def test_beta_run_that_does_not_fit_is_refused():
    """The reference copy. Bug caught: a `--beta 0.04` run passed the preflight on memory it would not have. On one 40
    GiB GPU the recipe fits without the reference copy and not with it (the copy adds 4P = 6.41 GiB to every phase)."""
    fits = _report(gpu_memory_gib=40, memory_limit_gib=40)
    assert not [p for p in fits.problems if p.field == "gpu memory"]
    refused = _report("--beta", "0.04", gpu_memory_gib=40, memory_limit_gib=40)
    [problem] = [p for p in refused.problems if p.field == "gpu memory"]
    assert refused.estimate.peak_gib > 40 and "exceeds the 40 GiB limit" in problem.message
    assert "--use_peft true" in problem.fix  # LoRA needs no copy: the base with the adapter disabled


def test_reference_copy_dtype_and_sharding(shape):
    """The reference copy: pure bf16 loads a 2P copy; DeepSpeed's engine casts it to bf16 (2P at ZeRO-1/2) and shards
    it at ZeRO-3 (2P / W); LoRA has none."""

    def reference(**fields):
        return estimate_memory(shape, TrainingSetup(beta=0.04, **fields)).phases["train"].get("reference model")

    assert reference() == 4 * P and reference(precision="pure_bf16") == 2 * P
    assert reference(zero_stage=2, world_size=4) == 2 * P and reference(zero_stage=3, world_size=4) == 2 * P / 4
    assert reference(lora_rank=16) is None


class _ParameterCasts(torch.utils._python_dispatch.TorchDispatchMode):
    """Records which parameters are cast to bf16 (the casts autocast issues reach the dispatcher below it; a cast it
    serves from its cache does not)."""

    def __init__(self, model):
        super().__init__()
        self.names = {param.data_ptr(): name for name, param in model.named_parameters()}
        self.cast: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default and kwargs.get("dtype") == torch.bfloat16:
            if args[0].data_ptr() in self.names:
                self.cast.append(self.names[args[0].data_ptr()])
        return func(*args, **kwargs)


@pytest.mark.parametrize("model_type", ["qwen3", "qwen2"])
def test_autocast_caches_each_trainable_linear_weight_once_per_region(model_type):
    """The autocast cache, measured on the CPU (torch 2.13): under bf16 autocast an fp32 leaf that requires grad is
    cast once per outermost region and served from the cache after (inside no_grad too: the validation and reference
    forwards); a frozen one is cast at every use; a new region casts again. What is cast is every decoder linear
    layer's weight and bias, not the embedding (F.embedding is not an autocast op) nor the norms (elementwise): exactly
    `ModelShape.layer_linear_params` per layer. The body is run, as TRL's fused head does (it casts its own slices of
    the head). torch's `cached_cast` (aten/src/ATen/autocast_mode.cpp) keys the rule on the device's lower-precision
    dtype, fp32, requires_grad, is_leaf and not a view, the same on CUDA."""
    from transformers import AutoConfig, AutoModelForCausalLM

    head_dim = {"head_dim": 16} if model_type == "qwen3" else {}
    fields = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    fields.update(intermediate_size=96, vocab_size=128, tie_word_embeddings=True, **head_dim)
    config = AutoConfig.for_model(model_type, **fields)
    model = AutoModelForCausalLM.from_config(config).float()
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(0))
    params = dict(model.named_parameters())

    def casts(*, regions: int, frozen: bool = False, no_grad: bool = False) -> list[str]:
        model.requires_grad_(not frozen)
        mode = _ParameterCasts(model)
        with mode, torch.set_grad_enabled(not no_grad):
            for _ in range(regions):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    model.model(input_ids=ids)
                    model.model(input_ids=ids)
        return mode.cast

    once = casts(regions=1)
    assert len(once) == len(set(once))  # two forwards, each weight cast once
    linear = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert {name.rsplit(".", 2)[-2] for name in once} == linear
    shape = ModelShape.from_config(config.to_dict(), model_type)
    assert sum(params[name].numel() for name in once) == shape.num_layers * shape.layer_linear_params
    assert sorted(casts(regions=1, no_grad=True)) == sorted(once)
    assert sorted(casts(regions=2)) == sorted(once * 2)  # the cache is cleared when the region exits
    assert sorted(casts(regions=1, frozen=True)) == sorted(once * 2)  # frozen weights are not cached


def test_autocast_cache_in_the_train_and_eval_phases(shape):
    """The autocast cache. Bug caught: fp32 master weights under bf16 autocast hold a bf16 copy of every decoder linear
    weight through each forward (2.62 GiB for Qwen3-1.7B), which the train and eval phases did not count. None in pure
    bf16 (nothing to cast) or under DeepSpeed (accelerate turns autocast off; the weights are bf16); LoRA: the fp32
    adapters only (the frozen base is cast at each use)."""
    assert shape.layer_linear_params == LAYER_LINEAR and round(CACHE / GIB, 2) == 2.62
    assert ModelShape.from_config(KNOWN_CONFIGS["Qwen/Qwen2.5-1.5B-Instruct"]).layer_linear_params == (
        1536 * (1536 + 256 + 256) + 1536 * 1536 + 3 * 1536 * 8960 + (1536 + 2 * 256)
    )
    phases = _report().estimate.phases
    assert phases["train"]["autocast weight cache"] == phases["eval"]["autocast weight cache"] == CACHE
    assert not [phase for phase in ("optimizer step", "generation") if "autocast weight cache" in phases[phase]]
    setup = TrainingSetup(eval_batch=4)
    for other in (replace(setup, precision="pure_bf16"), replace(setup, zero_stage=2, world_size=4)):
        assert "autocast weight cache" not in estimate_memory(shape, other).phases["train"]
    lora = estimate_memory(shape, replace(setup, lora_rank=8)).phases
    assert lora["train"]["autocast weight cache"] == lora["eval"]["autocast weight cache"] == 2 * shape.lora_params(8)


def test_validation_forward_runs_beside_a_sleeping_engine():
    """Beside the autocast cache: TRL 1.16 puts a colocated engine in sleep mode back to sleep right after
    `llm.generate` (`VLLMGeneration.generate`), before the scoring and the validation loss forward, so the eval phase
    holds the sleeping allowance, not the engine's share. The GSM8K report's 24 GB recipe: train phase 21.2 GiB is the
    peak."""
    from trl.generation.vllm_generation import VLLMGeneration

    source = inspect.getsource(VLLMGeneration.generate)
    after = source[source.index("self.llm.generate(") :]
    assert "if self.enable_sleep_mode:\n                self.llm.sleep(level=2)" in after
    recipe = RECIPES / "gsm8k" / "qwen2.5_1.5b_instruct_grpo_24gb.yaml"
    estimate = _report(recipe=recipe, gpu_memory_gib=24, memory_limit_gib=24).estimate
    assert estimate.phases["eval"]["sleeping vLLM"] == SLEEPING_VLLM_GIB * GIB
    assert "colocated vLLM" not in estimate.phases["eval"]
    assert estimate.phases["generation"]["colocated vLLM"] == 0.3 * 24 * GIB
    assert estimate.peak_phase == "train" and estimate.peak_gib <= 24
