"""The wire of the CPU weight transfer: how the trainer's tensors travel to the vLLM server's workers over gloo.

TRL 1.16 syncs a vLLM server with vLLM's NCCL weight-transfer engine, which needs a CUDA device; on the CPU both sides
use this wire instead (`trl_ext.grpo.vllm.client`, the trainer's side; `trl_ext.grpo.weight_sync.engine`, each
vLLM worker's). The trainer is rank 0 of a `ProcessGroupGloo` built from a `TCPStore` it hosts on `vllm_group_port`
(the default group is never touched); each server worker is rank `1 + its rank`. Per sync the tensors are packed in
metadata order into uint8 chunks of at most `chunk_bytes` (one tensor per chunk when larger) and broadcast; both sides
cut the chunks from the same metadata (`chunk_plan`). Every wait is bounded by `timeout_s` (TRL's
`vllm_server_timeout`), so a server that is gone fails the trainer with its name, never a hang.

Light to import: torch loads where it is used.
"""

from __future__ import annotations

import datetime
import math
import socket
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# Bytes per broadcast: large enough that the per-call cost vanishes, small enough that the packed copy stays cheap.
CHUNK_BYTES = 64 * 2**20


def dtype_of(name: str) -> torch.dtype:
    """`"float32"` -> `torch.float32` (vLLM's update info names dtypes without the `torch.` prefix)."""
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown tensor dtype {name!r} in a weight update")
    return dtype


def nbytes(dtype_name: str, shape: Sequence[int]) -> int:
    return math.prod(shape) * dtype_of(dtype_name).itemsize


def chunk_plan(dtype_names: Sequence[str], shapes: Sequence[Sequence[int]], chunk_bytes: int) -> list[range]:
    """Consecutive index ranges of the tensors, each range one broadcast of at most `chunk_bytes` (a larger tensor
    gets a chunk of its own). Both sides compute it from the same metadata, so they cut the stream alike."""
    chunks: list[range] = []
    start, size = 0, 0
    for i, (dtype_name, shape) in enumerate(zip(dtype_names, shapes, strict=True)):
        n = nbytes(dtype_name, shape)
        if i > start and size + n > chunk_bytes:
            chunks.append(range(start, i))
            start, size = i, 0
        size += n
    if start < len(shapes):
        chunks.append(range(start, len(shapes)))
    return chunks


def pack(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The tensors' bytes, in order, as one uint8 CPU tensor `(sum of nbytes,)`."""
    import torch

    flat = [t.detach().to("cpu").contiguous().view(-1).view(torch.uint8) for t in tensors]
    return flat[0].clone() if len(flat) == 1 else torch.cat(flat)


def unpack(
    buffer: torch.Tensor, names: Sequence[str], dtype_names: Sequence[str], shapes: Sequence[Sequence[int]]
) -> list[tuple[str, torch.Tensor]]:
    """`(name, tensor)` views into `buffer` `(bytes,)`, the inverse of `pack`."""
    sizes = [nbytes(d, s) for d, s in zip(dtype_names, shapes, strict=True)]
    if sum(sizes) != buffer.numel():
        raise ValueError(f"a weight chunk of {buffer.numel()} bytes does not hold the {sum(sizes)} bytes announced")
    out = []
    for name, d, shape, part in zip(names, dtype_names, shapes, buffer.split(sizes), strict=True):
        dtype = dtype_of(d)
        if part.storage_offset() % dtype.itemsize:  # after a tensor of a smaller dtype: copy to an aligned one
            part = part.clone()
        out.append((name, part.view(dtype).view(tuple(shape))))
    return out


def local_address_towards(host: str) -> str:
    """This machine's address on the route to `host` (a UDP connect sends nothing): `127.0.0.1` for a server on
    loopback, the interface's address otherwise."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((host, 9))
        return probe.getsockname()[0]


class GlooLink:
    """A gloo process group of its own (torch's default group is never touched) and the `TCPStore` it met through.

    Rank 0 hosts the store on `master_port`; every rank's gloo device binds `bind_address`; every wait is bounded by
    `timeout_s`.

    Raises:
        RuntimeError: the rendezvous did not complete within `timeout_s` (torch's message).
    """

    def __init__(
        self, master_address: str, master_port: int, rank: int, world_size: int, timeout_s: float, bind_address: str
    ):
        from torch.distributed import ProcessGroupGloo, TCPStore

        self.timeout = datetime.timedelta(seconds=timeout_s)
        # The store outlives the rendezvous: gloo's connections were set up through it.
        self.store = TCPStore(
            master_address, master_port, world_size, rank == 0, timeout=self.timeout, wait_for_workers=False
        )
        options = ProcessGroupGloo._Options()
        options._devices = [ProcessGroupGloo.create_device(hostname=bind_address)]
        options._timeout = self.timeout
        self.group = ProcessGroupGloo(self.store, rank, world_size, options)

    def broadcast(self, buffer: torch.Tensor) -> None:
        """`buffer` from rank 0 to every rank, in place."""
        self.group.broadcast(buffer, 0).wait(self.timeout)

    def shutdown(self) -> None:
        try:
            self.group.shutdown()
        except RuntimeError:
            pass  # a peer already gone


def send_chunks(
    link: GlooLink, named_tensors: Iterator[tuple[str, torch.Tensor]], names: Sequence[str], plan: Sequence[range]
) -> None:
    """Broadcast the tensors of `named_tensors` chunk by chunk (`plan`), checking they come as `names` announced.

    Raises:
        RuntimeError: the iterator yields another name, fewer or more tensors than announced.
    """
    iterator = iter(named_tensors)
    for chunk in plan:
        tensors = []
        for i in chunk:
            try:
                name, tensor = next(iterator)
            except StopIteration:
                raise RuntimeError(f"the weights ended after {i} of {len(names)} announced tensors") from None
            if name != names[i]:
                raise RuntimeError(f"weight {i} is {name!r} but {names[i]!r} was announced")
            tensors.append(tensor)
        link.broadcast(pack(tensors))
    if next(iterator, None) is not None:
        raise RuntimeError(f"more weights than the {len(names)} announced")
