"""Held-out scoring of a demo model: greedy and sampled accuracy, pass@k, per-problem results for paired tests."""

from __future__ import annotations

import time

# Sampling at evaluation uses its own fixed seed: two runs differ only through their models.
EVAL_SAMPLING_SEED = 4321


def generate(model, tokenizer, prompts: list[str], max_new_tokens: int, do_sample: bool, batch_size: int = 512):
    """Completions (special tokens stripped, answer tags kept) for `prompts`; sampling is pure temperature 1."""
    import torch

    model.eval()
    sampling = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0) if do_sample else dict(do_sample=False)
    texts = []
    with torch.no_grad():
        for start in range(0, len(prompts), batch_size):
            enc = tokenizer(prompts[start : start + batch_size], return_tensors="pt", padding=True)
            out = model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
                **sampling,
            )  # (B, T_prompt + T_new)
            texts += tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    return texts


def evaluate(model, tokenizer, problems: list[dict], num_samples: int, max_new_tokens: int) -> dict:
    """Held-out accuracy with the training reward: a completion is correct when the reward is 1.0.

    Returns greedy accuracy, the per-problem greedy correctness (for the paired test), the tagged-answer rate,
    and, when `num_samples > 0`, the mean accuracy of `num_samples` samples per problem at temperature 1, the
    per-problem number of correct samples and pass@num_samples.
    """
    import torch

    from trl_ext.rewards import countdown_reward_fn
    from trl_ext.tasks import compact_prompt

    def score(text: str, problem: dict) -> float:
        return countdown_reward_fn(text, {"nums": problem["nums"], "target": problem["target"]}, require_all=True)

    started = time.perf_counter()
    was_training = model.training
    prompts = [compact_prompt(p["nums"], p["target"]) for p in problems]
    greedy = [
        score(t, p) for t, p in zip(generate(model, tokenizer, prompts, max_new_tokens, False), problems, strict=True)
    ]
    result = {
        "greedy_accuracy": sum(r == 1.0 for r in greedy) / len(problems),
        "greedy_tagged": sum(r > 0 for r in greedy) / len(problems),
        "greedy_correct": [int(r == 1.0) for r in greedy],
    }
    if num_samples:
        torch.manual_seed(EVAL_SAMPLING_SEED)
        texts = generate(model, tokenizer, [q for q in prompts for _ in range(num_samples)], max_new_tokens, True)
        hits = [int(score(t, problems[i // num_samples]) == 1.0) for i, t in enumerate(texts)]
        per_problem = [sum(hits[i : i + num_samples]) for i in range(0, len(hits), num_samples)]
        result["sampled_accuracy"] = sum(hits) / len(hits)
        result["sampled_correct"] = per_problem
        result[f"pass@{num_samples}"] = sum(c > 0 for c in per_problem) / len(problems)
    result["examples"] = [
        [prompts[i], text] for i, text in enumerate(generate(model, tokenizer, prompts[:3], max_new_tokens, False))
    ]
    result["seconds"] = time.perf_counter() - started
    model.train(was_training)
    return result
