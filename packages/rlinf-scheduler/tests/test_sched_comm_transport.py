"""Payload encoding and shared-memory segments, in one process (no Ray)."""

from __future__ import annotations

import dataclasses
import gc
import os
from typing import Any

import numpy as np
import pytest
import torch
from rlinf_scheduler import _transport as tp
from rlinf_scheduler._channel import _batch_len


@dataclasses.dataclass
class Pair:
    a: torch.Tensor
    b: Any


def roundtrip_inline(obj: Any) -> Any:
    enc = tp.encode(obj)
    blob = tp.pack_inline(enc) if enc.specs else b""
    area = np.frombuffer(bytearray(blob), dtype=np.uint8) if enc.specs else None
    return tp.decode(enc.meta, enc.specs, area)


def test_arrays_are_referenced_not_pickled() -> None:
    t = torch.randn(1000, 100)
    enc = tp.encode({"t": t, "n": np.zeros(10), "x": [1, "a"]})
    assert len(enc.meta) < 1000  # 400 kB of tensor data is not in the pickle
    assert [s.kind for s in enc.specs] == ["torch", "numpy"]
    assert all(s.offset % 64 == 0 for s in enc.specs)
    assert enc.total >= t.numel() * 4 + 80


@pytest.mark.parametrize(
    "tensor",
    [
        torch.arange(10, dtype=torch.int64),
        torch.randn(3, 4, dtype=torch.bfloat16),
        torch.randn(3, 4, dtype=torch.float16).t(),
        torch.tensor([True, False]),
        torch.tensor(2.5),
        torch.empty(0, 3),
        torch.randn(2, 3, dtype=torch.complex64),
    ],
)
def test_tensor_dtypes_and_layouts(tensor: torch.Tensor) -> None:
    got = roundtrip_inline(Pair(tensor, {"k": [tensor]}))
    assert got.a.dtype == tensor.dtype and got.a.shape == tensor.shape
    assert torch.equal(got.a, tensor) and torch.equal(got.b["k"][0], tensor)


def test_numpy_object_arrays_and_plain_objects_are_pickled() -> None:
    obj = {"o": np.array([None, "x"], dtype=object), "s": {1, 2}, "f": lambda v: v * 2}
    got = roundtrip_inline(obj)
    assert list(got["o"]) == [None, "x"] and got["s"] == {1, 2} and got["f"](3) == 6


def test_shared_memory_arena_roundtrip_and_release() -> None:
    pool, cache = tp.SegmentPool(), tp.SegmentCache()
    try:
        t = torch.randn(300_000)
        enc = tp.encode({"t": t})
        area, (ref,) = pool.reserve(enc.total, 1)
        tp.write_buffers(enc, area)
        del area
        assert ref[0] == os.getpid() and pool.stats()["arenas"] == 1
        busy = pool.stats()["busy_chunks"]
        assert busy == -(-enc.total // (64 * 1024))
        got = tp.decode(enc.meta, enc.specs, cache.open(ref))["t"]
        assert torch.equal(got, t)
        got.mul_(2)  # writable, private to this message
        assert pool.stats()["busy_chunks"] == busy
        del got
        gc.collect()
        assert pool.stats()["busy_chunks"] == 0
        # The freed chunks are handed out again (first fit), in the same arena.
        _, (ref2,) = pool.reserve(enc.total, 1)
        assert ref2[2] == ref[2] and ref2[4] == ref[4]
    finally:
        cache.close()
        pool.close()


def test_dedicated_segment_for_broadcast_slots() -> None:
    pool, cache = tp.SegmentPool(), tp.SegmentCache()
    try:
        enc = tp.encode(np.arange(1000, dtype=np.float64))
        area, refs = pool.reserve(enc.total, 3)
        tp.write_buffers(enc, area)
        del area
        assert [r[6] for r in refs] == [0, 1, 2] and len({r[2] for r in refs}) == 1
        views = [tp.decode(enc.meta, enc.specs, cache.open(r)) for r in refs]
        assert all(np.array_equal(v, np.arange(1000)) for v in views)
        del views
        gc.collect()
        # All three receivers released it: the same segment serves the next broadcast.
        _, refs2 = pool.reserve(enc.total, 2)
        assert refs2[0][2] == refs[0][2]
    finally:
        cache.close()
        pool.close()


def test_read_and_release_for_remote_consumers() -> None:
    pool = tp.SegmentPool()
    try:
        enc = tp.encode(torch.arange(70_000, dtype=torch.int32))
        area, (ref,) = pool.reserve(enc.total, 1)
        tp.write_buffers(enc, area)
        del area
        data = pool.read_and_release(ref)
        assert data is not None and pool.stats()["busy_chunks"] == 0
        got = tp.decode(enc.meta, enc.specs, np.frombuffer(bytearray(data), dtype=np.uint8))
        assert torch.equal(got, torch.arange(70_000, dtype=torch.int32))
    finally:
        pool.close()


def test_get_batch_arithmetic() -> None:
    items = [(1.0, b""), (2.0, b""), (3.0, b"")]
    from collections import deque

    assert _batch_len(deque(items), 3) == 2  # 1 + 2 reaches 3
    assert _batch_len(deque(items), 2) == 1  # 1 + 2 would overshoot 2
    assert _batch_len(deque(items), 10) is None  # 6 < 10: wait for more
    assert _batch_len(deque([(5.0, b"")]), 4) == 0  # the head alone is too heavy


def test_channel_create_needs_a_ray_connection() -> None:
    import ray
    from rlinf_scheduler import Channel

    if ray.is_initialized():
        pytest.skip("another test of this process connected Ray")
    with pytest.raises(RuntimeError, match=r"Channel.create\('c'\): Ray is not connected"):
        Channel.create("c")


def test_a_message_whose_sender_is_gone_is_a_clear_error() -> None:
    cache = tp.SegmentCache()
    ref = (2**22 + 12345, 999, b"x" * 16, 1024, 0, 10, 0, 1)  # a pid that does not exist
    with pytest.raises(RuntimeError, match=r"the sender \(pid 4206649\) of this message exited"):
        cache.open(ref)
