"""Framed messages over persistent TCP connections: the low-latency control path between processes.

A Ray actor call costs about a millisecond on a loaded machine; a frame on an open TCP connection costs tens
of microseconds. Workers exchange their addresses once through Ray, then control messages (and small inline
payloads) go straight from process to process. A frame is an 8-byte little-endian length and a body.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import ray

__all__: list[str] = []

_log = logging.getLogger(__name__)
_LEN = struct.Struct("<Q")
#: A connection claimed by a thread that has not read it for this many seconds goes back to its reader thread.
REVOKE_S = 0.05
_ONEWAY = 0
_REQUEST = 1


def node_ip() -> str:
    """This node's IP address as Ray sees it (what other nodes can reach)."""
    return str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]  # ray leaves it unannotated


def _sendall(
    sock: socket.socket, parts: list[bytes | memoryview], on_block: Callable[[], None] | None = None
) -> None:
    """Send every byte of ``parts``; ``on_block()`` runs once before the first send that would block."""
    views = [memoryview(p).cast("B") for p in parts if len(p)]
    flags = socket.MSG_DONTWAIT if on_block is not None else 0
    while views:
        try:
            sent = sock.sendmsg(views, [], flags)
        except BlockingIOError:
            sent = 0
        if flags and sum(len(v) for v in views) > sent:
            assert on_block is not None
            on_block()
            flags = 0
        while sent and views:
            n = len(views[0])
            if sent >= n:
                sent -= n
                views.pop(0)
            else:
                views[0] = views[0][sent:]
                sent = 0


def recv_exact(sock: socket.socket, n: int, into: memoryview | None = None) -> memoryview:
    """Read exactly ``n`` bytes (into ``into`` if given); raises ``ConnectionError`` on EOF."""
    view = into if into is not None else memoryview(bytearray(n))
    got = 0
    while got < n:
        r = sock.recv_into(view[got:n])
        if r == 0:
            raise ConnectionError("connection closed by peer")
        got += r
    return view


def _recv_frame(sock: socket.socket) -> tuple[int, memoryview]:
    head = recv_exact(sock, _LEN.size + 1)
    (length,) = _LEN.unpack(head[: _LEN.size])
    return head[_LEN.size], recv_exact(sock, length)


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _same_host(sock: socket.socket) -> bool:
    try:
        return bool(sock.getpeername()[0] == sock.getsockname()[0])
    except OSError:
        return False


class Connection:
    """One accepted connection, read by its reader thread or by a thread that claimed it.

    The reader thread reads and handles the frames, unless a thread that waits for a message has *claimed* the
    connection: that thread then reads the frames itself (see ``claim``).

    A claimed read saves the thread hand-overs of the reader path (the reader wakes on the data and hands the
    message to the waiting thread, which wakes again and takes the GIL); on a small machine they are most of a
    round trip's latency. Frames are handled the same way whichever thread reads them. A claim lasts until
    ``release`` (the comm layer releases a thread's claims when its worker method returns or before a send
    that would block), so a method that exchanges many messages with a peer pays the hand-over once; a claim
    not used for ``REVOKE_S`` seconds is taken back, so frames never wait long for a busy thread.
    """

    def __init__(
        self, sock: socket.socket, handler: Callable[[int, memoryview, Connection], list[Any] | None]
    ):
        self.sock = sock
        self._handler = handler
        self.closed = False
        #: The peer runs on this node (its frames never need prompt handling by the reader thread).
        self.local = _same_host(sock)
        self._gate = threading.Lock()  # held by whichever thread may read frames now
        self._mutex = threading.Lock()  # guards the claim state below
        self._owner: int | None = None  # the claiming thread (None: the reader thread reads)
        self._reading = False  # the claiming thread is inside read()
        self._handover = False  # a thread is taking the connection from the reader thread
        self._last_read = 0.0  # when the claiming thread last read (monotonic)
        self._send_lock = threading.Lock()  # replies to request frames may come from either thread
        self._want = False
        self._resume = threading.Event()
        self._resume.set()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._own_poll = select.poll()  # the claiming thread's
        self._own_poll.register(sock.fileno(), select.POLLIN)

    # ----------------------------------------------------------------------------------- reader thread
    def serve(self) -> None:
        """The reader thread's loop: read and handle frames until the peer disconnects."""
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        try:
            while not self.closed:
                # While a thread has the connection claimed, look every REVOKE_S whether it still reads.
                if not self._resume.wait(REVOKE_S) or not self._gate.acquire(timeout=REVOKE_S):
                    self._revoke_idle_claim()
                    continue
                frame = None
                try:
                    if self._want:
                        continue
                    events = dict(poller.poll())
                    if self._wake_r in events:
                        with contextlib.suppress(BlockingIOError):
                            os.read(self._wake_r, 4096)
                    if self._want or self.sock.fileno() not in events:
                        continue
                    try:
                        frame = _recv_frame(self.sock)
                    except (ConnectionError, OSError):
                        self.closed = True
                        return
                finally:
                    self._gate.release()
                self.handle(*frame)
        finally:
            self._close()

    def _revoke_idle_claim(self) -> None:
        """Take the connection back from a claiming thread that has not read it for ``REVOKE_S``.

        Frames then never wait longer than that for a thread that is busy with something else.
        """
        with self._mutex:
            if (
                self._owner is None
                or self._reading
                or self._handover
                or time.monotonic() - self._last_read < REVOKE_S
            ):
                return
            self._owner = None
            self._want = False
        self._gate.release()
        self._resume.set()

    # ------------------------------------------------------------------------------- claiming thread
    def claim(self, timeout: float) -> bool:
        """Make the calling thread this connection's reader; ``True`` if it is (already, or now).

        ``False`` if the connection is closed, or another thread claimed it and is reading (it handles the
        frames meanwhile). A claimed connection whose thread is not reading is taken over.

        Args:
            timeout: seconds to wait for the reader thread to step aside.
        """
        me = threading.get_ident()
        with self._mutex:
            if self.closed:
                return False
            if self._owner == me:
                return True
            if self._owner is not None:
                if self._reading:
                    return False
                self._owner = me
                self._last_read = time.monotonic()
                return True
            if self._handover:
                return False
            self._handover = True
            self._resume.clear()
            self._want = True
        with contextlib.suppress(OSError):  # BlockingIOError: a wake-up byte is already pending
            os.write(self._wake_w, b"\0")
        got = self._gate.acquire(timeout=max(timeout, 0.001))
        with self._mutex:
            self._handover = False
            if got:
                self._owner = me
                self._last_read = time.monotonic()
            else:
                self._want = False
        if not got:
            self._resume.set()
        return got

    def read(self, timeout: float, spin: float = 0.0) -> bool:
        """Read and handle one frame (claiming thread).

        Returns ``False`` if none began within ``timeout`` or the calling thread no longer holds the claim
        (another thread took it over).

        Args:
            timeout: seconds to wait for a frame.
            spin: first poll the socket without sleeping for up to this many seconds (yielding the core to
                any other runnable thread between polls): a frame that comes within it is read without the
                wake-up latency of a sleeping thread.

        Raises:
            ConnectionError: the peer disconnected (the connection is closed).
        """
        with self._mutex:
            if self._owner != threading.get_ident():
                return False
            self._reading = True
        try:
            ready = False
            if spin > 0:
                end = time.perf_counter() + min(spin, timeout)
                while not (ready := bool(self._own_poll.poll(0))) and time.perf_counter() < end:
                    os.sched_yield()
            if not ready and not self._own_poll.poll(max(0, int(timeout * 1000))):
                return False
            frame = _recv_frame(self.sock)
        except (ConnectionError, OSError, ValueError) as e:
            self.closed = True
            raise ConnectionError(str(e)) from e
        finally:
            with self._mutex:
                self._reading = False
                self._last_read = time.monotonic()
        self.handle(*frame)
        return True

    def release(self, force: bool = False) -> None:
        """Give reading back to the reader thread, if the calling thread holds the claim.

        ``force``: whichever thread holds it, unless it is reading.
        """
        with self._mutex:
            if self._owner is None or self._reading or (not force and self._owner != threading.get_ident()):
                return
            self._owner = None
            self._want = False  # under the lock: a thread claiming next sets it again after this
        self._gate.release()
        self._resume.set()

    # ------------------------------------------------------------------------------------------ both
    def handle(self, kind: int, body: memoryview) -> None:
        """Run the handler on one frame and answer a request frame."""
        try:
            reply = self._handler(kind, body, self)
        except Exception:  # keep serving the connection; the sender's wait will time out
            _log.exception("rlinf_scheduler: failed to handle a control frame")
            reply = None
        if kind == _REQUEST:
            parts = reply or []
            total = sum(memoryview(p).nbytes for p in parts)
            try:
                with self._send_lock:
                    _sendall(self.sock, [_LEN.pack(total) + bytes([_ONEWAY]), *parts])
            except OSError:
                self.closed = True

    def _close(self) -> None:
        self.closed = True
        self._resume.set()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        with contextlib.suppress(OSError):
            self.sock.close()


class FrameServer:
    """Accepts connections and runs ``handler(kind, body)`` for each frame, one reader thread per connection.

    For request frames, the handler's return value (a list of buffers) is sent back as the reply body.

    Args:
        host: address to listen on (the node IP, so that other nodes reach it).
        handler: ``handler(kind, body) -> list of buffers | None``; with ``with_connection``,
            ``handler(kind, body, connection)`` (the ``Connection`` the frame came on: a thread waiting for a
            message from that peer may ``claim`` it and read the frames itself).
        with_connection: pass the connection to the handler.
    """

    def __init__(
        self,
        host: str,
        handler: Callable[..., list[Any] | None],
        *,
        with_connection: bool = False,
    ) -> None:
        self._handler: Callable[[int, memoryview, Connection], list[Any] | None] = (
            handler if with_connection else lambda kind, body, _conn: handler(kind, body)
        )
        self._sock = socket.create_server((host, 0))
        self.address: tuple[str, int] = (host, self._sock.getsockname()[1])
        self._closed = False
        threading.Thread(target=self._accept, name="rlinf-comm-accept", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                sock, _ = self._sock.accept()
            except OSError:
                return
            _tune(sock)
            conn = Connection(sock, self._handler)
            threading.Thread(target=conn.serve, name="rlinf-comm-reader", daemon=True).start()

    def close(self) -> None:
        """Stop accepting connections (open ones end when their peers disconnect)."""
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.close()


class FrameClient:
    """One persistent connection to a ``FrameServer``; thread-safe."""

    def __init__(self, address: tuple[str, int], timeout: float = 30.0) -> None:
        self._sock = socket.create_connection(address, timeout=timeout)
        self._sock.settimeout(None)
        _tune(self._sock)
        self._lock = threading.Lock()
        self.address = address

    def send(self, obj: Any, on_block: Callable[[], None] | None = None) -> None:
        """Send one pickled one-way frame.

        ``on_block()`` runs first if the peer's buffer is full (the send then waits until the peer reads).
        """
        body = pickle.dumps(obj, protocol=5)
        with self._lock:
            _sendall(self._sock, [_LEN.pack(len(body)) + bytes([_ONEWAY]), body], on_block)

    def request(self, obj: Any, into: Callable[[int], memoryview] | None = None) -> memoryview:
        """Send a request frame and return the reply body (read into ``into(nbytes)`` if given)."""
        body = pickle.dumps(obj, protocol=5)
        with self._lock:
            _sendall(self._sock, [_LEN.pack(len(body)) + bytes([_REQUEST]), body])
            head = recv_exact(self._sock, _LEN.size + 1)
            (length,) = _LEN.unpack(head[: _LEN.size])
            return recv_exact(self._sock, length, into(length) if into is not None else None)

    def close(self) -> None:
        """Close the connection."""
        with contextlib.suppress(OSError):
            self._sock.close()
