"""vLLM's own finish reason for each completion TRL's vLLM paths return.

vLLM says why each completion ended: `finish_reason` "stop" (an EOS, a stop token, a stop string) or "length"
(`max_tokens` or the context), with `stop_reason` the stop string or token id that matched. TRL 1.16 drops both:
in server mode `VLLMClient.generate` keeps only `token_ids` and `logprobs` of the `/v1/completions` choices
(`trl/generation/vllm_client.py`); in colocate mode `VLLMGeneration.generate` keeps only `token_ids` of
`llm.generate`'s outputs (`trl/generation/vllm_generation.py`). Guessing from the token tail fails where the ids
hold more than the stop string (speculative decoding accepts several tokens a step, and vLLM keeps all of them),
where the decode differs from vLLM's (a special-token stop string under `skip_special_tokens: false`), and where
vLLM skipped an earlier match (a stop string inside `min_tokens`).

`TrlExtVLLMGeneration` (`trl_ext.grpo.vllm.generation`) keeps them, without touching TRL's or vLLM's objects:

- server, main process: `TrlExtVLLMClient._post` records `(finish_reason, stop_reason)` of each choice of a
  `/v1/completions` answer, in the order TRL reads `token_ids` from the same choices (after the replay of async
  rollouts, so a replayed answer is recorded as a sent one);
- colocate: TRL's `VLLMGeneration` reaches its engine as `self.llm`; the subclass holds it as a `RecordingEngine`,
  whose `generate` records them from each `CompletionOutput`, in the order TRL flattens the outputs (every other
  attribute is the engine's own);
- `TrlExtVLLMGeneration.generate`: clears the record before TRL's call and, after it, cuts this process's share as
  TRL cuts the completions (server: broadcast from the main process, then slice `process_index`; colocate with
  tensor parallel: slice the rank in its group), kept with a copy of the completion ids TRL returned.

`vllm_finish_reasons(generation, completion_ids)` gives the reasons only when `completion_ids` are exactly those ids:
TRL's tool loop and a `rollout_func` return other ids, and the multimodal server path (`/inference/v1/generate`,
one request per prompt, concurrently) is not recorded; then it returns None and the caller falls back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


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


Record = list[tuple[str | None, str | int | None]]  # `(finish_reason, stop_reason)` per completion


class RecordingEngine:
    """A colocated `vllm.LLM` as `TrlExtVLLMGeneration` holds it: `generate` keeps the finish reasons of the last
    call's outputs in `last_finish_reasons`; every other attribute is the engine's (`engine`) own.

    Args:
        engine: the `vllm.LLM` TRL's `VLLMGeneration._init_vllm` built.
    """

    def __init__(self, engine):
        self.engine = engine
        self.last_finish_reasons: Record | None = None

    def generate(self, *args, **kwargs):
        outputs = self.engine.generate(*args, **kwargs)
        self.last_finish_reasons = output_reasons(outputs)
        return outputs

    def __getattr__(self, name: str):
        if name == "engine":  # not set yet (a copy being built): no engine to look in
            raise AttributeError(name)
        return getattr(self.engine, name)


def finish_reasons_of(records: Record | None, completion_ids) -> FinishReasons | None:
    """`FinishReasons` of `completion_ids` (this process's completions) from their `records`, None without."""
    if records is None:
        return None
    return FinishReasons(
        completion_ids=[list(ids) for ids in completion_ids],
        finish_reason=[reason for reason, _ in records],
        stop_reason=[stop for _, stop in records],
    )


def vllm_finish_reasons(generation, completion_ids: Sequence[Sequence[int]]) -> FinishReasons | None:
    """vLLM's finish reasons of `completion_ids`, or None when `generation` (a `VLLMGeneration` or None) recorded
    none or its last call returned other ids (tool calls, a `rollout_func`, the multimodal server path)."""
    record = getattr(generation, "finish_reasons", None)
    if record is None or len(record.completion_ids) != len(completion_ids):
        return None
    if any(list(ids) != kept for ids, kept in zip(completion_ids, record.completion_ids, strict=True)):
        return None
    return record
