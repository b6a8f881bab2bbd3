"""Validation accuracy during SFT: at every evaluation of TRL's `SFTTrainer`, generate answers to held-out problems
with the current weights and score them with the reward, as NYU Assignment 3 asks ("validation accuracy curves").

`ValidatingSFTTrainer` is `trl.SFTTrainer` plus three things:

1. `evaluate()` runs TRL's (the loss on the validation traces, when there are any), then `measure_accuracy()`:
   the problems' prompts (`trl_ext.tasks`, rendered as `trl-ext eval` renders them) -> completions from the current
   weights (`transformers` `generate`, or vLLM through the trainers' `TrlExtVLLMGeneration`: an engine colocated on the
   training GPU or a `trl vllm-serve` server, the weights pushed before each measurement) -> cut at the stop string /
   EOS / the budget -> reward components (`trl_ext.evaluation.scoring`, the training rewards) -> one log entry with
   the GRPO recipes' names: `eval_rewards/<reward>_reward/answer_reward` (accuracy), `.../format_reward`,
   `eval_reward`, `eval_completions/mean_length`, and `eval_runtime` (its seconds). With several processes each
   generates a shard of the problems and the records are gathered.
2. `step_time` in each training log entry (mean seconds per optimizer step since the previous log, measured
   between `on_step_begin` and `on_step_end`), as TRL's GRPO logs it, so `trl-ext plot` rebuilds wall-clock time.
3. `train_loss_drop` in the training metrics (`train_results.json`): `1 - mean(last) / mean(first)` over the first
   and last tenth of the logged training losses, the number NYU Assignment 3's tuning target (~40%) is about.

`trl-ext plot runs/sft/size_*` then draws accuracy and loss curves per dataset size.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_utils import IntervalStrategy
from trl import SFTTrainer

from trl_ext.evaluation import EvalConfig, cut_samples, eos_token_ids, render_prompts, score_samples, summarize
from trl_ext.evaluation.samples import Sample
from trl_ext.evaluation.transformers_backend import generate_transformers

VLLM_MODES = ("colocate", "server")
# TRL's `VLLMGeneration` defaults for the server's address and weight-sync port.
SERVER_DEFAULTS = {"vllm_server_host": "0.0.0.0", "vllm_server_port": 8000, "vllm_group_port": 51216}


@dataclass
class ValidationAccuracy:
    """What to measure: an `EvalConfig` (task, split, prompt, chat, budget `max_tokens[0]`, sampling, `n`, reward,
    backend `transformers` or `vllm`), its problems (`trl_ext.evaluation.load_problems`, loaded before the model)
    and the vLLM placement.

    Attributes:
        config: the settings; `config.model` is unused (the policy is measured).
        prompts: `(P,)` prompts as the task gives them (strings or chat messages).
        ground_truths: `(P,)` the reward's ground truths.
        reward: the reward name (`trl_ext.evaluation.reward_name_for`).
        vllm_mode: `colocate` or `server` (backend `vllm`).
        vllm_gpu_memory_utilization: the colocated engine's share of the GPU.
        vllm_server_host, vllm_server_port, vllm_group_port: server mode's `trl vllm-serve` and its weight-sync port
            (TRL's defaults: 0.0.0.0, 8000, 51216); refused in colocate mode unless left at them.
    """

    config: EvalConfig
    prompts: list
    ground_truths: list
    reward: str
    vllm_mode: str = "colocate"
    vllm_gpu_memory_utilization: float = 0.3
    vllm_server_host: str = SERVER_DEFAULTS["vllm_server_host"]
    vllm_server_port: int = SERVER_DEFAULTS["vllm_server_port"]
    vllm_group_port: int = SERVER_DEFAULTS["vllm_group_port"]

    def __post_init__(self) -> None:
        if self.config.backend not in ("transformers", "vllm"):
            backend = self.config.backend
            raise ValueError(f"backend: validation accuracy generates with 'transformers' or 'vllm', not {backend!r}")
        if self.vllm_mode not in VLLM_MODES:
            raise ValueError(f"vllm_mode: {self.vllm_mode!r}; choose one of {list(VLLM_MODES)}")
        for name, default in SERVER_DEFAULTS.items():
            if self.vllm_mode != "server" and getattr(self, name) != default:
                raise ValueError(
                    f"{name}: {getattr(self, name)!r} is a server-mode setting; vllm_mode is {self.vllm_mode!r}"
                )
        if len(self.config.max_tokens) != 1:
            raise ValueError(f"max_tokens: one budget, got {self.config.max_tokens}")

    @property
    def metric_prefix(self) -> str:
        return f"eval_rewards/{self.reward}_reward"

    def metrics(self, records: list[dict], seconds: float) -> dict[str, float]:
        """The log entry of one measurement from its scored records (`trl_ext.evaluation.score_samples`)."""
        summary = summarize(records, self.config.n, (1,), 0)
        return {
            f"{self.metric_prefix}/answer_reward": summary["accuracy"],
            f"{self.metric_prefix}/format_reward": summary["format_rate"],
            "eval_reward": summary["mean_reward"],
            "eval_completions/mean_length": summary["mean_response_tokens"],
            "eval_runtime": seconds,
        }


def loss_drop(history: list[dict], fraction: float = 0.1) -> float | None:
    """`1 - mean(last) / mean(first)` of the training `loss` entries of `history`, over the first and the last
    `fraction` of them (at least one entry each); None with fewer than two entries."""
    losses = [e["loss"] for e in history if isinstance(e.get("loss"), int | float)]
    if len(losses) < 2:
        return None
    k = max(1, round(fraction * len(losses)))
    first, last = sum(losses[:k]) / k, sum(losses[-k:]) / k
    return 1.0 - last / first if first else None


class _StepTimer(TrainerCallback):
    """Seconds of each optimizer step, from `on_step_begin` to `on_step_end`, collected for the next log entry."""

    def __init__(self) -> None:
        self.began: float | None = None
        self.seconds: list[float] = []

    def on_step_begin(self, args, state, control, **kwargs):
        self.began = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if self.began is not None:
            self.seconds.append(time.perf_counter() - self.began)
            self.began = None


class ValidatingSFTTrainer(SFTTrainer):
    """`trl.SFTTrainer` that also measures validation accuracy at every evaluation and logs `step_time` (module
    docstring). Overrides `train` (adds `train_loss_drop`), `evaluate` and `log` (adds `step_time`); without
    `accuracy` it is TRL's trainer plus those two numbers.

    Args:
        accuracy: what to measure, or None for the loss only.
        args, kwargs: as `trl.SFTTrainer`.
    """

    def __init__(self, *args, accuracy: ValidationAccuracy | None = None, **kwargs):
        training_args = kwargs.get("args")
        # Accuracy alone (no validation loss set, as NYU Assignment 3's course runs it): HF's Trainer refuses
        # evaluations without an eval_dataset at construction, though `evaluate` below needs none; it reads the
        # strategy again only in the training loop.
        accuracy_only = accuracy is not None and kwargs.get("eval_dataset") is None and training_args is not None
        strategy = training_args.eval_strategy if accuracy_only else None
        if accuracy_only:
            training_args.eval_strategy = IntervalStrategy.NO
        try:
            super().__init__(*args, **kwargs)
        finally:
            if accuracy_only:
                training_args.eval_strategy = strategy
        self.accuracy = accuracy
        self._timer = _StepTimer()
        self.add_callback(self._timer)
        self.vllm_generation = None

    def train(self, *args, **kwargs):
        result = super().train(*args, **kwargs)
        drop = loss_drop(self.state.log_history)
        if drop is not None:
            result.metrics["train_loss_drop"] = drop
        return result

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and self._timer.seconds:
            logs = {**logs, "step_time": sum(self._timer.seconds) / len(self._timer.seconds)}
            self._timer.seconds.clear()
        super().log(logs, start_time)

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        metrics = {}
        if eval_dataset is not None or self.eval_dataset is not None:
            metrics = super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
        if self.accuracy is not None:
            measured = self.measure_accuracy()
            self.log(measured)
            metrics.update(measured)
            if eval_dataset is None and self.eval_dataset is None:
                # What HF's `evaluate` would have done: tell the callbacks, which clears `should_evaluate` (else
                # the epoch's end measures the same step again).
                self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def measure_accuracy(self) -> dict[str, float]:
        """Generate, cut, score and summarise the validation problems with the current weights (this process's
        shard, then gathered); returns the metrics `ValidationAccuracy.metrics` logs."""
        from accelerate.utils import gather_object

        acc, cfg = self.accuracy, self.accuracy.config
        began = time.perf_counter()
        tokenizer = self.processing_class
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        texts = render_prompts(acc.prompts[rank::world], tokenizer, cfg.chat_template_kwargs)
        model = self.accelerator.unwrap_model(self.model)
        was_training = model.training
        model.eval()
        try:
            if cfg.backend == "vllm":
                samples = self._generate_vllm(texts)
            else:
                samples = self._generate_transformers(model, texts)
        finally:
            model.train(was_training)
        budget = cfg.max_tokens[0]
        cuts = cut_samples(samples, tokenizer, (budget,), eos_token_ids(model, tokenizer), cfg.stop)
        records = score_samples(texts, acc.ground_truths[rank::world], cuts, budget, acc.reward)
        if world > 1:
            records = gather_object(records)
        return acc.metrics(records, time.perf_counter() - began)

    def _generate_transformers(self, model, texts: list[str]) -> list[list[Sample]]:
        cfg = self.accuracy.config
        tokenizer = self.processing_class
        side, tokenizer.padding_side = tokenizer.padding_side, "left"  # generate continues after the prompt
        try:
            return generate_transformers(
                model, tokenizer, texts, n=cfg.n, max_new_tokens=cfg.max_tokens[0], temperature=cfg.temperature,
                top_p=cfg.top_p, seed=cfg.seed, batch_size=cfg.batch_size, stop=cfg.stop, progress=False,
                min_new_tokens=cfg.min_tokens,
            )  # fmt: skip
        finally:
            tokenizer.padding_side = side

    def _generate_vllm(self, texts: list[str]) -> list[list[Sample]]:
        """Completions from the vLLM generation (built on first use) with the measurement's sampling, after
        pushing the current weights."""
        cfg = self.accuracy.config
        generation = self.vllm_generation or self._build_vllm_generation()
        set_vllm_sampling(generation, cfg)
        generation.sync_weights()
        prompt_ids = [self.processing_class(t, add_special_tokens=False)["input_ids"] for t in texts]
        prompt_ids = [ids for ids in prompt_ids for _ in range(cfg.n)]
        _, completion_ids, logprobs, _ = generation.generate(prompt_ids, None, cfg.n)
        flat = [
            Sample(token_ids=list(ids), logprobs=[float(lp[0]) for lp in (lps or [])])
            for ids, lps in zip(completion_ids, logprobs or [None] * len(completion_ids), strict=True)
        ]
        return [flat[i : i + cfg.n] for i in range(0, len(flat), cfg.n)]

    def _build_vllm_generation(self):
        """The GRPO trainer's vLLM generation (`trl_ext.grpo.vllm.TrlExtVLLMGeneration`: TRL's, with the colocated
        CPU engine's weight sync and sampler, the gloo weight sync to a server from a trainer without CUDA, and the
        watchdog), colocated on this GPU or connected to a server, tied to this trainer's steps as the trainers'
        are (`install_generation`)."""
        from trl_ext.grpo.vllm.generation import TrlExtVLLMGeneration, install_generation  # imports vLLM

        acc, cfg = self.accuracy, self.accuracy.config
        texts = render_prompts(acc.prompts, self.processing_class, cfg.chat_template_kwargs)
        longest = max(len(self.processing_class(t, add_special_tokens=False)["input_ids"]) for t in texts)
        self.vllm_generation = TrlExtVLLMGeneration(
            model=self.model,
            accelerator=self.accelerator,
            processing_class=self.processing_class,
            mode=acc.vllm_mode,
            gpu_memory_utilization=acc.vllm_gpu_memory_utilization,
            max_model_length=longest + cfg.max_tokens[0],
            server_host=acc.vllm_server_host,
            server_port=acc.vllm_server_port,
            group_port=acc.vllm_group_port,
        )
        install_generation(self)
        return self.vllm_generation


def set_vllm_sampling(generation, cfg: EvalConfig) -> None:
    """Give TRL's `VLLMGeneration` the sampling of `cfg` (it reads these attributes at every `generate`): budget,
    temperature (0: greedy), top-p, the sampled token's log-prob, and the stop strings kept in the text, as the
    courses' vLLM call. No per-request seed: the n copies of a prompt would all draw the same sample."""
    generation.temperature = cfg.temperature
    generation.top_p = cfg.top_p
    generation.top_k = 0
    generation.min_p = 0.0
    generation.repetition_penalty = 1.0
    generation.max_completion_length = cfg.max_tokens[0]
    generation.logprobs = 0
    kwargs: dict[str, Any] = {"stop": list(cfg.stop), "include_stop_str_in_output": True}
    if cfg.min_tokens:
        kwargs["min_tokens"] = cfg.min_tokens
    generation.generation_kwargs = kwargs
