"""Framed messages over persistent TCP connections: the low-latency control path between processes.

A Ray actor call costs about a millisecond on a loaded machine; a frame on an open TCP connection costs tens
of microseconds. Workers exchange their addresses once through Ray, then control messages (and small inline
payloads) go straight from process to process. A frame is an 8-byte little-endian length and a body.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

import ray

__all__: list[str] = []

_log = logging.getLogger(__name__)
_LEN = struct.Struct("<Q")
_ONEWAY = 0
_REQUEST = 1


def node_ip() -> str:
    """This node's IP address as Ray sees it (what other nodes can reach)."""
    return str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]  # ray leaves it unannotated


def _sendall(sock: socket.socket, parts: list[bytes | memoryview]) -> None:
    views = [memoryview(p).cast("B") for p in parts if len(p)]
    while views:
        sent = sock.sendmsg(views)
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


class FrameServer:
    """Accepts connections and runs ``handler(body)`` for each frame, one reader thread per connection.

    For request frames, the handler's return value (a list of buffers) is sent back as the reply body.

    Args:
        host: address to listen on (the node IP, so that other nodes reach it).
        handler: ``handler(kind, body) -> list of buffers | None``.
    """

    def __init__(self, host: str, handler: Callable[[int, memoryview], list[Any] | None]) -> None:
        self._handler = handler
        self._sock = socket.create_server((host, 0))
        self.address: tuple[str, int] = (host, self._sock.getsockname()[1])
        self._closed = False
        threading.Thread(target=self._accept, name="rlinf-comm-accept", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            _tune(conn)
            threading.Thread(target=self._serve, args=(conn,), name="rlinf-comm-reader", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            while True:
                try:
                    kind, body = _recv_frame(conn)
                except (ConnectionError, OSError):
                    return
                try:
                    reply = self._handler(kind, body)
                except Exception:  # keep serving the connection; the sender's wait will time out
                    _log.exception("rlinf_scheduler: failed to handle a control frame")
                    reply = None
                if kind == _REQUEST:
                    parts = reply or []
                    total = sum(memoryview(p).nbytes for p in parts)
                    try:
                        _sendall(conn, [_LEN.pack(total) + bytes([_ONEWAY]), *parts])
                    except OSError:
                        return

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

    def send(self, obj: Any) -> None:
        """Send one pickled one-way frame."""
        body = pickle.dumps(obj, protocol=5)
        with self._lock:
            _sendall(self._sock, [_LEN.pack(len(body)) + bytes([_ONEWAY]), body])

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
