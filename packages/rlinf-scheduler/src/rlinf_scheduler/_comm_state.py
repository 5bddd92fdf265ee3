"""Per-worker communication state: peers' control connections, inboxes, and the receive that reads a connection.

Part of the point-to-point layer of ``_comm`` (see its docstring); ``CommMixin`` keeps one ``_CommState`` per
worker.
"""

from __future__ import annotations

import itertools
import os
import pickle
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

import ray

from rlinf_scheduler import _transport as tp
from rlinf_scheduler._transport_socket import Connection, FrameClient, FrameServer, node_ip

__all__: list[str] = []

PeerKey = tuple[str, int]
_INFO_TIMEOUT_S = 60.0
#: A receive reads its peer's connection itself (``RLINF_COMM_DIRECT_RECV=0``: always through the reader thread).
_DIRECT_RECV = os.environ.get("RLINF_COMM_DIRECT_RECV", "1") != "0"
#: A receive reading its connection first polls it without sleeping for this long (``RLINF_COMM_SPIN_US``).
_SPIN_S = float(os.environ.get("RLINF_COMM_SPIN_US", "1000")) / 1e6
#: A receive reading its connection looks at its slot at least this often (a message can also come by Ray).
_SLICE_S = 0.05


class _Slot:
    """One pending receive: ``msg`` is filled in when a message is assigned to it."""

    __slots__ = ("msg",)

    def __init__(self) -> None:
        self.msg: tuple[Any, ...] | None = None


class _Inbox:
    """Messages from one peer on one stream: reordered by sequence number, handed to receives in call order."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.early: dict[int, tuple[Any, ...]] = {}
        self.next_seq = 0
        self.ready: deque[tuple[Any, ...]] = deque()
        self.waiting: deque[_Slot] = deque()

    def _assign(self) -> None:
        while self.waiting and self.ready:
            self.waiting.popleft().msg = self.ready.popleft()

    def put(self, seq: int, msg: tuple[Any, ...]) -> None:
        with self.cond:
            self.early[seq] = msg
            while self.next_seq in self.early:
                self.ready.append(self.early.pop(self.next_seq))
                self.next_seq += 1
            self._assign()
            self.cond.notify_all()

    def reserve(self) -> _Slot:
        slot = _Slot()
        with self.cond:
            self.waiting.append(slot)
            self._assign()
        return slot

    def wait(self, slot: _Slot, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a message to be assigned to ``slot``; whether one was."""
        with self.cond:
            return self.cond.wait_for(lambda: slot.msg is not None, timeout)

    def cancel(self, slot: _Slot) -> tuple[Any, ...] | None:
        """Withdraw a receive that timed out; returns a message assigned to it in the meantime."""
        with self.cond:
            if slot.msg is None:
                self.waiting.remove(slot)
            return slot.msg


class _CommState:
    """Per-worker communication state, created on first use."""

    def __init__(self, me: PeerKey, namespace: str | None) -> None:
        self.me = me
        self.namespace = namespace
        self.node_id = ray.get_runtime_context().get_node_id()
        self.lock = threading.Lock()
        self.actors: dict[PeerKey, Any] = {}
        self.info: dict[PeerKey, tuple[str, int, str, int]] = {}
        self.clients: dict[PeerKey, FrameClient] = {}
        self.send_seq: dict[tuple[PeerKey, str], itertools.count[int]] = {}
        self.inboxes: dict[tuple[PeerKey, str], _Inbox] = {}
        self.pool = tp.SegmentPool()
        self.cache = tp.SegmentCache()
        self.gloo: Any = None
        self.nccl: Any = None
        self.cuda_uuids: dict[PeerKey, tuple[str, ...]] = {}
        self.stats: dict[str, int] = {"inline": 0, "shm": 0, "gloo": 0, "ipc": 0, "nccl": 0}
        #: The connection each peer's frames arrive on: a receive from that peer reads it directly (``take``).
        self.conns: dict[PeerKey, Connection] = {}
        self.server = FrameServer(node_ip(), self._on_frame, with_connection=True)

    def _on_frame(self, kind: int, body: memoryview, conn: Connection) -> None:
        src, stream, seq, msg = pickle.loads(body)
        src = (src[0], int(src[1]))
        if self.conns.get(src) is not conn:
            self.conns[src] = conn
        self.on_message(src, stream, seq, msg)

    def take(
        self, peer: PeerKey, box: _Inbox, slot: _Slot, timeout: float | None, what: str
    ) -> tuple[Any, ...]:
        """Wait for ``slot``'s message from ``peer``, reading ``peer``'s connection in this thread when possible.

        The thread keeps the connection of a same-node peer claimed after the message came (its next receive
        from that peer reads at once); ``release_claims`` gives it back. Another peer's is given back at once.

        Raises:
            TimeoutError: no message within ``timeout`` seconds (``None``: wait for ever).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        spin = _SPIN_S
        while True:
            msg = slot.msg
            if msg is not None:
                return msg
            left = _SLICE_S if deadline is None else min(_SLICE_S, deadline - time.monotonic())
            if left <= 0:
                raise TimeoutError(f"{what}: no message after {timeout} s")
            conn = self.conns.get(peer) if _DIRECT_RECV else None
            if conn is not None and conn.claim(left):
                try:
                    # A slice at a time: a message may also come another way (the Ray fallback).
                    conn.read(left, spin)
                    spin = 0.0
                except ConnectionError:
                    pass  # the peer is gone: wait as without a connection (the run's monitor reports the death)
                finally:
                    if not conn.local:
                        conn.release()
            else:  # the reader thread, or another receiving thread, reads the frames
                box.wait(slot, left)

    def release_claims(self) -> None:
        """Give the connections the calling thread claimed back to their reader threads."""
        for conn in list(self.conns.values()):
            conn.release()

    def on_message(self, src: PeerKey, stream: str, seq: int, msg: tuple[Any, ...]) -> None:
        src = (src[0], int(src[1]))
        self.inbox(src, stream).put(seq, self._post(src, msg))

    def _post(self, src: PeerKey, msg: tuple[Any, ...]) -> tuple[Any, ...]:
        """Post the receives a message needs now: the sender never waits for our recv()."""
        if msg[0] == "gloo":
            _, meta, specs, total, tag = msg
            pair = self.gloo_pairs().get(src)
            work, buf = pair.recv(total, tag)
            return ("gloo-posted", meta, specs, work, buf)
        if msg[0] == "cuda" and msg[2][0] == "nccl":
            import torch  # a CUDA payload: torch is needed to receive it

            posted: dict[int, tuple[Any, Any]] = {}
            count = torch.cuda.device_count()
            for src_dev, address, items in msg[2][1]:
                device = torch.device("cuda", self.cuda_module().local_device(src_dev, count))
                got = self.nccl_links().post_recvs(src, src_dev, address, [n for _, n in items], device)
                posted.update(zip([i for i, _ in items], got, strict=True))
            return ("cuda", self._post(src, msg[1]), ("nccl-posted", posted))
        if msg[0] == "cuda":
            return ("cuda", self._post(src, msg[1]), msg[2])
        return msg

    def actor(self, peer: PeerKey) -> Any:
        with self.lock:
            handle = self.actors.get(peer)
        if handle is None:
            name = f"{peer[0]}:{peer[1]}"
            try:
                handle = ray.get_actor(name, namespace=self.namespace)
            except ValueError:
                raise ValueError(
                    f"no worker ({peer[0]!r}, {peer[1]}) (Ray actor {name!r}) in namespace {self.namespace!r}: "
                    + _why_missing(peer, _running_groups(self.namespace))
                ) from None
            with self.lock:
                self.actors[peer] = handle
        return handle

    def _ask_once(
        self, cache: dict[PeerKey, Any], peers: Iterable[PeerKey], method: str
    ) -> dict[PeerKey, Any]:
        """``{peer: answer}`` of ``method`` (a worker method without arguments), asking each peer only once."""
        peers = list(peers)
        with self.lock:
            missing = [p for p in peers if p not in cache]
        if missing:
            refs = [getattr(self.actor(p), method).remote() for p in missing]
            try:
                values = ray.get(refs, timeout=_INFO_TIMEOUT_S)
            except ray.exceptions.GetTimeoutError:
                raise TimeoutError(f"workers {missing} did not answer within {_INFO_TIMEOUT_S} s") from None
            except ray.exceptions.RayActorError as e:
                raise RuntimeError(f"one of the workers {missing} is gone") from e
            with self.lock:
                cache.update(zip(missing, values, strict=True))
        with self.lock:
            return {p: cache[p] for p in peers}

    def peer_info(self, peers: Iterable[PeerKey]) -> dict[PeerKey, tuple[str, int, str, int]]:
        """Each peer's (node id, pid, host, port of its frame server), asked once per peer."""
        return self._ask_once(self.info, peers, "_comm_info")

    def next_seq(self, peer: PeerKey, stream: str) -> int:
        with self.lock:
            counter = self.send_seq.setdefault((peer, stream), itertools.count())
            return next(counter)

    def inbox(self, peer: PeerKey, stream: str) -> _Inbox:
        with self.lock:
            box = self.inboxes.get((peer, stream))
            if box is None:
                box = self.inboxes[(peer, stream)] = _Inbox()
            return box

    def deliver(self, peer: PeerKey, stream: str, seq: int, msg: tuple[Any, ...]) -> None:
        with self.lock:
            client = self.clients.get(peer)
        if client is None:
            _, _, host, port = self.peer_info([peer])[peer]
            try:
                client = FrameClient((host, port))
            except OSError as e:
                raise RuntimeError(f"cannot reach worker {peer} at {host}:{port}: {e}") from e
            with self.lock:
                client = self.clients.setdefault(peer, client)
        try:
            # A send that must wait for the peer to read first gives this thread's claimed connections back
            # to their reader threads: the peer may itself be waiting for us to read.
            client.send((self.me, stream, seq, msg), self.release_claims)
        except OSError as e:
            raise RuntimeError(f"worker {peer} is gone; the message to it was lost ({e})") from e

    def peer_cuda(self, peers: Iterable[PeerKey]) -> dict[PeerKey, tuple[str, ...]]:
        """The GPU UUIDs each peer sees (asked once per peer, when the first CUDA payload goes to it)."""
        return self._ask_once(self.cuda_uuids, peers, "_comm_cuda_info")  # a tuple from each peer

    @staticmethod
    def cuda_module() -> Any:
        from rlinf_scheduler import _transport_cuda  # torch only for CUDA payloads

        return _transport_cuda

    def nccl_links(self) -> Any:
        with self.lock:
            if self.nccl is None:
                self.nccl = self.cuda_module().NcclLinks()
            return self.nccl

    def gloo_pairs(self) -> Any:
        with self.lock:
            if self.gloo is None:
                from rlinf_scheduler._transport_gloo import GlooPairs  # torch only when crossing nodes

                def ask(peer: PeerKey) -> tuple[str, int]:
                    ref = self.actor(peer)._comm_gloo_address.remote(self.me)
                    host, port = ray.get(ref, timeout=_INFO_TIMEOUT_S)
                    return str(host), int(port)

                def notify(peer: PeerKey, host: str, port: int) -> None:
                    self.actor(peer)._comm_gloo_join.remote(self.me, host, port)

                self.gloo = GlooPairs(self.me, ask, notify)
            return self.gloo

    def close(self) -> None:
        self.server.close()
        for conn in list(self.conns.values()):
            conn.release(force=True)
        with self.lock:
            clients, self.clients = list(self.clients.values()), {}
        for c in clients:
            c.close()
        self.pool.close()
        self.cache.close()
        if self.gloo is not None:
            self.gloo.close()
        if self.nccl is not None:
            self.nccl.close()


def _running_groups(namespace: str | None) -> dict[str, int]:
    """Worker groups alive in ``namespace``: name -> number of ranks found (from Ray's named actors)."""
    found: dict[str, set[int]] = {}
    for entry in ray.util.list_named_actors(all_namespaces=True):
        group, _, rank = str(entry["name"]).rpartition(":")
        if entry["namespace"] == namespace and group and rank.isdigit():
            found.setdefault(group, set()).add(int(rank))
    return {g: max(ranks) + 1 for g, ranks in sorted(found.items())}


def _why_missing(peer: PeerKey, groups: dict[str, int]) -> str:
    if peer[0] in groups:
        return f"group {peer[0]!r} has ranks 0..{groups[peer[0]] - 1}"
    return (
        f"no group {peer[0]!r} runs (running groups: {sorted(groups)}; a group exists once launch() returned)"
    )
