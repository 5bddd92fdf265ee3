"""Cross-node transport: one lazily created two-process gloo group per pair of workers.

No global default process group is created (the user may create their own): each pair gets a
``ProcessGroupGloo`` built directly on a ``TCPStore`` hosted by the pair's *master* (the smaller
``(group_name, rank)``). The master's address reaches the other side through a Ray control call.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import os
import threading
from collections.abc import Callable
from typing import Any

from rlinf_scheduler._transport_socket import node_ip

try:
    import torch
    import torch.distributed as dist
except ImportError as e:  # pragma: no cover - depends on the install
    raise ImportError(
        'Cross-node send/recv needs torch.distributed: pip install "rlinf-scheduler[torch]"'
    ) from e

__all__: list[str] = []

PeerKey = tuple[str, int]
_SETUP_TIMEOUT_S = 120.0


class GlooPair:
    """A ready two-rank gloo group; ``peer_rank`` is the other side's rank in it (0 or 1)."""

    def __init__(self, pg: Any, peer_rank: int, store: Any) -> None:
        self.pg = pg
        self.peer_rank = peer_rank
        self._store = store  # keep the TCPStore (and its server on the master) alive with the group
        self._tag_lock = threading.Lock()
        self._next_tag = 0

    def next_tag(self) -> int:
        """Allocate the tag of the next message sent to the peer (tags are matched per source rank)."""
        with self._tag_lock:
            tag = self._next_tag
            self._next_tag = (self._next_tag + 1) % (1 << 30)
            return tag

    def send(self, staging: torch.Tensor, tag: int) -> Any:
        """Start sending ``staging`` (``[n]`` uint8) to the peer; returns the gloo work."""
        return self.pg.send([staging], self.peer_rank, tag)

    def recv(self, nbytes: int, tag: int) -> tuple[Any, torch.Tensor]:
        """Post a receive of ``nbytes`` from the peer; returns (gloo work, ``[nbytes]`` uint8 buffer)."""
        buf = torch.empty(nbytes, dtype=torch.uint8)
        return self.pg.recv([buf], self.peer_rank, tag), buf


def _device() -> Any:
    ifname = os.environ.get("GLOO_SOCKET_IFNAME")
    if ifname:
        return dist.ProcessGroupGloo.create_device(interface=ifname.split(",")[0])
    return dist.ProcessGroupGloo.create_device(hostname=node_ip())


def _build(store: Any, rank: int, timeout_s: float) -> Any:
    opts = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # private torch class, absent from its stubs
    opts._timeout = datetime.timedelta(seconds=timeout_s)
    opts._devices = [_device()]
    prefixed = dist.PrefixStore("rlinf-pair/", store)  # type: ignore[attr-defined]  # exported from torch._C, invisible to the stubs
    return dist.ProcessGroupGloo(prefixed, rank, 2, opts)


class GlooPairs:
    """Per-worker registry of pair groups, created on first use and shared by both directions.

    Args:
        me: this worker's ``(group_name, rank)``.
        ask_master: ``ask_master(peer) -> (host, port)``: asks the peer (the pair's master) for its store.
        notify_peer: ``notify_peer(peer, host, port)``: tells the peer to join the master's store.
    """

    def __init__(
        self,
        me: PeerKey,
        ask_master: Callable[[PeerKey], tuple[str, int]],
        notify_peer: Callable[[PeerKey, str, int], None],
    ) -> None:
        self._me = me
        self._ask_master = ask_master
        self._notify_peer = notify_peer
        self._lock = threading.Lock()
        self._pairs: dict[PeerKey, concurrent.futures.Future[GlooPair]] = {}
        self._addr: dict[PeerKey, tuple[str, int]] = {}
        self._pool = concurrent.futures.ThreadPoolExecutor(thread_name_prefix="rlinf-gloo-setup")

    def get(self, peer: PeerKey, timeout: float | None = _SETUP_TIMEOUT_S) -> GlooPair:
        """Return the pair group with ``peer``, creating it (both sides) on first use."""
        fut = self._ensure(peer, notify=True)
        try:
            return fut.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(
                f"gloo group between {self._me} and {peer} not ready after {timeout} s"
            ) from None

    def master_address(self, peer: PeerKey) -> tuple[str, int]:
        """Called (through Ray) by a non-master peer: make sure our side exists and return our store."""
        self._ensure(peer, notify=False)
        return self._addr[peer]

    def join(self, peer: PeerKey, host: str, port: int) -> None:
        """Called (through Ray) by the master peer: build our side against its store."""
        self._ensure(peer, notify=False, addr=(host, port))

    def _ensure(
        self, peer: PeerKey, *, notify: bool, addr: tuple[str, int] | None = None
    ) -> concurrent.futures.Future[GlooPair]:
        if peer == self._me:
            raise ValueError(f"a worker cannot open a pair group with itself: {peer}")
        is_master = self._me < peer
        with self._lock:
            fut = self._pairs.get(peer)
            if fut is not None:
                return fut
            if is_master:
                host = node_ip()
                store = dist.TCPStore(  # type: ignore[attr-defined]  # exported from torch._C, invisible to the stubs
                    host,
                    0,
                    2,
                    True,
                    timeout=datetime.timedelta(seconds=_SETUP_TIMEOUT_S),
                    wait_for_workers=False,
                )
                self._addr[peer] = (host, store.port)
                fut = self._pool.submit(lambda: GlooPair(_build(store, 0, _SETUP_TIMEOUT_S), 1, store))
                self._pairs[peer] = fut
                if notify:
                    self._notify_peer(peer, host, store.port)
                return fut

            def connect() -> GlooPair:
                host, port = addr if addr is not None else self._ask_master(peer)
                store = dist.TCPStore(  # type: ignore[attr-defined]  # exported from torch._C, invisible to the stubs
                    host, port, 2, False, timeout=datetime.timedelta(seconds=_SETUP_TIMEOUT_S)
                )
                return GlooPair(_build(store, 1, _SETUP_TIMEOUT_S), 0, store)

            fut = self._pool.submit(connect)
            self._pairs[peer] = fut
            return fut

    def close(self) -> None:
        """Forget every pair group (their sockets close when garbage-collected)."""
        with self._lock:
            self._pairs.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)
