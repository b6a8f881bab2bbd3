"""Held-out scoring of a testbed model through `trl_ext.evaluation`: greedy and sampled accuracy, pass@k, the
per-problem results the paired tests need, and the sampled responses' entropy and lengths."""

from __future__ import annotations

import functools
import time

# Sampling at evaluation uses its own fixed seed: two runs differ only through their models.
EVAL_SAMPLING_SEED = 4321
# Sequences per `generate` call: the whole held-out set at once is fastest for a model this small.
BATCH_SIZE = 512


def evaluate(
    model, tokenizer, problems: list[dict], num_samples: int, max_new_tokens: int, static_cache: bool = False
) -> dict:
    """Held-out accuracy with the training reward (`require_all=True`): a completion is correct when its answer
    reward is 1, i.e. the expression uses every number once and equals the target.

    Generation, cutting at EOS, scoring and pass@k are `trl_ext.evaluation.evaluate_model`'s; this
    adds the compact prompts and keeps the per-problem results. `static_cache`: sample through
    `trl_ext.static_cache` instead of `generate` (the same distributions, a fraction of the CPU); the sampler gives
    each token's entropy as it samples, so the sampled responses' statistics come with them (`response`).

    Returns:
        `greedy_accuracy`, `greedy_reward` (mean training reward: 1 correct, 0.1 tagged but wrong, 0 untagged),
        `greedy_tagged` (share of greedy answers in tags), `greedy_correct` (per problem, 0/1);
        with `num_samples > 0` also `sampled_accuracy` (mean over `num_samples` samples per problem at temperature
        1, no top-k / top-p), `sampled_reward`, `sampled_correct` (per problem, 0..num_samples) and
        `pass@<num_samples>`, and with `static_cache` `response`: `response_stats`' numbers over these
        `num_samples` responses per problem;
        `examples` (a few greedy prompt / completion pairs) and `seconds`.
    """
    from trl_ext.evaluation import evaluate_model, ground_truth_of
    from trl_ext.rewards import countdown_reward_components
    from trl_ext.tasks import compact_prompt

    started = time.perf_counter()
    was_training = model.training
    model.eval()
    prompts = [compact_prompt(p["nums"], p["target"]) for p in problems]
    truths = [ground_truth_of("countdown", p) for p in problems]
    common = dict(
        reward=functools.partial(countdown_reward_components, require_all=True),
        max_new_tokens=max_new_tokens,
        batch_size=BATCH_SIZE,
        # Completions end at EOS or the budget, as in GRPO's rollouts (whose reward sees the same text); the char
        # tokenizer has no letters, which transformers' stop-string matcher needs.
        stop=(),
        num_examples=2,
        static_cache=static_cache,
    )
    summary, records = evaluate_model(model, tokenizer, prompts, truths, n=1, temperature=0.0, ns=(1,), **common)
    result = {
        "greedy_accuracy": summary["accuracy"],
        "greedy_reward": summary["mean_reward"],
        "greedy_tagged": summary["format_rate"],
        "greedy_correct": [int(r["answer_reward"] == 1.0) for r in records],
        "examples": [[r["prompt"], r["response"]] for r in records[:3]],
    }
    if num_samples:
        summary, records, samples = evaluate_model(
            model, tokenizer, prompts, truths, n=num_samples, temperature=1.0, seed=EVAL_SAMPLING_SEED,
            ns=(num_samples,), with_samples=True, **common,
        )  # fmt: skip
        hits = [int(r["answer_reward"] == 1.0) for r in records]  # problem-major, num_samples per problem
        if static_cache:  # the sampler stops at EOS: each sample is the scored response, entropies included
            entropies = [s.entropies for row in samples for s in row]
            entropy = sum(map(sum, entropies)) / sum(map(len, entropies))
            result["response"] = _stats([len(e) for e in entropies], hits, entropy)
        result["sampled_accuracy"] = summary["accuracy"]
        result["sampled_reward"] = summary["mean_reward"]
        result["sampled_correct"] = [sum(hits[i : i + num_samples]) for i in range(0, len(hits), num_samples)]
        result[f"pass@{num_samples}"] = summary["pass_at_n"][str(num_samples)]
    result["seconds"] = time.perf_counter() - started
    model.train(was_training)
    return result


# Sampling seed of the response statistics along the curves (one sample per held-out problem).
RESPONSE_SAMPLING_SEED = 8765


def response_stats(model, tokenizer, problems: list[dict], max_new_tokens: int, static_cache: bool = False) -> dict:
    """Entropy and length of the policy's responses: one sample per held-out problem at temperature 1 (no top-k /
    top-p, as the rollouts sample), then one forward over prompt + response (`static_cache`: sampled through
    `trl_ext.static_cache`, which returns each token's entropy as it samples, so no second forward).

    `entropy` is the token mean over every response token (EOS included) of the entropy of the next-token
    distribution that produced it, `H_t = -sum_v p_v log p_v`, as TRL's `entropy` metric averages it;
    `mean_length` counts a response's tokens through its EOS (TRL's `completions/mean_length`); `accuracy` is the
    share of the samples the training reward marks correct; `correct_length` / `incorrect_length` are the mean
    lengths (tokens, as `mean_length`) of the correct and of the incorrect responses (None when there are none).
    Torch's global random state is left as it was, so measuring along a run does not change the run.

    Returns:
        `{"entropy", "mean_length", "accuracy", "correct_length", "incorrect_length"}`.
    """
    import torch

    from trl_ext.evaluation.transformers_backend import eos_token_ids, generate_transformers
    from trl_ext.rewards import countdown_reward_components
    from trl_ext.static_cache import sample_static_cache
    from trl_ext.tasks import compact_prompt

    was_training = model.training
    model.eval()
    prompts = [compact_prompt(p["nums"], p["target"]) for p in problems]
    eos = eos_token_ids(model, tokenizer)
    with torch.random.fork_rng(devices=[]):
        if static_cache:
            torch.manual_seed(RESPONSE_SAMPLING_SEED * 1_000_003)  # the seed of generate_transformers' first call
            ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
            out = sample_static_cache(model, ids, max_new_tokens, eos, tokenizer.pad_token_id, with_entropies=True)
        else:
            samples = generate_transformers(
                model, tokenizer, prompts, n=1, max_new_tokens=max_new_tokens, temperature=1.0,
                seed=RESPONSE_SAMPLING_SEED, batch_size=BATCH_SIZE, stop=(), progress=False,
            )  # fmt: skip
    if static_cache:
        responses = out.token_ids
        entropy = sum(map(sum, out.entropies)) / sum(map(len, out.entropies))
    else:
        responses = []
        for (sample,) in samples:
            ids = sample.token_ids
            end = next((i + 1 for i, t in enumerate(ids) if t in eos), len(ids))
            responses.append(ids[:end])
        entropy = response_entropy(model, tokenizer, prompts, responses)
    correct = [
        countdown_reward_components(
            tokenizer.decode(r, skip_special_tokens=True), {"nums": p["nums"], "target": p["target"]},
            require_all=True,
        )["answer_reward"] == 1.0
        for p, r in zip(problems, responses, strict=True)
    ]  # fmt: skip
    model.train(was_training)
    return _stats([len(r) for r in responses], correct, entropy)


def _stats(lengths: list[int], correct: list, entropy: float) -> dict:
    """`response_stats`' numbers from each response's length (tokens through EOS) and correctness."""
    right = [n for n, c in zip(lengths, correct, strict=True) if c]
    wrong = [n for n, c in zip(lengths, correct, strict=True) if not c]
    return {
        "entropy": entropy,
        "mean_length": sum(lengths) / len(lengths),
        "accuracy": sum(map(bool, correct)) / len(correct),
        "correct_length": sum(right) / len(right) if right else None,
        "incorrect_length": sum(wrong) / len(wrong) if wrong else None,
    }


def response_entropy(model, tokenizer, prompts: list[str], responses: list[list[int]]) -> float:
    """Token-mean entropy of the next-token distributions that predict `responses` given `prompts`.

    One batched forward: prompts left-padded, responses right-padded, positions counted over real tokens only (as
    `generate` counts them), so each row sees what it saw unpadded.

    Args:
        prompts: `(B,)` prompt strings.
        responses: `(B,)` response token ids (each non-empty).

    Returns:
        `sum_{b,t} H_bt m_bt / sum_{b,t} m_bt` over the response tokens, in nats.
    """
    import torch

    from trl_ext.objectives import compute_entropy

    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    width = max(len(r) for r in responses)
    pad = tokenizer.pad_token_id
    completion = torch.tensor([r + [pad] * (width - len(r)) for r in responses])  # (B, T)
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in responses])  # (B, T)
    input_ids = torch.cat([enc["input_ids"], completion], dim=1)  # (B, P + T)
    attention = torch.cat([enc["attention_mask"], mask], dim=1)
    positions = (attention.cumsum(dim=1) - 1).clamp(min=0)
    prompt_len = enc["input_ids"].shape[1]
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention, position_ids=positions).logits
    entropy = compute_entropy(logits[:, prompt_len - 1 : prompt_len - 1 + width])  # (B, T)
    return float((entropy * mask).sum() / mask.sum())
