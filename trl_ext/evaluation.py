"""Zero-shot evaluation: sample n completions per problem, score them with the training rewards, report
accuracy, the seeds' three outcome categories, pass@N and Best@N, for one or several generation budgets.

Pipeline (one function per arrow): task rows (`trl_ext.tasks.load_task`) -> prompt strings (chat template when
`chat`) -> samples with per-token log-probabilities (vLLM on a GPU, else `transformers.generate`) -> cut at the
first `</answer>` / EOS / the budget -> reward components (`trl_ext.rewards`, the same functions training uses)
-> `generations.jsonl` + `summary.json` + `pass_at_n.png` per budget.

How the budgets share samples: autoregressive sampling is prefix-consistent (the first L tokens of a sample drawn
with budget L' > L are distributed exactly as a sample drawn with budget L, same stop rule), so we sample once with
the largest `max_tokens` and cut each sample to every smaller budget, instead of sampling again.

Stop rule, as the seeds' vLLM `SamplingParams(stop=["</answer>"], include_stop_str_in_output=True)`: a response
ends right after the first `</answer>` (kept in the text) or at EOS. The transformers backend passes
`stop_strings=` to `generate` and, as a token may run past the stop string (`"</answer>."`), also cuts the decoded
text after the first `</answer>` itself.

Mean token log-probability (the Best@N score): the mean over the response's generated tokens (stop / EOS token
included) of log p(token | prefix) under the model's raw distribution (temperature 1, no top-p), i.e. what vLLM
returns with its default `logprobs_mode="raw_logprobs"`. The transformers backend records it during generation
from the unprocessed logits, so no second forward pass is needed.

Categories (seed 000): `format1_answer1` (format reward 1 and answer reward 1), `format1_answer0`, `format0`.
Accuracy is the mean answer reward; pass@1 equals it.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import typer

TASK_NAMES = ("countdown", "gsm8k", "math")
REWARD_NAMES = ("countdown", "r1_zero", "question_only")
BACKENDS = ("auto", "transformers", "vllm")
CATEGORIES = ("format1_answer1", "format1_answer0", "format0")
STOP = ("</answer>",)


@dataclass
class EvalConfig:
    """Everything one evaluation run needs; `evaluate(EvalConfig(...))` or `trl-ext eval`.

    Attributes:
        model: hub id or local directory of a causal LM (with its tokenizer).
        task: `countdown`, `gsm8k` or `math`.
        data_file: local `.jsonl` / `.parquet` file; None means the task's Hub dataset.
        split: Hub split (or a slice of the local file, `"test[:100]"`).
        prompt: prompt name (`r1_zero`, `question_only`, `countdown`, `intellect`, ...); None: the task's default.
        chat: wrap the prompt in the tokenizer's chat template (instruct models); the seeds use plain text.
        max_tokens: one or several generation budgets (new tokens).
        temperature, top_p: sampling; temperature 0 means greedy.
        n: samples per problem.
        seed: sampling seed.
        limit: evaluate the first `limit` problems.
        output_dir: where the results go (one `L<max_tokens>/` folder per budget).
        backend: `auto` (vLLM when installed and a GPU is present, else transformers), `vllm`, `transformers`.
        batch_size: sequences per `generate` call (transformers backend).
        dtype: model dtype for the transformers backend (`float32`, `bfloat16`).
        reward: `countdown`, `r1_zero`, `question_only`; None: from the task and prompt.
        ns: the N values of pass@N / Best@N (those above n are skipped).
        num_examples: examples kept per category in `summary.json`.
        stop: stop strings.
    """

    model: str
    task: str = "gsm8k"
    data_file: str | None = None
    split: str = "test"
    prompt: str | None = None
    chat: bool = False
    max_tokens: tuple[int, ...] = (1024,)
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    seed: int = 0
    limit: int | None = None
    output_dir: str = "eval_results"
    backend: str = "auto"
    batch_size: int = 64
    dtype: str = "float32"
    reward: str | None = None
    ns: tuple[int, ...] = (1, 4, 8, 16)
    num_examples: int = 3
    stop: tuple[str, ...] = field(default=STOP)

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, int | str):
            self.max_tokens = parse_int_list(str(self.max_tokens), "max_tokens")
        self.max_tokens = tuple(sorted(set(int(m) for m in self.max_tokens)))
        self.ns = tuple(sorted(set(int(k) for k in self.ns)))
        self.stop = tuple(self.stop)
        if self.task not in TASK_NAMES:
            raise ValueError(f"task: unknown task {self.task!r}; valid: {', '.join(TASK_NAMES)}")
        if not self.max_tokens or min(self.max_tokens) < 1:
            raise ValueError(f"max_tokens: every budget must be >= 1, got {self.max_tokens}")
        if self.n < 1:
            raise ValueError(f"n: samples per problem must be >= 1, got {self.n}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend: unknown backend {self.backend!r}; valid: {', '.join(BACKENDS)}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.reward is not None and self.reward not in REWARD_NAMES:
            raise ValueError(f"reward: unknown reward {self.reward!r}; valid: {', '.join(REWARD_NAMES)}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be >= 1, got {self.limit}")
        if self.data_file is not None and not Path(self.data_file).is_file():
            raise FileNotFoundError(f"data_file: no such file {self.data_file}")
        if self.n > 1 and self.temperature == 0:
            raise ValueError("n > 1 with temperature 0 (greedy) gives n identical samples; set a temperature")


def parse_int_list(text: str, name: str) -> tuple[int, ...]:
    """`"256,512,1024"` -> `(256, 512, 1024)`; a clear error naming `name` otherwise."""
    try:
        values = tuple(int(part) for part in str(text).replace(" ", "").split(",") if part)
    except ValueError:
        raise ValueError(f"{name}: expected comma-separated integers like '256,512,1024', got {text!r}") from None
    if not values:
        raise ValueError(f"{name}: no value given")
    return values


def reward_name_for(task: str, prompt: str | None, reward: str | None = None) -> str:
    """The reward that scores `task` with `prompt`: Countdown's for Countdown; for GSM8K / MATH `r1_zero` (answer in
    `<answer>` tags) with the `r1_zero` prompt and `question_only` (last `\\boxed{}`) with the others."""
    if reward is not None:
        return reward
    if task == "countdown":
        return "countdown"
    return "r1_zero" if prompt in (None, "r1_zero") else "question_only"


def score_response(reward: str, response: str, ground_truth: Any) -> dict[str, float]:
    """Reward components `{"reward", "format_reward", "answer_reward"}` of one response."""
    from trl_ext import rewards

    if reward == "countdown":
        return dict(rewards.countdown_reward_components(response, ground_truth))
    if reward == "r1_zero":
        return dict(rewards.r1_zero_reward_fn(response, ground_truth))
    return dict(rewards.question_only_reward_fn(response, ground_truth))


def category(components: dict[str, float]) -> str:
    """The seeds' outcome category of one scored response."""
    if components["format_reward"] < 1:
        return "format0"
    return "format1_answer1" if components["answer_reward"] >= 1 else "format1_answer0"


def ground_truth_of(task: str, row: dict) -> Any:
    """The reward's ground truth for a task row: `{"numbers", "target"}` for Countdown, else the answer string."""
    if task == "countdown":
        return {"numbers": list(row["nums"]), "target": int(row["target"])}
    return row["ground_truth"]


@dataclass
class Sample:
    """One generated continuation before cutting: `token_ids (T,)`, `logprobs (T,)` (raw model log-probs)."""

    token_ids: list[int]
    logprobs: list[float]


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
        for s in stop:  # a token may overhang the stop string; the seeds' vLLM output ends at it
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


def resolve_backend(backend: str) -> str:
    """`auto` -> `vllm` when vLLM is installed and CUDA is available, else `transformers`."""
    if backend != "auto":
        return backend
    import importlib.util

    import torch

    return "vllm" if importlib.util.find_spec("vllm") is not None and torch.cuda.is_available() else "transformers"


def vllm_sampling_kwargs(cfg: EvalConfig) -> dict[str, Any]:
    """The `vllm.SamplingParams(**kwargs)` the vLLM backend builds (pure, testable without vLLM).

    As the seeds: stop at `</answer>` with the stop string kept in the output. `logprobs=0` returns the sampled
    token's log-prob at each position (vLLM's default `raw_logprobs` mode: before temperature / top-p).
    """
    return {
        "n": cfg.n,
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "max_tokens": max(cfg.max_tokens),
        "seed": cfg.seed,
        "stop": list(cfg.stop),
        "include_stop_str_in_output": True,
        "logprobs": 0,
    }


def vllm_engine_kwargs(cfg: EvalConfig) -> dict[str, Any]:
    """The `vllm.LLM(**kwargs)` the vLLM backend builds (pure). The float32 default is the CPU backend's; on a GPU
    vLLM picks the checkpoint's dtype (`auto`) unless another dtype was asked for."""
    return {"model": cfg.model, "seed": cfg.seed, "dtype": "auto" if cfg.dtype == "float32" else cfg.dtype}


def generate_vllm(cfg: EvalConfig, prompts: list[str]) -> list[list[Sample]]:
    """Samples `(P, n)` with vLLM (GPU). vllm is imported here only."""
    from vllm import LLM, SamplingParams

    llm = LLM(**vllm_engine_kwargs(cfg))
    outputs = llm.generate(prompts, SamplingParams(**vllm_sampling_kwargs(cfg)))
    result = []
    for request in outputs:
        samples = []
        for completion in request.outputs:
            ids = list(completion.token_ids)
            lps = [float(pos[tok].logprob) for tok, pos in zip(ids, completion.logprobs or [], strict=False)]
            samples.append(Sample(token_ids=ids, logprobs=lps))
        result.append(samples)
    return result


class _RawLogProbRecorder:
    """Logits processor placed before the sampling warpers: it keeps log_softmax of the raw logits `(B, V)` of the
    current step and, at the next step (when the chosen token is the last input id), stores its log-prob."""

    def __init__(self) -> None:
        self.previous = None
        self.steps: list = []  # each (B,) log-probs of the tokens chosen at one step

    def __call__(self, input_ids, scores):
        import torch

        if self.previous is not None:
            self.steps.append(self.previous.gather(1, input_ids[:, -1:]).squeeze(1))
        self.previous = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def finish(self, last_tokens):
        """Log-probs `(B, T)` of all generated tokens; `last_tokens (B,)` are the final step's choices."""
        import torch

        if self.previous is not None:
            self.steps.append(self.previous.gather(1, last_tokens[:, None]).squeeze(1))
            self.previous = None
        return torch.stack(self.steps, dim=1) if self.steps else torch.zeros(len(last_tokens), 0)


def load_model_and_tokenizer(model_name: str, dtype: str = "float32", device: str | None = None):
    """A causal LM in eval mode and its tokenizer with LEFT padding (a pad token falls back to EOS)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_name, padding_side="left")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = AutoModelForCausalLM.from_pretrained(model_name, dtype=getattr(torch, dtype)).to(device).eval()
    return model, tokenizer


def eos_token_ids(model, tokenizer) -> set[int]:
    """EOS ids of the tokenizer and of the model's generation config (chat models often have several)."""
    ids = set()
    for value in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif value:
            ids.update(int(v) for v in value)
    return ids


def generate_transformers(
    model,
    tokenizer,
    prompts: list[str],
    n: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
    batch_size: int = 64,
    stop: tuple[str, ...] = STOP,
    progress: bool = True,
    min_new_tokens: int = 0,
) -> list[list[Sample]]:
    """Samples `(P, n)` with `model.generate`: `batch_size // n` prompts (at least one) per call, left-padded, each
    prompt's prefill computed once and its KV cache repeated for the n samples, with raw per-token log-probs.

    Only the sampling we ask for is applied (a fresh `GenerationConfig`: no top-k, no repetition penalty from the
    model's defaults), so temperature 1 / top-p 1 samples the model's own distribution as vLLM does.
    `min_new_tokens` (EOS suppressed before it) is for fixed-length benchmarks.
    """
    import torch
    from tqdm.auto import tqdm
    from transformers import GenerationConfig, LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper

    eos = sorted(eos_token_ids(model, tokenizer))
    greedy = temperature == 0
    gen_config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        min_new_tokens=min_new_tokens,
        do_sample=not greedy,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        eos_token_id=eos,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=getattr(tokenizer, "bos_token_id", None),
        stop_strings=list(stop) or None,
    )
    result: list[list[Sample]] = [[None] * n for _ in prompts]  # type: ignore[list-item]
    device = next(model.parameters()).device
    per_batch = max(1, batch_size // n)  # whole groups: a prompt's n samples share one prefill
    batches = range(0, len(prompts), per_batch)
    desc = f"generate ({len(prompts)} prompts x {n})"
    for b, start in enumerate(tqdm(batches, desc=desc, disable=not progress)):
        chunk = list(range(start, min(start + per_batch, len(prompts))))
        enc = tokenizer([prompts[p] for p in chunk], return_tensors="pt", padding=True, add_special_tokens=False)
        ids, mask = enc["input_ids"].to(device), enc["attention_mask"].to(device)
        cache = _shared_prefill(model, ids, mask, n)
        recorder = _RawLogProbRecorder()
        # The recorder sees the logits before our warpers; TRL / vLLM apply temperature then top-p, so do we.
        processors = [recorder]
        if not greedy and temperature != 1.0:
            processors.append(TemperatureLogitsWarper(temperature))
        if not greedy and top_p < 1.0:
            processors.append(TopPLogitsWarper(top_p))
        torch.manual_seed(seed * 1_000_003 + b)
        with torch.no_grad():
            out = model.generate(
                input_ids=ids.repeat_interleave(n, dim=0),
                attention_mask=mask.repeat_interleave(n, dim=0),
                past_key_values=cache,
                generation_config=gen_config,
                logits_processor=LogitsProcessorList(processors),
                tokenizer=tokenizer,
            )
        new = out[:, ids.shape[1] :]
        logprobs = recorder.finish(new[:, -1]) if new.shape[1] else torch.zeros(len(out), 0)
        for row in range(len(out)):
            p, j = chunk[row // n], row % n
            result[p][j] = Sample(token_ids=new[row].tolist(), logprobs=logprobs[row, : new.shape[1]].tolist())
    return result


def _shared_prefill(model, ids, mask, n: int):
    """KV cache of all prompt tokens but the last `(B * n, ...)`, computed once per prompt and repeated n times.

    `generate` then feeds only each prompt's last token, so n samples of a prompt pay for one prefill instead of n.
    Positions follow the left padding as `generate` computes them (cumulative sum of the attention mask).
    Returns None (plain `generate`) for n == 1 or one-token prompts.
    """
    import torch

    if n == 1 or ids.shape[1] < 2:
        return None
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        out = model(
            input_ids=ids[:, :-1],
            attention_mask=mask[:, :-1],
            position_ids=positions[:, :-1],
            use_cache=True,
            logits_to_keep=1,  # only the cache is needed; full (B, T, V) logits would cost memory and time
        )
    cache = out.past_key_values
    cache.batch_repeat_interleave(n)
    return cache


def summarize(records: list[dict], n: int, ns: tuple[int, ...] = (1, 4, 8, 16), num_examples: int = 3) -> dict:
    """Summary of one budget's scored records (one per sample, problem-major, `n` per problem).

    Returns:
        accuracy (mean answer reward), mean_reward, format_rate, the three categories with count / fraction /
        examples, pass_at_n and best_at_n (`{N: value}` for N <= n), mean response tokens, finish reasons.
    """
    from trl_ext.passk import best_at_n_curve, pass_at_n_curve

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


def load_problems(cfg: EvalConfig) -> tuple[list[str] | list[list[dict]], list[dict]]:
    """Task rows and their prompts (strings, or chat messages when `cfg.chat`); raises before any model loads."""
    from trl_ext.tasks import load_task

    dataset = load_task(
        cfg.task, source=cfg.data_file, split=cfg.split, prompt=cfg.prompt, chat=cfg.chat, limit=cfg.limit
    )
    rows = dataset.to_list()
    if not rows:
        raise ValueError(f"no problems to evaluate in {cfg.data_file or cfg.task} (split {cfg.split!r})")
    return [r["prompt"] for r in rows], rows


def render_prompts(prompts: list, tokenizer) -> list[str]:
    """Prompt strings; chat messages go through the tokenizer's chat template with the generation prompt."""
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            out.append(p)
        elif getattr(tokenizer, "chat_template", None):
            out.append(tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True))
        else:
            raise ValueError(f"row {i}: chat prompt given but the tokenizer has no chat template; drop --chat")
    return out


def evaluate(cfg: EvalConfig, model=None, tokenizer=None, progress: bool = True) -> dict:
    """Run an evaluation and write its files.

    Args:
        cfg: the run's settings.
        model, tokenizer: an already loaded model / tokenizer (transformers backend); loaded from `cfg.model`
            otherwise.
        progress: show the tqdm bar.

    Returns:
        `{"config": ..., "generation": {...}, "results": {"<max_tokens>": summary}}`, also written to
        `<output_dir>/summary.json`; each budget gets `<output_dir>/L<max_tokens>/` with `generations.jsonl`,
        `summary.json` and `pass_at_n.png`.
    """
    prompts, rows = load_problems(cfg)  # bad data fails here, before the model loads
    reward = reward_name_for(cfg.task, cfg.prompt, cfg.reward)
    backend = resolve_backend(cfg.backend) if model is None else "transformers"
    out_dir = Path(cfg.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    start = time.perf_counter()
    if backend == "vllm":
        from transformers import AutoTokenizer

        tokenizer = tokenizer or AutoTokenizer.from_pretrained(cfg.model)
        texts = render_prompts(prompts, tokenizer)
        samples = generate_vllm(cfg, texts)
        eos = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    else:
        if model is None:
            model, tokenizer = load_model_and_tokenizer(cfg.model, cfg.dtype)
        elif tokenizer is None:
            raise ValueError("evaluate(model=...) needs tokenizer= too")
        texts = render_prompts(prompts, tokenizer)
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
        )
        eos = eos_token_ids(model, tokenizer)
    seconds = time.perf_counter() - start
    # Tokens actually generated (to EOS / stop / the largest budget): the work the backend did.
    cuts = [[cut_sample(s, tokenizer, cfg.max_tokens, eos, cfg.stop) for s in per_problem] for per_problem in samples]
    generated = sum(c[max(cfg.max_tokens)]["num_tokens"] for per_problem in cuts for c in per_problem)
    generation = {
        "backend": backend,
        "seconds": seconds,
        "generated_tokens": generated,
        "tokens_per_second": generated / seconds if seconds > 0 else None,
    }

    results = {}
    for budget in cfg.max_tokens:
        records = []
        for p, (row, text) in enumerate(zip(rows, texts, strict=True)):
            gt = ground_truth_of(cfg.task, row)
            for j, cut in enumerate(cuts[p]):
                c = cut[budget]
                comps = score_response(reward, c["response"], gt)
                records.append(
                    {
                        "problem_index": p,
                        "sample_index": j,
                        "max_tokens": budget,
                        "prompt": text,
                        "response": c["response"],
                        "ground_truth": gt,
                        "reward": comps["reward"],
                        "format_reward": comps["format_reward"],
                        "answer_reward": comps["answer_reward"],
                        "category": category(comps),
                        "mean_logprob": c["mean_logprob"],
                        "num_tokens": c["num_tokens"],
                        "finish_reason": c["finish_reason"],
                    }
                )
        summary = summarize(records, cfg.n, cfg.ns, cfg.num_examples)
        summary.update({"max_tokens": budget, "reward_function": reward})
        budget_dir = out_dir / f"L{budget}"
        budget_dir.mkdir(parents=True, exist_ok=True)
        with open(budget_dir / "generations.jsonl", "w", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        (budget_dir / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False))
        if summary["pass_at_n"]:
            from trl_ext.plotting import plot_pass_at_n

            plot_pass_at_n(summary, budget_dir / "pass_at_n.png", title=f"{Path(cfg.model).name} {cfg.task} L{budget}")
        results[str(budget)] = summary

    report = {"config": asdict(cfg), "generation": generation, "results": results}
    (out_dir / "summary.json").write_text(json.dumps(report, indent=2, ensure_ascii=False))
    return report


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
        lines.append(
            f"{gen['backend']}: {gen['generated_tokens']} tokens in {gen['seconds']:.1f}s "
            f"({gen['tokens_per_second']:.1f} tokens/s)"
        )
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    """Add `trl-ext eval` to the CLI."""

    @app.command("eval")
    def eval_command(
        model: str = typer.Argument(..., help="Hub id or local directory of the model."),
        task: str = typer.Option("gsm8k", help=f"One of {', '.join(TASK_NAMES)}."),
        split: str = typer.Option("test", help="Hub split, or a slice of --data-file ('test[:100]')."),
        data_file: str | None = typer.Option(None, help="Local .jsonl / .parquet instead of the Hub dataset."),
        prompt: str | None = typer.Option(
            None, help="r1_zero, question_only, countdown, intellect (default: the task's)."
        ),
        chat: bool = typer.Option(False, help="Wrap prompts in the tokenizer's chat template (instruct models)."),
        max_tokens: str = typer.Option("1024", help="One or several budgets: '256,512,1024'."),
        temperature: float = typer.Option(1.0, help="Sampling temperature (0 = greedy)."),
        top_p: float = typer.Option(1.0, help="Nucleus sampling mass."),
        n: int = typer.Option(1, help="Samples per problem (pass@N / Best@N use N <= n)."),
        seed: int = typer.Option(0, help="Sampling seed."),
        limit: int | None = typer.Option(None, help="Evaluate the first LIMIT problems."),
        output_dir: str = typer.Option("eval_results", help="Output folder."),
        backend: str = typer.Option("auto", help="auto, transformers, vllm."),
        batch_size: int = typer.Option(64, help="Sequences per generate call (transformers backend)."),
        dtype: str = typer.Option("float32", help="Model dtype (transformers backend)."),
        reward: str | None = typer.Option(None, help="countdown, r1_zero, question_only (default: from task/prompt)."),
        ns: str = typer.Option("1,4,8,16", help="N values of pass@N / Best@N."),
    ) -> None:
        """Zero-shot evaluation: accuracy, outcome categories, pass@N and Best@N per token budget."""
        try:
            cfg = EvalConfig(
                model=model,
                task=task,
                data_file=data_file,
                split=split,
                prompt=prompt,
                chat=chat,
                max_tokens=parse_int_list(max_tokens, "--max-tokens"),
                temperature=temperature,
                top_p=top_p,
                n=n,
                seed=seed,
                limit=limit,
                output_dir=output_dir,
                backend=backend,
                batch_size=batch_size,
                dtype=dtype,
                reward=reward,
                ns=parse_int_list(ns, "--ns"),
            )
        except (ValueError, FileNotFoundError) as err:
            raise typer.BadParameter(str(err)) from None
        report = evaluate(cfg)
        typer.echo(format_report(report))
        typer.echo(f"wrote {Path(output_dir) / 'summary.json'}")
