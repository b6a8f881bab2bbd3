"""Shared helpers of the trainer tests (tiny models, rewards, trainer factories, an independent log-prob reference).

Imported by the `test_trainer_*.py` modules; its own tests check the helpers that the others trust.
"""

from __future__ import annotations

import atexit
import copy
import functools
import gc

import pytest
import torch
from outcomes import TEST_THREADS

PROMPTS = ["abc", "hello", "12+3", "xyz", "qq", "Zeta", "R1", "w"]
TARGET_CHARS = set("0123456789")

# Kept small on purpose: every trainer test must fit the suite's CPU budget.
COMMON = dict(
    report_to="none",
    use_cpu=True,
    save_strategy="no",
    logging_steps=1,
    max_completion_length=8,
    num_generations=4,
    per_device_train_batch_size=8,
    seed=0,
    data_seed=0,
    bf16=False,
    disable_dropout=True,
    learning_rate=1e-2,
    dataloader_num_workers=0,
)


@functools.cache
def freeze_imports() -> None:
    """Once per process: collect, then move every object alive now (the imported modules of torch, transformers,
    TRL, vLLM: about 750k) out of the cyclic collector's reach with `gc.freeze()`. transformers and accelerate call
    `gc.collect()` when a training run ends; each such full collection would walk all of them (0.4 s on a 2-core
    CPU, 20 of them in the learning module alone) and walks only what the tests created since."""
    import trl_ext.grpo.trainer  # noqa: F401 (the heavy imports, before the freeze)

    gc.collect()
    gc.freeze()
    atexit.register(gc.unfreeze)  # at exit they are collectable again (else nanobind reports them as leaked)


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Pin torch to one thread: tiny models gain nothing from more, and `pytest -n 2` on 2 cores with torch's
    default threads per worker oversubscribes the CPU (measured: the trainer tests took 343 s instead of 43 s).
    Autouse in every module that imports it; its first use also freezes the imports (`freeze_imports`).
    `$TRL_EXT_TEST_THREADS` (tests/outcomes.py) overrides the 1: the outcome matrix runs with 2 as well, where
    reductions round differently."""
    previous = torch.get_num_threads()
    torch.set_num_threads(TEST_THREADS)
    freeze_imports()
    yield
    torch.set_num_threads(previous)


def id_reward(completion_ids, **kwargs) -> list[float]:
    """A deterministic reward with spread inside most groups: `(sum of token ids mod 5) / 4` in [0, 1]."""
    return [float(sum(ids) % 5) / 4 for ids in completion_ids]


def digit_share_reward(completions, **kwargs) -> list[float]:
    """Share of the completion's characters that are digits (0 for an empty completion); learnable fast."""
    return [sum(ch in TARGET_CHARS for ch in text) / max(len(text), 1) for text in completions]


def prompt_dataset(n_repeats: int = 8):
    from datasets import Dataset

    return Dataset.from_dict({"prompt": PROMPTS * n_repeats})


def tiny_model(tokenizer, seed: int = 0):
    """A 1-layer, 32-wide Qwen3 (about 10k parameters with the char vocabulary), same weights for the same seed."""
    from trl_ext.tiny import build_tiny_qwen3

    return build_tiny_qwen3(
        tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64, seed=seed
    )


def tiny_moe_model(tokenizer, seed: int = 0):
    """A 1-layer Qwen3-MoE (4 experts, top 2) with a router aux-loss coefficient: TRL adds `coef * aux_loss`."""
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    config = Qwen3MoeConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, moe_intermediate_size=32,
        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_experts=4,
        num_experts_per_tok=2, output_router_logits=False, router_aux_loss_coef=0.01, tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    gen = model.generation_config
    gen.eos_token_id, gen.pad_token_id, gen.bos_token_id = tokenizer.eos_token_id, tokenizer.pad_token_id, None
    return model


def make_trainer(
    tokenizer,
    output_dir,
    stock: bool = False,
    model=None,
    reward=id_reward,
    dataset=None,
    trainer_cls=None,
    **overrides,
):
    """A stock `trl.GRPOTrainer` or an `AblationGRPOTrainer` (or `trainer_cls`) on a tiny Qwen3 (seed 0 weights)."""
    from trl import GRPOConfig, GRPOTrainer

    from trl_ext import AblationGRPOConfig, AblationGRPOTrainer

    kwargs = {**COMMON, "output_dir": str(output_dir), **overrides}
    config_cls, default_cls = (GRPOConfig, GRPOTrainer) if stock else (AblationGRPOConfig, AblationGRPOTrainer)
    trainer_cls = trainer_cls or default_cls
    return trainer_cls(
        tiny_model(tokenizer) if model is None else model,
        reward,
        args=config_cls(**kwargs),
        train_dataset=prompt_dataset() if dataset is None else dataset,
        processing_class=tokenizer,
    )


def group_inputs(prompts=PROMPTS[:2], group_size: int = 4) -> list[dict]:
    """A generation batch as TRL's sampler lays it out: each prompt repeated `group_size` times, contiguous."""
    return [{"prompt": p} for p in prompts for _ in range(group_size)]


def generate(trainer, inputs, seed: int = 1) -> dict:
    """`_generate_and_score_completions` in train mode with a fixed sampling seed."""
    trainer.model.train()
    torch.manual_seed(seed)
    return trainer._generate_and_score_completions(copy.deepcopy(inputs))


def loss_and_grads(trainer, batch, accumulation: int = 1) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """`trainer._compute_loss` on `batch` in train mode, then backward; returns the loss and every parameter grad."""
    model = trainer.model
    model.train()
    model.zero_grad(set_to_none=True)
    trainer.current_gradient_accumulation_steps = accumulation
    loss = trainer._compute_loss(model, batch)
    loss.backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def window_loss_and_grads(trainer, batch, accumulation: int = 2) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One optimizer step's worth of work, as `Trainer.training_step` does it: `batch` split (in order) into
    `accumulation` micro-batches, `trainer._compute_loss` and backward on each, gradients accumulated.

    Returns the summed micro-batch losses and every parameter gradient.
    """
    from trl.trainer.utils import split_tensor_dict

    model = trainer.model
    model.train()
    model.zero_grad(set_to_none=True)
    trainer.current_gradient_accumulation_steps = accumulation
    total = torch.zeros(())
    for micro in split_tensor_dict(batch, accumulation):
        loss = trainer._compute_loss(model, micro)
        loss.backward()
        total = total + loss.detach()
    return total, {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def saved_tiny_model(tokenizer, path):
    """`tiny_model` saved to `path` and pointing at it (`config._name_or_path`), so TRL can load a reference model
    from the same weights when `beta > 0`."""
    model = tiny_model(tokenizer)
    model.save_pretrained(path)
    model.config._name_or_path = str(path)
    return model


@torch.no_grad()
def perturb_(model, seed: int = 123, scale: float = 0.05) -> None:
    """Add the same seeded Gaussian noise to every parameter (so two copies stay identical)."""
    gen = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.add_(torch.randn(p.shape, generator=gen) * scale)


def reference_logps(model, batch) -> torch.Tensor:
    """Log-probs `(B, T)` of the completion tokens from a plain forward + log_softmax (independent of TRL)."""
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits  # (B, P + T, V)
    t = batch["completion_ids"].size(1)
    logps = torch.log_softmax(logits[:, -t - 1 : -1].float(), dim=-1)
    return logps.gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)


def max_rel_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """max over parameters of `|a - b|_max / (|b|_max + 1e-12)`; also checks both have the same parameters."""
    assert a.keys() == b.keys()
    return max(((a[k] - b[k]).abs().max() / (b[k].abs().max() + 1e-12)).item() for k in a)


def test_rewards_by_hand():
    # ids 1+2+3 = 6 -> 6 % 5 = 1 -> 0.25; 4 % 5 = 4 -> 1.0
    assert id_reward([[1, 2, 3], [4]]) == [0.25, 1.0]
    # "a1b2" has 2 digits of 4 characters; "" counts as 0
    assert digit_share_reward(["a1b2", "", "99"]) == [0.5, 0.0, 1.0]


def test_reference_logps_match_trl(char_tokenizer, tmp_path):
    trainer = make_trainer(char_tokenizer, tmp_path)
    batch = generate(trainer, group_inputs())
    ours = reference_logps(trainer.model, batch)
    trl_logps, _, _ = trainer._get_per_token_logps_and_entropies(
        trainer.model,
        torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1),
        torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1),
        batch["completion_ids"].size(1),
    )
    mask = batch["completion_mask"].bool()
    torch.testing.assert_close(ours[mask], trl_logps[mask], atol=1e-5, rtol=1e-5)
