"""trl_ext.grpo.weight_sync.wire: the CPU weight transfer's wire, without vLLM (the real server:
test_vllm_server_sync).

Chunks computed by hand; a real gloo group of two ranks (two threads of this process, their own `TCPStore`, torch's
default group untouched) moves a model's tensors bit for bit, refuses a stream that is not the announced one, and
gives up within its timeout when the other side never comes.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch
from helpers import free_port

from trl_ext.grpo.weight_sync.wire import GlooLink, chunk_plan, pack, send_chunks, unpack


def test_chunk_plan_by_hand():
    # bytes: 4*10=40, 2*20=40, 8*3=24, 4*100=400, 4*1=4 with 64-byte chunks: [40] (40+40 > 64), [40, 24], [400]
    # alone (larger than a chunk), [4]
    dtypes = ["float32", "bfloat16", "int64", "float32", "float32"]
    shapes = [[10], [4, 5], [3], [10, 10], []]
    assert chunk_plan(dtypes, shapes, 64) == [range(0, 1), range(1, 3), range(3, 4), range(4, 5)]
    assert chunk_plan(dtypes, shapes, 10**6) == [range(0, 5)]
    assert chunk_plan([], [], 64) == []


def test_pack_and_unpack_round_trip_bit_for_bit():
    gen = torch.Generator().manual_seed(0)
    tensors = [
        torch.randn(3, 4, generator=gen),
        torch.randn(5, generator=gen).to(torch.bfloat16),
        torch.randint(-(2**40), 2**40, (2, 2), generator=gen),
        torch.tensor(1.5),  # 0-dim
        torch.randn(4, 6, generator=gen).t(),  # not contiguous
    ]
    names = [f"t{i}" for i in range(len(tensors))]
    dtypes = [str(t.dtype).removeprefix("torch.") for t in tensors]
    buffer = pack(tensors)
    assert buffer.dtype == torch.uint8 and buffer.numel() == sum(t.numel() * t.element_size() for t in tensors)
    out = unpack(buffer, names, dtypes, [list(t.shape) for t in tensors])
    assert [name for name, _ in out] == names
    for (_, got), ref in zip(out, tensors, strict=True):
        assert got.dtype == ref.dtype and got.shape == ref.shape and torch.equal(got, ref)
    with pytest.raises(ValueError, match="does not hold the"):
        unpack(buffer[:-1], names, dtypes, [list(t.shape) for t in tensors])


def _pair(timeout_s: float = 30.0):
    """Two ranks of one gloo group: (sender, receiver)."""
    port, links = free_port(), {}

    def join(rank):
        links[rank] = GlooLink("127.0.0.1", port, rank, 2, timeout_s, "127.0.0.1")

    threads = [threading.Thread(target=join, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return links[0], links[1]


def test_a_models_tensors_arrive_bit_for_bit_in_announced_chunks():
    from trl_ext.tiny import build_char_tokenizer, build_tiny_qwen3

    model = build_tiny_qwen3(build_char_tokenizer(), seed=1)
    named = [(name, param.detach()) for name, param in model.named_parameters()]
    names = [name for name, _ in named]
    dtypes = [str(t.dtype).removeprefix("torch.") for _, t in named]
    shapes = [list(t.shape) for _, t in named]
    plan = chunk_plan(dtypes, shapes, 20_000)  # several chunks
    assert 1 < len(plan) < len(names)
    sender, receiver = _pair()
    received = []

    def receive():
        for chunk in plan:
            part = slice(chunk.start, chunk.stop)
            nbytes = sum(named[i][1].numel() * named[i][1].element_size() for i in chunk)
            buffer = torch.empty(nbytes, dtype=torch.uint8)
            receiver.broadcast(buffer)
            received.extend(unpack(buffer, names[part], dtypes[part], shapes[part]))

    thread = threading.Thread(target=receive)
    thread.start()
    send_chunks(sender, iter(named), names, plan)
    thread.join()
    assert [name for name, _ in received] == names
    assert all(torch.equal(got, ref) for (_, got), (_, ref) in zip(received, named, strict=True))
    assert not torch.distributed.is_initialized()  # the default group was never touched
    sender.shutdown()
    receiver.shutdown()


def test_a_stream_that_differs_from_the_announcement_is_refused():
    """Checked before anything is sent, so the receiving side is not left waiting on a wrong-sized broadcast (it
    times out on its own)."""
    tensors = [("a", torch.zeros(2)), ("b", torch.ones(3))]
    plan = chunk_plan(["float32"] * 2, [[2], [3]], 1)
    with pytest.raises(RuntimeError, match="weight 0 is 'a' but 'x' was announced"):
        send_chunks(None, iter(tensors), ["x", "b"], plan)
    with pytest.raises(RuntimeError, match="ended after 0 of 2 announced"):
        send_chunks(None, iter([]), ["a", "b"], plan)


def test_a_missing_peer_fails_within_the_timeout_instead_of_hanging():
    start = time.monotonic()
    with pytest.raises(RuntimeError):
        GlooLink("127.0.0.1", free_port(), 0, 2, 2.0, "127.0.0.1")
    assert time.monotonic() - start < 30
