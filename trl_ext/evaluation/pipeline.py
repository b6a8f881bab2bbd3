"""Evaluation runs: problems -> prompts -> samples -> scored records -> summaries, in memory or written to files.

`evaluate_model` is the in-memory path for a model already loaded (transformers backend, no files), for callers
such as a training loop or the demo; `evaluate` runs an `EvalConfig` end to end, picks the backend and writes
`generations.jsonl`, `summary.json` and `pass_at_n.png` per budget; `evaluate_pair` runs it for two models on the same
problems with the same sampling and compares them (`trl_ext.evaluation.compare`).
"""

from __future__ import annotations

import gc
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from trl_ext.evaluation.backend import choose_backend
from trl_ext.evaluation.compare import compare_runs
from trl_ext.evaluation.config import STOP, EvalConfig, check_model_name
from trl_ext.evaluation.samples import Sample, cut_samples
from trl_ext.evaluation.scoring import ground_truth_of, reward_name_for, score_samples
from trl_ext.evaluation.summary import summarize
from trl_ext.evaluation.transformers_backend import eos_token_ids, generate_transformers, load_model_and_tokenizer
from trl_ext.evaluation.vllm_backend import generate_vllm


def resolve_backend(backend: str) -> str:
    """`auto` -> `vllm` where vLLM can run here (its GPU build with CUDA, its CPU build without), else
    `transformers` (`trl_ext.evaluation.backend.choose_backend` without its reason)."""
    return choose_backend(backend)[0]


def load_problems(cfg: EvalConfig) -> tuple[list[str] | list[list[dict]], list[dict]]:
    """Task rows and their prompts (strings, or chat messages when `cfg.chat`); raises before any model loads.

    A split of `auto` (a recipe's Countdown default) is resolved as the recipe resolves it, and `cfg.split` is set to
    the split read, so `summary.json` records it.
    """
    from trl_ext.tasks import AUTO, choose_splits, load_task

    if cfg.split == AUTO:
        cfg.split = choose_splits(cfg.task, cfg.data_file, AUTO, AUTO).eval
    dataset = load_task(
        cfg.task, source=cfg.data_file, split=cfg.split, prompt=cfg.prompt, chat=cfg.chat, limit=cfg.limit
    )
    rows = dataset.to_list()
    if not rows:
        raise ValueError(f"no problems to evaluate in {cfg.data_file or cfg.task} (split {cfg.split!r})")
    return [r["prompt"] for r in rows], rows


def render_prompts(prompts: list, tokenizer, chat_template_kwargs: dict | None = None) -> list[str]:
    """Prompt strings; chat messages go through the tokenizer's chat template with the generation prompt and
    `chat_template_kwargs` (as TRL renders them in training and validation)."""
    out = []
    kwargs = chat_template_kwargs or {}
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            out.append(p)
        elif getattr(tokenizer, "chat_template", None):
            out.append(tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True, **kwargs))
        else:
            raise ValueError(f"row {i}: chat prompt given but the tokenizer has no chat template; drop --chat")
    return out


def evaluate_model(
    model,
    tokenizer,
    prompts: list[str],
    ground_truths: list[Any],
    reward,
    *,
    n: int = 1,
    max_new_tokens: int = 1024,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
    batch_size: int = 64,
    stop: tuple[str, ...] = STOP,
    ns: tuple[int, ...] = (1, 4, 8, 16),
    num_examples: int = 3,
    progress: bool = False,
    static_cache: bool = False,
    with_samples: bool = False,
) -> tuple[dict, list[dict]] | tuple[dict, list[dict], list[list[Sample]]]:
    """Samples, scores and summarises `n` completions per prompt with a loaded model; writes nothing.

    The same steps as `evaluate` for one budget: `generate_transformers` -> `cut_samples` (stop string / EOS /
    `max_new_tokens`) -> `score_samples` -> `summarize`. The model is used in the mode it is in (call
    `model.eval()` first for dropout-free sampling); the tokenizer must pad on the left.

    Args:
        model: a causal LM.
        tokenizer: its tokenizer, left padding.
        prompts: `(P,)` prompt strings.
        ground_truths: `(P,)` ground truths for the reward.
        reward: a reward name (`countdown`, `r1_zero`, `question_only`) or a function
            `(response, ground_truth) -> {"reward", "format_reward", "answer_reward"}`.
        n: samples per prompt; temperature 0 is greedy (then use n = 1).
        max_new_tokens: the generation budget.
        temperature, top_p, seed, batch_size, stop: as in `generate_transformers`.
        ns: the N of pass@N / Best@N (N > n skipped).
        num_examples: examples kept per category.
        progress: show the tqdm bar.
        static_cache: sample through `trl_ext.static_cache` instead of `generate` (`generate_transformers`).
        with_samples: also return the samples as generated, `(P, n)` (their token ids, log-probs, entropies).

    Returns:
        `(summary, records)`: the `summarize` dict, and one record per sample (problem-major, `n` per problem)
        with `response`, `reward`, `format_reward`, `answer_reward`, `category`, `mean_logprob`, ... (and the
        samples, with `with_samples`)
    """
    samples = generate_transformers(
        model,
        tokenizer,
        prompts,
        n=n,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        batch_size=batch_size,
        stop=stop,
        progress=progress,
        static_cache=static_cache,
    )
    cuts = cut_samples(samples, tokenizer, (max_new_tokens,), eos_token_ids(model, tokenizer), stop)
    records = score_samples(prompts, ground_truths, cuts, max_new_tokens, reward)
    summary = summarize(records, n, ns, num_examples)
    return (summary, records, samples) if with_samples else (summary, records)


def evaluate(cfg: EvalConfig, model=None, tokenizer=None, progress: bool = True) -> dict:
    """Run an evaluation and write its files.

    Args:
        cfg: the run's settings.
        model, tokenizer: an already loaded model / tokenizer (transformers backend); loaded from `cfg.model`
            otherwise.
        progress: show the tqdm bar and, on stderr, which backend runs and why.

    Returns:
        `{"config": ..., "generation": {...}, "results": {"<max_tokens>": summary}}`, also written to
        `<output_dir>/summary.json`; each budget gets `<output_dir>/L<max_tokens>/` with `generations.jsonl`,
        `summary.json` and `pass_at_n.png` (when there are two N values or more).
    """
    prompts, rows = load_problems(cfg)  # bad data fails here, before the model loads
    reward = reward_name_for(cfg.task, cfg.prompt, cfg.reward)
    backend, why = choose_backend(cfg.backend) if model is None else ("transformers", "a loaded model was given")
    if progress:
        print(f"backend: {backend} ({why})", file=sys.stderr, flush=True)
    out_dir = Path(cfg.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    start = time.perf_counter()
    if backend == "vllm":
        from transformers import AutoTokenizer

        tokenizer = tokenizer or AutoTokenizer.from_pretrained(cfg.model)
        texts = render_prompts(prompts, tokenizer, cfg.chat_template_kwargs)
        samples = generate_vllm(cfg, texts, tokenizer)
        eos = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    else:
        if model is None:
            model, tokenizer = load_model_and_tokenizer(cfg.model, cfg.dtype)
        elif tokenizer is None:
            raise ValueError("evaluate(model=...) needs tokenizer= too")
        texts = render_prompts(prompts, tokenizer, cfg.chat_template_kwargs)
        samples = generate_transformers(
            model,
            tokenizer,
            texts,
            n=cfg.n,
            max_new_tokens=max(cfg.max_tokens),
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            seed=cfg.seed,
            batch_size=cfg.batch_size,
            stop=cfg.stop,
            progress=progress,
            min_new_tokens=cfg.min_tokens,
        )
        eos = eos_token_ids(model, tokenizer)
    seconds = time.perf_counter() - start
    # Tokens actually generated (to EOS / stop / the largest budget): the work the backend did.
    cuts = cut_samples(samples, tokenizer, cfg.max_tokens, eos, cfg.stop)
    generated = sum(c[max(cfg.max_tokens)]["num_tokens"] for per_problem in cuts for c in per_problem)
    generation = {
        "backend": backend,
        "backend_choice": why,
        "seconds": seconds,
        "generated_tokens": generated,
        "tokens_per_second": generated / seconds if seconds > 0 else None,
    }

    ground_truths = [ground_truth_of(cfg.task, row) for row in rows]
    results = {}
    for budget in cfg.max_tokens:
        records = score_samples(texts, ground_truths, cuts, budget, reward)
        summary = summarize(records, cfg.n, cfg.ns, cfg.num_examples)
        summary.update({"max_tokens": budget, "reward_function": reward})
        _write_budget(out_dir / f"L{budget}", records, summary, f"{Path(cfg.model).name} {cfg.task} L{budget}")
        results[str(budget)] = summary

    report = {"config": asdict(cfg), "generation": generation, "results": results}
    (out_dir / "summary.json").write_text(json.dumps(report, indent=2, ensure_ascii=False))
    return report


def evaluate_pair(cfg: EvalConfig, model_b: str, progress: bool = True) -> dict:
    """Evaluate `cfg.model` (A) and `model_b` (B) on the same problems with the same sampling (every `cfg` field but
    the model, the seed included), one after the other, and compare them.

    Writes `<output_dir>/a/` and `<output_dir>/b/` (each what `evaluate` writes) and `<output_dir>/comparison.json`,
    `comparison.jsonl`, `comparison.md` (`trl_ext.evaluation.compare.compare_runs`).

    Returns:
        `{"a": A's report, "b": B's report, "comparison": comparison.json's content}`.

    Raises:
        ValueError: a model name that can be neither a local folder nor a hub id, before anything loads.
    """
    check_model_name(cfg.model, "model")
    check_model_name(model_b, "model_b")
    out = Path(cfg.output_dir)
    cfg_a = replace(cfg, output_dir=str(out / "a"))
    report_a = evaluate(cfg_a, progress=progress)
    # A's transformers model must be gone before B's loads: collect any reference cycle still holding it now, not at
    # some later collection (a vLLM engine shuts itself down when its generation ends).
    gc.collect()
    # From A's settings as run: a split of `auto` is resolved by then, so B reads the same one.
    report_b = evaluate(replace(cfg_a, model=model_b, output_dir=str(out / "b")), progress=progress)
    return {"a": report_a, "b": report_b, "comparison": compare_runs(out / "a", out / "b", out)}


def _write_budget(budget_dir: Path, records: list[dict], summary: dict, title: str) -> None:
    """`generations.jsonl`, `summary.json` and, when there is a pass@N curve (two N values or more),
    `pass_at_n.png` of one budget."""
    budget_dir.mkdir(parents=True, exist_ok=True)
    with open(budget_dir / "generations.jsonl", "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    (budget_dir / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False))
    if len(summary["pass_at_n"]) > 1:  # a single point (n = 1, greedy) is no curve
        from trl_ext.reporting.plot import plot_pass_at_n

        plot_pass_at_n(summary, budget_dir / "pass_at_n.png", title=title)
