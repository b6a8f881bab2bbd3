"""`trl_ext.static_cache` (batched sampling over a preallocated KV cache) and the trainer's `static_cache_generation`:
greedy completions equal a plain argmax loop and `generate`; sampled tokens follow the model's (warped) distribution;
the log-probs and entropies are a teacher-forced forward's; the trainer samples through it with the config's
settings and refuses what it cannot honour."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.stats import chisquare
from test_trainer_helpers import make_trainer, one_torch_thread  # noqa: F401 (autouse fixture)

from trl_ext.static_cache import sample_static_cache
from trl_ext.tiny import build_tiny_qwen3

PROMPTS = ["12+3", "hello", "w", "12+3", "abc xyz", "12+3", "(4)"]


def _ids(tokenizer, texts):
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


@pytest.fixture(scope="module")
def ending_model(char_tokenizer):
    """A tiny Qwen3 (grouped-query attention) whose EOS logit varies widely with the context, so completions end at
    many different steps (the rows that finish leave the batch) and some run to the budget."""
    model = build_tiny_qwen3(char_tokenizer, seed=3).eval()
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():  # tied embeddings: only the EOS row's logit changes (EOS is never an input)
        embed = model.get_input_embeddings().weight
        embed[char_tokenizer.eos_token_id] = 1.5 * torch.randn(embed.shape[1], generator=generator)
    return model


def _plain_greedy(model, prompt: list[int], budget: int, eos: int) -> list[int]:
    """The reference: one row, no padding, no cache, a full forward per token."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(budget):
            nxt = int(model(torch.tensor([ids])).logits[0, -1].argmax())
            ids.append(nxt)
            if nxt == eos:
                break
    return ids[len(prompt) :]


def test_greedy_equals_a_plain_argmax_loop_and_generate(char_tokenizer, ending_model):
    """Catches wrong rotary positions under left padding, a cache written at the wrong column, a row dropped with
    another's cache, or a prefill shared by prompts that differ."""
    from transformers import GenerationConfig

    tok, eos = char_tokenizer, char_tokenizer.eos_token_id
    prompts = _ids(tok, PROMPTS)
    got = sample_static_cache(ending_model, prompts, 12, [eos], tok.pad_token_id, temperature=0).token_ids
    assert got == [_plain_greedy(ending_model, p, 12, eos) for p in prompts]
    lengths = {len(g) for g in got}
    assert len(lengths) >= 3 and 12 in lengths, lengths  # rows ended at several steps, and some ran to the budget

    enc = tok(PROMPTS, return_tensors="pt", padding=True, add_special_tokens=False, padding_side="left")
    config = GenerationConfig(max_new_tokens=12, do_sample=False, eos_token_id=[eos], pad_token_id=tok.pad_token_id)
    with torch.no_grad():
        out = ending_model.generate(**enc, generation_config=config)[:, enc["input_ids"].shape[1] :].tolist()
    assert got == [row[: row.index(eos) + 1] if eos in row else row for row in out]


def _next_token_probs(model, prefix: list[int], temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """The sampling distribution by hand: raw logits / T, the top-k kept, then the smallest set of mass >= top_p."""
    with torch.no_grad():
        logits = model(torch.tensor([prefix])).logits[0, -1].double() / temperature
    if top_k:
        logits[logits < logits.topk(top_k).values[-1]] = -math.inf
    probs = torch.softmax(logits, dim=-1)
    if top_p < 1.0:
        order = probs.argsort(descending=True)
        before = probs[order].cumsum(0) - probs[order]  # mass of the tokens ranked above each
        probs[order[before >= top_p]] = 0.0
        probs /= probs.sum()
    return probs


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.8)])
def test_sampled_tokens_follow_the_model_distribution(char_tokenizer, ending_model, temperature, top_k, top_p):
    """20,000 completions of one prompt: the counts of the first token and of the second (its distribution mixed
    over the first's by hand) match the warped distribution by hand (chi-square, p > 0.001 at a fixed seed); no token
    outside the kept set comes first. Catches a temperature applied twice or not at all, a warper out of order, rows
    that share a prefill drawing the same token, a second step that reads another row's cache."""
    tok = char_tokenizer
    prompt = _ids(tok, ["12+3"])[0]
    torch.manual_seed(0)
    out = sample_static_cache(
        ending_model, [prompt] * 20000, 2, [], tok.pad_token_id, temperature=temperature, top_k=top_k, top_p=top_p
    ).token_ids
    first = _next_token_probs(ending_model, prompt, temperature, top_k, top_p)
    second = sum(
        p * _next_token_probs(ending_model, [*prompt, a], temperature, top_k, top_p)
        for a, p in enumerate(first.tolist())
        if p > 0
    )
    for step, probs in enumerate((first, second)):
        counts = torch.bincount(torch.tensor([row[step] for row in out]), minlength=len(probs)).double()
        assert counts[probs == 0].sum() == 0
        kept = probs > 0
        expected = probs[kept] * len(out)
        big = expected >= 5  # chi-square's rule of thumb; the rare tokens pooled into one cell
        observed = torch.cat([counts[kept][big], counts[kept][~big].sum().view(1)])
        expected = torch.cat([expected[big], expected[~big].sum().view(1)])
        if expected[-1] == 0:
            observed, expected = observed[:-1], expected[:-1]
        assert len(expected) >= 3, expected  # a test with power
        assert chisquare(observed.numpy(), expected.numpy()).pvalue > 1e-3, (step, observed, expected)


def test_logprobs_and_entropies_equal_a_teacher_forced_forward(char_tokenizer, ending_model):
    tok, eos = char_tokenizer, char_tokenizer.eos_token_id
    prompts = _ids(tok, PROMPTS[:4])
    torch.manual_seed(1)
    out = sample_static_cache(
        ending_model, prompts, 10, [eos], tok.pad_token_id, with_logprobs=True, with_entropies=True
    )
    for prompt, ids, logps, entropies in zip(prompts, out.token_ids, out.logprobs, out.entropies, strict=True):
        assert len(ids) == len(logps) == len(entropies) >= 1
        with torch.no_grad():
            logits = ending_model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].double()  # (T, V)
        log_p = torch.log_softmax(logits, dim=-1)
        assert logps == pytest.approx(log_p.gather(1, torch.tensor(ids)[:, None]).squeeze(1).tolist(), abs=1e-5)
        assert entropies == pytest.approx((-(log_p.exp() * log_p).sum(-1)).tolist(), abs=1e-5)


def test_the_trainer_samples_through_the_loop_with_the_configs_settings(char_tokenizer, tmp_path):
    """`static_cache_generation`: the trainer's rollouts are `sample_static_cache`'s at the config's temperature and
    top-k (same torch seed, same tokens), and a training step runs on them."""
    tok = char_tokenizer
    trainer = make_trainer(
        tok, tmp_path, static_cache_generation=True, temperature=0.8, top_k=6, max_steps=1, max_completion_length=6
    )
    prompts = [ids for ids in _ids(tok, ["abc", "hello"]) for _ in range(4)]
    torch.manual_seed(5)
    completions, logprobs = trainer._generate_single_turn(prompts, None, {}, 4)
    torch.manual_seed(5)
    model = trainer.accelerator.unwrap_model(trainer.model)
    direct = sample_static_cache(
        model, prompts, 6, trainer.eos_token_ids, tok.pad_token_id, temperature=0.8, top_k=6
    ).token_ids
    assert completions == direct and logprobs is None
    before = [p.detach().clone() for p in model.parameters()]
    trainer.train()
    assert any(not a.equal(b) for a, b in zip(before, model.parameters(), strict=True))


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(use_vllm=True), "use_vllm"),
        # async rollouts (the other behaviour on `_generate_single_turn`) need the server: never both at once
        (dict(use_vllm=True, vllm_mode="server", async_rollouts=True), "use_vllm"),
        (dict(repetition_penalty=1.1), "repetition_penalty"),
        (dict(generation_kwargs={"top_k": 3}), "generation_kwargs"),
        (dict(cache_implementation="static"), "cache_implementation"),
        (dict(use_transformers_continuous_batching=True), "use_transformers_continuous_batching"),
    ],
)
def test_the_config_refuses_what_the_loop_cannot_honour(overrides, field):
    from trl_ext import AblationGRPOConfig

    with pytest.raises(ValueError, match=f"static_cache_generation.*{field}"):
        AblationGRPOConfig(output_dir="unused", use_cpu=True, static_cache_generation=True, **overrides)


def test_a_model_the_loop_cannot_run_is_refused_before_training(char_tokenizer, tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=len(char_tokenizer), n_embd=32, n_layer=1, n_head=2, n_positions=64)
    with pytest.raises(ValueError, match="static_cache_generation=True cannot be used here: model type 'gpt2'"):
        make_trainer(char_tokenizer, tmp_path, model=GPT2LMHeadModel(config), static_cache_generation=True)


def test_the_evaluation_backend_through_the_loop_matches_generate_when_greedy(char_tokenizer, ending_model):
    """`generate_transformers(static_cache=True)` (the testbed's held-out scoring): greedy samples and their raw
    log-probs equal `generate`'s, cut at EOS; sampled ones have n rows per prompt within the budget."""
    from trl_ext.evaluation.transformers_backend import generate_transformers

    tok, eos = char_tokenizer, char_tokenizer.eos_token_id
    common = dict(max_new_tokens=12, stop=(), progress=False, batch_size=4)
    fast = generate_transformers(ending_model, tok, PROMPTS, n=1, temperature=0, static_cache=True, **common)
    slow = generate_transformers(ending_model, tok, PROMPTS, n=1, temperature=0, **common)
    for (a,), (b,) in zip(fast, slow, strict=True):
        end = b.token_ids.index(eos) + 1 if eos in b.token_ids else len(b.token_ids)
        assert a.token_ids == b.token_ids[:end]
        assert a.logprobs == pytest.approx(b.logprobs[:end], abs=1e-5)
    sampled = generate_transformers(ending_model, tok, PROMPTS[:3], n=5, static_cache=True, **common)
    assert [len(row) for row in sampled] == [5, 5, 5]
    assert all(1 <= len(s.token_ids) <= 12 for row in sampled for s in row)
