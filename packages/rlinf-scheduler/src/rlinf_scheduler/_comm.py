"""Point-to-point and broadcast between workers of any groups, addressed by ``(group_name, rank)``.

``CommMixin`` is a base class of ``Worker``. Peers are the named Ray actors ``f"{group_name}:{rank}"`` of
the run's namespace. Each worker learns a peer's node and control address once through a Ray call; after
that a message is one frame on a persistent TCP connection (a Ray actor call costs ~1 ms here, a frame tens of
microseconds) carrying a sequence number and either the payload itself (below ``INLINE_LIMIT`` bytes of
arrays) or a reference to where its arrays are:

- same node: a pooled shared-memory segment of the sender (one copy; the receiver's tensors view it);
- other node: a two-rank gloo group created lazily for the pair (``_transport_gloo``);
- CUDA tensors of a payload too big to go inline: CUDA IPC to a same-node receiver that sees their GPU, a
  directed NCCL group to a receiver on another node that has CUDA (``_transport_cuda``), else as above.

Messages are buffered by the receiver (delivery never waits for ``recv``), so sends in crossed directions
never deadlock; sequence numbers per ordered pair make delivery FIFO whatever the order Ray runs the calls.
Each incoming connection has a reader thread; a ``recv`` that has to wait takes the connection of its peer
over and reads the frames itself while it waits, which saves two thread hand-overs per message.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import ray

from rlinf_scheduler import _transport as tp
from rlinf_scheduler._comm_state import PeerKey, _CommState
from rlinf_scheduler._trace import NO_SPAN, WAIT, trace_span, tracing_enabled

__all__ = ["CommMixin", "Work"]

_P2P = "p2p"
_BCAST = "bcast"


class Work:
    """A pending ``isend``/``irecv``: ``wait(timeout)`` returns its result, ``done()`` polls it.

    For a send, the work is done when the payload has left the caller's buffers (the caller may then modify
    them); ``wait`` returns ``None``. For a receive, ``wait`` returns the received object.
    """

    def __init__(self, wait: Callable[[float | None], Any], done: Callable[[], bool]) -> None:
        self._wait = wait
        self._done = done
        self._lock = threading.Lock()
        self._finished = False
        self._result: Any = None

    def wait(self, timeout: float | None = None) -> Any:
        """Block until the operation completes and return its result.

        Args:
            timeout: seconds to wait; ``None`` waits for ever.

        Raises:
            TimeoutError: nothing completed within ``timeout`` (the operation stays pending: wait again).
        """
        with self._lock:
            if not self._finished:
                self._result = self._wait(timeout)
                self._finished = True
            return self._result

    def done(self) -> bool:
        """Whether ``wait`` would return without blocking."""
        return self._finished or self._done()


def _finished_work(result: Any = None) -> Work:
    return Work(lambda _t: result, lambda: True)


def _peer(group_name: str, rank: int, what: str) -> PeerKey:
    if not isinstance(group_name, str) or not group_name:
        raise ValueError(f"{what} group name must be a non-empty str, got {group_name!r}")
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or rank < 0:
        raise ValueError(f"{what} rank must be an int >= 0, got {rank!r}")
    return (group_name, int(rank))


def _members(groups: Sequence[tuple[str, int | Iterable[int]]]) -> list[PeerKey]:
    raw: object = groups  # checked at run time: callers may pass anything
    if isinstance(raw, (str, bytes)) or not isinstance(raw, Sequence) or not raw:
        raise ValueError(f"groups must be a non-empty list of (group_name, ranks) pairs, got {groups!r}")
    out: set[PeerKey] = set()
    for item in groups:
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise ValueError(f"each entry of groups must be (group_name, ranks), got {item!r}")
        name, ranks = item
        rank_list = [ranks] if isinstance(ranks, (int, np.integer)) else list(ranks)
        if not rank_list:
            raise ValueError(f"groups entry {item!r} has no ranks")
        out.update(_peer(name, r, "broadcast") for r in rank_list)
    return sorted(out)


def _first_listed(groups: Sequence[tuple[str, int | Iterable[int]]]) -> PeerKey:
    """The first worker named in ``groups`` (already checked by ``_members``): the default broadcast source."""
    name, ranks = groups[0]
    first = ranks if isinstance(ranks, (int, np.integer)) else next(iter(ranks))
    return (name, int(first))


def _broadcast_plan(
    st: _CommState, members: list[PeerKey], src: PeerKey
) -> tuple[list[PeerKey], dict[PeerKey, list[PeerKey]]]:
    """Who sends to whom: the same on every participant (it depends only on the members and their nodes).

    The source sends to every member of its node (one shared-memory copy) and to one *leader* per other node
    (the smallest ``(group, rank)`` there, over the pair's gloo group); each leader passes the object on to
    the other members of its node through shared memory. So each node is crossed once, not once per rank.

    Returns:
        (the source's receivers, {leader: the members it relays to}).
    """
    info = st.peer_info([m for m in members if m != st.me])
    node = {m: info[m][0] for m in info}
    node[st.me] = st.node_id
    by_node: dict[str, list[PeerKey]] = {}
    for m in members:
        if m != src:
            by_node.setdefault(node[m], []).append(m)
    direct = list(by_node.pop(node[src], []))
    relays: dict[PeerKey, list[PeerKey]] = {}
    for peers in by_node.values():
        leader = min(peers)
        direct.append(leader)
        relays[leader] = [p for p in peers if p != leader]
    return direct, relays


class CommMixin:
    """Point-to-point ``send``/``recv`` and ``broadcast`` for ``Worker``.

    The worker must have ``group_name`` (str) and ``rank`` (int) attributes and be the Ray actor named
    ``f"{group_name}:{rank}"`` in the namespace ``namespace`` (attribute; default: the job's namespace), and
    run threaded (``max_concurrency`` > 1) so that deliveries run while a method waits in ``recv``.

    Example (inside two workers of groups ``"env"`` and ``"rollout"``)::

        # env rank 0
        self.send({"obs": obs_tensor, "step": 3}, "rollout", 0)
        actions = self.recv("rollout", 0, timeout=60)

        # rollout rank 0
        batch = self.recv("env", 0, timeout=60)
        self.send(policy(batch["obs"]), "env", 0)
    """

    _comm_init_lock = threading.Lock()

    def _comm(self) -> _CommState:
        state: _CommState | None = self.__dict__.get("_rlinf_comm_state")
        if state is None:
            with CommMixin._comm_init_lock:
                state = self.__dict__.get("_rlinf_comm_state")
                if state is None:
                    me = _peer(self.group_name, self.rank, "this worker's")  # type: ignore[attr-defined]  # group_name/rank come from the Worker this mixin is part of
                    ns = getattr(self, "namespace", None) or ray.get_runtime_context().namespace
                    state = _CommState(me, ns)
                    self.__dict__["_rlinf_comm_state"] = state
        return state

    # ---------------------------------------------------------------------------------------- public API

    def send(self, obj: Any, dst_group_name: str, dst_rank: int) -> None:
        """Send ``obj`` to worker ``(dst_group_name, dst_rank)``; returns once ``obj``'s buffers may be reused.

        Args:
            obj: any picklable object; tensors (CPU or GPU) and numpy arrays inside lists, dicts, tuples and
                dataclasses are moved without pickling. GPU tensors arrive on a GPU of the receiver.
            dst_group_name: the receiver's group name.
            dst_rank: the receiver's rank in its group.

        Raises:
            ValueError: at once, if no such worker runs (the message names it and the running groups) or it
                is this worker.
            RuntimeError: the receiver died.
        """
        with trace_span(f"send {dst_group_name}:{dst_rank}", WAIT) if tracing_enabled() else NO_SPAN:
            self._comm_isend(obj, dst_group_name, dst_rank).wait()

    def isend(self, obj: Any, dst_group_name: str, dst_rank: int) -> Work:
        """Non-blocking ``send``: returns a ``Work`` whose ``wait()`` returns ``None`` once the data has left."""
        return self._comm_isend(obj, dst_group_name, dst_rank)

    def recv(self, src_group_name: str, src_rank: int, *, timeout: float | None = None) -> Any:
        """Receive the next object sent to this worker by ``(src_group_name, src_rank)`` (FIFO per sender).

        Args:
            src_group_name: the sender's group name.
            src_rank: the sender's rank in its group.
            timeout: seconds to wait; ``None`` waits for ever.

        Returns:
            The object; its tensors view a shared-memory segment (same node) or a fresh buffer (other node).

        Raises:
            ValueError: at once, if no such worker runs now (the message names it and the running groups).
            TimeoutError: nothing arrived within ``timeout``.
        """
        peer = self._comm_source(src_group_name, src_rank)
        with trace_span(f"recv {src_group_name}:{src_rank}", WAIT) if tracing_enabled() else NO_SPAN:
            return self._comm_receive(peer, _P2P, cancel_on_timeout=True).wait(timeout)

    def irecv(self, src_group_name: str, src_rank: int) -> Work:
        """Non-blocking ``recv``: reserves the next message from the sender; ``Work.wait()`` returns it.

        Raises:
            ValueError: at once, as for ``recv``.
        """
        peer = self._comm_source(src_group_name, src_rank)
        return self._comm_receive(peer, _P2P)

    def broadcast(
        self,
        obj: Any,
        groups: Sequence[tuple[str, int | Iterable[int]]],
        src: tuple[str, int] | None = None,
        *,
        timeout: float | None = None,
    ) -> Any:
        """Broadcast ``obj`` from ``src`` to every worker listed in ``groups``; every participant calls it.

        Same-node receivers share one shared-memory copy; each other node receives it once, over the gloo
        group between the source and that node's first participant, which passes it on in shared memory.

        Args:
            obj: the payload on ``src`` (ignored elsewhere; pass ``None``).
            groups: ``[(group_name, ranks), ...]`` where ranks is an int or an iterable of ints; the order
                does not matter and must list the same workers on every participant.
            src: ``(group_name, rank)`` of the sender; it must be among ``groups``. ``None`` (the default,
                as in RLinf): the first worker listed, i.e. the first rank of ``groups[0]`` in the order
                given (with the default, that order does matter).
            timeout: seconds a receiver waits; ``None`` waits for ever.

        Returns:
            ``obj`` on the source, the received copy elsewhere.

        Raises:
            ValueError: ``groups``/``src`` malformed, or this worker or ``src`` not among ``groups``.
            TimeoutError: a receiver got nothing within ``timeout``.
        """
        members = _members(groups)
        if src is None:
            src = _first_listed(groups)
        if not isinstance(src, (tuple, list)) or len(src) != 2:
            raise ValueError(f"src must be (group_name, rank), got {src!r}")
        src_key = _peer(src[0], src[1], "broadcast source")
        st = self._comm()
        if src_key not in members:
            raise ValueError(f"broadcast source {src_key} is not among groups {groups!r}")
        if st.me not in members:
            raise ValueError(f"this worker {st.me} is not among the broadcast groups {groups!r}")
        direct, relays = _broadcast_plan(st, members, src_key)
        if st.me == src_key:
            self._comm_fan_out(obj, direct)
            return obj
        upstream = next((leader for leader, peers in relays.items() if st.me in peers), src_key)
        got = self._comm_receive(upstream, _BCAST, cancel_on_timeout=True).wait(timeout)
        self._comm_fan_out(got, relays.get(st.me, []))
        return got

    # ------------------------------------------------------------------------------------------ internals

    def _comm_source(self, group_name: str, rank: int) -> PeerKey:
        """Check a receive's source: it must be a worker that exists now (else no message can come)."""
        peer = _peer(group_name, rank, "source")
        self._comm().actor(peer)  # raises ValueError naming the peer (cached after the first call)
        return peer

    def _comm_fan_out(self, obj: Any, receivers: list[PeerKey]) -> None:
        if receivers:
            st = self._comm()
            seqs = [st.next_seq(p, _BCAST) for p in receivers]
            self._comm_transmit(tp.encode(obj), receivers, _BCAST, seqs).wait()

    def _comm_isend(self, obj: Any, dst_group_name: str, dst_rank: int) -> Work:
        peer = _peer(dst_group_name, dst_rank, "destination")
        st = self._comm()
        if peer == st.me:
            raise ValueError(f"a worker cannot send to itself: {peer}")
        st.actor(peer)  # an unknown peer fails here, before any encoding
        enc = tp.encode(obj)
        seq = st.next_seq(peer, _P2P)
        return self._comm_transmit(enc, [peer], _P2P, [seq])

    def _comm_transmit(self, enc: tp.Encoded, peers: list[PeerKey], stream: str, seqs: list[int]) -> Work:
        st = self._comm()
        cuda = tp.cuda_indices(enc) if enc.total >= tp.INLINE_LIMIT else []
        if cuda:
            return self._comm_transmit_cuda(enc, cuda, peers, stream, seqs)

        def frame(peer: PeerKey, seq: int, msg: tuple[Any, ...]) -> None:
            st.deliver(peer, stream, seq, msg)

        return self._comm_transmit_host(enc, peers, seqs, frame)

    def _comm_transmit_cuda(
        self, enc: tp.Encoded, cuda: list[int], peers: list[PeerKey], stream: str, seqs: list[int]
    ) -> Work:
        """Send a payload holding large CUDA tensors: each receiver gets them by the route ``route`` picks."""
        st = self._comm()
        tc = st.cuda_module()
        info, gpus, mine = st.peer_info(peers), st.peer_cuda(peers), tc.device_uuids()
        src_dev = {i: tc.device_index(enc.specs[i].device) for i in cuda}
        src_uuids = {mine[d] for d in src_dev.values()}
        by_route: dict[str, tuple[list[PeerKey], list[int]]] = {}
        for p, s in zip(peers, seqs, strict=True):
            kind = tc.route(same_node=info[p][0] == st.node_id, src_uuids=src_uuids, peer_uuids=gpus[p])
            by_route.setdefault(kind, ([], []))[0].append(p)
            by_route[kind][1].append(s)
        works: list[Work] = []
        if "host" in by_route:

            def plain(peer: PeerKey, seq: int, msg: tuple[Any, ...]) -> None:
                st.deliver(peer, stream, seq, msg)

            works.append(self._comm_transmit_host(enc, *by_route["host"], plain))
        if "ipc" in by_route:
            tc.ipc_collect()  # free earlier copies that their receivers have released
            copies = {i: tc.ipc_copy(enc.sources[i]) for i in cuda}  # one copy for all receivers

            def ipc(peer: PeerKey, seq: int, msg: tuple[Any, ...]) -> None:
                handles = {i: tc.ipc_handle(c, gpus[peer].index(mine[src_dev[i]])) for i, c in copies.items()}
                st.deliver(peer, stream, seq, ("cuda", msg, ("ipc", handles)))
                st.stats["ipc"] += 1

            works.append(self._comm_transmit_host(tp.split_device(enc, cuda, "ipc"), *by_route["ipc"], ipc))
        if "nccl" in by_route:
            links = st.nccl_links()
            by_dev: dict[int, list[int]] = {}
            for i in cuda:
                by_dev.setdefault(src_dev[i], []).append(i)
            sent: list[Any] = []

            def nccl(peer: PeerKey, seq: int, msg: tuple[Any, ...]) -> None:
                with links.peer_lock(peer):  # frame order = NCCL send order on each link
                    entries, posts = [], []
                    for dev, idx in by_dev.items():
                        link, address = links.sender(peer, dev)
                        entries.append((dev, address, [(i, enc.specs[i].nbytes) for i in idx]))
                        posts.append((link, [enc.sources[i] for i in idx]))
                    st.deliver(peer, stream, seq, ("cuda", msg, ("nccl", entries)))
                    for link, srcs in posts:
                        sent.extend(links.post_sends(link, srcs))
                st.stats["nccl"] += 1

            works.append(
                self._comm_transmit_host(tp.split_device(enc, cuda, "nccl"), *by_route["nccl"], nccl)
            )
            works.append(_dist_work(sent, enc.sources))
        return _all_of(works)

    def _comm_transmit_host(
        self,
        enc: tp.Encoded,
        peers: list[PeerKey],
        seqs: list[int],
        frame: Callable[[PeerKey, int, tuple[Any, ...]], None],
    ) -> Work:
        """Move the host buffers of ``enc``; ``frame(peer, seq, msg)`` delivers each control message."""
        st = self._comm()
        if enc.total < tp.INLINE_LIMIT:
            blob = tp.pack_inline(enc) if enc.specs else b""
            for peer, seq in zip(peers, seqs, strict=True):
                frame(peer, seq, ("inline", enc.meta, enc.specs, blob))
                st.stats["inline"] += 1
            return _finished_work()
        info = st.peer_info(peers)
        local = [(p, s) for p, s in zip(peers, seqs, strict=True) if info[p][0] == st.node_id]
        remote = [(p, s) for p, s in zip(peers, seqs, strict=True) if info[p][0] != st.node_id]
        if local:
            area, refs = st.pool.reserve(enc.total, len(local))
            tp.write_buffers(enc, area)
            del area
            for ref, (peer, seq) in zip(refs, local, strict=True):
                frame(peer, seq, ("shm", enc.meta, enc.specs, ref))
                st.stats["shm"] += 1
        if not remote:
            return _finished_work()
        pairs = st.gloo_pairs()  # first: its import error names the extra to install
        import torch  # the cross-node transport stages bytes in a torch tensor

        staging = torch.empty(enc.total, dtype=torch.uint8)
        tp.write_buffers(enc, staging.numpy())
        works = []
        for peer, seq in remote:
            pair = pairs.get(peer)
            tag = pair.next_tag()
            frame(peer, seq, ("gloo", enc.meta, enc.specs, enc.total, tag))
            works.append(pair.send(staging, tag))
            st.stats["gloo"] += 1
        return _dist_work(works, staging)

    def _comm_receive(self, peer: PeerKey, stream: str, *, cancel_on_timeout: bool = False) -> Work:
        st = self._comm()
        box = st.inbox(peer, stream)
        slot = box.reserve()
        what = f"{st.me} waiting for {'broadcast' if stream == _BCAST else 'message'} from {peer}"

        def wait(timeout: float | None) -> Any:
            try:
                msg = st.take(peer, box, slot, timeout, what)
            except TimeoutError:
                # A blocking recv that timed out consumes nothing; an irecv stays first in line.
                late = box.cancel(slot) if cancel_on_timeout else None
                if late is None:
                    raise
                msg = late
            return _decode(st, peer, msg)

        def done() -> bool:
            msg = slot.msg
            return msg is not None and _msg_done(msg)

        return Work(wait, done)

    # ----------------------------------------------------------------------- called by peers through Ray

    def _comm_deliver(self, src: PeerKey, stream: str, seq: int, msg: tuple[Any, ...]) -> None:
        """Ray fallback of the socket control path (same effect as a control frame)."""
        self._comm().on_message(src, stream, seq, msg)

    def _comm_info(self) -> tuple[str, int, str, int]:
        st = self._comm()
        host, port = st.server.address
        return st.node_id, st.pool.pid, host, port

    def _comm_cuda_info(self) -> tuple[str, ...]:
        """UUIDs of the GPUs this worker sees (empty without torch or CUDA)."""
        try:
            tc = _CommState.cuda_module()
        except ImportError:
            return ()
        return tc.device_uuids()  # type: ignore[no-any-return]  # the CUDA transport module is imported lazily (typed Any)

    def _comm_gloo_address(self, peer: PeerKey) -> tuple[str, int]:
        return self._comm().gloo_pairs().master_address((peer[0], int(peer[1])))  # type: ignore[no-any-return]  # the Gloo transport module is imported lazily (typed Any)

    def _comm_gloo_join(self, peer: PeerKey, host: str, port: int) -> None:
        self._comm().gloo_pairs().join((peer[0], int(peer[1])), host, port)

    def _comm_close(self) -> None:
        """Release shared-memory segments and pair groups (call at worker teardown)."""
        state: _CommState | None = self.__dict__.pop("_rlinf_comm_state", None)
        if state is not None:
            state.close()


def _dist_work(works: list[Any], keep: Any) -> Work:
    """A ``Work`` over torch.distributed works; ``keep`` (their buffers) stays alive until it is waited."""

    def wait(timeout: float | None, _keep: Any = keep) -> None:
        for w in works:
            if timeout is None:
                w.wait()
            else:
                w.wait(datetime.timedelta(seconds=timeout))
        return None

    return Work(wait, lambda: all(w.is_completed() for w in works))


def _all_of(works: list[Work]) -> Work:
    if len(works) == 1:
        return works[0]

    def wait(timeout: float | None) -> None:
        for w in works:
            w.wait(timeout)
        return None

    return Work(wait, lambda: all(w.done() for w in works))


def _msg_done(msg: tuple[Any, ...]) -> bool:
    """Whether a received message can be decoded without waiting for posted transfers."""
    if msg[0] == "gloo-posted":
        return bool(msg[3].is_completed())
    if msg[0] == "cuda":
        dev = msg[2]
        return _msg_done(msg[1]) and (
            dev[0] != "nccl-posted" or all(w.is_completed() for w, _ in dev[1].values())
        )
    return True


def _device_buffers(st: _CommState, dev: tuple[Any, ...]) -> dict[int, Any]:
    """``{spec index: [nbytes] uint8 CUDA tensor}`` of a message's GPU part."""
    if dev[0] == "ipc":
        tc = st.cuda_module()
        return {i: tc.ipc_open(args) for i, args in dev[1].items()}
    if dev[0] == "nccl-posted":
        out = {}
        for i, (work, buf) in dev[1].items():
            work.wait()  # orders this thread's current CUDA stream after the receive
            out[i] = buf
        return out
    raise RuntimeError(f"unknown GPU transport {dev[0]!r}")


def _decode(st: _CommState, peer: PeerKey, msg: tuple[Any, ...], device: dict[int, Any] | None = None) -> Any:
    kind = msg[0]
    if kind == "inline":
        _, meta, specs, blob = msg
        area = np.frombuffer(bytearray(blob), dtype=np.uint8) if specs else None
        return tp.decode(meta, specs, area, device)
    if kind == "shm":
        _, meta, specs, ref = msg
        area = st.cache.open(ref)
        return tp.decode(meta, specs, area, device)
    if kind == "gloo-posted":
        _, meta, specs, work, buf = msg
        work.wait()
        return tp.decode(meta, specs, buf.numpy(), device)
    if kind == "cuda":
        return _decode(st, peer, msg[1], _device_buffers(st, msg[2]))
    raise RuntimeError(f"unknown message kind {kind!r} from {peer}")
