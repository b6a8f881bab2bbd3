"""vLLM's own finish reason for each completion TRL's vLLM paths return.

vLLM says why each completion ended: `finish_reason` "stop" (an EOS, a stop token, a stop string) or "length"
(`max_tokens` or the context), with `stop_reason` the stop string or token id that matched. TRL 1.16 drops both:
in server mode `VLLMClient.generate` keeps only `token_ids` and `logprobs` of the `/v1/completions` choices
(`trl/generation/vllm_client.py`); in colocate mode `VLLMGeneration.generate` keeps only `token_ids` of
`llm.generate`'s outputs (`trl/generation/vllm_generation.py`). Guessing from the token tail fails where the ids
hold more than the stop string (speculative decoding accepts several tokens a step, and vLLM keeps all of them),
where the decode differs from vLLM's (a special-token stop string under `skip_special_tokens: false`), and where
vLLM skipped an earlier match (a stop string inside `min_tokens`).

`install_finish_reasons` wraps three methods of one `VLLMGeneration` and its client or engine (instances only; TRL's
classes are left alone; `ReasonRecorder.watch_client` / `watch_engine` are the first two):

- server, main process: `vllm_client._post` records `(finish_reason, stop_reason)` of each choice of a
  `/v1/completions` answer, in the order TRL reads `token_ids` from the same choices (above the replay layer of
  `trl_ext.grpo.rollouts.rollout_worker` with async rollouts, so a replayed answer is recorded as a sent one);
- colocate: `llm.generate` records them from each `CompletionOutput`, in the order TRL flattens the outputs;
- `vllm_generation.generate`: clears the record before TRL's call and, after it, cuts this process's share as TRL
  cuts the completions (server: broadcast from the main process, then slice `process_index`; colocate with tensor
  parallel: slice the rank in its group), kept with a copy of the completion ids TRL returned.

`vllm_finish_reasons(generation, completion_ids)` gives the reasons only when `completion_ids` are exactly those ids:
TRL's tool loop and a `rollout_func` return other ids, and the multimodal server path (`/inference/v1/generate`,
one request per prompt, concurrently) is not recorded; then it returns None and the caller falls back.
"""

from __future__ import annotations

import types
from collections.abc import Sequence
from dataclasses import dataclass

from trl_ext.grpo.rollouts.rollout_worker import COMPLETIONS_ENDPOINT


@dataclass(frozen=True)
class FinishReasons:
    """vLLM's word on this process's completions of one `VLLMGeneration.generate` call, in TRL's order.

    Attributes:
        completion_ids: the completions TRL returned, one list of token ids each.
        finish_reason: per completion, "stop", "length", "abort", ... as vLLM names them.
        stop_reason: per completion, the matched stop string or stop token id, None for an EOS or a cut.
    """

    completion_ids: list[list[int]]
    finish_reason: list[str | None]
    stop_reason: list[str | int | None]

    def finished(self) -> list[bool]:
        """Per completion: vLLM stopped it (EOS, stop token or stop string) rather than cutting it."""
        return [reason == "stop" for reason in self.finish_reason]


def choice_reasons(choices: Sequence[dict]) -> list[tuple[str | None, str | int | None]]:
    """`(finish_reason, stop_reason)` of each choice of a `/v1/completions` answer, in the choices' order."""
    return [(choice.get("finish_reason"), choice.get("stop_reason")) for choice in choices]


def output_reasons(request_outputs) -> list[tuple[str | None, str | int | None]]:
    """`(finish_reason, stop_reason)` of each completion of `LLM.generate`'s outputs, flattened as TRL flattens
    them (request by request, then each request's completions)."""
    return [(out.finish_reason, out.stop_reason) for request in request_outputs for out in request.outputs]


def share(records: list | None, n_local: int, index: int) -> list | None:
    """This process's slice `[index * n_local, (index + 1) * n_local)` of every process's records, as TRL slices
    its completions; None when there is no record or it does not cover that slice."""
    if records is None or len(records) < (index + 1) * n_local:
        return None
    return records[index * n_local : (index + 1) * n_local]


class ReasonRecorder:
    """Keeps the `(finish_reason, stop_reason)` of each completion of the last answer a watched client or engine gave.

    Attributes:
        records: the last answer's pairs, in the order TRL reads that answer's completions; None before any.
    """

    def __init__(self):
        self.records: list[tuple[str | None, str | int | None]] | None = None

    def watch_client(self, client) -> None:
        """Wrap `client._post` (a `trl.generation.vllm_client.VLLMClient`): records each `/v1/completions` answer."""
        post = client._post

        def _post(this, url, **kwargs):
            answer = post(url, **kwargs)
            if url.endswith(COMPLETIONS_ENDPOINT):
                self.records = choice_reasons(answer["choices"])
            return answer

        client._post = types.MethodType(_post, client)

    def watch_engine(self, llm) -> None:
        """Wrap `llm.generate` (a `vllm.LLM`): each call's outputs are recorded."""
        generate = llm.generate

        def _generate(this, *args, **kwargs):
            outputs = generate(*args, **kwargs)
            self.records = output_reasons(outputs)
            return outputs

        llm.generate = types.MethodType(_generate, llm)


def install_finish_reasons(generation) -> bool:
    """Record vLLM's finish reasons of every `generation.generate` call (module docstring) in
    `generation.finish_reasons` (a `FinishReasons`, or None when nothing was recorded).

    Args:
        generation: a `trl.generation.vllm_generation.VLLMGeneration` (a GRPO trainer's `vllm_generation`), built.

    Returns:
        True when the wrappers were installed now (False when they already were).
    """
    if getattr(generation, "_finish_reasons_installed", False):
        return False
    recorder = ReasonRecorder()
    if getattr(generation, "vllm_client", None) is not None:  # server mode, main process only
        recorder.watch_client(generation.vllm_client)
    if getattr(generation, "llm", None) is not None:  # colocate mode
        recorder.watch_engine(generation.llm)
    trl_generate = generation.generate

    def _generate(self, *args, **kwargs):
        recorder.records = None
        result = trl_generate(*args, **kwargs)
        completion_ids = result[1]
        records, index = recorder.records, 0
        recorder.records = None
        if self.mode == "server":
            # Only the main process asked the server; TRL broadcasts the completions and each process takes its slice.
            if self.accelerator.num_processes > 1:
                from accelerate.utils import broadcast_object_list

                box = [records]
                broadcast_object_list(box, from_process=0)
                records = box[0]
            index = self.accelerator.process_index
        elif self.tensor_parallel_size > 1:
            import torch

            index = torch.distributed.get_rank(group=self.tp_group)  # each rank of a TP group generated all
        records = share(records, len(completion_ids), index)
        self.finish_reasons = None
        if records is not None:
            self.finish_reasons = FinishReasons(
                completion_ids=[list(ids) for ids in completion_ids],
                finish_reason=[reason for reason, _ in records],
                stop_reason=[stop for _, stop in records],
            )
        return result

    generation.generate = types.MethodType(_generate, generation)
    generation.finish_reasons = None
    generation._finish_reasons_installed = True
    return True


def vllm_finish_reasons(generation, completion_ids: Sequence[Sequence[int]]) -> FinishReasons | None:
    """vLLM's finish reasons of `completion_ids`, or None when `generation` (a `VLLMGeneration` or None) recorded
    none or its last call returned other ids (tool calls, a `rollout_func`, the multimodal server path)."""
    record = getattr(generation, "finish_reasons", None)
    if record is None or len(record.completion_ids) != len(completion_ids):
        return None
    if any(list(ids) != kept for ids, kept in zip(completion_ids, record.completion_ids, strict=True)):
        return None
    return record
