"""DeepSpeed's communication layer on CPU processes, started where the trainer first needs it.

Under an accelerate DeepSpeed config on CPU processes (`accelerate_configs/cpu_zero2.yaml` / `cpu_zero3.yaml`),
accelerate's `PartialState(cpu=True)` (what `TrainingArguments` builds whenever `use_cpu` or `ACCELERATE_USE_CPU` is
set) initialises `torch.distributed` itself and skips `deepspeed.comm.init_distributed`, which it calls on GPUs.
Until the first `deepspeed.initialize`, every `DeepSpeedConfig` then reads a world size of 1 (its
`dist.get_world_size()` fails and falls back): ZeRO-3's `zero.Init` in a `from_pretrained` (TRL's reference model in
`GRPOTrainer.__init__`, any model loaded after the trainer is built) checks the `train_batch_size` transformers
filled for all processes against one, and DeepSpeed's batch assertion stops the run (`train_batch_size 16 != 8 * 1 *
1`). `AblationGRPOTrainer.__init__` calls `join_deepspeed_comm` first, before TRL's `__init__` loads any model: the
first use of the process group by DeepSpeed.

DeepSpeed's CPU backend would also JIT-compile its shared-memory all-reduce (`deepspeed_shm_comm`, two C++ files:
1.5 to 3 minutes of g++ on a 2-core CPU, again for every new environment) as its communication layer starts. Only
`deepspeed.comm.inference_all_reduce` (DeepSpeed inference's tensor parallelism) uses it, and that falls back to the
process group's `all_reduce` without it; ZeRO training's collectives are torch.distributed's, over gloo. DeepSpeed's
`TorchBackend.__init__` builds it unconditionally (`build_shm_op()`, a function of `deepspeed.comm.torch`), with no
setting to skip it, so that name means "no op" for the duration of `init_distributed`: a scoped exception listed in
docs/architecture.md. (The other door, marking the op incompatible in `deepspeed.ops.__compatible_ops__`, runs
DeepSpeed's probe of every op first, about 0.5 CPU s per process, and stays changed for the process.)
"""

from __future__ import annotations

import importlib
import os
from contextlib import contextmanager


@contextmanager
def _without_shm_build():
    """While the block runs, DeepSpeed's `deepspeed.comm.torch.build_shm_op` builds nothing (module docstring)."""
    backend = importlib.import_module("deepspeed.comm.torch")  # `deepspeed.comm.torch` is torch itself
    build_shm_op = backend.build_shm_op
    backend.build_shm_op = lambda: None
    try:
        yield
    finally:
        backend.build_shm_op = build_shm_op


def join_deepspeed_comm() -> None:
    """Point DeepSpeed's communication layer at the process group the training arguments set up, without building its
    shared-memory all-reduce (module docstring). A no-op on GPUs (accelerate does it there), without DeepSpeed, outside
    a launch, or once the layer runs."""
    import torch.distributed

    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() != "true" or not torch.distributed.is_initialized():
        return
    from deepspeed import comm

    if comm.is_initialized():
        return
    with _without_shm_build():
        comm.init_distributed(dist_backend=torch.distributed.get_backend(), dist_init_required=False)
