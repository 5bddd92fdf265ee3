"""GPU transports for the CUDA tensors of a payload: CUDA IPC within a node, NCCL across nodes.

Imported only when a payload to send holds CUDA tensors (or a peer asks what GPUs this process sees).

- Same node, receiver sees the GPU the tensor is on (same device UUID): the sender copies the tensor into a
  fresh buffer of that GPU (so ``send`` keeps copy semantics: the caller may overwrite its tensor afterwards)
  and passes a CUDA IPC handle of the copy (``torch.multiprocessing.reductions.reduce_tensor``); the receiver
  maps it (``rebuild_cuda_tensor``) on its index of that GPU. torch's IPC reference counting keeps the copy
  allocated until the receiver frees every tensor built on it.
- Other node, both sides have CUDA: a *directed* two-rank ``ProcessGroupNCCL`` per (sender, receiver, sender
  device), built on a ``TCPStore`` hosted by the sender, never a global default group. The store address
  rides in the first control frame that uses the link. Each direction has its own group (its own NCCL stream
  on both sides), so crossed sends cannot deadlock; within a link, NCCL matches sends and receives in issue
  order, which is frame order because the sender posts its sends under a per-receiver lock right after the
  frame, and the receiver posts its receives in its frame-reader thread as frames arrive.
- Anything else (no CUDA on the receiver, a GPU the same-node receiver does not see, small payloads that
  travel inline) is staged through host memory by the other transports.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import threading
from collections.abc import Callable, Collection, Sequence
from typing import Any

from rlinf_scheduler._transport_socket import node_ip

try:
    import torch
    import torch.distributed as dist
    from torch.multiprocessing import reductions
except ImportError as e:  # pragma: no cover - depends on the install
    raise ImportError('GPU send/recv needs torch: pip install "rlinf-scheduler[torch]"') from e

__all__: list[str] = []

PeerKey = tuple[str, int]
_SETUP_TIMEOUT_S = 120.0
#: Index of ``storage_device`` in the arguments of ``rebuild_cuda_tensor`` (see ``reduce_tensor``).
_IPC_DEVICE_ARG = 6


def route(*, same_node: bool, src_uuids: Collection[str], peer_uuids: Sequence[str]) -> str:
    """How the CUDA tensors of one message reach one receiver.

    Args:
        same_node: whether the receiver runs on the sender's node.
        src_uuids: UUIDs of the GPUs the message's CUDA tensors are on.
        peer_uuids: UUIDs of the GPUs the receiver sees, in its device-index order (empty: no CUDA).

    Returns:
        ``"ipc"`` (same node, the receiver sees every one of those GPUs), ``"nccl"`` (other node, receiver has
        CUDA) or ``"host"`` (staged through host memory like CPU tensors).
    """
    if not peer_uuids:
        return "host"
    if same_node:
        return "ipc" if all(u in peer_uuids for u in src_uuids) else "host"
    return "nccl"


@functools.cache
def device_uuids() -> tuple[str, ...]:
    """UUIDs of the CUDA devices this process sees, in device-index order (empty without CUDA)."""
    if not torch.cuda.is_available():
        return ()
    return tuple(str(torch.cuda.get_device_properties(i).uuid) for i in range(torch.cuda.device_count()))


def device_index(device: str) -> int:
    """The index of a ``"cuda:N"`` device string (``"cuda"`` → the current device)."""
    dev = torch.device(device)
    if dev.type != "cuda":
        raise ValueError(f"device must be a CUDA device, got {device!r}")
    return dev.index if dev.index is not None else torch.cuda.current_device()


def local_device(src_index: int, count: int) -> int:
    """Receiver-side device index for a tensor sent over NCCL from the sender's ``cuda:src_index``.

    Args:
        src_index: the sender's device index.
        count: number of CUDA devices the receiver sees (> 0).

    Returns:
        ``src_index`` if the receiver has that index, else 0.
    """
    return src_index if 0 <= src_index < count else 0


# ------------------------------------------------------------------------------------------- CUDA IPC


def ipc_copy(src: torch.Tensor) -> torch.Tensor:
    """A fresh ``[nbytes]`` uint8 copy of the contiguous CUDA tensor ``src`` on its device (to be shared)."""
    return src.reshape(-1).view(torch.uint8).clone()


def ipc_handle(copy: torch.Tensor, peer_device: int) -> tuple[Any, ...]:
    """Arguments of ``rebuild_cuda_tensor`` for a receiver that sees the copy's GPU as ``cuda:peer_device``.

    Each call takes one IPC reference on ``copy``'s memory, released when the receiver frees its tensor.
    """
    _, args = reductions.reduce_tensor(copy)  # type: ignore[no-untyped-call]  # torch leaves it unannotated
    return (*args[:_IPC_DEVICE_ARG], peer_device, *args[_IPC_DEVICE_ARG + 1 :])


def ipc_open(args: tuple[Any, ...]) -> torch.Tensor:
    """Map a tensor shared by ``ipc_handle`` (its reads are ordered after the sender's copy)."""
    return reductions.rebuild_cuda_tensor(*args)  # type: ignore[no-untyped-call,no-any-return]  # torch leaves it unannotated


def ipc_collect() -> None:
    """Free sender-side IPC copies whose receivers have released them."""
    torch.cuda.ipc_collect()  # type: ignore[no-untyped-call]  # torch leaves it unannotated


# ------------------------------------------------------------------------------------ NCCL directed links


def _new_nccl_group(store: Any, rank: int) -> Any:
    prefixed = dist.PrefixStore("rlinf-nccl/", store)  # type: ignore[attr-defined]  # exported from torch._C, invisible to the stubs
    opts = dist.ProcessGroupNCCL.Options()
    opts._timeout = datetime.timedelta(seconds=_SETUP_TIMEOUT_S)
    return dist.ProcessGroupNCCL(prefixed, rank, 2, opts)


class _Link:
    """One end of a directed pair group: the sender is rank 0, the receiver rank 1."""

    def __init__(self, pg: Any, store: Any, device: int) -> None:
        self.pg = pg
        self.store = store  # keeps the TCPStore (the server, on the sender) alive with the group
        self.device = device


class NcclLinks:
    """This worker's directed NCCL groups, keyed by (peer, sender device index), created on first use.

    Args:
        new_group: ``new_group(store, rank) -> process group`` (tests pass a gloo factory).
    """

    def __init__(self, new_group: Callable[[Any, int], Any] = _new_nccl_group) -> None:
        self._new_group = new_group
        self._lock = threading.Lock()
        self._peer_locks: dict[PeerKey, threading.Lock] = {}
        self._out: dict[tuple[PeerKey, int], _Link] = {}
        self._in: dict[tuple[PeerKey, int], _Link] = {}

    def peer_lock(self, peer: PeerKey) -> threading.Lock:
        """Hold it from delivering a frame to ``peer`` until its NCCL sends are posted (keeps them in order)."""
        with self._lock:
            return self._peer_locks.setdefault(peer, threading.Lock())

    def sender(self, peer: PeerKey, device: int) -> tuple[_Link, tuple[str, int] | None]:
        """The sending link to ``peer`` for tensors on ``cuda:device``.

        Returns:
            (the link, the store address to put in the next frame if the link was just created, else None).
        """
        key = (peer, device)
        with self._lock:
            link = self._out.get(key)
            if link is not None:
                return link, None
            host = node_ip()
            store = dist.TCPStore(  # type: ignore[attr-defined]  # exported from torch._C, invisible to the stubs
                host, 0, 2, True, timeout=datetime.timedelta(seconds=_SETUP_TIMEOUT_S), wait_for_workers=False
            )
            link = self._out[key] = _Link(self._new_group(store, 0), store, device)
            return link, (host, int(store.port))

    def post_sends(self, link: _Link, sources: Sequence[torch.Tensor]) -> list[Any]:
        """Start sending each contiguous tensor's bytes to the link's receiver; returns the works."""
        return [link.pg.send([src.reshape(-1).view(torch.uint8)], 1, 0) for src in sources]

    def post_recvs(
        self,
        peer: PeerKey,
        src_device: int,
        address: tuple[str, int] | None,
        sizes: Sequence[int],
        device: Any,
    ) -> list[tuple[Any, torch.Tensor]]:
        """Post receives of ``sizes`` bytes from ``peer``'s link of its ``cuda:src_device`` (frame-reader thread).

        Args:
            peer: the sender.
            src_device: the sender's device index (names the link).
            address: the sender's store address, present in the first frame of the link.
            sizes: byte counts, in the order the sender sends them.
            device: where to receive (a ``torch.device``); fixed when the link is created.

        Returns:
            One (work, ``[nbytes]`` uint8 CUDA buffer) per size.
        """
        key = (peer, src_device)
        with self._lock:
            link = self._in.get(key)
            if link is None:
                if address is None:
                    raise RuntimeError(
                        f"NCCL link from {peer} (cuda:{src_device}) used before it was announced"
                    )
                store = dist.TCPStore(  # type: ignore[attr-defined]  # exported from torch._C, invisible to the stubs
                    address[0], address[1], 2, False, timeout=datetime.timedelta(seconds=_SETUP_TIMEOUT_S)
                )
                link = self._in[key] = _Link(self._new_group(store, 1), store, device)
        out = []
        for n in sizes:
            buf = torch.empty(n, dtype=torch.uint8, device=link.device)
            out.append((link.pg.recv([buf], 0, 0), buf))
        return out

    def close(self) -> None:
        """Shut every group down."""
        with self._lock:
            links = list(self._out.values()) + list(self._in.values())
            self._out.clear()
            self._in.clear()
        for link in links:
            with contextlib.suppress(Exception):
                link.pg.shutdown()
