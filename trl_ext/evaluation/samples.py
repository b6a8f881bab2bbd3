"""A generated sample (token ids, raw log-probs) and its cut at the first stop string / EOS / each budget."""

from __future__ import annotations

from dataclasses import dataclass

from trl_ext.evaluation.config import STOP


@dataclass
class Sample:
    """One generated continuation before cutting: `token_ids (T,)`, `logprobs (T,)` (raw model log-probs) and, where
    the sampler computes them (`trl_ext.static_cache`), `entropies (T,)` of the raw next-token distributions."""

    token_ids: list[int]
    logprobs: list[float]
    entropies: list[float] | None = None


def _first_stop_index(tokenizer, token_ids: list[int], stop: tuple[str, ...]) -> int | None:
    """Smallest t such that decode(token_ids[: t + 1]) contains a stop string (binary search: containment is
    monotone in the prefix length), or None."""
    if not stop or not token_ids:
        return None

    def hit(t: int) -> bool:
        text = tokenizer.decode(token_ids[: t + 1], skip_special_tokens=False)
        return any(s in text for s in stop)

    if not hit(len(token_ids) - 1):
        return None
    lo, hi = 0, len(token_ids) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if hit(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def cut_sample(
    sample: Sample, tokenizer, max_tokens: tuple[int, ...], eos_ids: set[int], stop: tuple[str, ...] = STOP
) -> dict[int, dict]:
    """Cut one sample to each budget in `max_tokens`.

    Returns:
        `{L: {"response", "num_tokens", "mean_logprob", "finish_reason"}}`, finish_reason in `stop` (a stop
        string), `eos`, `length` (the budget ran out).
    """
    ids = list(sample.token_ids)
    eos_at = next((i for i, t in enumerate(ids) if t in eos_ids), None)
    end, reason = len(ids), "length"
    if eos_at is not None:
        end, reason = eos_at + 1, "eos"
    stop_at = _first_stop_index(tokenizer, ids[:end], stop)
    if stop_at is not None:
        end, reason = stop_at + 1, "stop"
    out = {}
    for budget in max_tokens:
        n_tok = min(end, budget)
        text = tokenizer.decode(ids[:n_tok], skip_special_tokens=True)
        for s in stop:  # a token may overhang the stop string; the courses' vLLM output ends at it
            if s in text:
                text = text[: text.index(s) + len(s)]
        lps = sample.logprobs[:n_tok]
        out[budget] = {
            "response": text,
            "num_tokens": n_tok,
            "mean_logprob": sum(lps) / len(lps) if lps else 0.0,
            "finish_reason": reason if end <= budget else "length",
        }
    return out


def cut_samples(
    samples: list[list[Sample]],
    tokenizer,
    max_tokens: tuple[int, ...],
    eos_ids: set[int],
    stop: tuple[str, ...] = STOP,
) -> list[list[dict[int, dict]]]:
    """`cut_sample` over `(P, n)` samples; returns `(P, n)` dicts `{budget: cut}`."""
    return [[cut_sample(s, tokenizer, max_tokens, eos_ids, stop) for s in per_problem] for per_problem in samples]
