"""Summaries of scored records: accuracy, outcome categories, pass@N and Best@N; the one-line-per-budget report."""

from __future__ import annotations

from trl_ext.evaluation.passk import best_at_n_curve, pass_at_n_curve
from trl_ext.evaluation.scoring import CATEGORIES


def summarize(records: list[dict], n: int, ns: tuple[int, ...] = (1, 4, 8, 16), num_examples: int = 3) -> dict:
    """Summary of one budget's scored records (one per sample, problem-major, `n` per problem).

    Returns:
        accuracy (mean answer reward), mean_reward, format_rate, the three categories with count / fraction /
        examples, pass_at_n and best_at_n (`{N: value}` for N <= n), mean response tokens, finish reasons.
    """
    if not records or len(records) % n:
        raise ValueError(f"{len(records)} records is not a positive multiple of n={n}")
    total = len(records)
    cats: dict[str, dict] = {c: {"count": 0, "fraction": 0.0, "examples": []} for c in CATEGORIES}
    finish: dict[str, int] = {}
    for r in records:
        entry = cats[r["category"]]
        entry["count"] += 1
        if len(entry["examples"]) < num_examples:
            entry["examples"].append({k: r[k] for k in ("problem_index", "prompt", "response", "ground_truth")})
        finish[r["finish_reason"]] = finish.get(r["finish_reason"], 0) + 1
    for entry in cats.values():
        entry["fraction"] = entry["count"] / total
    correct = [[r["answer_reward"] for r in records[i : i + n]] for i in range(0, total, n)]
    scores = [[r["mean_logprob"] for r in records[i : i + n]] for i in range(0, total, n)]
    return {
        "num_problems": total // n,
        "n": n,
        "num_samples": total,
        "accuracy": sum(r["answer_reward"] for r in records) / total,
        "mean_reward": sum(r["reward"] for r in records) / total,
        "format_rate": sum(r["format_reward"] for r in records) / total,
        "categories": cats,
        "pass_at_n": {str(k): v for k, v in pass_at_n_curve(correct, ns).items()},
        "best_at_n": {str(k): v for k, v in best_at_n_curve(scores, correct, ns).items()},
        "mean_response_tokens": sum(r["num_tokens"] for r in records) / total,
        "finish_reasons": finish,
    }


def format_report(report: dict) -> str:
    """A few lines per budget: accuracy, categories, pass@N, Best@N."""
    lines = []
    for budget, s in report["results"].items():
        cats = ", ".join(f"{c}={s['categories'][c]['count']}" for c in CATEGORIES)
        pass_n = " ".join(f"@{k}={v:.3f}" for k, v in s["pass_at_n"].items())
        best_n = " ".join(f"@{k}={v:.3f}" for k, v in s["best_at_n"].items())
        lines.append(
            f"L{budget}: accuracy={s['accuracy']:.4f} mean_reward={s['mean_reward']:.4f} "
            f"({cats}; {s['num_samples']} samples) pass{pass_n} best{best_n}"
        )
    gen = report["generation"]
    if gen.get("tokens_per_second"):
        why = f" ({gen['backend_choice']})" if gen.get("backend_choice") else ""
        lines.append(
            f"{gen['backend']}{why}: {gen['generated_tokens']} tokens in {gen['seconds']:.1f}s "
            f"({gen['tokens_per_second']:.1f} tokens/s)"
        )
    return "\n".join(lines)
