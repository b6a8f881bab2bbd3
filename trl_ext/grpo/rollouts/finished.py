"""A completion that ended at a stop string is finished, not truncated.

TRL 1.16 calls a completion truncated when its last token is neither an EOS nor the pad token (`GRPOTrainer._generate`
logs `completions/clipped_ratio` and the `*_terminated_length` metrics by that rule; `_generate_and_score_completions`
applies it for `mask_truncated_completions`). A vLLM `stop` string ends a completion without an EOS: with
`stop: ["</answer>"]` (every Countdown and r1_zero recipe) every completion that answered counts as clipped, and
`mask_truncated_completions: true` (DAPO's overlong filtering) drops exactly the answered completions from the loss.

Here a completion is finished when its last token is an EOS or the pad token, or when a stop string first appears
with its last token (vLLM stops as soon as the text holds a stop string, `vllm/v1/engine/detokenizer.py`
`check_stop_strings`; the token ids keep the stop string's tokens whether or not `include_stop_str_in_output`
keeps its text). Only a completion cut at `max_completion_length` (or the model's context) is truncated.

`FinishedCompletionsMixin` (part of `AblationGRPOTrainer`, whose `_install_behaviours` lists what it changes in
order):

- `_generate` (the one TRL method changed here): TRL's, then which of this process's completions finished
  (`_finished`) and their lengths;
- `_finished_metrics`: the four metrics TRL logged from its own rule in `_generate` (clipped ratio, mean / min / max
  terminated length), recomputed over every process's completions; the trainer writes them in place of TRL's
  (`AblationGRPOTrainer._log_over_trl`, the one place that replaces a value TRL logged);
- `_truncation_mask_is_ours` (decided once, when the trainer is built) and `_mask_truncated`: with
  `mask_truncated_completions`, where TRL's rule would also mask the completions that stopped (vLLM, or stop
  strings), TRL's trainer attribute `mask_truncated_completions` is set False for the run and, after TRL's scoring of
  each generation batch, the loss mask (`completion_mask`, `tool_mask`) of the truncated completions only is zeroed,
  and `num_items_in_batch` recounted as TRL counts it. TRL's old / reference log-probs of the masked rows then come
  from an unmasked attention (TRL's from a masked one); they multiply a zero mask either way.

With vLLM (server and colocate modes) vLLM's own `finish_reason` decides: "stop" (EOS, stop token, stop string) is
finished, anything else ("length", "abort") truncated (`trl_ext.grpo.vllm.finish_reasons` keeps what TRL drops).
The token tail above is the fallback: the transformers backend, and vLLM completions TRL rewrote (tool calls,
`rollout_func`). The tail cannot see a stop string that speculative decoding accepted tokens past, a special-token stop
string decoded with `skip_special_tokens: false`, or an earlier match vLLM skipped inside `min_tokens`; vLLM's word
can.

Without vLLM (`use_vllm: false`) and without stop strings in `generation_kwargs` (`stop` for vLLM, `stop_strings`
for transformers) both defer to TRL.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import torch

from trl_ext.grpo.rows import loss_mask
from trl_ext.grpo.vllm.finish_reasons import vllm_finish_reasons


def stop_strings(generation_kwargs: Mapping | None) -> tuple[str, ...]:
    """The stop strings of TRL's `generation_kwargs`: vLLM's `stop`, else transformers' `stop_strings`."""
    kwargs = generation_kwargs or {}
    stops = kwargs.get("stop") or kwargs.get("stop_strings") or ()
    return (stops,) if isinstance(stops, str) else tuple(s for s in stops if s)


def finished_completions(
    completion_ids: Sequence[Sequence[int]],
    eos_and_pad: Iterable[int],
    decode: Callable[[list[list[int]]], list[str]],
    stops: Sequence[str],
) -> list[bool]:
    """Per completion: ended with an EOS / pad token, or at a stop string (module docstring).

    Args:
        completion_ids: token ids of each completion, as generated.
        eos_and_pad: the EOS ids and the pad id (TRL's `eos_and_pad`).
        decode: batch decode of token-id lists (`tokenizer.batch_decode(..., skip_special_tokens=True)`).
        stops: the stop strings.

    A stop string of m characters spans at most m tokens, so only the last m + 2 tokens are decoded: with and
    without the last token, the stop string must appear in the first text and not in the second.
    """
    ends = set(eos_and_pad)
    finished = [bool(ids) and ids[-1] in ends for ids in completion_ids]
    if not stops:
        return finished
    window = max(len(s) for s in stops) + 2
    open_rows = [i for i, done in enumerate(finished) if not done and completion_ids[i]]
    if not open_rows:
        return finished
    tails = [list(completion_ids[i][-window:]) for i in open_rows]
    with_last, without_last = decode(tails), decode([tail[:-1] for tail in tails])
    for i, full, before in zip(open_rows, with_last, without_last, strict=True):
        finished[i] = any(s in full and s not in before for s in stops)
    return finished


class FinishedCompletionsMixin:
    """`AblationGRPOTrainer`'s finished vs truncated completions (module docstring)."""

    _finished: torch.Tensor | None = None  # (B,) bool: this process's completions of the last `_generate` call
    _finished_lengths: list[int] | None = None  # (B,) their lengths in tokens (TRL's, tool tokens left out)

    def _truncation_mask_is_ours(self) -> bool:
        """Whether `mask_truncated_completions` is applied by `_mask_truncated` rather than by TRL: with vLLM or stop
        strings, where TRL's rule would also mask the completions that stopped. Read once, by the trainer's
        `__init__`, which then turns TRL's own masking off for the run."""
        return bool(self.args.mask_truncated_completions) and bool(
            self.use_vllm or stop_strings(self.args.generation_kwargs)
        )

    def _generate(self, prompts):
        generation = self.vllm_generation if self.use_vllm else None
        if generation is not None:
            generation.finish_reasons = None  # a rollout_func generates without TRL's vLLM call: no stale record
        output = super()._generate(prompts)
        completion_ids, tool_mask = output[1], output[2]
        reasons = vllm_finish_reasons(generation, completion_ids)
        if reasons is not None:
            finished = reasons.finished()
        else:  # the token tail; without stop strings this is TRL's rule
            eos_and_pad = [*self.eos_token_ids, self._tokenizer.pad_token_id]
            decode = lambda ids: self._tokenizer.batch_decode(ids, skip_special_tokens=True)  # noqa: E731
            finished = finished_completions(
                completion_ids, eos_and_pad, decode, stop_strings(self.args.generation_kwargs)
            )
        self._finished = torch.tensor(finished, dtype=torch.bool, device=self.accelerator.device)
        self._finished_lengths = (
            [sum(mask) for mask in tool_mask] if tool_mask is not None else [len(ids) for ids in completion_ids]
        )
        return output

    def _finished_metrics(self) -> dict[str, float]:
        """The four metrics TRL's `_generate` logged for the last call (clipped ratio, mean / min / max terminated
        length), by this module's rule over every process's completions; none where TRL's rule is this one (no vLLM,
        no stop strings: the condition is the same on every process)."""
        if not (self.use_vllm or stop_strings(self.args.generation_kwargs)):
            return {}
        device = self.accelerator.device
        all_lengths = self.accelerator.gather(torch.tensor(self._finished_lengths, device=device))
        all_finished = self.accelerator.gather(self._finished)
        finished_lengths = all_lengths[all_finished].float()
        if finished_lengths.numel() == 0:
            finished_lengths = torch.zeros(1, device=device)
        return {
            "completions/clipped_ratio": (~all_finished).float().mean().item(),
            "completions/mean_terminated_length": finished_lengths.mean().item(),
            "completions/min_terminated_length": finished_lengths.min().item(),
            "completions/max_terminated_length": finished_lengths.max().item(),
        }

    def _mask_truncated(self, output: dict) -> dict:
        """`output` (TRL's, scored with its own masking off) with the loss mask of the truncated completions zeroed
        and `num_items_in_batch` recounted."""
        keep = self._finished.to(output["completion_mask"].dtype).unsqueeze(1)  # (B, 1)
        output["completion_mask"] = output["completion_mask"] * keep
        if output.get("tool_mask") is not None:
            output["tool_mask"] = output["tool_mask"] * keep
        output["num_items_in_batch"] = self.accelerator.gather(loss_mask(output).sum()).sum()
        return output
