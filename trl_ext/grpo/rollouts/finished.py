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

`FinishedCompletionsMixin` (installed by `AblationGRPOTrainer`, whose `_install_behaviours` lists every behaviour in
its order):

- `_install_finish_reasons`: installs `trl_ext.grpo.rollouts.finish_reasons` on the trainer's vLLM objects (no-op
  without vLLM);
- `_generate` (the one TRL method changed here): recomputes the four metrics TRL just logged from its rule (clipped
  ratio, mean / min / max terminated length) over every process's completions;
- `_masks_truncated_itself` / `_mask_truncated`, around TRL's `_generate_and_score_completions` in the trainer's
  scoring of one generation batch: with `mask_truncated_completions`, TRL's runs with its masking off and the loss
  mask (`completion_mask`, `tool_mask`) of the truncated completions only is zeroed, and `num_items_in_batch`
  recounted as TRL counts it. TRL's old / reference log-probs of the masked rows then come from an unmasked attention
  (TRL's from a masked one); they multiply a zero mask either way.

With vLLM (server and colocate modes) vLLM's own `finish_reason` decides: "stop" (EOS, stop token, stop string) is
finished, anything else ("length", "abort") truncated (`trl_ext.grpo.rollouts.finish_reasons` keeps what TRL drops).
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

from trl_ext.grpo.rollouts.finish_reasons import install_finish_reasons, vllm_finish_reasons
from trl_ext.grpo.rows import loss_mask


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

    def _install_finish_reasons(self) -> None:
        """vLLM's finish reasons, recorded on `self.vllm_generation` (after TRL built it; no-op without vLLM)."""
        if self.use_vllm:
            install_finish_reasons(self.vllm_generation)

    def _generate(self, prompts):
        generation = self.vllm_generation if self.use_vllm else None
        if generation is not None:
            generation.finish_reasons = None  # a rollout_func generates without TRL's vLLM call: no stale record
        output = super()._generate(prompts)
        completion_ids, tool_mask = output[1], output[2]
        stops = stop_strings(self.args.generation_kwargs)
        reasons = vllm_finish_reasons(generation, completion_ids)
        device = self.accelerator.device
        if reasons is not None:
            finished = reasons.finished()
        else:  # the token tail; without stop strings this is TRL's rule
            eos_and_pad = [*self.eos_token_ids, self._tokenizer.pad_token_id]
            decode = lambda ids: self._tokenizer.batch_decode(ids, skip_special_tokens=True)  # noqa: E731
            finished = finished_completions(completion_ids, eos_and_pad, decode, stops)
        self._finished = torch.tensor(finished, dtype=torch.bool, device=device)
        if not (self.use_vllm or stops):
            return output  # TRL's rule: its metrics stand (the condition is the same on every process)
        # TRL logged these from its own rule just now; replace them, over every process's completions as TRL's.
        lengths = [sum(mask) for mask in tool_mask] if tool_mask is not None else [len(ids) for ids in completion_ids]
        all_lengths = self.accelerator.gather(torch.tensor(lengths, device=device))
        all_finished = self.accelerator.gather(self._finished)
        finished_lengths = all_lengths[all_finished].float()
        if finished_lengths.numel() == 0:
            finished_lengths = torch.zeros(1, device=device)
        metrics = self._metrics["train" if self.model.training else "eval"]
        metrics["completions/clipped_ratio"][-1] = (~all_finished).float().mean().item()
        metrics["completions/mean_terminated_length"][-1] = finished_lengths.mean().item()
        metrics["completions/min_terminated_length"][-1] = finished_lengths.min().item()
        metrics["completions/max_terminated_length"][-1] = finished_lengths.max().item()
        return output

    def _masks_truncated_itself(self) -> bool:
        """Whether `mask_truncated_completions` is applied by `_mask_truncated` rather than by TRL: with vLLM or stop
        strings, where TRL's rule would also mask the completions that stopped."""
        return bool(self.mask_truncated_completions) and bool(
            self.use_vllm or stop_strings(self.args.generation_kwargs)
        )

    def _mask_truncated(self, output: dict) -> dict:
        """`output` (TRL's, scored with its own masking off) with the loss mask of the truncated completions zeroed
        and `num_items_in_batch` recounted."""
        keep = self._finished.to(output["completion_mask"].dtype).unsqueeze(1)  # (B, 1)
        output["completion_mask"] = output["completion_mask"] * keep
        if output.get("tool_mask") is not None:
            output["tool_mask"] = output["tool_mask"] * keep
        output["num_items_in_batch"] = self.accelerator.gather(loss_mask(output).sum()).sum()
        return output
