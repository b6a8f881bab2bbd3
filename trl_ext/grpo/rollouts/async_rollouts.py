"""Asynchronous rollouts (`async_rollouts`, `max_staleness`): the vLLM server generates the next generation batch
while this process trains on the current one; no sample more than `max_staleness` optimizer steps old is scored.

With `m` optimizer steps per generation batch and `s = max_staleness` (0 < s <= m), for generation batch n:

    wait until the server has answered batch n; push the current policy into it (TRL's weight sync; never while
      it generates); read batch n's answer                       # the trainer waits here, and only here
    score batch n as TRL does: rewards, old log-probs of the current policy, TRL's vLLM importance-sampling ratio
      pi_current / pi_sampler from the server's own log-probs (vllm_importance_sampling_correction)
    train on batch n; after m - s of its m optimizer steps, push the policy and ask the server for batch n + 1
      in a background thread                                      # the server generates while the trainer trains

So batch n + 1 is drawn by the policy `s` optimizer steps older than the one that scores it; each row carries that
version (`policy_version`, the optimizer step of the weights that sampled it). The loss is TRL's and ours unchanged:
the PPO ratio against the old log-probs computed at scoring, times the sampler correction (AReaL's decoupled PPO,
https://arxiv.org/abs/2505.24298). `s = 0` asks for nothing ahead: the synchronous path, request for request.

One batch is requested ahead at a time, so a sample is never more than `m` steps old at scoring (`s <= m`). The
next batch's prompts come from TRL's own dataloader, read one generation batch ahead (`get_batch_samples`), so the
async run trains on the same prompts in the same order as the synchronous one; the first batch of each epoch is
generated synchronously (the next epoch's iterator does not exist yet). Only the main process's HTTP request runs in
the background (`trl_ext.grpo.vllm.replay`, answered through `TrlExtVLLMClient._post`); gathering the prompts and
broadcasting the answer and its version are collectives and stay on the main thread, in the same order on every
process.
"""

from __future__ import annotations

import copy
import logging
from collections import deque

import torch

from trl_ext.grpo.vllm.replay import COMPLETIONS_ENDPOINT, is_stale, next_payload, replay_for
from trl_ext.preflight.batch import batch_error, whole_optimizer_steps

logger = logging.getLogger(__name__)

# Per generation call in training: how old its batch is and where the time went (seconds, main process's clock).
METRICS = (
    "async/staleness",  # optimizer steps between the sampling policy and the scoring one
    "async/prefetched",  # 1 when the batch was requested ahead, 0 when generated on demand
    "async/wait_seconds",  # the trainer blocked on the server: its answer, and its end before a weight push
    "async/generate_seconds",  # the server answering this batch's request
    "async/sync_seconds",  # pushing the weights into the server
    "async/dropped",  # requests sent ahead and not used so far (stale, or not the request TRL made)
)


def optimizer_steps_per_generation(args) -> int:
    """`m`: optimizer steps per generation batch (`steps_per_generation * num_iterations / GA`).

    Raises:
        ValueError: not a whole number (then a generation batch would start inside an optimizer step).
    """
    steps, problems = whole_optimizer_steps(
        args.steps_per_generation, args.num_iterations, args.gradient_accumulation_steps
    )
    if problems:
        raise batch_error(problems[0])
    return steps


def check_async_rollouts_config(args) -> None:
    """Validate `async_rollouts` / `max_staleness` on a config (after TRL's `__post_init__`) and resolve the default
    `max_staleness = m` (one generation batch ahead, the most overlap).

    Raises:
        ValueError: `max_staleness` without `async_rollouts`; async without a vLLM server; a staleness outside
            `[0, m]`; a staleness > 0 without TRL's vLLM importance-sampling correction.
    """
    staleness = args.max_staleness
    if not args.async_rollouts:
        if staleness is not None:
            raise ValueError(
                f"max_staleness={staleness} has no effect without async_rollouts; set async_rollouts=True or leave "
                "max_staleness unset"
            )
        return
    if not args.use_vllm or args.vllm_mode != "server":
        raise ValueError(
            f"async_rollouts=True generates on a vLLM server while this process trains, but use_vllm="
            f"{args.use_vllm}, vllm_mode={args.vllm_mode!r}; set use_vllm=True and vllm_mode='server' (a colocated "
            "engine shares the training device: nothing would overlap)"
        )
    steps = optimizer_steps_per_generation(args)
    if staleness is None:
        args.max_staleness = staleness = steps
    if isinstance(staleness, bool) or not isinstance(staleness, int) or not 0 <= staleness <= steps:
        raise ValueError(
            f"max_staleness={staleness!r} must be an integer from 0 (synchronous) to {steps}: one generation batch "
            f"is requested ahead, and a generation batch lasts {steps} optimizer step(s) (steps_per_generation * "
            "num_iterations / gradient_accumulation_steps), so its samples are at most that old when scored"
        )
    if staleness > 0 and not args.vllm_importance_sampling_correction:
        raise ValueError(
            f"max_staleness={staleness} scores samples drawn by a policy {staleness} optimizer step(s) older than the "
            "scoring one; the loss corrects for that only through TRL's vLLM importance-sampling correction (each "
            "token / sequence weighed by pi_trainer / pi_sampler from the server's log-probs). Set "
            "vllm_importance_sampling_correction=True, or max_staleness=0"
        )


def check_trainer_inputs(kwargs: dict) -> None:
    """Refuse, before TRL loads the model, what the replayed single-turn request cannot cover."""
    for name in ("rollout_func", "tools", "environment_factory"):
        if kwargs.get(name):
            raise ValueError(
                f"async_rollouts requests single-turn completions ahead; {name} generates otherwise (several turns, "
                "or its own calls). Remove it or set async_rollouts=False"
            )
    for split in ("train_dataset", "eval_dataset"):
        columns = set(getattr(kwargs.get(split), "column_names", None) or [])
        if columns & {"image", "images"}:
            raise ValueError(f"async_rollouts does not support multimodal datasets ({split} has image columns)")


class _Rollouts:
    """Per-trainer state: the dataloader read ahead, the version of the last batch, the main process's replay (also
    its vLLM client's `replay`, which answers the completions request sent ahead)."""

    def __init__(self, trainer):
        args = trainer.args
        self.staleness = args.max_staleness
        self.every = args.steps_per_generation * args.num_iterations  # micro-steps per generation batch
        steps = optimizer_steps_per_generation(args)
        # Micro-step of a generation batch at which the next one is requested (after m - s optimizer steps).
        self.phase = (steps - self.staleness) * args.gradient_accumulation_steps if self.staleness else None
        self.queue: deque = deque()
        self.iterator = None
        self.returned = 0  # dataloader items handed to the training loop
        self.requested = None  # micro-step of the generation batch last requested ahead
        self.version: int | None = None  # policy version of the last training generation (every process)
        self.unlogged = (0.0, 0.0)  # (waited, pushed) seconds of a mid-batch push, logged with the next generation
        self.replay = None
        if trainer.accelerator.is_main_process:
            client = trainer.vllm_generation.vllm_client
            self.replay = client.replay = replay_for(
                client,
                is_training=lambda: trainer.model.training,
                server_version=lambda: trainer._last_loaded_step,
                stale=lambda version: is_stale(version, trainer.state.global_step, self.staleness),
            )

    def lookahead(self, step: int):
        """The dataloader item the training loop will hand over at micro-step `step`, if already read."""
        position = step - self.returned
        return self.queue[position] if 0 <= position < len(self.queue) else None


class AsyncRolloutsMixin:
    """`AblationGRPOTrainer`'s asynchronous rollouts: generation batches requested one ahead from the vLLM server
    (module docstring). Active only when `args.async_rollouts` is true.

    Installed by `AblationGRPOTrainer` (its `_install_behaviours` lists what it changes in order): the trainer
    refuses with `check_trainer_inputs` what cannot be replayed before TRL loads the model, then
    `_install_async_rollouts` gives the vLLM client (`TrlExtVLLMClient`) its `replay`, which its `_post` consults
    before TRL's, and the trainer's scoring of one generation batch calls `_tag_policy_version`. The TRL
    methods changed here, each only here: `train` (waits for a request still in flight at the end),
    `get_batch_samples` (reads the dataloader one generation batch ahead), `_prepare_inputs` (requests the next batch
    mid-batch when `max_staleness < m`), `_generate_single_turn` (waits for the server to be idle before a weight
    push, pushes, then requests the next batch).
    """

    _rollouts: _Rollouts | None = None  # the state of an active run; None when `async_rollouts` is off

    def _install_async_rollouts(self) -> None:
        """The per-run state and, on the main process, the replay of the vLLM client (after TRL built the client)."""
        if self.args.async_rollouts:
            self._rollouts = _Rollouts(self)

    def train(self, *args, **kwargs):
        try:
            return super().train(*args, **kwargs)
        finally:
            if self._rollouts is not None and self._rollouts.replay is not None:
                self._rollouts.replay.worker.drop()  # the server ends the request it is running; nothing uses it

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        state = self._rollouts
        if state is None or not state.staleness:
            return super().get_batch_samples(epoch_iterator, num_batches, device)
        if state.iterator is not epoch_iterator:  # a new epoch
            state.iterator, state.queue = epoch_iterator, deque()
        while len(state.queue) < num_batches + state.every:
            try:
                state.queue.append(next(epoch_iterator))
            except StopIteration:
                break
        batch = [state.queue.popleft() for _ in range(min(num_batches, len(state.queue)))]
        state.returned += len(batch)
        return batch, self._get_num_items_in_batch(batch, device)

    def _prepare_inputs(self, generation_batch):
        state = self._rollouts
        if state is not None and state.phase and self.model.training and self._step % state.every == state.phase:
            rows = self._rows_to_request()
            if rows is not None:  # the request samples from the policy of now: push it first
                waited, pushed = self._push_weights()
                state.unlogged = (state.unlogged[0] + waited, state.unlogged[1] + pushed)
                self._request_ahead(rows)
        return super()._prepare_inputs(generation_batch)

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        state = self._rollouts
        turn = (prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
        if state is None:
            return super()._generate_single_turn(*turn)
        waited, pushed = self._push_weights() if self.state.global_step != self._last_loaded_step else (0.0, 0.0)
        result = super()._generate_single_turn(*turn)  # TRL's: no push left to do; the request may be replayed
        if self.model.training:
            self._record_generation(waited, pushed)
            rows = self._rows_to_request() if state.phase == 0 else None
            if rows is not None:
                self._request_ahead(rows)
        return result

    def _tag_policy_version(self, output: dict) -> dict:
        """`output` (one scored generation batch) with `policy_version` per row (training, async only); checks the
        staleness bound and logs `async/staleness`."""
        state = self._rollouts
        if state is None or not self.model.training:
            return output
        lag = self.state.global_step - state.version
        if lag > self.args.max_staleness:
            raise RuntimeError(
                f"a batch sampled by policy {state.version} reached scoring at step {self.state.global_step}, "
                f"beyond max_staleness={self.args.max_staleness}"
            )
        rows = output["completion_ids"].size(0)
        output["policy_version"] = torch.full((rows,), state.version, dtype=torch.long, device=self.accelerator.device)
        self._metrics["train"]["async/staleness"].append(float(lag))
        return output

    def _push_weights(self) -> tuple[float, float]:
        """Wait until the server has answered the request in flight, then push the current policy (TRL's sync).

        Returns:
            `(waited, pushed)` seconds (main process; 0 elsewhere).
        """
        import time

        from trl.extras.profiling import profiling_context

        replay = self._rollouts.replay
        waited = replay.worker.wait() if replay is not None else 0.0
        started = time.perf_counter()
        with profiling_context(self, "sync_weights"):
            self.vllm_generation.sync_weights()
        self._last_loaded_step = self.state.global_step
        return waited, time.perf_counter() - started

    def _record_generation(self, waited: float, pushed: float) -> None:
        """Every process learns the version of the batch just generated (the main process's answer); metrics."""
        state = self._rollouts
        served = state.replay.served if state.replay is not None else None
        record = None
        if served is not None:
            record = (served.version, served.prefetched, served.generate_seconds, served.wait_seconds)
            record += (state.replay.discarded,)
        if self.accelerator.num_processes > 1:
            from accelerate.utils import broadcast_object_list

            box = [record]
            broadcast_object_list(box, from_process=0)
            record = box[0]
        if record is None:
            raise RuntimeError("async rollouts: the main process saw no completions request for this generation")
        version, prefetched, generated, answer_wait, dropped = record
        state.version = version
        # A push mid-batch (max_staleness < m) is counted with the next generation.
        waited, pushed = waited + state.unlogged[0], pushed + state.unlogged[1]
        state.unlogged = (0.0, 0.0)
        metrics = self._metrics["train"]
        metrics["async/prefetched"].append(float(prefetched))
        metrics["async/wait_seconds"].append(waited + answer_wait)
        metrics["async/generate_seconds"].append(generated)
        metrics["async/sync_seconds"].append(pushed)
        metrics["async/dropped"].append(float(dropped))

    def _rows_to_request(self) -> list | None:
        """This process's dataloader rows of the next generation batch, when it is to be requested now: read already
        (not past the epoch's end), not requested yet, and scored before the last step. The same on every process."""
        state = self._rollouts
        target = self._step - self._step % state.every + state.every  # the micro-step that will need it
        if state.requested == target:
            return None
        state.requested = target
        if self.state.global_step + state.staleness >= self.state.max_steps:
            return None  # it would be scored after the last step
        return state.lookahead(target)  # None past the epoch's end: generated on demand then

    def _request_ahead(self, rows: list) -> None:
        """Ask the server for the generation batch of `rows` in the background (main process). Every process
        tokenizes its rows as TRL does; the prompts are gathered to the main process (a collective)."""
        from accelerate.utils import gather_object

        state = self._rollouts
        prompts = copy.deepcopy([row["prompt"] for row in rows])
        prompt_ids, _, _ = self._tokenize_prompts(prompts)
        every_prompt = gather_object(prompt_ids) if self.accelerator.num_processes > 1 else list(prompt_ids)
        replay = state.replay
        if replay is None or replay.template is None:
            return
        client = self.vllm_generation.vllm_client
        dropped = replay.worker.drop()
        if dropped is not None:
            replay.discarded += 1
            logger.warning("async rollouts: a batch requested ahead was never asked for; dropped it")
        payload = next_payload(replay.template, every_prompt[:: self.num_generations])
        replay.worker.submit(f"{client.base_url}{COMPLETIONS_ENDPOINT}", payload, self._last_loaded_step)
