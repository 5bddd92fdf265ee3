"""``Channel``: a named, cluster-wide set of FIFO queues (one per key) with weights and back-pressure.

The queues live in a private asyncio Ray actor (``rlinf-channel:<name>``). Clients talk to it over one
persistent TCP connection per process (requests are pipelined and answered out of order by id), because a
Ray actor call costs about a millisecond and a channel must move thousands of small items per second.

Payloads do not pass through the actor: a small item (arrays under ``INLINE_LIMIT`` bytes) is pickled into a
few bytes the actor stores opaquely; a large one is written once into a shared-memory segment of the
producer and the actor only stores where it is. A consumer on the producer's node maps the segment (its
tensors view it); a consumer on another node fetches the bytes straight from the producer process.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import pickle
import queue
import socket
import struct
import threading
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray

from rlinf_scheduler import _transport as tp
from rlinf_scheduler._trace import NO_SPAN, WAIT, trace_span, tracing_enabled
from rlinf_scheduler._transport_socket import FrameClient, FrameServer, node_ip, recv_exact

__all__ = ["DEFAULT_KEY", "Channel", "Empty", "Full"]

#: The key used when none is given.
DEFAULT_KEY = "default"
_LEN = struct.Struct("<Q")
_GRACE_S = 30.0  # extra client-side wait beyond a server-side timeout before declaring the actor lost
_CONNECT_TIMEOUT_S = 120.0


class Full(queue.Full):
    """Raised by ``put_nowait`` (or ``put`` with a timeout) when the key's queue is full."""


class Empty(queue.Empty):
    """Raised by ``get_nowait``/``get_batch`` (or a blocking get with a timeout) when nothing is available."""


class _Withdrawn(Exception):
    """Server side: the client gave up on a waiting request (its asyncio task was cancelled)."""


_ONE_WAY = frozenset({"cancel", "requeue"})
"""Requests the actor does not answer."""


# --------------------------------------------------------------------------------------------------------
# Server side (inside the channel actor)


@dataclass
class _Waiter:
    fut: asyncio.Future[Any]
    target: float | None = None  # get_batch target weight; None for a single get
    item: tuple[float, bytes] | None = None  # for a waiting put


@dataclass
class _KeyQueue:
    items: deque[tuple[float, bytes]] = field(default_factory=deque)
    getters: deque[_Waiter] = field(default_factory=deque)
    putters: deque[_Waiter] = field(default_factory=deque)


def _batch_len(items: deque[tuple[float, bytes]], target: float) -> int | None:
    """How many head items form a batch of weight ``target`` (None: not enough yet; 0: head too heavy)."""
    acc = 0.0
    for n, (w, _) in enumerate(items):
        if acc + w > target:
            return n
        acc += w
        if acc >= target:
            return n + 1
    return None


class _ChannelActor:
    """The queues of one channel; served over asyncio TCP streams on the actor's event loop."""

    def __init__(self, name: str, maxsize: int) -> None:
        self._name = name
        self._maxsize = maxsize
        self._queues: dict[Any, _KeyQueue] = {}
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Future[None]] = set()  # requests waiting to be answered
        self._serving: set[asyncio.Future[None]] = set()  # one per client connection
        self._writers: set[asyncio.StreamWriter] = set()
        self._host = node_ip()

    async def address(self) -> tuple[str, int, int]:
        """Start the server on first call; return (host, port, maxsize)."""
        if self._server is None:
            self._server = await asyncio.start_server(self._serve, self._host, 0)
        port = self._server.sockets[0].getsockname()[1]
        return self._host, port, self._maxsize

    def _queue(self, key: Any) -> _KeyQueue:
        q: _KeyQueue | None = self._queues.get(key)
        if q is None:
            q = self._queues[key] = _KeyQueue()
        return q

    def _has_room(self, q: _KeyQueue) -> bool:
        return self._maxsize == 0 or len(q.items) < self._maxsize

    def _pump(self, q: _KeyQueue) -> None:
        moved = True
        while moved:
            moved = False
            while q.putters and (q.putters[0].fut.done() or self._has_room(q)):
                p = q.putters.popleft()
                if not p.fut.done():
                    assert p.item is not None
                    q.items.append(p.item)
                    p.fut.set_result(None)
                    moved = True
            while q.getters:
                g = q.getters[0]
                if g.fut.done():
                    q.getters.popleft()
                    continue
                if g.target is None:
                    if not q.items:
                        break
                    g.fut.set_result(q.items.popleft())
                else:
                    n = _batch_len(q.items, g.target)
                    if n is None:
                        break
                    if n == 0:
                        g.fut.set_exception(_head_too_heavy(q.items[0][0], g.target))
                    else:
                        g.fut.set_result([q.items.popleft() for _ in range(n)])
                q.getters.popleft()
                moved = True

    def _op(self, op: str, args: tuple[Any, ...]) -> tuple[str, Any] | asyncio.Future[Any]:
        """Admit one request in arrival order: either an immediate reply or a future to wait on."""
        if op == "put":
            key, weight, blob, block = args
            q = self._queue(key)
            if not q.putters and self._has_room(q):
                q.items.append((weight, blob))
                self._pump(q)
                return ("ok", None)
            if not block:
                return ("full", None)
            fut = asyncio.get_running_loop().create_future()
            q.putters.append(_Waiter(fut, item=(weight, blob)))
            return fut
        if op in ("get", "get_batch"):
            key, target, block = args
            q = self._queue(key)
            if not q.getters:
                if target is None and q.items:
                    item = q.items.popleft()
                    self._pump(q)
                    return ("ok", item)
                if target is not None:
                    n = _batch_len(q.items, target)
                    if n == 0:
                        return ("error", _head_too_heavy(q.items[0][0], target))
                    if n is not None:
                        batch = [q.items.popleft() for _ in range(n)]
                        self._pump(q)
                        return ("ok", batch)
            if not block:
                return ("empty", None)
            fut = asyncio.get_running_loop().create_future()
            q.getters.append(_Waiter(fut, target=target))
            return fut
        if op == "requeue":
            # Items a cancelled get received after all: back to the head of the queue, in order.
            key, items = args
            q = self._queue(key)
            q.items.extendleft(reversed(items))
            self._pump(q)
            return ("ok", None)
        if op == "qsize":
            found = self._queues.get(args[0])
            return ("ok", 0 if found is None else len(found.items))
        if op == "maxsize":
            return ("ok", self._maxsize)
        return ("error", ValueError(f"unknown channel operation {op!r}"))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def reply(req_id: int, status: str, value: Any) -> None:
            body = pickle.dumps((req_id, status, value), protocol=5)
            writer.write(_LEN.pack(len(body)) + b"\0" + body)

        waiting: dict[int, asyncio.Future[Any]] = {}  # this connection's requests that wait, by id
        me = asyncio.current_task()
        if me is not None:
            self._serving.add(me)
        self._writers.add(writer)
        try:
            while True:
                head = await reader.readexactly(_LEN.size + 1)
                (length,) = _LEN.unpack(head[: _LEN.size])
                req_id, op, args, timeout = pickle.loads(await reader.readexactly(length))
                if op == "shutdown":
                    reply(req_id, "ok", None)
                    await writer.drain()
                    await self._close_all()
                    return
                if op == "cancel":
                    _withdraw(waiting.get(args[0]))
                    continue
                res = self._op(op, args)
                if isinstance(res, asyncio.Future):
                    waiting[req_id] = res
                    task = asyncio.ensure_future(self._finish(reply, waiting, req_id, op, timeout))
                    self._tasks.add(task)  # keep a reference until it finishes
                    task.add_done_callback(self._tasks.discard)
                elif op not in _ONE_WAY:
                    reply(req_id, *res)
                if writer.transport.get_write_buffer_size() > (1 << 20):
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._writers.discard(writer)
            if me is not None:
                self._serving.discard(me)
            with contextlib.suppress(RuntimeError):  # the actor's loop may already be closing
                writer.close()

    async def _finish(
        self,
        reply: Callable[[int, str, Any], None],
        waiting: dict[int, asyncio.Future[Any]],
        req_id: int,
        op: str,
        timeout: float | None,
    ) -> None:
        """Answer a request that had to wait, once it completes, times out or is withdrawn."""
        try:
            value = await asyncio.wait_for(waiting[req_id], timeout)
        except TimeoutError:
            reply(req_id, "full" if op == "put" else "empty", None)
            self._pump_all()
        except _Withdrawn:
            reply(req_id, "cancelled", None)
            self._pump_all()
        except Exception as e:
            reply(req_id, "error", e)
        else:
            reply(req_id, "ok", value)
        finally:
            waiting.pop(req_id, None)

    async def _close_all(self) -> None:
        """Stop serving: every client connection closes, so their pending calls fail at once.

        Every task of the actor ends here, before the actor process is killed: a task still pending when
        the process exits makes asyncio print "Task was destroyed but it is pending!".
        """
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            w.close()
        self._writers.clear()
        waiting = list(self._tasks)
        for t in waiting:
            t.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        # Connection handlers are not cancelled (asyncio's stream machinery logs a cancelled handler as an
        # error): their sockets are closed, so each ends at its next read.
        me = asyncio.current_task()
        others = [t for t in self._serving if t is not me]
        if others:
            await asyncio.wait(others, timeout=5.0)

    def _pump_all(self) -> None:
        # A waiter that timed out may have been the one blocking the head of a queue.
        for q in self._queues.values():
            self._pump(q)


def _withdraw(fut: asyncio.Future[Any] | None) -> None:
    """Fail a waiting request its client gave up on (a no-op if it already completed)."""
    if fut is not None and not fut.done():
        fut.set_exception(_Withdrawn())


def _head_too_heavy(weight: float, target: float) -> ValueError:
    return ValueError(
        f"get_batch: the next item weighs {weight}, more than target_weight={target}; it can never fit a batch"
    )


# --------------------------------------------------------------------------------------------------------
# Client side (driver or worker)


@dataclass
class _Request:
    """A request sent to the channel actor; ``fut`` gets ``(status, value)``."""

    req_id: int
    op: str
    key: Any
    fut: concurrent.futures.Future[Any]


class _Client:
    """One pipelined connection from this process to a channel actor."""

    def __init__(self, address: tuple[str, int], name: str) -> None:
        self._name = name
        try:
            self._sock = socket.create_connection(address, timeout=_CONNECT_TIMEOUT_S)
        except OSError as e:
            raise RuntimeError(f"channel {name!r} is shut down or its actor is gone ({e})") from e
        self._sock.settimeout(None)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._pending: dict[int, _Request] = {}
        self._abandoned: dict[int, _Request] = {}
        self.closed = False
        threading.Thread(target=self._read, name=f"rlinf-channel-{name}", daemon=True).start()

    def call(self, op: str, args: tuple[Any, ...], timeout: float | None = None) -> _Request:
        req = _Request(-1, op, args[0] if args else None, concurrent.futures.Future())
        with self._lock:
            if self.closed:
                raise RuntimeError(f"channel {self._name!r} is shut down or its actor is gone")
            req.req_id = next(self._ids)
            if op not in _ONE_WAY:
                self._pending[req.req_id] = req
            self._send(req.req_id, op, args, timeout)
        return req

    def _send(self, req_id: int, op: str, args: tuple[Any, ...], timeout: float | None) -> None:
        body = pickle.dumps((req_id, op, args, timeout), protocol=5)
        try:
            self._sock.sendall(_LEN.pack(len(body)) + b"\0" + body)
        except OSError as e:
            self._pending.pop(req_id, None)
            raise RuntimeError(f"channel {self._name!r}: connection to its actor lost ({e})") from e

    def abandon(self, req: _Request) -> None:
        """The caller gave up on ``req`` (its asyncio task was cancelled): withdraw it, keep its items.

        A request still waiting in the actor is withdrawn there; items a get received anyway (the answer
        crossed the cancellation) go back to the head of their queue, so nothing is lost.
        """
        with self._lock:
            if self._pending.pop(req.req_id, None) is not None:
                self._abandoned[req.req_id] = req
                with contextlib.suppress(RuntimeError):  # connection gone: nothing left to withdraw
                    self._send(next(self._ids), "cancel", (req.req_id,), None)
                return
        if req.fut.done() and req.fut.exception() is None:
            self._give_back(req, *req.fut.result())

    def _give_back(self, req: _Request, status: str, value: Any) -> None:
        if status != "ok" or req.op not in ("get", "get_batch"):
            return
        items = [value] if req.op == "get" else list(value)

        def send() -> None:
            with contextlib.suppress(RuntimeError):
                self.call("requeue", (req.key, items))

        # Not on the reader thread: a blocking send there could wait on an actor waiting for us to read.
        threading.Thread(target=send, name=f"rlinf-channel-{self._name}-requeue", daemon=True).start()

    def _read(self) -> None:
        try:
            while True:
                head = recv_exact(self._sock, _LEN.size + 1)
                (length,) = _LEN.unpack(head[: _LEN.size])
                req_id, status, value = pickle.loads(recv_exact(self._sock, length))
                with self._lock:
                    req = self._pending.pop(req_id, None)
                    if req is not None and not req.fut.done():
                        req.fut.set_result((status, value))  # under the lock: abandon() sees it done
                    gone = self._abandoned.pop(req_id, None)
                if gone is not None:
                    self._give_back(gone, status, value)
        except (ConnectionError, OSError):
            pass
        with self._lock:
            self.closed = True
            pending, self._pending = self._pending, {}
            self._abandoned.clear()
        for req in pending.values():
            if not req.fut.done():
                req.fut.set_exception(
                    RuntimeError(f"channel {self._name!r} is shut down or its actor is gone")
                )

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._sock.close()


class _ProcessState:
    """This process's shared-memory pool, segment cache and fetch server for large channel items."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.clients: dict[tuple[str, int], _Client] = {}
        self.fetchers: dict[tuple[str, int], FrameClient] = {}
        self.pool = tp.SegmentPool()
        self.cache = tp.SegmentCache()
        self._server: FrameServer | None = None
        self._node_id: str | None = None

    @property
    def node_id(self) -> str:
        if self._node_id is None:
            self._node_id = ray.get_runtime_context().get_node_id()
        return self._node_id

    def server_address(self) -> tuple[str, int]:
        with self.lock:
            if self._server is None:
                self._server = FrameServer(node_ip(), self._serve_fetch)
            return self._server.address

    def _serve_fetch(self, kind: int, body: memoryview) -> list[Any]:
        data = self.pool.read_and_release(pickle.loads(body))
        return [] if data is None else [data]

    def client(self, address: tuple[str, int], name: str) -> _Client:
        with self.lock:
            c = self.clients.get(address)
            if c is None or c.closed:
                c = self.clients[address] = _Client(address, name)
            return c

    def fetch(self, address: tuple[str, int], ref: tp.ShmRef) -> np.ndarray:
        with self.lock:
            fc = self.fetchers.get(address)
            if fc is None:
                fc = self.fetchers[address] = FrameClient(address)
        total = ref[5]
        buf = bytearray(total)
        got = fc.request(ref, into=lambda n: memoryview(buf)[:n])
        if got.nbytes != total:
            raise RuntimeError(f"channel item's producer at {address} no longer has its data")
        return np.frombuffer(buf, dtype=np.uint8)


_ACTOR_CLS: Any = None
_STATE_LOCK = threading.Lock()
_STATE: _ProcessState | None = None


def _state() -> _ProcessState:
    global _STATE
    with _STATE_LOCK:
        if _STATE is None:
            _STATE = _ProcessState()
        return _STATE


def _pack(item: Any) -> bytes:
    enc = tp.encode(item)
    if enc.total < tp.INLINE_LIMIT:
        return pickle.dumps(
            ("inline", enc.meta, enc.specs, tp.pack_inline(enc) if enc.specs else b""), protocol=5
        )
    st = _state()
    area, (ref,) = st.pool.reserve(enc.total, 1)
    tp.write_buffers(enc, area)
    del area
    return pickle.dumps(("shm", enc.meta, enc.specs, (st.node_id, ref, st.server_address())), protocol=5)


def _unpack(blob: bytes) -> Any:
    rec = pickle.loads(blob)
    if rec[0] == "inline":
        _, meta, specs, data = rec
        return tp.decode(meta, specs, np.frombuffer(bytearray(data), dtype=np.uint8) if specs else None)
    _, meta, specs, (node_id, ref, address) = rec
    st = _state()
    area = st.cache.open(ref) if node_id == st.node_id else st.fetch(address, ref)
    return tp.decode(meta, specs, area)


def _check_timeout(timeout: float | None) -> None:
    if timeout is not None and (isinstance(timeout, bool) or not timeout >= 0):
        raise ValueError(f"timeout must be None or a number >= 0, got {timeout!r}")


def _check_key(key: Hashable) -> None:
    try:
        hash(key)
    except TypeError:
        raise TypeError(f"key must be hashable, got {key!r}") from None


class Channel:
    """A named, cluster-wide set of FIFO queues, one per key, with item weights and back-pressure.

    Create (or connect to) one with ``Channel.create(name)`` in the driver or in a worker, and pass it to
    workers as an argument. Items are any picklable objects; tensors and numpy arrays inside them move
    through shared memory (same node) or straight from the producer (other node), not through the actor.

    Per producer and key, items are delivered in ``put`` order; concurrent consumers of one key are served
    in request order. A ``get`` waiting on one key never delays another key.

    Example:
        >>> ch = Channel.create("rollout-to-actor", maxsize=8)  # doctest: +SKIP
        >>> ch.put({"obs": torch.zeros(4)}, key="env0", weight=1)  # doctest: +SKIP
        >>> ch.get(key="env0", timeout=10)  # doctest: +SKIP
        {'obs': tensor([0., 0., 0., 0.])}
        >>> ch.put_nowait(1); ch.put_nowait(2); ch.get_batch(2, timeout=10)  # doctest: +SKIP
        [1, 2]
        >>> ch.shutdown()  # doctest: +SKIP
    """

    def __init__(self, name: str, actor: Any, address: tuple[str, int], maxsize: int) -> None:
        """Use ``Channel.create``; this connects to an existing channel actor."""
        self._name = name
        self._actor = actor
        self._address = address
        self._maxsize = maxsize
        self._closed = False

    @classmethod
    def create(cls, name: str, maxsize: int = 0) -> Channel:
        """Create the channel ``name`` in the current Ray namespace, or connect to it if it exists.

        Args:
            name: cluster-wide channel name (non-empty str).
            maxsize: capacity of each key's queue; ``0`` means unbounded. Ignored when connecting to an
                existing channel (its ``maxsize`` property tells the real one).

        Returns:
            A picklable ``Channel`` handle.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty str, got {name!r}")
        if isinstance(maxsize, bool) or not isinstance(maxsize, int) or maxsize < 0:
            raise ValueError(f"maxsize must be an int >= 0, got {maxsize!r}")
        if not ray.is_initialized():
            raise RuntimeError(
                f"Channel.create({name!r}): Ray is not connected; create the Cluster (or call ray.init) first"
            )
        global _ACTOR_CLS
        if _ACTOR_CLS is None:
            _ACTOR_CLS = ray.remote(_ChannelActor)
        actor = _ACTOR_CLS.options(
            name=f"rlinf-channel:{name}", get_if_exists=True, num_cpus=0, max_concurrency=1000
        ).remote(name, maxsize)
        try:
            host, port, real_maxsize = ray.get(actor.address.remote(), timeout=_CONNECT_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(
                f"channel {name!r}: its actor did not start within {_CONNECT_TIMEOUT_S} s"
            ) from None
        return cls(name, actor, (host, port), real_maxsize)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Channel, (self._name, self._actor, self._address, self._maxsize))

    def __repr__(self) -> str:
        return f"Channel(name={self._name!r}, maxsize={self._maxsize})"

    @property
    def name(self) -> str:
        """The channel's name."""
        return self._name

    @property
    def maxsize(self) -> int:
        """Capacity of each key's queue (0: unbounded)."""
        return self._maxsize

    # ------------------------------------------------------------------------------------------ plumbing

    def _call(self, op: str, args: tuple[Any, ...], timeout: float | None) -> _Request:
        if self._closed:
            raise RuntimeError(f"channel {self._name!r} is shut down")
        return _state().client(self._address, self._name).call(op, args, timeout)

    def _result(self, req: _Request, timeout: float | None, what: str) -> Any:
        try:
            status, value = req.fut.result(None if timeout is None else timeout + _GRACE_S)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(
                f"channel {self._name!r}: {what} got no answer from the channel actor"
            ) from None
        return self._status(status, value, what)

    def _status(self, status: str, value: Any, what: str) -> Any:
        if status == "ok":
            return value
        if status == "full":
            raise Full(f"channel {self._name!r}: {what}: queue full (maxsize={self._maxsize})")
        if status == "empty":
            raise Empty(f"channel {self._name!r}: {what}: nothing available")
        if status == "error":
            raise value
        raise RuntimeError(f"channel {self._name!r}: {what}: unexpected answer {status!r}")

    async def _await(self, req: _Request, what: str) -> Any:
        # shield: cancelling the caller must not cancel the request's future behind the reader's back;
        # the request is withdrawn instead (its items, if any arrived, go back to the queue).
        try:
            status, value = await asyncio.shield(asyncio.wrap_future(req.fut))
        except asyncio.CancelledError:
            _state().client(self._address, self._name).abandon(req)
            raise
        return self._status(status, value, what)

    def _put_request(
        self, item: Any, key: Hashable, weight: float, block: bool, timeout: float | None
    ) -> Any:
        _check_key(key)
        _check_timeout(timeout)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight >= 0:
            raise ValueError(f"weight must be a number >= 0, got {weight!r}")
        return self._call("put", (key, float(weight), _pack(item), block), timeout)

    def _get_request(self, key: Hashable, target: float | None, block: bool, timeout: float | None) -> Any:
        _check_key(key)
        _check_timeout(timeout)
        if target is not None and (
            isinstance(target, bool) or not isinstance(target, (int, float)) or not target > 0
        ):
            raise ValueError(f"target_weight must be a number > 0, got {target!r}")
        op = "get" if target is None else "get_batch"
        return self._call(op, (key, None if target is None else float(target), block), timeout)

    # ---------------------------------------------------------------------------------------- blocking

    def put(
        self, item: Any, *, key: Hashable = DEFAULT_KEY, weight: float = 1, timeout: float | None = None
    ) -> None:
        """Append ``item`` to ``key``'s queue, waiting while it is full.

        ``key`` and ``weight`` are keyword-only: RLinf's ``put(item, weight, key)`` has them the other way
        round, so a positional call written for RLinf fails with ``TypeError`` instead of using the weight as
        the key.

        Args:
            item: any picklable object.
            key: which queue (any hashable; default ``DEFAULT_KEY``).
            weight: the item's weight for ``get_batch`` (>= 0).
            timeout: seconds to wait for room; ``None`` waits for ever.

        Raises:
            Full: no room within ``timeout``.
        """
        with trace_span(f"put {self._name}", WAIT) if tracing_enabled() else NO_SPAN:
            fut = self._put_request(item, key, weight, True, timeout)
            self._result(fut, timeout, f"put(key={key!r})")

    def get(self, key: Hashable = DEFAULT_KEY, *, timeout: float | None = None) -> Any:
        """Remove and return the oldest item of ``key``'s queue, waiting while it is empty.

        Raises:
            Empty: nothing arrived within ``timeout``.
        """
        with trace_span(f"get {self._name}", WAIT) if tracing_enabled() else NO_SPAN:
            fut = self._get_request(key, None, True, timeout)
            return _unpack(self._result(fut, timeout, f"get(key={key!r})")[1])

    def get_batch(
        self, target_weight: float, key: Hashable = DEFAULT_KEY, *, timeout: float | None = None
    ) -> list[Any]:
        """Remove and return the oldest items of ``key`` whose weights add up to ``target_weight``.

        Items are taken in order until their total weight reaches ``target_weight``; an item that would push
        the total past it is left in the queue and ends the batch. The call waits until one of the two
        happens.

        Args:
            target_weight: the batch weight (> 0).
            key: which queue.
            timeout: seconds to wait; ``None`` waits for ever.

        Raises:
            Empty: the batch was not complete within ``timeout`` (no item is taken).
            ValueError: the next item alone weighs more than ``target_weight``.
        """
        with trace_span(f"get_batch {self._name}", WAIT) if tracing_enabled() else NO_SPAN:
            fut = self._get_request(key, target_weight, True, timeout)
            return [_unpack(b) for _, b in self._result(fut, timeout, f"get_batch(key={key!r})")]

    # -------------------------------------------------------------------------------------- non-blocking

    def put_nowait(self, item: Any, *, key: Hashable = DEFAULT_KEY, weight: float = 1) -> None:
        """Append ``item`` if there is room, else raise ``Full``."""
        fut = self._put_request(item, key, weight, False, None)
        self._result(fut, 0.0, f"put_nowait(key={key!r})")

    def get_nowait(self, key: Hashable = DEFAULT_KEY) -> Any:
        """Remove and return the oldest item if there is one, else raise ``Empty``."""
        fut = self._get_request(key, None, False, None)
        return _unpack(self._result(fut, 0.0, f"get_nowait(key={key!r})")[1])

    def get_batch_nowait(self, target_weight: float, key: Hashable = DEFAULT_KEY) -> list[Any]:
        """``get_batch`` that raises ``Empty`` at once if the batch is not complete."""
        fut = self._get_request(key, target_weight, False, None)
        return [_unpack(b) for _, b in self._result(fut, 0.0, f"get_batch_nowait(key={key!r})")]

    # ---------------------------------------------------------------------------------------- asyncio

    async def put_async(
        self, item: Any, *, key: Hashable = DEFAULT_KEY, weight: float = 1, timeout: float | None = None
    ) -> None:
        """Asyncio form of ``put`` (the request is sent when the coroutine starts).

        Cancelling it (e.g. ``asyncio.wait_for`` timing out) withdraws a put still waiting for room; the item
        is then not added.
        """
        await self._await(self._put_request(item, key, weight, True, timeout), f"put_async(key={key!r})")

    async def get_async(self, key: Hashable = DEFAULT_KEY, *, timeout: float | None = None) -> Any:
        """Asyncio form of ``get``.

        Cancelling it (e.g. ``asyncio.wait_for`` timing out) withdraws the request: no item is lost (one
        that was already on its way goes back to the head of the queue) and the channel stays usable.
        """
        _, blob = await self._await(self._get_request(key, None, True, timeout), f"get_async(key={key!r})")
        return _unpack(blob)

    async def get_batch_async(
        self, target_weight: float, key: Hashable = DEFAULT_KEY, *, timeout: float | None = None
    ) -> list[Any]:
        """Asyncio form of ``get_batch``."""
        fut = self._get_request(key, target_weight, True, timeout)
        return [_unpack(b) for _, b in await self._await(fut, f"get_batch_async(key={key!r})")]

    # ------------------------------------------------------------------------------------------- state

    def qsize(self, key: Hashable = DEFAULT_KEY) -> int:
        """Number of items in ``key``'s queue."""
        _check_key(key)
        return int(self._result(self._call("qsize", (key,), None), _CONNECT_TIMEOUT_S, "qsize"))

    def empty(self, key: Hashable = DEFAULT_KEY) -> bool:
        """Whether ``key``'s queue has no item."""
        return self.qsize(key) == 0

    def full(self, key: Hashable = DEFAULT_KEY) -> bool:
        """Whether ``key``'s queue holds ``maxsize`` items (never for an unbounded channel)."""
        return self._maxsize > 0 and self.qsize(key) >= self._maxsize

    def shutdown(self) -> None:
        """Destroy the channel actor; pending and later operations on any handle raise ``RuntimeError``."""
        if self._closed:
            return
        with contextlib.suppress(RuntimeError, concurrent.futures.TimeoutError):
            self._call("shutdown", (), None).fut.result(timeout=_GRACE_S)
        self._closed = True
        st = _state()
        with st.lock:
            client = st.clients.pop(self._address, None)
        if client is not None:
            client.close()
        with contextlib.suppress(Exception):
            ray.kill(self._actor, no_restart=True)
