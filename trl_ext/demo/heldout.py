"""Held-out scoring of a demo model through `trl_ext.evaluation`: greedy and sampled accuracy, pass@k, and the
per-problem results the paired tests need."""

from __future__ import annotations

import functools
import time

# Sampling at evaluation uses its own fixed seed: two runs differ only through their models.
EVAL_SAMPLING_SEED = 4321
# Sequences per `generate` call: the whole held-out set at once is fastest for a model this small.
BATCH_SIZE = 512


def evaluate(model, tokenizer, problems: list[dict], num_samples: int, max_new_tokens: int) -> dict:
    """Held-out accuracy with the training reward (`require_all=True`): a completion is correct when its answer
    reward is 1, i.e. the expression uses every number once and equals the target.

    Generation, cutting at EOS, scoring and pass@k are `trl_ext.evaluation.evaluate_model`'s; this
    adds the compact prompts and keeps the per-problem results.

    Returns:
        `greedy_accuracy`, `greedy_reward` (mean training reward: 1 correct, 0.1 tagged but wrong, 0 untagged),
        `greedy_tagged` (share of greedy answers in tags), `greedy_correct` (per problem, 0/1);
        with `num_samples > 0` also `sampled_accuracy` (mean over `num_samples` samples per problem at temperature
        1, no top-k / top-p), `sampled_reward`, `sampled_correct` (per problem, 0..num_samples) and
        `pass@<num_samples>`;
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
        summary, records = evaluate_model(
            model, tokenizer, prompts, truths, n=num_samples, temperature=1.0, seed=EVAL_SAMPLING_SEED,
            ns=(num_samples,), **common,
        )  # fmt: skip
        hits = [int(r["answer_reward"] == 1.0) for r in records]  # problem-major, num_samples per problem
        result["sampled_accuracy"] = summary["accuracy"]
        result["sampled_reward"] = summary["mean_reward"]
        result["sampled_correct"] = [sum(hits[i : i + num_samples]) for i in range(0, len(hits), num_samples)]
        result[f"pass@{num_samples}"] = summary["pass_at_n"][str(num_samples)]
    result["seconds"] = time.perf_counter() - started
    model.train(was_training)
    return result
