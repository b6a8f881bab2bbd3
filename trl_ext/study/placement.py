"""Where each run of a study goes on one node (pure): disjoint GPU sets, or disjoint cores without a GPU, and ports
no two runs share.

`pack` hands the node's GPUs (or cores) to the runs in order, first fit, as many at once as fit; a run waits for an
earlier one to end when none is left. `waves` simulates that with runs of equal length, which is what `--dry-run`
prints. Ports: the launcher picks a free server port when it plans a launch, but two launches planned at the same
moment see the same free port, so the study states each run's ports itself, from the run's index: server
`8000 + 10 i`, weight-sync group `51216 + 10 i`, torch rendezvous `29500 + 10 i`.
"""

from __future__ import annotations

from collections.abc import Sequence

SERVER_PORT_BASE = 8000
GROUP_PORT_BASE = 51216
RENDEZVOUS_PORT_BASE = 29500
PORT_STRIDE = 10


def ports(index: int) -> dict[str, int]:
    """The ports of the study's `index`-th run (module docstring)."""
    offset = PORT_STRIDE * index
    return {
        "vllm_server_port": SERVER_PORT_BASE + offset,
        "vllm_group_port": GROUP_PORT_BASE + offset,
        "main_process_port": RENDEZVOUS_PORT_BASE + offset,
    }


def take(free: Sequence, need: int) -> list | None:
    """The first `need` of `free` (in the node's order), or None when fewer are free."""
    if need > len(free):
        return None
    return list(free)[:need]


def waves(units: Sequence, needs: Sequence[int]) -> list[tuple[int, list]]:
    """`(wave, units)` per run: runs of equal length placed first fit in order; wave w starts when wave w-1 ends.

    Raises:
        ValueError: a run needs more units than the node has.
    """
    out: list[tuple[int, list]] = []
    free, wave = list(units), 0
    for i, need in enumerate(needs):
        if need > len(units):
            raise ValueError(f"run {i} needs {need} of the node's {len(units)}")
        got = take(free, need)
        if got is None:
            wave, free = wave + 1, list(units)
            got = take(free, need)
        free = [u for u in free if u not in got]
        out.append((wave, got))
    return out
