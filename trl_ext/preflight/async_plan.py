"""The preflight's part for asynchronous rollouts (`async_rollouts`): the staleness the run trains with, and the
memory of the rollouts queued ahead, checked against the host's available memory.

With `async_rollouts`, one generation batch is requested from the vLLM server ahead of its turn
(`trl_ext.grpo.rollouts.async_rollouts`); until its turn, the server's answer waits, parsed, in the host memory of the
main training process: every completion's token ids and one log-prob per token, with the strings vLLM's
`/v1/completions` sends beside them and the prompt's ids echoed in each choice. Nothing waits in GPU memory: the
batch becomes tensors on its turn, as in the synchronous run, and the server generates the same batch size either
way. On several GPUs (NCCL) or the CPU layout alike, only the main process holds the queued answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from trl_ext.preflight.batch import BatchLayout
from trl_ext.preflight.problems import Problem

# Host bytes per queued completion token: the parsed `/v1/completions` answer TRL's request gets (token id, its
# log-prob, the "token_id:N" string, a text offset, a one-entry top-logprobs dict). Measured 370-410 B on vLLM 0.31's
# CPU build with ids below 100; longer ids (151k vocabularies) make longer strings, hence 450.
BYTES_PER_COMPLETION_TOKEN = 450
# Each choice echoes its prompt's ids: a Python int and the list's pointer to it.
BYTES_PER_PROMPT_TOKEN = 40


@dataclass(frozen=True)
class AsyncPlan:
    """What an async run holds and how stale its samples are.

    Attributes:
        staleness: `max_staleness`, optimizer steps between the sampling policy and the scoring one.
        steps_per_rollout: `m`, optimizer steps per generation batch.
        completions: completions per generation batch (every process's).
        completion_tokens, prompt_tokens: the longest completion (`max_completion_length`) and prompt.
        queued_bytes: host memory of the batch queued ahead, at the longest completions.
    """

    staleness: int
    steps_per_rollout: int
    completions: int
    completion_tokens: int
    prompt_tokens: int
    queued_bytes: int

    def render(self, mode: str, clip_max: float | None) -> list[str]:
        if self.staleness == 0:
            return ["async:   max_staleness 0: generation is synchronous (nothing requested ahead)"]
        after = self.steps_per_rollout - self.staleness
        when = "as soon as this one is generated" if after == 0 else f"after {after} of its optimizer steps"
        return [
            f"async:   the next generation batch is requested {when}: its samples are scored {self.staleness} "
            f"optimizer step(s) after the policy that drew them (max_staleness {self.staleness}, "
            f"{self.steps_per_rollout} step(s) per batch), reweighted by TRL's vLLM importance-sampling correction "
            f"({mode}, clip max {clip_max})",
            f"         queued: 1 batch of {self.completions} completions x (<= {self.completion_tokens} + "
            f"{self.prompt_tokens} prompt) tokens, ids and log-probs: <= {_mib(self.queued_bytes)} MiB of host "
            "memory on the main training process; no GPU memory beyond the synchronous run's",
        ]


def plan_async(args, layout: BatchLayout, prompt_tokens: int) -> AsyncPlan | None:
    """The async plan of a config (`AblationGRPOConfig`, its `max_staleness` resolved), or None without async."""
    if not getattr(args, "async_rollouts", False):
        return None
    completions = layout.rollout_batch_size
    tokens = int(args.max_completion_length)
    queued = completions * (tokens * BYTES_PER_COMPLETION_TOKEN + prompt_tokens * BYTES_PER_PROMPT_TOKEN)
    return AsyncPlan(
        staleness=int(args.max_staleness),
        steps_per_rollout=layout.optimizer_steps_per_rollout,
        completions=completions,
        completion_tokens=tokens,
        prompt_tokens=prompt_tokens,
        queued_bytes=queued if args.max_staleness else 0,
    )


def check_async(plan: AsyncPlan, available: int | None) -> list[Problem]:
    """The queued batch must fit the host memory available now (with half of it left for everything else)."""
    if available is None or plan.queued_bytes <= available // 2:
        return []
    return [
        Problem(
            "async_rollouts",
            f"the batch queued ahead may hold {_mib(plan.queued_bytes)} MiB on the main training process, more than "
            f"half of the {_mib(available)} MiB this machine has available",
            "lower rollout_batch_size or max_completion_length, or set max_staleness 0",
        )
    ]


def _mib(value: int) -> str:
    return f"{value / 2**20:.0f}" if value >= 2**20 else f"{value / 2**20:.2f}"
