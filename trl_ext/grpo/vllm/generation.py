"""`TrlExtVLLMGeneration`: TRL's `VLLMGeneration` as trl_ext's trainers generate with it, and the one swap that makes
TRL's trainers build it.

TRL 1.16's `GRPOTrainer.__init__` builds its vLLM generation as `VLLMGeneration(...)`, looking the name up in
`trl.trainer.grpo_trainer` (`trl/trainer/grpo_trainer.py`, `if self.use_vllm:`). `vllm_generation_class()` makes that
name mean this subclass while a trainer's `__init__` runs: the one module global trl_ext swaps (docs/architecture.md).
The GRPO and expert-iteration trainers are built inside it; SFT validation builds the subclass itself; then each
ties it to its steps with `install_generation`.

The subclass's overrides, each chaining to TRL's method:

- `_init_vllm` (the engine's start): server mode: TRL's server branch with `TrlExtVLLMClient` (`client`: the gloo
  weight sync off CUDA, the replay of async rollouts, finish reasons) in place of TRL's `VLLMClient`, and on the main
  process a `Watchdog` shared with that client (`watchdog`); colocate: TRL's engine, held as a `RecordingEngine`
  (`finish_reasons`), with vLLM's eager sampler on its CPU platform (`cpu_sampler`);
- `sync_weights`: timed by the watchdog (server); on a colocated CPU engine vLLM's layerwise reload
  (`trl_ext.grpo.weight_sync.colocate.sync_weights_cpu`) in place of TRL's per-parameter load, which fails there;
- `_iter_named_params`: TRL's tensors, each reported to the watchdog as it is handed on (server);
- `generate`: TRL's, then vLLM's finish reason of each of this process's completions in `finish_reasons`.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager

from trl.generation.vllm_generation import VLLMGeneration
from trl.import_utils import is_vllm_available

from trl_ext.grpo.vllm.client import TrlExtVLLMClient
from trl_ext.grpo.vllm.cpu_sampler import fix_engine_sampler
from trl_ext.grpo.vllm.finish_reasons import FinishReasons, RecordingEngine, finish_reasons_of, share
from trl_ext.grpo.vllm.watchdog import Watchdog, watched
from trl_ext.grpo.weight_sync.colocate import sync_weights_cpu


class TrlExtVLLMGeneration(VLLMGeneration):
    """TRL's `VLLMGeneration` with the overrides of the module docstring; built with TRL's arguments.

    Attributes:
        watchdog: times every weight sync and generation request of a server (main process, server mode), else None.
        cpu_engine: the colocated engine runs on vLLM's CPU platform (its weight sync is vLLM's layerwise reload).
        finish_reasons: vLLM's word on this process's completions of the last `generate` call, or None.
    """

    def __init__(self, *args, **kwargs):
        self.watchdog: Watchdog | None = None
        self.cpu_engine = False
        self.finish_reasons: FinishReasons | None = None
        super().__init__(*args, **kwargs)  # TRL's: the settings, then `_init_vllm`

    def follow(self, step: Callable[[], int]) -> None:
        """The watchdog's messages name `step()`, the owner's optimizer step."""
        if self.watchdog is not None:
            self.watchdog.step = step

    def _init_vllm(self):
        if self.mode != "server":
            super()._init_vllm()
            self.llm = RecordingEngine(self.llm)
            from vllm.platforms import current_platform

            if current_platform.is_cpu():  # TRL builds the engine without a way to pass vLLM's sampler setting
                self.cpu_engine = True
                fix_engine_sampler(self.llm)
            return
        # TRL's server branch (`VLLMGeneration._init_vllm`), with our client (tests/test_trl_internals.py pins it).
        if not is_vllm_available():
            raise ImportError(
                "vLLM is not available and `use_vllm` is set to True. Please install vLLM with "
                "`pip install trl[vllm]` to use it."
            )
        accelerator = self.accelerator
        if accelerator.is_main_process:
            if self.server_base_url is not None:
                base_url = self.server_base_url
            else:
                base_url = f"http://{self.server_host}:{self.server_port}"
            self.vllm_client = TrlExtVLLMClient(
                base_url=base_url, group_port=self.group_port, connection_timeout=self.server_timeout
            )
            self.vllm_client.init_communicator(device=accelerator.device)
            self.watchdog = self.vllm_client.watchdog = Watchdog(self.server_timeout, step=lambda: 0)
        accelerator.wait_for_everyone()

    def sync_weights(self):
        with watched(self.watchdog, "weight sync"):
            if self.cpu_engine:
                sync_weights_cpu(self)
            else:
                super().sync_weights()

    def _iter_named_params(self):
        if self.watchdog is None:
            yield from super()._iter_named_params()
            return
        total = len(self._weight_metadata or []) or None  # known from the second sync on
        for index, (name, param) in enumerate(super()._iter_named_params()):
            self.watchdog.progress(name, index, total)
            yield name, param

    def generate(self, *args, **kwargs):
        source = getattr(self, "vllm_client", None) if self.mode == "server" else self.llm  # main process's client
        if source is not None:
            source.last_finish_reasons = None
        result = super().generate(*args, **kwargs)
        completion_ids = result[1]
        records = None if source is None else source.last_finish_reasons
        index = 0
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
        self.finish_reasons = finish_reasons_of(share(records, len(completion_ids), index), completion_ids)
        return result


@contextmanager
def vllm_generation_class(cls: type[VLLMGeneration] = TrlExtVLLMGeneration):
    """While the block runs (a TRL trainer's `__init__`), `trl.trainer.grpo_trainer` builds its vLLM generation as
    `cls`: the name `VLLMGeneration` it looks up there means `cls`. The one module global trl_ext swaps."""
    import trl.trainer.grpo_trainer as grpo_trainer

    trl_class = grpo_trainer.VLLMGeneration
    grpo_trainer.VLLMGeneration = cls
    try:
        yield
    finally:
        grpo_trainer.VLLMGeneration = trl_class


def install_generation(owner) -> None:
    """Tie `owner.vllm_generation` (a trainer's, None without vLLM) to `owner`: its watchdog names the owner's global
    step. For the GRPO and expert-iteration trainers after TRL's `__init__`, and SFT validation after building it.

    Raises:
        TypeError: the generation is TRL's own class: TRL no longer builds it by the name `vllm_generation_class`
            swaps, and none of the behaviours above would run.
    """
    generation = getattr(owner, "vllm_generation", None)
    if generation is None:
        return
    if not isinstance(generation, TrlExtVLLMGeneration):
        raise TypeError(
            f"{type(owner).__name__}.vllm_generation is a {type(generation).__name__}, not a TrlExtVLLMGeneration: "
            "trl.trainer.grpo_trainer no longer builds its vLLM generation by the name VLLMGeneration"
        )
    generation.follow(lambda: owner.state.global_step)
