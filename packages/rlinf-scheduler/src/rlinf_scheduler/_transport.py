"""Payload encoding and the same-node shared-memory transport.

A payload (any picklable object) is split into a small pickled *skeleton* and a list of raw *buffers*: every
CPU/GPU ``torch.Tensor`` and every non-object ``numpy.ndarray`` inside it (at any nesting depth: lists, dicts,
dataclasses, ...) is replaced by a reference to a buffer. Buffers are then moved by a transport:

- inline: packed into one ``bytes`` object that travels inside the Ray control message (small payloads);
- shared memory: written once into a pooled ``memfd`` segment of the sender; the receiver maps the segment
  and gets tensors that *view* it (no receive-side copy). When the receiver drops the last tensor of a
  message, the segment returns to the sender's pool, so a steady stream reuses already-faulted pages;
- gloo: packed into one staging tensor sent over a per-pair ``torch.distributed`` group (``_transport_gloo``).

The bytes of large CUDA tensors may instead travel by a GPU transport (``_transport_cuda``): ``split_device``
marks their specs, which then take no room in the packed area, and ``decode`` takes them as device buffers.

torch is imported only when a payload contains tensors (``sys.modules`` check) or a tensor must be built.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import pickle
import sys
import threading
import uuid
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import cloudpickle
import numpy as np

__all__: list[str] = []

_ALIGN = 64
#: Bytes at the start of every shared-memory segment: [0:16] segment id, [16] retired flag,
#: [64:HEADER] one busy byte per receiver slot (broadcast uses one slot per same-node receiver).
_HEADER = 4096
_MAX_SLOTS = _HEADER - 64
#: Payloads whose buffers total fewer bytes than this travel inline in the control message.
INLINE_LIMIT = 256 * 1024
#: The sender keeps at most this many *free* bytes cached in its segment pool.
_POOL_FREE_BYTES = 1 << 29


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


@dataclass(frozen=True)
class BufferSpec:
    """Where one array of a payload lives in the packed buffer area.

    Attributes:
        kind: ``"torch"``, ``"param"`` (``torch.nn.Parameter``) or ``"numpy"``.
        dtype: dtype name (``"float32"``, ``"bfloat16"``, ...).
        shape: the array shape.
        offset: byte offset of the data in the packed area (64-byte aligned).
        nbytes: number of data bytes.
        device: ``"cpu"`` or the source device (``"cuda:0"``); GPU tensors arrive on the same kind of device.
        requires_grad: restored on the received tensor.
        transport: ``"host"`` (the bytes are in the packed area at ``offset``), ``"ipc"`` or ``"nccl"`` (a CUDA
            tensor whose bytes travel by that GPU transport; ``offset`` is unused).
    """

    kind: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    device: str = "cpu"
    requires_grad: bool = False
    transport: str = "host"


@dataclass
class Encoded:
    """A payload split into a pickled skeleton and the arrays it references.

    Attributes:
        meta: pickled skeleton (protocol 5, cloudpickle for lambdas/local classes).
        specs: one ``BufferSpec`` per array, in reference order.
        sources: the source arrays (contiguous ``torch.Tensor`` or ``numpy.ndarray``), aligned with ``specs``.
        total: bytes needed for the packed buffer area.
    """

    meta: bytes
    specs: list[BufferSpec]
    sources: list[Any]
    total: int


class _Pickler(cloudpickle.CloudPickler):  # type: ignore[misc]  # cloudpickle has no type information: the base class is Any
    def __init__(self, file: io.BytesIO, out: Encoded) -> None:
        super().__init__(file, protocol=5)
        self._out = out
        torch = sys.modules.get("torch")
        self._tensor_types: tuple[type, ...] = (torch.Tensor, torch.nn.Parameter) if torch is not None else ()

    def _add(self, spec_kw: dict[str, Any], src: Any, nbytes: int) -> int:
        out = self._out
        offset = out.total
        out.specs.append(BufferSpec(offset=offset, nbytes=nbytes, **spec_kw))
        out.sources.append(src)
        out.total = _align(offset + nbytes)
        return len(out.specs) - 1

    def persistent_id(self, obj: Any) -> Any:
        t = type(obj)
        if t is np.ndarray and not obj.dtype.hasobject:
            arr = np.ascontiguousarray(obj)
            np_kw: dict[str, Any] = {"kind": "numpy", "dtype": arr.dtype.str, "shape": tuple(arr.shape)}
            return ("rlinf-buf", self._add(np_kw, arr, arr.nbytes))
        if t in self._tensor_types:
            if obj.layout != sys.modules["torch"].strided or obj.is_quantized or obj.is_meta:
                return None  # rare layouts: let torch pickle them itself
            ten = obj.detach()
            if not ten.is_contiguous():
                ten = ten.contiguous()
            kw: dict[str, Any] = {
                "kind": "param" if t is not self._tensor_types[0] else "torch",
                "dtype": str(ten.dtype).removeprefix("torch."),
                "shape": tuple(ten.shape),
                "device": str(ten.device),
                "requires_grad": bool(obj.requires_grad),
            }
            return ("rlinf-buf", self._add(kw, ten, ten.numel() * ten.element_size()))
        return None


def encode(obj: Any) -> Encoded:
    """Split ``obj`` into a pickled skeleton and the arrays it contains.

    Args:
        obj: any picklable object; tensors and numpy arrays inside it are not pickled but referenced.

    Returns:
        The ``Encoded`` payload; nothing has been copied yet except non-contiguous arrays.
    """
    out = Encoded(b"", [], [], 0)
    f = io.BytesIO()
    _Pickler(f, out).dump(obj)
    out.meta = f.getvalue()
    return out


def cuda_indices(enc: Encoded) -> list[int]:
    """Indices (into ``enc.specs``) of the non-empty CUDA tensors of ``enc``."""
    return [i for i, s in enumerate(enc.specs) if s.nbytes and s.device.startswith("cuda")]


def split_device(enc: Encoded, indices: Sequence[int], transport: str) -> Encoded:
    """A copy of ``enc`` whose arrays at ``indices`` travel by the GPU transport ``transport``.

    The other arrays are laid out again from the start of the packed area, so ``total`` counts only them.

    Args:
        enc: the encoded payload.
        indices: spec indices of CUDA tensors (see ``cuda_indices``).
        transport: ``"ipc"`` or ``"nccl"``.

    Returns:
        The new ``Encoded`` (same skeleton and sources).
    """
    if transport not in ("ipc", "nccl"):
        raise ValueError(f"transport must be 'ipc' or 'nccl', got {transport!r}")
    moved = set(indices)
    out = Encoded(enc.meta, [], enc.sources, 0)
    for i, spec in enumerate(enc.specs):
        if i in moved:
            if not spec.device.startswith("cuda"):
                raise ValueError(f"spec {i} is on {spec.device!r}, not a CUDA device")
            out.specs.append(replace(spec, offset=0, transport=transport))
        else:
            out.specs.append(replace(spec, offset=out.total))
            out.total = _align(out.total + spec.nbytes)
    return out


def write_buffers(enc: Encoded, dst: np.ndarray) -> None:
    """Copy every host-transported source array of ``enc`` into ``dst`` at its spec offset.

    Args:
        enc: the encoded payload.
        dst: a writable ``[>= enc.total]`` uint8 numpy array.
    """
    torch = sys.modules.get("torch")
    for spec, src in zip(enc.specs, enc.sources, strict=True):
        if spec.nbytes == 0 or spec.transport != "host":
            continue
        window = dst[spec.offset : spec.offset + spec.nbytes]
        if isinstance(src, np.ndarray):
            window[...] = src.reshape(-1).view(np.uint8)
        else:  # torch.Tensor: torch copies large buffers with several threads, and from GPU memory
            assert torch is not None
            flat = src.reshape(-1)
            if flat.dtype != torch.uint8:
                flat = flat.view(torch.uint8)
            torch.from_numpy(window).copy_(flat)


def pack_inline(enc: Encoded) -> bytes:
    """Pack the buffers of a small payload into one ``bytes`` object."""
    area = np.empty(enc.total, dtype=np.uint8)
    write_buffers(enc, area)
    return area.tobytes()


def _torch_dtype(name: str) -> Any:
    torch = sys.modules.get("torch")
    if torch is None:
        import torch  # a tensor payload arrived: the receiver needs torch to rebuild it
    return getattr(torch, name)


def _build(spec: BufferSpec, area: np.ndarray | None, device_buffer: Any = None) -> Any:
    if device_buffer is not None:  # ``[nbytes]`` uint8 tensor already on its CUDA device
        ten = device_buffer.view(_torch_dtype(spec.dtype)).reshape(spec.shape)
        return _finish(spec, ten)
    if area is None:
        raise pickle.UnpicklingError("a payload array arrived without its buffer area")
    raw = area[spec.offset : spec.offset + spec.nbytes]
    if spec.kind == "numpy":
        return raw.view(np.dtype(spec.dtype)).reshape(spec.shape)
    dtype = _torch_dtype(spec.dtype)
    torch = sys.modules["torch"]
    if spec.nbytes == 0:
        ten = torch.empty(spec.shape, dtype=dtype)
    else:
        ten = torch.from_numpy(raw).view(dtype).reshape(spec.shape)
    if spec.device != "cpu":
        dev = torch.device(spec.device)
        if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
            dev = torch.device("cuda")  # same kind of device; the index does not exist in this process
        ten = ten.to(dev)
    return _finish(spec, ten)


def _finish(spec: BufferSpec, ten: Any) -> Any:
    torch = sys.modules["torch"]
    if spec.kind == "param":
        return torch.nn.Parameter(ten, requires_grad=spec.requires_grad)
    if spec.requires_grad:
        ten.requires_grad_(True)
    return ten


class _Unpickler(pickle.Unpickler):
    def __init__(
        self,
        data: bytes,
        specs: list[BufferSpec],
        area: np.ndarray | None,
        device_buffers: Mapping[int, Any],
    ) -> None:
        super().__init__(io.BytesIO(data))
        self._specs = specs
        self._area = area
        self._device_buffers = device_buffers

    def persistent_load(self, pid: Any) -> Any:
        tag, index = pid
        if tag != "rlinf-buf":
            raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")
        spec = self._specs[index]
        if spec.transport != "host":
            return _build(spec, None, self._device_buffers[index])
        return _build(spec, self._area)


def decode(
    meta: bytes,
    specs: list[BufferSpec],
    area: np.ndarray | None,
    device_buffers: Mapping[int, Any] | None = None,
) -> Any:
    """Rebuild a payload; arrays become views of ``area`` (a 1-D ``uint8`` array that must stay valid).

    Args:
        meta: the pickled skeleton from ``encode``.
        specs: its buffer specs.
        area: the packed buffer area (``[total]`` uint8), or ``None`` if there are no host buffers.
        device_buffers: ``{spec index: [nbytes] uint8 CUDA tensor}`` for the specs whose ``transport`` is not
            ``"host"``; the tensors are viewed, not copied.

    Returns:
        The payload object.
    """
    return _Unpickler(meta, specs, area, device_buffers or {}).load()


# --------------------------------------------------------------------------------------------------------
# Shared-memory segments
#
# Two kinds of segments, both memfd files that a receiver opens through /proc/<sender pid>/fd/<fd>:
# - arenas (sparse, _ARENA_CHUNKS chunks of _CHUNK bytes): a message for one receiver takes a run of chunks,
#   one busy byte per chunk in the header. Arenas are mapped once by each receiver and their pages stay
#   faulted in, so a stream of messages costs one memcpy each, not page faults and mmap calls;
# - dedicated segments for big messages and same-node broadcasts: one busy byte per receiver.
# A reference to a message's bytes is the tuple ``ShmRef``.

_CHUNK = 64 * 1024
_ARENA_CHUNKS = _MAX_SLOTS
_ARENA_MAX_ITEM = 16 * 1024 * 1024
_MAX_ARENAS = 8

#: (sender pid, fd, segment id, capacity, offset, nbytes, first busy byte, number of busy bytes)
ShmRef = tuple[int, int, bytes, int, int, int, int, int]


@dataclass
class _Segment:
    seg_id: bytes
    fd: int
    mm: mmap.mmap
    capacity: int
    header: np.ndarray  # uint8 view of the first _HEADER bytes
    area: np.ndarray  # uint8 view of the data area
    arena: bool = False
    nslots: int = 0

    def busy(self, start: int, count: int) -> bool:
        return self.mm[64 + start : 64 + start + count].count(0) != count


class SegmentPool:
    """Sender-side pool of shared-memory segments (``memfd``, never a named file: nothing leaks on a crash).

    A receiver clears the busy bytes of a message when its last array is garbage-collected, which makes the
    space reusable.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._segments: list[_Segment] = []
        self._arenas: list[_Segment] = []
        self.pid = os.getpid()

    def reserve(self, nbytes: int, nreceivers: int) -> tuple[np.ndarray, list[ShmRef]]:
        """Reserve ``nbytes`` for ``nreceivers`` receivers.

        Returns:
            The ``[nbytes]`` uint8 area to write the message into, and one ``ShmRef`` per receiver.
        """
        if not 1 <= nreceivers <= _MAX_SLOTS:
            raise ValueError(f"nreceivers must be in [1, {_MAX_SLOTS}], got {nreceivers}")
        with self._lock:
            if nreceivers == 1 and nbytes <= _ARENA_MAX_ITEM:
                span = self._arena_span(nbytes)
                if span is not None:
                    seg, start, count = span
                    offset = start * _CHUNK
                    ref = (self.pid, seg.fd, seg.seg_id, seg.capacity, offset, nbytes, start, count)
                    return seg.area[offset : offset + nbytes], [ref]
            seg = self._dedicated(nbytes, nreceivers)
            refs = [(self.pid, seg.fd, seg.seg_id, seg.capacity, 0, nbytes, i, 1) for i in range(nreceivers)]
            return seg.area[:nbytes], refs

    def _arena_span(self, nbytes: int) -> tuple[_Segment, int, int] | None:
        count = max(1, -(-nbytes // _CHUNK))
        want = bytes(count)
        for seg in self._arenas:
            start = seg.mm[64 : 64 + _ARENA_CHUNKS].find(want)
            if start >= 0:
                seg.header[64 + start : 64 + start + count] = 1
                return seg, start, count
        if len(self._arenas) >= _MAX_ARENAS:
            return None
        seg = self._create(_ARENA_CHUNKS * _CHUNK)
        seg.arena = True
        self._arenas.append(seg)
        seg.header[64 : 64 + count] = 1
        return seg, 0, count

    def _dedicated(self, nbytes: int, nslots: int) -> _Segment:
        best = None
        for seg in self._segments:
            fits = nbytes <= seg.capacity <= 4 * max(nbytes, 1 << 20)
            if fits and not seg.busy(0, seg.nslots) and (best is None or seg.capacity < best.capacity):
                best = seg
        if best is None:
            best = self._create(max(_align(nbytes), 1 << 16))
            self._segments.append(best)
        best.header[64 : 64 + nslots] = 1
        best.nslots = nslots
        self._trim()
        return best

    def read_and_release(self, ref: ShmRef) -> bytes | None:
        """Copy a message's bytes out (for a receiver on another node) and mark them free; None if gone."""
        _, _, seg_id, _, offset, nbytes, start, count = ref
        with self._lock:
            seg = next((s for s in self._arenas + self._segments if s.seg_id == seg_id), None)
            if seg is None:
                return None
            data = bytes(seg.area[offset : offset + nbytes])
            seg.header[64 + start : 64 + start + count] = 0
            return data

    def _create(self, capacity: int) -> _Segment:
        fd = os.memfd_create("rlinf-shm", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, _HEADER + capacity)
            mm = mmap.mmap(fd, _HEADER + capacity, flags=mmap.MAP_SHARED)
        except BaseException:
            os.close(fd)
            raise
        whole = np.frombuffer(mm, dtype=np.uint8)
        seg_id = uuid.uuid4().bytes
        whole[:16] = np.frombuffer(seg_id, dtype=np.uint8)
        return _Segment(seg_id, fd, mm, capacity, whole[:_HEADER], whole[_HEADER:])

    def _trim(self) -> None:
        free = [s for s in self._segments if not s.busy(0, s.nslots)]
        total = sum(s.capacity for s in free)
        while free and total > _POOL_FREE_BYTES:
            seg = free.pop(0)
            total -= seg.capacity
            self._segments.remove(seg)
            self._retire(seg)

    @staticmethod
    def _retire(seg: _Segment) -> None:
        seg.header[16] = 1
        seg.header = seg.area = np.empty(0, dtype=np.uint8)
        with contextlib.suppress(BufferError):  # a view is still alive; the mapping goes with it
            seg.mm.close()
        os.close(seg.fd)

    def stats(self) -> dict[str, int]:
        """Arenas, dedicated segments and arena chunks still held by receivers (for tests and benchmarks)."""
        with self._lock:
            busy = sum(_ARENA_CHUNKS - a.mm[64 : 64 + _ARENA_CHUNKS].count(0) for a in self._arenas)
            return {"arenas": len(self._arenas), "segments": len(self._segments), "busy_chunks": busy}

    def close(self) -> None:
        """Retire every segment (receivers keep their own mappings of segments still in use)."""
        with self._lock:
            for seg in self._arenas + self._segments:
                self._retire(seg)
            self._segments.clear()
            self._arenas.clear()


class _Mapped:
    __slots__ = ("header", "live", "mm", "whole")

    def __init__(self, mm: mmap.mmap) -> None:
        self.mm = mm
        self.whole = np.frombuffer(mm, dtype=np.uint8)
        self.header = self.whole[:_HEADER]
        self.live = 0


class SegmentCache:
    """Receiver-side cache of mapped segments, keyed by (sender pid, segment id)."""

    def __init__(self) -> None:
        # Reentrant: a release finalizer may run (garbage collection) while open() holds the lock.
        self._lock = threading.RLock()
        self._maps: dict[tuple[int, bytes], _Mapped] = {}
        self._opens = 0

    def open(self, ref: ShmRef) -> np.ndarray:
        """Map (or reuse the mapping of) a sender's segment and return the message's ``[nbytes]`` bytes.

        When the returned array and every view of it are garbage-collected, the message's busy bytes are
        cleared and the sender may reuse the space.
        """
        pid, fd, seg_id, capacity, offset, nbytes, start, count = ref
        key = (pid, seg_id)
        with self._lock:
            self._opens += 1
            if self._opens % 64 == 0:
                self._sweep()
            m = self._maps.get(key)
            if m is None:
                path = f"/proc/{pid}/fd/{fd}"
                try:
                    rfd = os.open(path, os.O_RDWR)
                except OSError as e:
                    raise RuntimeError(
                        f"the sender (pid {pid}) of this message exited or closed its shared memory "
                        f"before the message was received ({e})"
                    ) from e
                try:
                    mm = mmap.mmap(rfd, _HEADER + capacity, flags=mmap.MAP_SHARED)
                finally:
                    os.close(rfd)
                m = _Mapped(mm)
                if m.header[:16].tobytes() != seg_id:
                    raise RuntimeError(f"shared-memory segment {path} changed before it was opened")
                self._maps[key] = m
            m.live += 1
        area = np.frombuffer(m.mm, dtype=np.uint8, offset=_HEADER + offset, count=nbytes)
        weakref.finalize(area, self._release, key, start, count)
        return area

    def _release(self, key: tuple[int, bytes], start: int, count: int) -> None:
        with self._lock:
            m = self._maps.get(key)
            if m is not None:
                m.header[64 + start : 64 + start + count] = 0
                m.live -= 1

    def _sweep(self) -> None:
        for key, m in list(self._maps.items()):
            if m.live == 0 and m.header[16]:
                del self._maps[key]
                m.header = m.whole = np.empty(0, dtype=np.uint8)
                with contextlib.suppress(BufferError):
                    m.mm.close()

    def close(self) -> None:
        """Drop mappings of segments nothing uses any more."""
        with self._lock:
            for key, m in list(self._maps.items()):
                if m.live == 0:
                    del self._maps[key]
                    m.header = m.whole = np.empty(0, dtype=np.uint8)
                    with contextlib.suppress(BufferError):
                        m.mm.close()
