"""The vLLM-worker side of the CPU weight transfer (`trl_ext.grpo.vllm.client` describes both sides): a
weight-transfer engine that receives the trainer's tensors over gloo and loads them into the CPU engine's model.

Loaded by vLLM's `WeightTransferEngineFactory` in a server started with
`--weight-transfer-config '{"backend": "trl_ext_gloo"}'` (registered by our `vllm.general_plugins` entry point);
the worker's `init_weight_transfer_engine` / `start_weight_update` / `update_weights` / `finish_weight_update`
(`vllm/v1/worker/gpu_worker.py`, inherited by the CPU worker) call it for the HTTP endpoints of the same names.

Loading, as vLLM's NCCL engine does, through the layerwise reload (`vllm.model_executor.model_loader.reload`): the
CPU backend repacks each linear layer for its kernels and replaces `layer.weight` (see
`trl_ext.grpo.weight_sync.colocate`), so per-parameter `load_weights` has nothing to load into, while the layerwise
reload restores each layer, loads it and runs `process_weights_after_loading` again. Then the layers that kept their
weight but pack a copy of it (a tied LM head) are repacked from the updated weight.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from trl_ext.grpo.weight_sync.colocate import repack_kept_weight_layers
from trl_ext.grpo.weight_sync.wire import (
    CHUNK_BYTES,
    GlooLink,
    chunk_plan,
    local_address_towards,
    nbytes,
    unpack,
)


@dataclass
class GlooInitInfo(WeightTransferInitInfo):
    """What `/init_weight_transfer_engine` carries: the trainer's rendezvous and the wire's parameters."""

    master_address: str
    master_port: int
    world_size: int
    rank_offset: int = 1
    chunk_bytes: int = CHUNK_BYTES
    timeout_s: float = 240.0


@dataclass
class GlooUpdateInfo(WeightTransferUpdateInfo):
    """What `/update_weights` carries: the tensors about to be broadcast, in order."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]

    def __post_init__(self):
        if not len(self.names) == len(self.dtype_names) == len(self.shapes):
            raise ValueError(
                f"a weight update needs one dtype and one shape per name: {len(self.names)} names, "
                f"{len(self.dtype_names)} dtypes, {len(self.shapes)} shapes"
            )


class GlooWeightTransferEngine(WeightTransferEngine[GlooInitInfo, GlooUpdateInfo]):
    """Receives checkpoint-format weights broadcast by the trainer (rank 0) over a gloo group and loads them with
    vLLM's layerwise reload; repacks the layers that kept their weight (tied LM head) at the end of each update."""

    init_info_cls = GlooInitInfo
    update_info_cls = GlooUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config, vllm_config, device: torch.device, model: torch.nn.Module) -> None:
        super().__init__(config, vllm_config, device, model)
        self.link: GlooLink | None = None
        self.info: GlooInitInfo | None = None

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        """Joins the trainer's group as rank `rank_offset + worker rank` (a trainer that starts again replaces the
        group of the one before)."""
        self.shutdown()
        parallel = self.parallel_config
        worker = parallel.data_parallel_index * parallel.world_size + parallel.rank
        bind = local_address_towards(init_info.master_address)
        self.link = GlooLink(
            init_info.master_address,
            init_info.master_port,
            init_info.rank_offset + worker,
            init_info.world_size,
            init_info.timeout_s,
            bind,
        )
        self.info = init_info

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def update_weights(self, update_info: dict) -> None:
        # The base class ends with `torch.accelerator.synchronize()`; gloo on the CPU has nothing to synchronize.
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: GlooUpdateInfo) -> None:
        if self.link is None or self.info is None:
            raise RuntimeError(f"{type(self).__name__}: /init_weight_transfer_engine was not called")
        from vllm.model_executor.model_loader.mtp_validation import disable_mtp_completeness_check

        names, dtypes, shapes = update_info.names, update_info.dtype_names, update_info.shapes
        with disable_mtp_completeness_check():
            for chunk in chunk_plan(dtypes, shapes, self.info.chunk_bytes):
                part = slice(chunk.start, chunk.stop)
                # A fresh buffer per chunk: the layerwise reload keeps views of it until the layer is complete.
                buffer = torch.empty(sum(nbytes(dtypes[i], shapes[i]) for i in chunk), dtype=torch.uint8)
                self.link.broadcast(buffer)
                self.model.load_weights(unpack(buffer, names[part], dtypes[part], shapes[part]))

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)
        repack_kept_weight_layers(self.model)

    def shutdown(self) -> None:
        if self.link is not None:
            self.link.shutdown()
            self.link = None
