"""trl_ext.launch.tensor_parallel: vLLM also shards the 64-padded vocabulary, so TP must divide it;
and the plan picks the server's TP by a stated rule (the smallest size with at most 4 B parameters per GPU), not the
largest that shards the model, and prints why."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from trl_ext.launch import plan_launch
from trl_ext.launch.configs import LaunchError
from trl_ext.launch.tensor_parallel import (
    SERVER_PARAMS_PER_GPU,
    choose_tensor_parallel,
    padded_vocab,
    tensor_parallel_ok,
    tensor_parallel_sizes,
)
from trl_ext.preflight import ModelShape, load_model_shape

REPO = Path(__file__).resolve().parents[1]
# Qwen2.5-7B / 14B architecture fields (their hub config.json); 7,615,616,512 and 14,770,033,664 parameters.
QWEN25_7B = dict(model_type="qwen2", hidden_size=3584, num_hidden_layers=28, num_attention_heads=28)
QWEN25_7B.update(num_key_value_heads=4, intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False)
QWEN25_14B = dict(model_type="qwen2", hidden_size=5120, num_hidden_layers=48, num_attention_heads=40)
QWEN25_14B.update(num_key_value_heads=8, intermediate_size=13824, vocab_size=152064, tie_word_embeddings=False)


def _vllm_source(module: str) -> str:
    """An installed vLLM module's source, read without importing vLLM."""
    package, name = module.rsplit(".", 1)
    return Path(importlib.util.find_spec(package).submodule_search_locations[0], f"{name}.py").read_text()


def test_padded_vocabulary_must_divide_by_tp():
    """Bug caught: the check looked at heads, KV heads and MLP width only. vLLM 0.31 pads the vocabulary to a multiple
    of 64 and `divide`s that by TP (an assert). A model whose heads (24), KV heads (3) and MLP (3 x 4096) allow TP 3
    but whose vocabulary 32,000 (= 2^8 x 125, padded: 32,000) does not divide by 3 is refused; 32,001 pads to
    32,064 = 3 x 10,688 and is not."""
    source = _vllm_source("vllm.model_executor.layers.vocab_parallel_embedding")
    assert "DEFAULT_VOCAB_PADDING_SIZE = 64" in source
    assert "return ((vocab_size + pad_to - 1) // pad_to) * pad_to" in source
    assert "divide(\n            self.num_embeddings_padded, self.tp_size\n        )" in source
    fields = dict(hidden_size=3072, num_hidden_layers=2, num_attention_heads=24, num_key_value_heads=3)
    fields.update(intermediate_size=12288, model_type="llama")
    refused = ModelShape.from_config({**fields, "vocab_size": 32000}, "vocab-32000")
    assert (padded_vocab(32000), padded_vocab(32001), padded_vocab(151936)) == (32000, 32064, 151936)
    assert not tensor_parallel_ok(refused, 3) and tensor_parallel_sizes(refused, 4) == [1]  # 3 KV heads: no 2, no 4
    accepted = ModelShape.from_config({**fields, "vocab_size": 32001})
    assert tensor_parallel_ok(accepted, 3) and tensor_parallel_sizes(accepted, 4) == [1, 3]


def test_tp_that_does_not_shard_the_vocabulary_is_refused_by_name(tmp_path):
    from trl_ext.launch.planning import server_parallelism

    fields = dict(hidden_size=3072, num_hidden_layers=2, num_attention_heads=24, num_key_value_heads=3)
    shape = ModelShape.from_config({**fields, "intermediate_size": 12288, "vocab_size": 32000}, "vocab-32000")
    with pytest.raises(
        LaunchError, match=r"--vllm-tp 3 does not shard vocab-32000 .*vocabulary 32000 padded to 32000"
    ):
        server_parallelism(["0", "1", "2"], 3, None, shape)


def test_the_rule_picks_the_smallest_tp_with_at_most_4b_parameters_per_gpu():
    """Bug caught: the plan gave a 1.7 B model the largest TP the free GPUs allowed (4 of 4, 8 of 12), which decodes
    little faster than TP 1 while those GPUs could train. The rule, by hand: Qwen3-1.7B (1.72 B) -> 1; Qwen2.5-7B
    (7.62 B: 3.81 B at TP 2) -> 2; Qwen2.5-14B (14.77 B: 7.39 at 2, 3.69 at 4) -> 4, or 2 when only 2 GPUs are free."""
    assert SERVER_PARAMS_PER_GPU == 4e9
    small = load_model_shape("Qwen/Qwen3-1.7B")[0]
    seven = ModelShape.from_config(QWEN25_7B, "Qwen2.5-7B")
    fourteen = ModelShape.from_config(QWEN25_14B, "Qwen2.5-14B")
    assert (seven.params, fourteen.params) == (7_615_616_512, 14_770_033_664)
    assert choose_tensor_parallel(small, tensor_parallel_sizes(small, 8)) == 1
    assert choose_tensor_parallel(seven, tensor_parallel_sizes(seven, 8)) == 2
    assert choose_tensor_parallel(fourteen, tensor_parallel_sizes(fourteen, 8)) == 4
    assert choose_tensor_parallel(fourteen, tensor_parallel_sizes(fourteen, 2)) == 2
    assert choose_tensor_parallel(None, [1, 2, 4]) == 4  # unknown size: the largest power of two, as before


def test_plan_prints_why_this_tp(tmp_path):
    """A 4-GPU node with vllm_server_gpu0_train_gpu1.yaml: training on GPU 1, the server on GPU 0 at TP 1 (was 0,2 at
    TP 2), GPUs 2 and 3 idle, and the plan says why; `--vllm-tp 2` still gives TP 2, without the rule's note."""
    recipe = REPO / "recipes" / "countdown" / "base.yaml"
    kwargs = dict(num_gpus=4, gpu_memory_gb=80.0, check_packages=False, environ={}, log_dir=tmp_path)
    args = (
        REPO / "accelerate_configs" / "vllm_server_gpu0_train_gpu1.yaml",
        REPO / "recipes" / "countdown.py",
        recipe,
    )
    plan = plan_launch(*args, ["--output_dir", str(tmp_path / "run")], **kwargs)
    assert (plan.server_gpus, plan.tp, plan.train_gpus) == (("0",), 1, ("1",))
    text = plan.render()
    assert (
        "vLLM server tp 1: the smallest size that shards Qwen/Qwen3-1.7B with at most 4 B parameters per GPU "
        "(1.72 B, 3.4 GB of bf16 weights); more TP gains a model this size little" in text
    )
    assert "idle: 2,3" in text
    forced = plan_launch(*args, ["--output_dir", str(tmp_path / "run2")], vllm_tp=2, **kwargs)
    assert forced.tp == 2 and "the smallest size that shards" not in forced.render()
