"""In-training reporting: example rollouts with their rewards, written offline every few steps.

Periodic validation needs no code of ours: TRL's `GRPOTrainer` evaluates with the training reward functions when
the config has `eval_strategy="steps"`, `eval_steps=K` and the trainer an `eval_dataset`, logging `eval_reward`
and `eval_rewards/<func>/mean` (our rewards add `eval_rewards/<func>/format_reward` / `answer_reward`), which
`trl-ext plot` draws. `log_completions=True` prints a table of rollouts at each log and, with wandb, logs it as a
wandb table.

`RolloutSamplesCallback` keeps a plain-file record of the same rollouts, so a user without wandb sees them improve
over training: every `every_n_steps` optimizer steps it appends a few samples of the latest generation batch
(TRL's `trainer._logs`: prompt, completion, per-function rewards, advantage) to `<output_dir>/rollouts.jsonl`.

    trainer = AblationGRPOTrainer(...)
    trainer.add_callback(RolloutSamplesCallback(trainer, every_n_steps=10, num_samples=4))
"""

from __future__ import annotations

import json
import os

from transformers import TrainerCallback

__all__ = ["RolloutSamplesCallback", "read_rollouts"]


def _plain(value):
    """JSON-safe copy of a prompt / completion (plain text or chat messages)."""
    try:
        json.dumps(value)
        return value
    except TypeError:
        return str(value)


class RolloutSamplesCallback(TrainerCallback):
    """Append example rollouts of the latest generation batch to `<output_dir>/rollouts.jsonl`.

    Each line: `{"step", "index", "prompt", "completion", "rewards": {func: value}, "reward", "advantage"}`, where
    `reward` is the weighted sum TRL optimises (`reward_weights`) and `index` the sample's position in the batch.
    Samples are spread evenly over the batch so that several prompts (groups) show up.

    Args:
        trainer: the `GRPOTrainer` (or subclass) whose `_logs` to read; may be set later with `bind`.
        every_n_steps: write at global steps divisible by this.
        num_samples: rollouts per write.
        filename: file name inside `args.output_dir`.
    """

    def __init__(self, trainer=None, every_n_steps: int = 10, num_samples: int = 4, filename: str = "rollouts.jsonl"):
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1, got {every_n_steps}")
        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        self.trainer = trainer
        self.every_n_steps = every_n_steps
        self.num_samples = num_samples
        self.filename = filename

    def bind(self, trainer) -> RolloutSamplesCallback:
        """Attach to `trainer` (for callbacks built before the trainer)."""
        self.trainer = trainer
        return self

    def _snapshot(self) -> dict:
        logs = self.trainer._logs
        return {
            "prompt": list(logs["prompt"]),
            "completion": list(logs["completion"]),
            "rewards": {name: list(values) for name, values in logs["rewards"].items()},
            "advantages": list(logs["advantages"]),
        }

    def samples(self, step: int, snapshot: dict | None = None) -> list[dict]:
        """The rollouts to write at `step` from a snapshot of `trainer._logs` (default: the current one)."""
        snap = self._snapshot() if snapshot is None else snapshot
        prompts, completions, rewards, advantages = (
            snap["prompt"], snap["completion"], snap["rewards"], snap["advantages"]
        )  # fmt: skip
        if not completions:
            return []
        names = list(getattr(self.trainer, "reward_func_names", rewards))
        weights = getattr(self.trainer, "reward_weights", None)
        weights = [float(w) for w in weights] if weights is not None else [1.0] * len(names)
        total = len(completions)
        count = min(self.num_samples, total)
        picks = sorted({round(i * total / count) for i in range(count)})
        out = []
        for i in picks:
            per_func = {name: float(rewards[name][i]) for name in names if name in rewards}
            out.append(
                {
                    "step": step,
                    "index": i,
                    "prompt": _plain(prompts[i]),
                    "completion": _plain(completions[i]),
                    "rewards": per_func,
                    "reward": sum(w * per_func.get(n, 0.0) for n, w in zip(names, weights, strict=False)),
                    "advantage": float(advantages[i]) if i < len(advantages) else None,
                }
            )
        return out

    def on_evaluate(self, args, state, control, **kwargs):
        # TRL's evaluation generates into the same `_logs`; remember what it left there, so that a training step
        # that reuses its rollout batch (num_iterations > 1) does not report evaluation samples as training ones.
        if self.trainer is not None:
            self._eval_completions = list(self.trainer._logs["completion"])
        return control

    def on_step_end(self, args, state, control, **kwargs):
        if self.trainer is None or not state.is_world_process_zero:
            return control
        snapshot = self._snapshot()
        if snapshot["completion"] and snapshot["completion"] == getattr(self, "_eval_completions", None):
            snapshot = getattr(self, "_last_train", None)  # no training generation since the evaluation
        else:
            self._last_train, self._eval_completions = snapshot, None
        if snapshot is None or state.global_step % self.every_n_steps:
            return control
        rows = self.samples(state.global_step, snapshot)
        if rows:
            os.makedirs(args.output_dir, exist_ok=True)
            with open(os.path.join(args.output_dir, self.filename), "a", encoding="utf-8") as f:
                for row in rows:
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
        return control


def read_rollouts(path: str | os.PathLike) -> list[dict]:
    """The rows of a `rollouts.jsonl` file (or of `<run_dir>/rollouts.jsonl` when given a folder)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, "rollouts.jsonl")
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
