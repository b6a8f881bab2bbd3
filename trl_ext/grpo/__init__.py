"""The GRPO trainer: `AblationGRPOConfig` and `AblationGRPOTrainer`, and the modules they are wired from.

Modules, one job each (top to bottom):

- `trainer`: `AblationGRPOTrainer`, the wiring of the three hooks (advantages, per-token loss, reduction) into TRL's
  `GRPOTrainer`;
- `config`: `AblationGRPOConfig` (TRL's `GRPOConfig` plus the axes and the seeds' batch vocabulary), resolved by
  `axes`;
- `sampling`: DAPO's dynamic sampling and the batch helpers (`loss_mask`, row trimming); `finished`: finished vs
  truncated completions; `packing`: padding-free rows; `fused_head`: the LM head at the completion tokens only;
- `vllm_sync`: the colocated weight sync on vLLM's CPU backend; `weight_transfer` (with `weight_transfer_engine`, the
  vLLM side, and `weight_transfer_client`, the trainer side): server-mode weight sync without CUDA, over gloo;
  `async_rollouts` (with `rollout_worker`): the next generation batch requested from the server while this one
  trains; `callbacks`: rollout samples to a JSONL file.

Light to import: TRL loads on first use of the two public names.
"""

from importlib import import_module

_LAZY = {
    "AblationGRPOConfig": "trl_ext.grpo.config",
    "AblationGRPOTrainer": "trl_ext.grpo.trainer",
}

__all__ = ["AblationGRPOConfig", "AblationGRPOTrainer"]


def __getattr__(name):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'trl_ext.grpo' has no attribute {name!r}")
