"""`static_cache_generation`: the rollouts sampled by `trl_ext.static_cache` instead of transformers' `generate`.

For the small decoders of the CPU testbed (`recipes/countdown/cpu_demo*.yaml`), where `generate`'s per-token work
and the repeated prefill of every group member cost more than the model: one forward per new token over a
preallocated KV cache, each distinct prompt prefilled once, finished rows dropped. The same sampling as TRL's
`generate` call (temperature, top-k, top-p, min-p from the config; EOS ends a completion), so the training signal is
unchanged in distribution (benchmarks/bench_throughput.py measures both the equality and the speed).
"""

from __future__ import annotations

import torch
from trl.extras.profiling import profiling_context
from trl.models import unwrap_model_for_generation

from trl_ext.static_cache import sample_static_cache, static_cache_problem


def check_static_cache_config(args) -> None:
    """The settings `static_cache_generation` cannot honour, refused with the field to change."""
    if not args.static_cache_generation:
        return
    fix = "set static_cache_generation=False"
    if args.use_vllm:
        raise ValueError(f"static_cache_generation samples with the training model, but use_vllm=True; {fix}")
    if args.use_transformers_continuous_batching:
        raise ValueError(
            f"static_cache_generation replaces transformers' generation; use_transformers_continuous_batching=True: "
            f"{fix}"
        )
    if args.repetition_penalty != 1.0:
        raise ValueError(f"static_cache_generation has no repetition penalty (repetition_penalty="
                         f"{args.repetition_penalty}); set repetition_penalty=1.0 or {fix}")  # fmt: skip
    if args.generation_kwargs:
        raise ValueError(f"static_cache_generation reads temperature, top_k, top_p and min_p only; generation_kwargs="
                         f"{args.generation_kwargs!r} would be ignored: remove them or {fix}")  # fmt: skip
    if args.cache_implementation is not None:
        raise ValueError(f"static_cache_generation keeps its own cache; cache_implementation="
                         f"{args.cache_implementation!r}: remove it or {fix}")  # fmt: skip


class StaticCacheGenerationMixin:
    """`_generate_single_turn` through `trl_ext.static_cache` when `args.static_cache_generation` (TRL's otherwise)."""

    def _check_static_cache_model(self) -> None:
        """After TRL loaded the model: a model type or input the loop does not run, refused before training."""
        if not self.args.static_cache_generation:
            return
        problem = static_cache_problem(self.accelerator.unwrap_model(self.model))
        if problem is None and self._is_vlm:
            problem = "the model takes images"
        if problem is None and self.tools:
            problem = "tool calls need generate's multi-turn path"
        if problem is not None:
            raise ValueError(f"static_cache_generation=True cannot be used here: {problem}; set it to False")

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        if not self.args.static_cache_generation:
            return super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images=has_tool_images
            )
        with (
            profiling_context(self, "static_cache.generate"),
            unwrap_model_for_generation(
                self.model_wrapped,
                self.accelerator,
                gather_deepspeed3_params=self.args.ds3_gather_for_generation,
                gradient_checkpointing_kwargs=self.args.gradient_checkpointing_kwargs,
            ) as unwrapped_model,
            torch.no_grad(),
            self._dist.summon_full_params(self.model_wrapped, recurse=False),
        ):
            sampled = sample_static_cache(
                unwrapped_model,
                prompt_ids,
                self.max_completion_length,
                self.eos_token_ids,
                self._tokenizer.pad_token_id,
                temperature=self.temperature,
                top_k=self.top_k or 0,
                top_p=self.top_p,
                min_p=self.min_p,
            )
        return sampled.token_ids, None  # TRL's transformers path has no sampling log-probs either
