"""`padding_free`: each micro-batch's rows packed into one sequence give the same loss, gradients and metrics.

The packed path (`trl_ext.grpo.packing` + `AblationGRPOTrainer._get_per_token_logps_and_entropies`) against the padded
one, which is TRL 1.16's own `_get_per_token_logps_and_entropies` (itself checked against stock `GRPOTrainer` in
test_trainer_equivalence.py). Per case two trainers are built from the same keywords, `padding_free` off and on;
both generate with the same seed (the old and reference log-probs TRL computes there go through the packed path
too), the completions are cut to ragged lengths (0 to 8 tokens: the random policy rarely stops by itself) and the
stored old / reference log-probs recomputed by each trainer's own method, both policies are perturbed identically,
then one optimizer step's work runs: 16 completions as gradient_accumulation_steps = 2 micro-batches. Run with `-s`
for the table of differences.

Bugs caught: position_ids that do not restart per row (a row attends to the rows packed before it: logits move by
~0.5), a packed forward with the KV cache on (transformers then ignores the packing), labels or scatter off by one
token (log-probs of the wrong tokens), values left at padded positions.
"""

from __future__ import annotations

import contextlib
import functools

import pytest
import torch
from datasets import Dataset
from helpers import ragged_rows
from test_sampling import DATA, equal_or_varied_reward
from test_trainer_helpers import (
    PROMPTS,
    generate,
    group_inputs,
    id_reward,
    make_trainer,
    max_rel_diff,
    one_torch_thread,  # noqa: F401 (autouse fixture)
    perturb_,
    prompt_dataset,
    saved_tiny_model,
    tiny_model,
    tiny_moe_model,
    window_loss_and_grads,
)

from trl_ext import AblationGRPOConfig, AblationGRPOTrainer
from trl_ext.grpo.packing import assign_rows, pack_rows, packing_problem, unpack_per_token
from trl_ext.objectives import ADVANTAGE_TYPES, LENGTH_NORMALIZATIONS
from trl_ext.tiny import build_tiny_qwen3

LOSS_ATOL, GRAD_RTOL = 1e-6, 1e-5
# VESPO weighs each sequence by exp(k log w - lambda w) of its summed token log-ratios, which multiplies the ~2e-7
# per-token rounding of a differently shaped forward: measured |dloss| 1.04e-6 at loss -0.31 (3e-6 relative).
VESPO_LOSS_ATOL = 3e-6
LOGP_ATOL = 1e-5  # packed vs padded log-probs of one forward: measured <= 1e-6
STEP = dict(num_iterations=2, gradient_accumulation_steps=2)  # old log-probs stored; 2 micro-batches per step
ON_POLICY = dict(num_iterations=1, gradient_accumulation_steps=2)  # the -A logp losses ignore old log-probs
# Completion lengths after the cut, one per row (two micro-batches of 8): empty, 1 token and full rows in both.
LENGTHS = [8, 1, 5, 0, 3, 8, 2, 6, 7, 4, 8, 1, 5, 0, 6, 2]
METRICS = ("entropy", "kl", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean",
           "cispo_clip_ratio", "vespo/phi_seq_mean", "policy_loss", "entropy_coef", "aux_loss")  # fmt: skip

CASES = {
    **{f"loss_type={name}": dict(loss_type=name) for name in ("grpo", "dr_grpo", "dapo", "bnpo", "sapo", "vespo")},
    "loss_type=cispo": dict(loss_type="cispo", epsilon_high=1.05),
    "loss_type=luspo": dict(loss_type="luspo", importance_sampling_level="sequence"),
    **{f"advantage_type={name}": dict(advantage_type=name) for name in ADVANTAGE_TYPES},
    **{f"pg_loss_type={name}": dict(pg_loss_type=name, **ON_POLICY) for name in ("no_baseline", "reinforce")},
    "pg_loss_type=reinforce_with_baseline": dict(pg_loss_type="reinforce_with_baseline", **ON_POLICY),
    **{f"pg_loss_type={name}": dict(pg_loss_type=name) for name in ("grpo_clip", "grpo_no_clip", "gspo", "luspo")},
    "pg_loss_type=cispo": dict(pg_loss_type="cispo", epsilon_high=5.0),
    "pg_loss_type=sapo": dict(pg_loss_type="sapo"),
    "pg_loss_type=vespo": dict(pg_loss_type="vespo"),
    **{f"length_normalization={name}": dict(length_normalization=name) for name in LENGTH_NORMALIZATIONS},
    "num_iterations=1 (on-policy)": dict(ON_POLICY),
    "beta=0.04 (reference forward)": dict(beta=0.04, loss_type="grpo"),
    "skip_zero_advantage_completions": dict(skip_zero_advantage_completions=True, loss_type="grpo"),
    "dynamic_sampling": dict(dynamic_sampling=True),
    "temperature=0.7": dict(temperature=0.7, loss_type="grpo"),
    "entropy_coef=0.01": dict(entropy_coef=0.01),
    "top_entropy_quantile=0.2": dict(top_entropy_quantile=0.2),
    "MoE aux loss": dict(),
    "Qwen3 vocabulary (5 tiles of TRL's LM head)": dict(loss_type="grpo"),
    "PEFT LoRA, beta=0.04 (reference: adapter off)": dict(beta=0.04, loss_type="grpo"),
}
PERTURBATION = {"loss_type=luspo": 0.5, "pg_loss_type=luspo": 0.5, "pg_loss_type=gspo": 0.5}


def _models(case, tokenizer, tmp_path):
    if case == "MoE aux loss":
        return tiny_moe_model(tokenizer), tiny_moe_model(tokenizer)
    if not case.startswith("beta"):
        return tiny_model(tokenizer), tiny_model(tokenizer)
    off = saved_tiny_model(tokenizer, tmp_path / "ref")  # TRL loads the reference model from this path
    on = tiny_model(tokenizer)
    on.config._name_or_path = off.config._name_or_path
    return off, on


@torch.no_grad()
def _ragged_(trainer, batch) -> None:
    """Cut the completions to `LENGTHS` (padding after), then recompute the stored old / reference log-probs as TRL
    does (per-device batches), by the trainer's own method: packed when `padding_free`."""
    width = batch["completion_ids"].size(1)
    mask = batch["completion_mask"] * (torch.arange(width) < torch.tensor(LENGTHS).unsqueeze(1))
    batch["completion_mask"] = mask
    batch["completion_ids"] = batch["completion_ids"].masked_fill(mask == 0, trainer.processing_class.pad_token_id)
    batch["num_items_in_batch"] = mask.sum()
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention_mask = torch.cat([batch["prompt_mask"], mask], dim=1)
    size = trainer.args.per_device_train_batch_size
    for key in ("old_per_token_logps", "ref_per_token_logps"):
        if key not in batch:
            continue
        model, context = trainer.model, contextlib.nullcontext()
        if key == "ref_per_token_logps" and trainer.ref_model is not None:
            model = trainer.ref_model
        elif key == "ref_per_token_logps":
            context = trainer.model.disable_adapter()  # PEFT: the reference is the base model, as TRL does it
        with context:
            logps, _, _ = trainer._get_per_token_logps_and_entropies(model, input_ids, attention_mask, width, size)
        batch[key] = logps


def _pair(tokenizer, tmp_path, case):
    """Trainers with `padding_free` off and on, their (equal) sampled batches made ragged, policies perturbed."""
    kwargs = {**STEP, **CASES[case]}
    reward, dataset, prompts = id_reward, prompt_dataset(), PROMPTS[:4]
    if case == "dynamic_sampling":
        # Half the prompts' groups get equal rewards: the sampler draws more batches and keeps the varied groups.
        reward, dataset, prompts = equal_or_varied_reward, Dataset.from_dict({"prompt": DATA * 4}), DATA[:4]
    models = _models(case, tokenizer, tmp_path)
    trainer_cls = None
    if case.startswith("PEFT"):
        from peft import LoraConfig

        lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
        trainer_cls = functools.partial(AblationGRPOTrainer, peft_config=lora)
    trainers, batches = [], []
    for flag, model in zip((False, True), models, strict=True):
        trainer = make_trainer(
            tokenizer, tmp_path / str(flag), model=model, reward=reward, dataset=dataset, trainer_cls=trainer_cls,
            padding_free=flag, **kwargs,
        )  # fmt: skip
        trainers.append(trainer)
        batches.append(generate(trainer, group_inputs(prompts, group_size=4)))
    off, on = batches
    assert torch.equal(off["completion_ids"], on["completion_ids"])
    for key in ("old_per_token_logps", "ref_per_token_logps"):  # TRL's generation-time forwards, packed
        assert (key in off) == (key in on)
        if key in off:
            torch.testing.assert_close(on[key], off[key], atol=LOGP_ATOL, rtol=0)
    for trainer, batch in zip(trainers, batches, strict=True):
        _ragged_(trainer, batch)
        if case == "skip_zero_advantage_completions":
            batch["advantages"] = batch["advantages"].masked_fill(torch.arange(16) < 4, 0.0)  # group 0 skipped
        perturb_(trainer.model, scale=PERTURBATION.get(case, 0.05))
    return trainers, batches


@pytest.mark.parametrize("case", list(CASES))
def test_padding_free_matches_padded(char_tokenizer, qwen3_tokenizer, tmp_path, case):
    # The real 151,669-token vocabulary: TRL's fused LM head folds it in 5 tiles of 32,768 (the char vocabulary: 1).
    tokenizer = qwen3_tokenizer if case.startswith("Qwen3") else char_tokenizer
    (off, on), (batch_off, batch_on) = _pair(tokenizer, tmp_path, case)
    for key in ("old_per_token_logps", "ref_per_token_logps"):
        if key in batch_off:  # recomputed on the ragged rows, packed vs padded
            torch.testing.assert_close(batch_on[key], batch_off[key], atol=LOGP_ATOL, rtol=0)
    assert off.args.padding_free is False and on.args.padding_free is True
    lengths = (batch_on["prompt_mask"].sum(dim=1) + batch_on["completion_mask"].sum(dim=1))[:8].tolist()
    assert len(assign_rows(lengths, max(lengths))) < 8  # sdpa: rows share packed rows of the longest row's tokens
    loss_off, grads_off = window_loss_and_grads(off, batch_off)
    loss_on, grads_on = window_loss_and_grads(on, batch_on)

    assert max(g.abs().max().item() for g in grads_off.values()) > 1e-3  # a real gradient to compare
    loss_diff = abs(loss_on.item() - loss_off.item())
    grad_rel = max_rel_diff(grads_on, grads_off)
    print(f"\n[padding_free] {case:40s} loss {loss_off.item():+.6f} |dloss| {loss_diff:.1e} max rel {grad_rel:.1e}")
    assert loss_diff <= (VESPO_LOSS_ATOL if case.endswith("vespo") else LOSS_ATOL)
    assert grad_rel <= GRAD_RTOL
    logged = 0
    for name in METRICS:
        theirs, mine = off._metrics["train"].get(name), on._metrics["train"].get(name)
        assert bool(theirs) == bool(mine), name  # both log it, or neither
        if theirs:
            logged += 1
            assert mine[-2:] == pytest.approx(theirs[-2:], rel=1e-5, abs=1e-7), name
    assert logged >= 1  # at least the entropy
    if case == "dynamic_sampling":  # equal-reward groups were dropped and more batches generated
        assert on._metrics["train"]["dynamic_sampling/generation_batches"][-1] > 1
    if case.startswith("PEFT"):
        assert type(on.model).__name__ == "PeftModel" and on.ref_model is None and "ref_per_token_logps" in batch_on
    if case == "MoE aux loss":
        assert on.aux_loss_enabled and min(on._metrics["train"]["aux_loss"]) > 0.5
    if case == "dynamic_sampling":  # equal-reward groups were dropped and more batches generated
        assert on._metrics["train"]["dynamic_sampling/generation_batches"][-1] > 1


# The packed forward itself, and the log-prob function against TRL's and against full logits.


def test_pack_rows_by_hand():
    input_ids = torch.tensor([[0, 5, 6, 7, 0], [8, 9, 3, 4, 2], [0, 0, 1, 0, 0]])  # prompt columns 0-1
    mask = torch.tensor([[0, 1, 1, 1, 0], [1, 1, 1, 1, 1], [0, 0, 1, 0, 0]])  # 3, 5 and 1 real tokens

    one = pack_rows(input_ids, mask, logits_to_keep=3)  # one row, in row order
    assert one.input_ids.tolist() == [[5, 6, 7, 8, 9, 3, 4, 2, 1]]
    assert one.position_ids.tolist() == [[0, 1, 2, 0, 1, 2, 3, 4, 0]]
    assert one.labels.tolist() == [[-100, 6, 7, -100, -100, 3, 4, 2, -100]]  # a row's first token: never scored
    assert one.index.tolist() == [[1, 2, 3, 5, 6, 7, 8, 9, 12]]
    # flash-attention's varlen arguments of the one row: boundaries 0, 3, 3 + 5, 3 + 5 + 1 (int32), longest 5
    assert one.varlen_kwargs()["cu_seq_lens_q"].tolist() == [0, 3, 8, 9] and one.cu_seq_lens.dtype == torch.int32
    assert one.varlen_kwargs()["max_length_k"] == 5
    # values[k, j - 1] belongs to packed token (k, j); back to (B, T) over the completion columns, 0 at padding.
    values = torch.tensor([[10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0, 17.0]])
    assert unpack_per_token(values, one, 3).tolist() == [[10.0, 11.0, 0.0], [14.0, 15.0, 16.0], [17.0, 0.0, 0.0]]

    # At most 5 tokens per packed row, longest row first: [row 1], [row 0, row 2, 1 filler (id 0, own sequence)].
    bins = pack_rows(input_ids, mask, logits_to_keep=3, capacity=5)
    assert bins.input_ids.tolist() == [[8, 9, 3, 4, 2], [5, 6, 7, 1, 0]]
    assert bins.position_ids.tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 0, 0]]
    assert bins.labels.tolist() == [[-100, -100, 3, 4, 2], [-100, 6, 7, -100, -100]]
    assert bins.index.tolist() == [[5, 6, 7, 8, 9], [1, 2, 3, 12, -1]]
    assert bins.cu_seq_lens is None  # several packed rows: the dense-mask kernels, no varlen arguments
    values = torch.tensor([[20.0, 21.0, 22.0, 23.0], [30.0, 31.0, 32.0, 33.0]])
    assert unpack_per_token(values, bins, 3).tolist() == [[30.0, 31.0, 0.0], [21.0, 22.0, 23.0], [32.0, 0.0, 0.0]]
    assert assign_rows([3, 5, 1, 4, 2], capacity=5) == [[1], [3, 2], [0, 4]]
    assert assign_rows([3, 5, 1], capacity=None) == [[0, 1, 2]]


@pytest.mark.parametrize("capacity", [None, 15], ids=["one row", "rows of 15"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_forward_equals_padded_forward(char_tokenizer, attention, capacity):
    model = build_tiny_qwen3(char_tokenizer, seed=0)  # 2 layers, 4 heads
    model.config._attn_implementation = attention
    input_ids, mask, t = ragged_rows(len(char_tokenizer))  # rows of 15, 5, 6, 4 and 9 real tokens
    packed = pack_rows(input_ids, mask, t, capacity=capacity)
    real = packed.index >= 0
    with torch.no_grad():
        padded = model(input_ids=input_ids, attention_mask=mask).logits.flatten(0, 1)[packed.index[real]]  # (N, V)
        ids, positions = packed.input_ids, packed.position_ids
        logits = model(input_ids=ids, position_ids=positions, use_cache=False).logits[real]
        no_restart = model(input_ids=ids, use_cache=False).logits[real]
        with_cache = model(input_ids=ids, position_ids=positions, use_cache=True).logits[real]
    assert packed.input_ids.size(0) == (1 if capacity is None else 3)  # [15], [9, 6], [5, 4]
    diff = (logits - padded).abs().max().item()
    print(f"\n[padding_free] {attention}, {packed.input_ids.size(0)} packed rows: logits max |diff| {diff:.1e}")
    assert diff < 1e-5
    # Each bug lets a row attend to the rows packed before it.
    assert (no_restart - padded).abs().max() > 0.1
    assert (with_cache - padded).abs().max() > 0.1


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_log_probs_and_entropies_equal_trls_onragged_rows(char_tokenizer, tmp_path, temperature):
    """Ours packed, in chunks of 3 rows (rows 1 and 2 share a packed row), against TRL's
    `_get_per_token_logps_and_entropies` (the trainer with `padding_free` off calls it) and against full logits /
    temperature -> log_softmax; gradients too."""
    trainers = [
        make_trainer(char_tokenizer, tmp_path / str(flag), padding_free=flag, temperature=temperature)
        for flag in (False, True)
    ]
    input_ids, mask, t = ragged_rows(len(char_tokenizer), seed=1)
    results = []
    for trainer in trainers:
        model = trainer.model
        model.zero_grad(set_to_none=True)
        logps, entropies, _ = trainer._get_per_token_logps_and_entropies(
            model, input_ids, mask, t, batch_size=3, compute_entropy=True
        )
        weights = torch.linspace(-1.0, 1.0, logps.numel()).view_as(logps)
        ((logps * weights).sum() + (entropies * weights.flip(0)).sum()).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((logps.detach(), entropies.detach(), grads))
    (logps_trl, ent_trl, grads_trl), (logps, ent, grads) = results
    completion = mask[:, -t:].bool()
    assert (logps[~completion] == 0).all() and (ent[~completion] == 0).all()
    torch.testing.assert_close(logps, logps_trl, atol=1e-6, rtol=0)
    torch.testing.assert_close(ent, ent_trl, atol=1e-6, rtol=0)
    assert max_rel_diff(grads, grads_trl) < GRAD_RTOL

    with torch.no_grad():  # independent reference: full (B, T, V) logits of the padded forward
        logits = trainers[0].model(input_ids=input_ids, attention_mask=mask).logits[:, -t - 1 : -1] / temperature
        full = torch.log_softmax(logits.float(), dim=-1)
        ref_logps = full.gather(-1, input_ids[:, -t:].unsqueeze(-1)).squeeze(-1) * completion
        ref_ent = -(full.exp() * full).sum(-1) * completion
    torch.testing.assert_close(logps, ref_logps, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=0)


# Refusals, before training starts.


def test_refuses_an_attention_that_cannot_pack_and_fixed_shapes(char_tokenizer, tmp_path):
    with pytest.raises(ValueError, match=r"padding_free=True.*'paged\|sdpa'"):
        AblationGRPOConfig(
            output_dir=str(tmp_path), use_cpu=True, report_to="none", padding_free=True,
            model_init_kwargs={"attn_implementation": "paged|sdpa"},
        )  # fmt: skip
    with pytest.raises(ValueError, match=r"padding_free=True .* defeats pad_to_multiple_of=64"):
        AblationGRPOConfig(output_dir=str(tmp_path), use_cpu=True, padding_free=True, pad_to_multiple_of=64)
    model = tiny_model(char_tokenizer)
    model.config._attn_implementation = "paged|sdpa"  # continuous batching's paged kernels: no packed mask
    with pytest.raises(ValueError, match=r"padding_free=True cannot be used here: attention implementation"):
        make_trainer(char_tokenizer, tmp_path, model=model, padding_free=True)
    make_trainer(char_tokenizer, tmp_path / "off", model=model, padding_free=False)  # the default is untouched
    # A model switched after the trainer was built (or a reference model loaded otherwise): refused at the forward.
    trainer = make_trainer(char_tokenizer, tmp_path / "on", padding_free=True)
    trainer.model.config._attn_implementation = "paged|sdpa"
    with pytest.raises(ValueError, match=r"padding_free=True cannot be used here: attention implementation"):
        trainer._get_per_token_logps_and_entropies(trainer.model, *ragged_rows(len(char_tokenizer)))


def test_refuses_recurrent_layers_and_multimodal_batches(char_tokenizer, tmp_path):
    model = tiny_model(char_tokenizer)
    assert packing_problem(model) is None
    model.config.layer_types = ["linear_attention"]  # e.g. Qwen3-Next's Gated DeltaNet layers carry state
    assert "linear_attention layers" in packing_problem(model)
    assert "multimodal" in packing_problem(tiny_model(char_tokenizer), is_multimodal=True)

    trainer = make_trainer(char_tokenizer, tmp_path, padding_free=True)
    input_ids, mask, t = ragged_rows(len(char_tokenizer))
    with pytest.raises(ValueError, match=r"padding_free=True cannot pack a multimodal batch.*pixel_values"):
        trainer._get_per_token_logps_and_entropies(
            trainer.model, input_ids, mask, t, pixel_values=torch.zeros(5, 3, 4, 4)
        )


def test_training_with_padding_free_ends_at_the_same_weights(char_tokenizer, tmp_path):
    """`trainer.train()` end to end (generation, old log-probs, 2 epochs per rollout, 2 micro-batches per step, Adam):
    3 steps with `padding_free` off and on reach the same weights and log the same losses."""
    finals, losses = [], []
    for flag in (False, True):
        trainer = make_trainer(
            char_tokenizer, tmp_path / str(flag), padding_free=flag, max_steps=3, num_iterations=2,
            gradient_accumulation_steps=2, per_device_train_batch_size=4, learning_rate=5e-2,
        )  # fmt: skip
        start = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        trainer.train()
        finals.append({n: p.detach().clone() for n, p in trainer.model.named_parameters()})
        losses.append([log["loss"] for log in trainer.state.log_history if "loss" in log])
    moved = max((finals[0][n] - start[n]).abs().max().item() for n in start)
    weights_rel = max_rel_diff(finals[1], finals[0])
    print(f"\n[padding_free] train() 3 steps: weights max rel diff {weights_rel:.1e}, losses {losses}")
    assert moved > 1e-2  # the optimizer moved the weights
    assert weights_rel < 1e-4
    assert len(losses[0]) == 3 and losses[1] == pytest.approx(losses[0], abs=1e-6)
