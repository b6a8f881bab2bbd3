"""`EvalConfig`: the settings of one evaluation run, checked before anything loads."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

TASK_NAMES = ("countdown", "gsm8k", "math")
REWARD_NAMES = ("countdown", "countdown_single_equation", "countdown_binary", "r1_zero", "question_only")
BACKENDS = ("auto", "transformers", "vllm")
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
        chat: wrap the prompt in the tokenizer's chat template (instruct models); the courses use plain text.
        max_tokens: one or several generation budgets (new tokens).
        temperature, top_p: sampling; temperature 0 means greedy.
        n: samples per problem.
        seed: sampling seed.
        limit: evaluate the first `limit` problems.
        output_dir: where the results go (one `L<max_tokens>/` folder per budget).
        backend: `auto` (vLLM where it can run: its GPU build with CUDA, its CPU build without; else transformers;
            `trl_ext.evaluation.backend`), `vllm`, `transformers`.
        batch_size: sequences per `generate` call (transformers backend).
        dtype: model dtype (`float32`, `bfloat16`) of the transformers backend and of vLLM's CPU build; for vLLM on a
            GPU, `float32` (the default) means the checkpoint's dtype.
        reward: `countdown`, `countdown_single_equation` (Assignment 2's verifier), `countdown_binary` (1 / 0),
            `r1_zero`, `question_only`; None: from the task and prompt.
        ns: the N values of pass@N / Best@N (those above n are skipped).
        num_examples: examples kept per category in `summary.json`.
        stop: stop strings.
        chat_template_kwargs: extra variables of the chat template (Qwen3: `{"enable_thinking": true}`), as the
            recipes' TRL field of the same name; only with `chat`.
        min_tokens: tokens generated before EOS / stop may end a sample (the recipes' vLLM `min_tokens`).
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
    chat_template_kwargs: dict | None = None
    min_tokens: int = 0

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
        if self.chat_template_kwargs and not self.chat:
            raise ValueError(
                f"chat_template_kwargs {self.chat_template_kwargs} apply to the chat template only; set chat or "
                "drop them"
            )
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {self.min_tokens}")
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


def check_model_name(name: str, option: str) -> None:
    """Raise before anything loads when `name` can be neither a local model folder nor a hub id: a path that is not
    a directory (absolute, `./`, `../`, `~`, or with more than one `/`), or anything but a directory while the hub is
    offline (`HF_HUB_OFFLINE=1`). `option` names the field or flag in the message."""
    if Path(name).expanduser().is_dir():
        return
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise ValueError(f"{option} {name}: no such directory (and the hub is offline)")
    if name.startswith(("/", "./", "../", "~")) or name.count("/") > 1:
        raise ValueError(f"{option} {name}: no such directory")
