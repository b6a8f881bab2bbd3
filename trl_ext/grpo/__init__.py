"""The GRPO trainer: `AblationGRPOConfig` and `AblationGRPOTrainer`, and the modules they are wired from.

Modules, one job each (docs/architecture.md has the table and the way through the trainer):

- `trainer`: `AblationGRPOTrainer`, the wiring of the three hooks (advantages, per-token loss, reduction) into TRL's
  `GRPOTrainer`, and the one place the generation side's behaviours are installed, in an order it states;
- `config`: `AblationGRPOConfig` (TRL's `GRPOConfig` plus the axes and the courses' batch vocabulary), resolved by
  `axes`;
- the loss side: `rows` (a batch's per-completion entries, the loss mask), `packing` (padding-free rows),
  `fused_head` (the LM head at the completion tokens only); `callbacks`: rollout samples to a JSONL file;
- `rollouts/`, what shapes a generation batch: `dynamic_sampling` (DAPO's), `finished` (finished vs truncated
  completions, by vLLM's finish reasons), `async_rollouts` (the next generation batch requested from the server while
  this one trains);
- `vllm/`, the integration with vLLM through TRL's own classes: `TrlExtVLLMGeneration` and `TrlExtVLLMClient`
  (subclasses of TRL's `VLLMGeneration` and `VLLMClient`), the one swap that makes TRL's trainers build them, the
  replay of async rollouts, finish reasons, the watchdog and the CPU engine's sampler;
- `weight_sync/`, the trainer's weights into vLLM where TRL's sync cannot reach: `colocate` (a colocated engine on
  vLLM's CPU backend) and the CPU transfer to a server over gloo: `plugin` (its name, flags and vLLM entry point),
  `wire`, `engine` (the vLLM worker's side; the trainer's side is `vllm.client`);
- `deepspeed_comm`: DeepSpeed's communication layer on CPU processes, joined when the trainer is built.

Light to import: TRL loads on first use of the two public names.
"""

from trl_ext.lazy import lazy_names

_LAZY = {
    "AblationGRPOConfig": "trl_ext.grpo.config",
    "AblationGRPOTrainer": "trl_ext.grpo.trainer",
}

__all__ = ["AblationGRPOConfig", "AblationGRPOTrainer"]


__getattr__ = lazy_names(__name__, _LAZY)
