"""Guard: the TRL / transformers internals that `trl_ext.grpo.trainer` and `trl_ext.grpo.config` rely on.

AblationGRPOTrainer overrides private GRPOTrainer methods and rewrites their outputs. When a TRL upgrade renames a
method, changes a signature, an output key or the `_metrics` / `_logs` layout, these tests fail first, with a
message saying what changed and where trl_ext depends on it (written for TRL 1.16).
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
from collections import defaultdict, deque

import pytest
import torch
import transformers
import trl
from test_trainer_helpers import generate, group_inputs, make_trainer, one_torch_thread  # noqa: F401 (autouse fixture)
from trl import GRPOConfig, GRPOTrainer

from trl_ext.grpo.axes import TRL_ADVANTAGE_EPS, TRL_DEFAULT_LOSS_TYPE, TRL_EPSILON, TRL_LOSS_TYPES, TRL_SCALE_REWARDS
from trl_ext.grpo.rows import FORWARD_KEYS
from trl_ext.grpo.trainer import _LOSS_FIELDS

WHERE = "trl_ext/grpo/trainer.py, trl_ext/grpo/rows.py, trl_ext/grpo/axes.py"


def _changed(what: str) -> str:
    return f"TRL internals changed (trl {trl.__version__}): {what}. AblationGRPOTrainer ({WHERE}) depends on it."


def _params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


@pytest.mark.parametrize(
    ("method", "expected"),
    [
        ("_calculate_rewards", ["self", "inputs", "prompts", "completions", "completion_ids_list"]),
        ("_generate_and_score_completions", ["self", "inputs"]),
        ("_generate", ["self", "prompts"]),
        ("_prepare_inputs", ["self", "generation_batch"]),
        ("_compute_loss", ["self", "model", "inputs"]),
        ("compute_loss", ["self", "model", "inputs", "return_outputs", "num_items_in_batch"]),
        ("get_high_entropy_mask", ["self", "entropies", "mask", "threshold"]),
        ("get_off_policy_mask", ["advantages", "per_token_logps", "sampling_per_token_logps", "mask",
                                 "off_policy_threshold"]),
        ("get_gamma_weights", ["advantages", "log_ratio_per_token", "mask", "importance_sampling_ratio", "k_pos",
                               "lambda_pos", "k_neg", "lambda_neg"]),
    ],
)  # fmt: skip
def test_overridden_method_signatures(method, expected):
    assert hasattr(GRPOTrainer, method), _changed(f"GRPOTrainer.{method} no longer exists")
    got = _params(getattr(GRPOTrainer, method))
    assert got == expected, _changed(f"GRPOTrainer.{method}{tuple(got)} was {tuple(expected)}")


# Which class of AblationGRPOTrainer's MRO changes which TRL method: each in one class only (trl_ext/grpo/trainer.py),
# but for `_generate_single_turn` (EXCLUSIVE_CHANGES).
TRL_METHODS_CHANGED = {
    "AblationGRPOTrainer": {
        "__init__",
        "_calculate_rewards",
        "_generate_and_score_completions",
        "_get_per_token_logps_and_entropies",
        "_compute_loss",
    },
    "DynamicSamplingMixin": set(),
    "FinishedCompletionsMixin": {"_generate"},
    "AsyncRolloutsMixin": {"train", "get_batch_samples", "_prepare_inputs", "_generate_single_turn"},
    "StaticCacheGenerationMixin": {"_generate_single_turn"},
}
# Methods two behaviours change, with the config flags that switch them on: the config refuses both flags at once,
# so at most one of them acts and the other hands the call to `super()`.
EXCLUSIVE_CHANGES = {"_generate_single_turn": ("async_rollouts", "static_cache_generation")}


def test_each_trl_method_is_changed_in_one_class_only():
    """No TRL method is wrapped twice along the MRO, so no behaviour's order follows from the order of the bases: the
    trainer's `_install_behaviours` and `_generate_and_score_completions` state it. The exceptions
    (EXCLUSIVE_CHANGES) are behaviours the config never turns on together."""
    from trl_ext.grpo.trainer import AblationGRPOTrainer

    mro = AblationGRPOTrainer.__mro__
    ours = mro[: mro.index(GRPOTrainer)]
    changed = {
        cls.__name__: {name for name, value in vars(cls).items() if callable(value) and hasattr(GRPOTrainer, name)}
        for cls in ours
    }
    assert changed == TRL_METHODS_CHANGED
    owners: dict[str, list[str]] = defaultdict(list)
    for cls, names in changed.items():
        for name in names:
            owners[name].append(cls)
    assert {name for name, classes in owners.items() if len(classes) > 1} == set(EXCLUSIVE_CHANGES)
    for name in set().union(*TRL_METHODS_CHANGED.values()):
        assert callable(getattr(GRPOTrainer, name)), _changed(f"GRPOTrainer.{name} no longer exists")


# The TRL methods trl_ext's subclasses of TRL's vLLM classes change (trl_ext/grpo/vllm/generation.py, client.py).
GENERATION_METHODS_CHANGED = {"__init__", "_init_vllm", "sync_weights", "_iter_named_params", "generate"}
CLIENT_METHODS_CHANGED = {
    "__init__",
    "init_communicator",
    "update_named_params",
    "_start_weight_update",
    "_finish_weight_update",
    "close_communicator",
    "generate",
    "chat",
    "reset_prefix_cache",
    "_post",
}


def test_the_vllm_classes_trl_builds_and_the_methods_our_subclasses_change():
    """TRL's trainer builds its vLLM generation by the name `VLLMGeneration` of `trl.trainer.grpo_trainer` (the one
    name trl_ext swaps, `vllm_generation_class`); the subclasses change exactly the methods listed, each of which TRL
    still has with the signature the overrides assume."""
    import trl.trainer.grpo_trainer as grpo_trainer
    from trl.generation.vllm_client import VLLMClient
    from trl.generation.vllm_generation import VLLMGeneration

    from trl_ext.grpo.vllm.client import TrlExtVLLMClient
    from trl_ext.grpo.vllm.generation import TrlExtVLLMGeneration, vllm_generation_class

    where = "trl_ext/grpo/vllm/generation.py"
    assert "self.vllm_generation = VLLMGeneration(" in inspect.getsource(GRPOTrainer.__init__), _changed(
        f"GRPOTrainer.__init__ no longer builds its generation by the name VLLMGeneration ({where})"
    )
    assert grpo_trainer.VLLMGeneration is VLLMGeneration
    with pytest.raises(KeyError):  # the swap holds inside the block and is undone when it raises
        with vllm_generation_class():
            assert grpo_trainer.VLLMGeneration is TrlExtVLLMGeneration
            raise KeyError("inside")
    assert grpo_trainer.VLLMGeneration is VLLMGeneration
    for ours, trl_class, expected in (
        (TrlExtVLLMGeneration, VLLMGeneration, GENERATION_METHODS_CHANGED),
        (TrlExtVLLMClient, VLLMClient, CLIENT_METHODS_CHANGED),
    ):
        changed = {name for name, value in vars(ours).items() if callable(value) and hasattr(trl_class, name)}
        assert changed == expected, f"{ours.__name__} changes {sorted(changed)}"
    assert _params(VLLMGeneration.sync_weights) == ["self"], _changed("VLLMGeneration.sync_weights(self)")
    assert _params(VLLMGeneration._init_vllm) == ["self"], _changed("VLLMGeneration._init_vllm(self)")
    assert _params(VLLMGeneration._iter_named_params) == ["self"], _changed("VLLMGeneration._iter_named_params(self)")
    assert _params(VLLMGeneration.generate) == ["self", "prompts", "images", "num_generations", "profiler"], _changed(
        f"VLLMGeneration.generate{tuple(_params(VLLMGeneration.generate))}"
    )
    assert _params(VLLMClient._post) == ["self", "url", "kwargs"], _changed("VLLMClient._post(self, url, **kwargs)")
    assert "self.vllm_generation.sync_weights()" in inspect.getsource(GRPOTrainer._generate_single_turn), _changed(
        "GRPOTrainer no longer syncs the weights through its VLLMGeneration instance"
    )


def test_trl_s_server_branch_that_our_init_vllm_repeats_with_our_client():
    """`TrlExtVLLMGeneration._init_vllm` repeats TRL's server branch with `TrlExtVLLMClient` in place of `VLLMClient`
    (the colocate branch is TRL's own): these lines of TRL's are the ones it repeats."""
    from trl.generation.vllm_generation import VLLMGeneration

    source = inspect.getsource(VLLMGeneration._init_vllm)
    for line in (
        'if self.mode == "server":',
        "if accelerator.is_main_process:",
        "if self.server_base_url is not None:",
        'base_url = f"http://{self.server_host}:{self.server_port}"',
        "self.vllm_client = VLLMClient(",
        "base_url=base_url, group_port=self.group_port, connection_timeout=self.server_timeout",
        "self.vllm_client.init_communicator(device=accelerator.device)",
        'elif self.mode == "colocate":',
        "self.llm = LLM(",
        "accelerator.wait_for_everyone()",
    ):
        assert line in source, _changed(f"VLLMGeneration._init_vllm no longer has `{line}` (trl_ext/grpo/vllm)")
    server_branch = source[source.index('if self.mode == "server":') : source.index('elif self.mode == "colocate":')]
    assert server_branch.count("\n") == 11, _changed("VLLMGeneration._init_vllm's server branch changed length")


def test_every_private_trl_and_vllm_name_trl_ext_uses():
    """Each private name (leading underscore) of TRL, transformers, vLLM, DeepSpeed or torch that trl_ext reads, calls,
    overrides or sets, with where; a rename upstream fails here by name. Methods are looked up on their class,
    attributes in the source of the method that sets them."""
    import torch.distributed as dist
    import transformers
    import trl.trainer.utils as trl_utils
    from trl.generation.vllm_client import VLLMClient
    from trl.generation.vllm_generation import VLLMGeneration

    methods = {
        GRPOTrainer: ["_calculate_rewards", "_generate_and_score_completions", "_generate", "_generate_single_turn",
                      "_prepare_inputs", "_compute_loss", "_get_per_token_logps_and_entropies", "_tokenize_prompts"],
        transformers.Trainer: ["_remove_unused_columns", "_get_num_items_in_batch", "_save_checkpoint"],
        VLLMGeneration: ["_init_vllm", "_iter_named_params"],
        VLLMClient: ["_post", "_start_weight_update", "_finish_weight_update"],
    }  # fmt: skip
    for owner, names in methods.items():
        for name in names:
            assert callable(getattr(owner, name, None)), _changed(f"{owner.__name__}.{name} no longer exists")
    attributes = {
        GRPOTrainer.__init__: ["_metrics", "_logs", "_last_loaded_step", "_is_vlm", "_entropy_bonus_enabled",
                               "_last_world_entropy", "_entropy_window_stats", "_tokenizer"],
        GRPOTrainer._prepare_inputs: ["_step"],
        transformers.Trainer.__init__: ["_train_batch_size"],
        VLLMGeneration.__init__: ["_weight_metadata"],
        VLLMClient.update_named_params: ["_updating_weights"],
    }  # fmt: skip
    for setter, names in attributes.items():
        source = inspect.getsource(setter)
        for name in names:
            assert f"self.{name}" in source, _changed(f"{setter.__qualname__} no longer uses self.{name}")
    assert callable(trl_utils._use_triton), _changed("trl.trainer.utils._use_triton (trl_ext/grpo/fused_head.py)")
    options = dist.ProcessGroupGloo._Options()
    assert hasattr(options, "_devices") and hasattr(options, "_timeout"), "torch's ProcessGroupGloo options changed"
    import deepspeed.comm.torch  # noqa: F401 (trl_ext/grpo/deepspeed_comm.py; deepspeed.comm's `torch` is torch)

    backend = sys.modules["deepspeed.comm.torch"]
    assert callable(backend.build_shm_op) and "build_shm_op()" in inspect.getsource(backend.TorchBackend.__init__), (
        "DeepSpeed's TorchBackend no longer builds its shared-memory op through build_shm_op"
    )


def test_no_method_is_replaced_on_the_trainer_s_objects(char_tokenizer, tmp_path):
    """A plain trainer and one with dynamic sampling, built and generating: no instance attribute of the trainer (or
    any TRL object it holds) shadows a method of its class. The vLLM modes check the same inside the processes that
    build them (test_vllm_colocate, test_vllm_server_sync: colocated, server, async, expert iteration)."""
    from helpers import shadowed_methods

    for config in ({}, {"dynamic_sampling": True}):
        trainer = make_trainer(char_tokenizer, tmp_path, **config)
        generate(trainer, group_inputs())
        assert shadowed_methods(trainer) == {"trainer": []}, config


def test_constructor_and_loss_entry_points():
    got = _params(GRPOTrainer.__init__)[:4]
    assert got == ["self", "model", "reward_funcs", "args"], _changed(f"GRPOTrainer.__init__ starts {got}")
    assert {"train_dataset", "processing_class"} <= set(_params(GRPOTrainer.__init__))
    # Trainer.compute_loss -> GRPOTrainer.compute_loss -> self._compute_loss: the override point of the loss.
    assert "self._compute_loss(model, inputs)" in inspect.getsource(GRPOTrainer.compute_loss), _changed(
        "GRPOTrainer.compute_loss no longer delegates to self._compute_loss(model, inputs)"
    )


def test_logps_helper_signature():
    params = _params(GRPOTrainer._get_per_token_logps_and_entropies)
    needed = ["model", "input_ids", "attention_mask", "logits_to_keep", "compute_entropy", "compute_aux_loss"]
    missing = [p for p in [*needed, *FORWARD_KEYS] if p not in params]
    assert not missing, _changed(f"_get_per_token_logps_and_entropies lost parameters {missing}")
    assert params[1:5] == needed[:4], _changed(f"_get_per_token_logps_and_entropies positional order {params[1:5]}")


def test_fused_lm_head_choice_that_compact_lm_head_swaps():
    # trl_ext.grpo.fused_head swaps the `_use_triton` name trl.trainer.utils looks up when `_fused_forward` decides to
    # score only the labelled positions; the TRL method must still go through the fused head.
    import trl.kernels.chunked_logprob as kernel
    import trl.trainer.utils as trl_utils

    where = "trl_ext/grpo/fused_head.py"
    assert trl_utils._use_triton is kernel._use_triton, _changed(
        f"trl.trainer.utils no longer imports _use_triton ({where})"
    )
    assert _params(trl_utils._use_triton) == ["device"], _changed(
        f"_use_triton{tuple(_params(trl_utils._use_triton))}"
    )
    got = _params(trl_utils.add_fused_lm_head)
    assert got == ["model", "temperature", "cast_lm_head_to_fp32", "outputs"], _changed(
        f"add_fused_lm_head{tuple(got)}"
    )
    source = inspect.getsource(trl_utils.add_fused_lm_head)
    for line in (
        "compact = _use_triton(hidden_states.device)",
        "hidden_states[mask] if compact",
        "labels[mask] if compact",
    ):
        assert line in source, _changed(f"add_fused_lm_head's `_fused_forward` no longer has `{line}` ({where})")
    got = _params(trl_utils._ChunkedLogProbFunction.forward)
    expected = ["ctx", "hidden", "weight", "bias", "targets", "temperature", "chunk_size", "final_logit_softcapping",
                "logit_scale", "outputs"]  # fmt: skip
    assert got == expected, _changed(f"_ChunkedLogProbFunction.forward{tuple(got)}")
    assert "fused_lm_head=True" in inspect.getsource(GRPOTrainer._get_per_token_logps_and_entropies), _changed(
        "_get_per_token_logps_and_entropies no longer calls the model with fused_lm_head=True"
    )


def test_train_batch_size_shadowing_is_still_repaired_by_one_attribute():
    # The courses' field `train_batch_size` shadows TrainingArguments.train_batch_size; HF copies that property into
    # Trainer._train_batch_size once, and TRL's dataloader reads only `_train_batch_size`. The trainer resets it.
    prop = inspect.getattr_static(transformers.TrainingArguments, "train_batch_size")
    assert isinstance(prop, property), _changed("TrainingArguments.train_batch_size is no longer a property")
    assert "self._train_batch_size = args.train_batch_size" in inspect.getsource(transformers.Trainer.__init__)
    loader = inspect.getsource(GRPOTrainer.get_train_dataloader)
    assert "self._train_batch_size" in loader and "args.train_batch_size" not in loader, _changed(
        "GRPOTrainer.get_train_dataloader sizes batches from something other than self._train_batch_size"
    )


def test_config_fields_and_defaults_the_config_maps_onto():
    # With no axis field set, AblationGRPOConfig resolves to these TRL defaults (trl_ext/grpo/axes.py hard-codes them).
    defaults = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}
    expected = {
        "loss_type": TRL_DEFAULT_LOSS_TYPE,
        "scale_rewards": "group",
        "epsilon": TRL_EPSILON,
        "importance_sampling_level": "token",
        "num_generations": 8,
        "num_iterations": 1,
        "generation_batch_size": None,
        "steps_per_generation": None,
        "beta": 0.0,
        "epsilon_high": None,
        "delta": None,
        "top_entropy_quantile": 1.0,
        "off_policy_mask_threshold": None,
        "entropy_coef": 0.0,
        "use_adaptive_entropy": False,
        "use_bias_correction_kl": True,
        "multi_objective_aggregation": "sum_then_normalize",
    }
    for name, value in expected.items():
        assert name in defaults, _changed(f"GRPOConfig.{name} no longer exists (trl_ext/grpo/config.py reads it)")
        assert defaults[name] == value, _changed(f"GRPOConfig.{name} default {defaults[name]!r}, was {value!r}")
    for name in _LOSS_FIELDS:  # the loss parameters the trainer hands to the registered losses
        assert name in defaults, _changed(f"GRPOConfig.{name} no longer exists (trl_ext/grpo/trainer.py passes it)")
    assert "steps_per_generation" in inspect.getsource(GRPOConfig.__post_init__)


def test_trl_loss_types_and_advantage_formulas_are_the_ones_mapped():
    # A new or renamed TRL loss_type / scale_rewards must be mapped onto the axes (trl_ext/grpo/axes.py) and get an
    # equivalence case (tests/test_trainer_equivalence.py) before trl_ext claims to be a drop-in for it.
    loss_source = inspect.getsource(GRPOTrainer._compute_loss)
    named = set(
        re.findall(r'"([a-z_]+)"', " ".join(re.findall(r"self\.loss_type (?:==|in|!=) ([^:]+):", loss_source)))
    )
    assert named == set(TRL_LOSS_TYPES), _changed(f"_compute_loss handles loss types {sorted(named)}")
    help_text = GRPOConfig.__dataclass_fields__["loss_type"].metadata["help"]
    assert all(f"'{name}'" in help_text for name in TRL_LOSS_TYPES), _changed("GRPOConfig.loss_type's values")
    generate_source = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    for value in TRL_SCALE_REWARDS:
        assert f'"{value}"' in generate_source, _changed(f"scale_rewards={value!r} is no longer handled")
    assert TRL_ADVANTAGE_EPS == 1e-4 and "(std_rewards + 1e-4)" in generate_source, _changed(
        "TRL's advantage epsilon is no longer 1e-4 (AblationGRPOConfig's default advantage_eps mirrors it)"
    )
    # The token_mean window (TRL dapo) and the loss order the trainer reproduces.
    assert "num_items_in_batch" in loss_source and "steps_per_generation" in loss_source, _changed("dapo normaliser")
    assert 'self.loss_type != "vespo"' in loss_source, _changed("vespo no longer folds the vLLM ratio into phi")
    for attr in ("_entropy_bonus_enabled", "_last_world_entropy", "_entropy_window_stats"):
        assert attr in loss_source, _changed(f"the entropy bonus no longer uses self.{attr}")


def test_runtime_structures_and_output_keys(char_tokenizer, tmp_path):
    trainer = make_trainer(char_tokenizer, tmp_path, stock=True, loss_type="grpo", num_iterations=2)
    assert set(trainer._metrics) == {"train", "eval"}, _changed("_metrics keys")
    assert all(isinstance(m, defaultdict) and m.default_factory is list for m in trainer._metrics.values())
    assert isinstance(trainer._logs["advantages"], deque), _changed("_logs['advantages'] is not a deque")
    assert {"prompt", "completion", "rewards", "advantages"} <= set(trainer._logs), _changed("_logs keys")
    for attr in ("reward_weights", "num_generations", "num_generations_eval", "aux_loss_enabled",
                 "router_aux_loss_coef", "accelerator", "scale_rewards", "entropy_coef", "use_adaptive_entropy",
                 "_entropy_bonus_enabled", "_last_world_entropy", "_entropy_window_stats"):  # fmt: skip
        assert hasattr(trainer, attr), _changed(f"GRPOTrainer.{attr} no longer set in __init__")

    captured = {}
    original = trainer._calculate_rewards

    def calculate_rewards(*args):
        captured["rewards"] = original(*args)
        return captured["rewards"]

    trainer._calculate_rewards = calculate_rewards  # a pass-through, to check it is still called and its output
    n_logged = len(trainer._logs["advantages"])
    inputs = group_inputs(group_size=4)
    out = generate(trainer, inputs)
    assert "rewards" in captured, _changed("_generate_and_score_completions no longer calls _calculate_rewards")
    assert captured["rewards"].shape == (len(inputs), 1), _changed("_calculate_rewards output is not (N, n_funcs)")
    needed = {
        "prompt_ids",
        "prompt_mask",
        "completion_ids",
        "completion_mask",
        "advantages",
        "old_per_token_logps",
        "num_items_in_batch",
    }
    assert needed <= set(out), _changed(f"_generate_and_score_completions output lacks {needed - set(out)}")
    assert out["advantages"].shape == (len(inputs),), _changed("advantages are no longer one per completion (B,)")
    assert len(trainer._logs["advantages"]) == n_logged + len(inputs), _changed(
        "_generate_and_score_completions no longer appends one logged advantage per completion"
    )
    assert trainer._metrics["train"]["reward"], _changed("the 'reward' metric is no longer logged")

    logps, entropies, aux = trainer._get_per_token_logps_and_entropies(
        trainer.model,
        torch.cat([out["prompt_ids"], out["completion_ids"]], 1),
        torch.cat([out["prompt_mask"], out["completion_mask"]], 1),
        out["completion_ids"].size(1),
        compute_entropy=True,
    )
    assert logps.shape == entropies.shape == out["completion_ids"].shape and aux is None, _changed(
        "_get_per_token_logps_and_entropies no longer returns (logps (B, T), entropies (B, T), aux_loss)"
    )
    assert "current_gradient_accumulation_steps" in inspect.getsource(transformers.Trainer), _changed(
        "transformers.Trainer.current_gradient_accumulation_steps (the loss divides by it)"
    )


def test_vllm_outputs_the_finish_reason_record_follows():
    # trl_ext/grpo/vllm/finish_reasons.py records vLLM's finish reasons beside TRL's vLLM paths, in the order TRL
    # reads the completions, and cuts this process's share as TRL does; each line below is one of those assumptions.
    from trl.generation.vllm_client import VLLMClient
    from trl.generation.vllm_generation import VLLMGeneration
    from vllm.outputs import CompletionOutput

    where = "trl_ext/grpo/vllm/finish_reasons.py"
    expected = {
        VLLMClient.generate: [
            'choices = self._post(f"{self.base_url}/v1/completions", json=payload)["choices"]',
            'completion_ids = [choice["token_ids"] for choice in choices]',
        ],
        VLLMGeneration._init_vllm: ["self.vllm_client = VLLMClient(", "self.llm = LLM("],
        VLLMGeneration.generate: [
            "output = self.vllm_client.generate(",
            "broadcast_object_list(obj_list, from_process=0)",
            "accelerator.process_index * len(prompts),",
            "all_outputs = self.llm.generate(vllm_prompts, sampling_params=sampling_params, use_tqdm=False)",
            "all_completion_ids = [output.token_ids for outputs in all_outputs for output in outputs.outputs]",
            "local_rank_in_group = torch.distributed.get_rank(group=self.tp_group)",
            "tp_slice = slice(local_rank_in_group * orig_size, (local_rank_in_group + 1) * orig_size)",
            "return prompt_ids, completion_ids, logprobs, logprob_token_ids",
        ],
        GRPOTrainer._generate_single_turn: ["_, completion_ids, logprobs, _ = self.vllm_generation.generate("],
        GRPOTrainer._generate: [
            "is_truncated = torch.tensor([ids[-1] not in eos_and_pad for ids in completion_ids], device=device)",
            "return prompt_ids, completion_ids, tool_mask, completions, logprobs, extra_fields, images, tool_images",
        ],
    }
    for method, lines in expected.items():
        source = inspect.getsource(method)
        for line in lines:
            assert line in source, _changed(f"{method.__qualname__} no longer has `{line}` ({where})")
    assert _params(VLLMClient._post) == ["self", "url", "kwargs"], _changed(f"VLLMClient._post ({where})")
    fields = {f.name for f in dataclasses.fields(CompletionOutput)}
    assert {"token_ids", "finish_reason", "stop_reason"} <= fields, f"vLLM's CompletionOutput fields changed ({where})"


def test_what_async_rollouts_rely_on():
    # trl_ext/grpo/rollouts/async_rollouts.py and trl_ext/grpo/vllm/replay.py: the next batch is read ahead through the
    # training loop's `get_batch_samples`, tokenized by `_tokenize_prompts`, requested as TRL's last `/v1/completions`
    # payload with the next prompts (`all_prompts[::num_generations]`), replayed in `TrlExtVLLMClient._post`; the
    # weight push is TRL's `sync_weights` guarded by `_last_loaded_step`; `_prepare_inputs` generates every
    # `generate_every` steps.
    from trl.generation.vllm_client import VLLMClient
    from trl.generation.vllm_generation import VLLMGeneration

    where = "trl_ext/grpo/rollouts/async_rollouts.py, trl_ext/grpo/vllm/replay.py"
    expected = {
        VLLMClient.generate: [
            'payload = {\n            "model": self.model,\n            "prompt": prompts,',
            'choices = self._post(f"{self.base_url}/v1/completions", json=payload)["choices"]',
        ],
        VLLMGeneration.generate: ["all_prompts = gather_object(prompts)", "all_prompts[::num_generations]"],
        GRPOTrainer._generate_single_turn: [
            "if self.state.global_step != self._last_loaded_step:",
            "self.vllm_generation.sync_weights()",
        ],
        GRPOTrainer._generate: ["prompt_ids, images, multimodal_fields = self._tokenize_prompts(prompts)"],
        GRPOTrainer._prepare_inputs: [
            "generate_every = self.args.steps_per_generation * self.num_iterations",
            "if self._step % generate_every == 0 or self._buffered_inputs is None:",
        ],
    }
    for method, lines in expected.items():
        source = inspect.getsource(method)
        for line in lines:
            assert line in source, _changed(f"{method.__qualname__} no longer has `{line}` ({where})")
    got = _params(GRPOTrainer._generate_single_turn)
    single_turn = ["self", "prompt_ids", "images", "multimodal_fields", "num_generations", "has_tool_images"]
    assert got == single_turn, _changed(f"GRPOTrainer._generate_single_turn{tuple(got)} ({where})")
    got = _params(transformers.Trainer.get_batch_samples)
    batch_samples = ["self", "epoch_iterator", "num_batches", "device"]
    assert got == batch_samples, f"transformers' Trainer.get_batch_samples{tuple(got)} ({where})"
    loop = inspect.getsource(transformers.Trainer)
    assert "self.get_batch_samples(epoch_iterator, num_batches, self.args.device)" in loop, where
    assert hasattr(transformers.Trainer, "_get_num_items_in_batch"), where
