"""``RobotClient``: one connection to a robot server, every request bounded by a timeout, every motion checked first."""

from __future__ import annotations

import socket
import time
from typing import Any

import numpy as np

from ._geometry import Vector
from ._protocol import (
    PROTOCOL_VERSION,
    EmergencyStopped,
    RobotFault,
    RobotState,
    RobotUnreachable,
    SafetyLimits,
    recv_message,
    send_message,
    unpack_arrays,
)

__all__ = ["RobotClient"]


class RobotClient:
    """A robot server reached over TCP (a real robot's bridge or the dummy), as a few blocking calls.

    Every request waits at most ``timeout_s`` for its reply. A refused or closed connection, a reply that does
    not come in time or a malformed one raise :class:`RobotUnreachable` naming the robot, its address and the
    request; the connection is dropped then (a late reply must never pass for the next request's), and the
    next request connects again (and raises the same way if the robot is still gone). A motion (``move``) is checked against ``limits`` before anything is sent: a
    :class:`SafetyViolation` means the robot never saw the command.

    Refusals by the robot itself raise :class:`EmergencyStopped` (the e-stop is latched) or :class:`RobotFault`
    (a fault its own limits latched, cleared by ``reset``; a malformed request; a server speaking another
    protocol version, found by the ``hello`` the constructor sends).

    Attributes:
        info: the robot's ``hello`` reply: ``robot_type``, ``serial``, ``cameras`` (camera name to serial),
            ``image_shape``, ``protocol``.

    Args:
        address: ``(host, port)`` of the robot server.
        name: how errors name the robot, e.g. ``"Franka unit 0"``.
        limits: what a ``move`` may command.
        timeout_s: longest wait for a connection or for one reply.
    """

    def __init__(
        self, address: tuple[str, int], *, name: str, limits: SafetyLimits, timeout_s: float = 5.0
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.address = (str(address[0]), int(address[1]))
        self.name = name
        self.limits = limits
        self.timeout_s = float(timeout_s)
        self._sock: socket.socket | None = None
        self._next_id = 0
        self._last: RobotState | None = None
        self._closed = False
        self.info: dict[str, Any] = self._request("hello")
        if self.info.get("protocol") != PROTOCOL_VERSION:
            self._drop()
            raise RobotFault(
                f"{name} at {self.address[0]}:{self.address[1]} speaks protocol {self.info.get('protocol')!r}; "
                f"this client speaks {PROTOCOL_VERSION}"
            )

    # -- transport -----------------------------------------------------------------------------------------

    def _unreachable(self, request: str, reason: str) -> RobotUnreachable:
        return RobotUnreachable(self.name, self.address, request, self.timeout_s, reason)

    def _connect(self) -> socket.socket:
        try:
            sock = socket.create_connection(self.address, timeout=self.timeout_s)
        except OSError as e:
            raise self._unreachable("connect", f"{type(e).__name__}: {e}") from e
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _request(self, op: str, payload_out: bytes = b"", **fields: Any) -> dict[str, Any]:
        header, _ = self._exchange(op, payload_out, fields)
        return header

    def _exchange(self, op: str, payload_out: bytes, fields: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        """Send one request and wait for its reply; raise on a refusal."""
        if self._closed:
            raise RuntimeError(f"{self.name}: this RobotClient is closed")
        if self._sock is None:
            self._sock = self._connect()
        self._next_id += 1
        request_id = self._next_id
        deadline = time.monotonic() + self.timeout_s
        try:
            self._sock.settimeout(self.timeout_s)
            send_message(self._sock, {"op": op, "id": request_id, **fields}, payload_out)
            header, payload = recv_message(self._sock, deadline)
        except (TimeoutError, EOFError, ValueError, OSError) as e:
            # TimeoutError is an OSError: the specific causes are tested first.
            self._drop()
            if isinstance(e, TimeoutError):
                reason = f"no reply ({e})"
            elif isinstance(e, EOFError):
                reason = f"connection lost ({e})"
            elif isinstance(e, ValueError):
                reason = f"malformed reply ({e})"
            else:
                reason = f"{type(e).__name__}: {e}"
            raise self._unreachable(op, reason) from e
        if header.get("id") != request_id:
            self._drop()
            raise self._unreachable(op, f"reply to request {header.get('id')!r} instead of {request_id}")
        if not header.get("ok", False):
            error, message = header.get("error"), str(header.get("message", ""))
            if error == "estopped":
                raise EmergencyStopped(f"{self.name}: {op} refused: {message}")
            raise RobotFault(f"{self.name}: {op} refused ({error}): {message}")
        return header, payload

    def _state_reply(self, header: dict[str, Any], op: str) -> RobotState:
        try:
            state = RobotState.from_dict(header["state"])
        except (KeyError, TypeError, ValueError) as e:
            self._drop()
            raise self._unreachable(op, f"malformed state in the reply ({e})") from e
        self._last = state
        return state

    # -- requests ------------------------------------------------------------------------------------------

    @property
    def last_state(self) -> RobotState | None:
        """The state the latest reply carried (``state``, ``move``, ``reset``); ``None`` before any."""
        return self._last

    def state(self) -> RobotState:
        """The robot's current state."""
        return self._state_reply(self._request("state"), "state")

    def frames(self) -> dict[str, np.ndarray]:
        """One ``[H, W, 3]`` uint8 image per camera, by camera name."""
        header, payload = self._exchange("frames", b"", {})
        try:
            return unpack_arrays(header.get("arrays", []), payload)
        except (KeyError, TypeError, ValueError) as e:
            self._drop()
            raise self._unreachable("frames", f"malformed frames ({e})") from e

    def move(self, pose: Vector, gripper: float) -> RobotState:
        """Command one control period toward ``pose`` (``[7]`` xyz + quaternion ``x, y, z, w``); the state after it.

        The command is checked against :attr:`limits` from the last known state (fetched first when there is
        none) before it is sent.

        Raises:
            SafetyViolation: outside the limits; nothing was sent.
            EmergencyStopped: the robot's e-stop is latched.
            RobotFault: the robot refused it (a latched fault).
            RobotUnreachable: no answer within ``timeout_s``.
        """
        current = self._last if self._last is not None else self.state()
        target = [float(v) for v in np.asarray(pose, dtype=np.float64).reshape(-1)]
        self.limits.check(target, float(gripper), current.tcp_pose, robot=self.name)
        return self._state_reply(self._request("move", pose=target, gripper=float(gripper)), "move")

    def reset(self, pose: Vector, gripper: float, *, seed: int | None = None) -> RobotState:
        """Move to ``pose`` (a planned motion: checked against the workspace box, not the step limits) at rest.

        Clears a fault the robot latched. ``seed`` reseeds a simulated robot's noise (a real one ignores it).
        """
        target = [float(v) for v in np.asarray(pose, dtype=np.float64).reshape(-1)]
        self.limits.check_pose(target, robot=self.name)
        fields: dict[str, Any] = {"pose": target, "gripper": float(gripper)}
        if seed is not None:
            fields["seed"] = int(seed)
        return self._state_reply(self._request("reset", **fields), "reset")

    def estop(self) -> None:
        """Latch the robot's emergency stop: it refuses every motion until :meth:`clear_estop`."""
        self._request("estop")

    def clear_estop(self) -> None:
        """Release the emergency stop."""
        self._request("clear_estop")

    def stats(self) -> dict[str, Any]:
        """The server's counters (``moves_received``, ``moves_executed``, ``moves_refused``, ...), ``estopped``, ``fault``."""
        header = self._request("stats")
        return {"estopped": header.get("estopped"), "fault": header.get("fault"), **header.get("stats", {})}

    def shutdown_server(self) -> None:
        """Ask the server to exit (the dummy does; a real robot's bridge may ignore it), then close."""
        try:
            self._request("close")
        finally:
            self.close()

    def close(self) -> None:
        """Drop the connection (the robot keeps running); idempotent."""
        self._drop()
        self._closed = True

    def __enter__(self) -> RobotClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
