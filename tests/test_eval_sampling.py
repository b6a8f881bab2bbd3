"""Evaluation samples exactly what it says: a checkpoint's generation_config does not leak in.

transformers 5 fills every sampling field a `generate` call leaves unset from the model's generation config, and
Qwen2.5 Instruct checkpoints ship a repetition penalty, top-k, top-p and temperature. Here a tiny model's config
sets strong ones (repetition penalty 5, top-k 1, top-p 0.5, temperature 0.05, no 2-gram repeats): greedy must equal
a plain argmax loop over the raw logits, sampling at temperature 1 must vary, and vLLM's server must get every field
it would otherwise fill from that config. tests/test_vllm_eval.py runs both backends on such a checkpoint.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest
import torch

from trl_ext.discover.backends import NEUTRAL_SAMPLING, TransformersChatBackend
from trl_ext.evaluation.transformers_backend import checkpoint_sampling_off, generate_transformers
from trl_ext.tiny import build_tiny_qwen3

LEAKY = dict(do_sample=True, repetition_penalty=5.0, top_k=1, top_p=0.5, temperature=0.05, no_repeat_ngram_size=2)
PROMPTS = ["12+3=", "hello"]


@pytest.fixture(scope="module")
def leaky(char_tokenizer):
    torch.manual_seed(0)
    model = build_tiny_qwen3(char_tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, seed=3)
    with torch.no_grad():  # sharper logits than the default init: greedy repeats itself, which the penalty forbids
        for param in model.parameters():
            if param.dim() > 1:
                param.mul_(20)
    model.generation_config.update(**LEAKY)
    return model.eval()


def _argmax_loop(model, tokenizer, prompt: str, steps: int) -> list[int]:
    """Greedy decoding by hand: argmax of the raw logits, stopping at EOS (no processor of any kind)."""
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    out: list[int] = []
    with torch.no_grad():
        for _ in range(steps):
            token = int(model(input_ids=torch.tensor([ids + out])).logits[0, -1].argmax())
            out.append(token)
            if token == tokenizer.eos_token_id:
                break
    return out


def test_greedy_and_sampling_ignore_the_checkpoints_generation_config(leaky, char_tokenizer):
    greedy = generate_transformers(leaky, char_tokenizer, PROMPTS, 1, 12, temperature=0, stop=(), progress=False)
    for prompt, [sample] in zip(PROMPTS, greedy, strict=True):
        reference = _argmax_loop(leaky, char_tokenizer, prompt, 12)
        assert sample.token_ids == reference
        assert len(set(reference)) < len(reference)  # it repeats a token: the checkpoint's penalty would not let it
    sampled = generate_transformers(leaky, char_tokenizer, PROMPTS, 8, 6, temperature=1.0, stop=(), progress=False)
    assert all(len({tuple(s.token_ids) for s in group}) > 1 for group in sampled)  # top-k 1 would make 8 equal
    assert leaky.generation_config.repetition_penalty == 5.0 and leaky.generation_config.top_k == 1  # restored
    with checkpoint_sampling_off(leaky):
        assert leaky.generation_config.repetition_penalty is None and leaky.generation_config.top_k is None
        assert leaky.generation_config.eos_token_id == char_tokenizer.eos_token_id


def test_discover_local_backend_samples_only_its_temperature(leaky, char_tokenizer, tmp_path):
    leaky.save_pretrained(tmp_path)
    char_tokenizer.save_pretrained(tmp_path)
    backend = TransformersChatBackend(str(tmp_path))
    assert backend.model.generation_config.repetition_penalty == 5.0  # the saved checkpoint carries it
    messages = [{"role": "user", "content": "12+3="}]
    [reply] = backend.chat(messages, 1, 0.0, 10, seed=0)
    expected = _argmax_loop(backend.model, char_tokenizer, backend._prompt(messages), 10)
    assert reply == char_tokenizer.decode(expected, skip_special_tokens=True)
    assert len(set(backend.chat(messages, 8, 1.0, 6, seed=0))) > 1


def test_http_backend_sends_every_field_vllm_fills_from_the_checkpoint():
    """vLLM's server fills each sampling field a request leaves unset from the model's generation_config (its
    `to_sampling_params` over `_DEFAULT_SAMPLING_PARAMS`, read here from vLLM's source without importing vLLM);
    the discover backend sends every one of them, at vLLM's neutral value."""
    spec = importlib.util.find_spec("vllm")
    if spec is None:
        pytest.skip("vLLM is not installed: its protocol source cannot be read")
    source = Path(spec.submodule_search_locations[0]) / "entrypoints" / "openai" / "chat_completion" / "protocol.py"
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "_DEFAULT_SAMPLING_PARAMS":
            defaults = ast.literal_eval(node.value)
            break
    else:
        raise AssertionError(f"_DEFAULT_SAMPLING_PARAMS not found in {source}")
    assert {k: v for k, v in defaults.items() if k != "temperature"} == NEUTRAL_SAMPLING
