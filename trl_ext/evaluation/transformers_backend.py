"""The transformers generation backend: `model.generate` with one shared prefill per prompt and raw log-probs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from trl_ext.evaluation.config import STOP
from trl_ext.evaluation.samples import Sample


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


@contextmanager
def checkpoint_sampling_off(model) -> Iterator[None]:
    """While inside, `model.generate` samples only what it is given: the fields a call leaves unset come from
    transformers' global defaults, not from the checkpoint's `generation_config.json`.

    transformers 5 fills every unset field of the `GenerationConfig` a call passes from `model.generation_config`
    (`GenerationMixin._prepare_generation_config`: `update(**self.generation_config.to_dict(), defaults_only=True)`),
    and Qwen2.5 Instruct checkpoints ship their own repetition penalty, top-k, top-p and temperature, so an
    evaluation that names temperature 1 / top-p 1 would sample something else. The token ids (EOS, pad, BOS) stay.
    """
    from transformers import GenerationConfig

    saved = model.generation_config
    model.generation_config = GenerationConfig(
        eos_token_id=saved.eos_token_id, pad_token_id=saved.pad_token_id, bos_token_id=saved.bos_token_id
    )
    try:
        yield
    finally:
        model.generation_config = saved


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
    static_cache: bool = False,
) -> list[list[Sample]]:
    """Samples `(P, n)` with `model.generate`: `batch_size // n` prompts (at least one) per call, left-padded, each
    prompt's prefill computed once and its KV cache repeated for the n samples, with raw per-token log-probs.

    `static_cache`: sample each call with `trl_ext.static_cache.sample_static_cache` instead of `generate` (the same
    sampling at a fraction of the CPU for a small Llama-style model; same seeds per call). It stops at EOS or the
    budget only: a stop string is cut afterwards, as it is from `generate`'s output (no `min_new_tokens`).

    Only the sampling we ask for is applied (`checkpoint_sampling_off`: no top-k, repetition penalty or temperature
    from the checkpoint's generation config), so temperature 1 / top-p 1 samples the model's own distribution as
    vLLM does.
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
    if static_cache and min_new_tokens:
        raise ValueError("min_new_tokens needs generate (static_cache=False)")
    for b, start in enumerate(tqdm(batches, desc=desc, disable=not progress)):
        chunk = list(range(start, min(start + per_batch, len(prompts))))
        if static_cache:
            torch.manual_seed(seed * 1_000_003 + b)
            _sample_static_cache(model, tokenizer, prompts, chunk, n, max_new_tokens, eos, temperature, top_p, result)
            continue
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
        with torch.no_grad(), checkpoint_sampling_off(model):
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


def _sample_static_cache(model, tokenizer, prompts, chunk, n, max_new_tokens, eos, temperature, top_p, result):
    """One call of `generate_transformers` through `sample_static_cache`: `n` rows per prompt of `chunk` (one prefill
    each), written into `result[prompt][j]`."""
    import torch

    from trl_ext.static_cache import sample_static_cache

    ids = [tokenizer(prompts[p], add_special_tokens=False)["input_ids"] for p in chunk]
    with torch.no_grad(), checkpoint_sampling_off(model):
        out = sample_static_cache(
            model, [i for i in ids for _ in range(n)], max_new_tokens, eos, tokenizer.pad_token_id,
            temperature=temperature, top_p=top_p, with_logprobs=True, with_entropies=True,
        )  # fmt: skip
    for row, (tokens, logprobs, entropies) in enumerate(zip(out.token_ids, out.logprobs, out.entropies, strict=True)):
        result[chunk[row // n]][row % n] = Sample(token_ids=tokens, logprobs=logprobs, entropies=entropies)


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
