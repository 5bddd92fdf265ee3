"""What a robot server and its client exchange: the robot state, safety limits, errors and the framed wire format.

**Wire format.** Every message, request or reply, is one frame::

    !II prefix (8 bytes): header length H, payload length P (unsigned, network byte order)
    H bytes: the header, a UTF-8 JSON object
    P bytes: the payload (raw array bytes; empty for most messages)

A request header carries ``op`` (one of :data:`OPS`) and ``id`` (echoed by the reply). A reply header carries
``ok``; a refused request ``ok: false`` with ``error`` (one of :data:`ERRORS`) and ``message``. Arrays (camera
frames) travel in the payload, described by the header's ``arrays`` list (``name``, ``dtype``, ``shape``,
``offset``, ``nbytes``), so an image is never turned into JSON numbers.

**Ops.** ``hello`` (robot type, serial, cameras and their serials, image shape, protocol version), ``state``
(:class:`RobotState`), ``frames`` (one ``[H, W, 3]`` uint8 image per camera), ``move`` (``pose`` [7] and
``gripper``: the target of one control period; the reply carries the state after it), ``reset`` (``pose``,
``gripper``, optional ``seed``: move to a pose and clear a latched fault), ``estop``, ``clear_estop``, ``stats``
(requests received and what became of the moves) and ``close`` (the server exits after replying).
"""

from __future__ import annotations

import json
import math
import socket
import struct
import time
from collections.abc import Mapping, Sequence
from typing import Any, cast

import attrs
import numpy as np

from ._geometry import Vector, clip_arc, euler_to_quat, in_arc, quat_to_euler, rotation_angle

__all__ = [
    "ERRORS",
    "MAX_HEADER_BYTES",
    "MAX_PAYLOAD_BYTES",
    "OPS",
    "PROTOCOL_VERSION",
    "STATE_DIM",
    "EmergencyStopped",
    "RobotFault",
    "RobotState",
    "RobotUnreachable",
    "SafetyLimits",
    "SafetyViolation",
    "encode_message",
    "pack_arrays",
    "recv_message",
    "send_message",
    "unpack_arrays",
]

PROTOCOL_VERSION = 1
OPS = ("hello", "state", "frames", "move", "reset", "estop", "clear_estop", "stats", "close")
ERRORS = ("estopped", "fault", "bad_request")
"""``error`` of a refused request: e-stop latched, a fault latched by the robot's own limits, a malformed request."""
STATE_DIM = 19
"""Length of :meth:`RobotState.state_vector`: TCP pose 7, TCP velocity 6, force 3, torque 3 (RLinf's ``state_dim``)."""
MAX_HEADER_BYTES = 1 << 20
MAX_PAYLOAD_BYTES = 1 << 28
"""Frames announcing more are refused unread (a corrupt prefix must not allocate gigabytes)."""
_PREFIX = struct.Struct("!II")


# -- state ---------------------------------------------------------------------------------------------------


def _floats(value: Any) -> tuple[float, ...]:
    """Convert any flat sequence of numbers as a tuple of floats (the validators check length and finiteness)."""
    return tuple(float(x) for x in np.asarray(value, dtype=np.float64).reshape(-1))


def _length(n: int) -> Any:
    def check(_inst: object, attr: attrs.Attribute[tuple[float, ...]], value: tuple[float, ...]) -> None:
        if len(value) != n or not all(math.isfinite(x) for x in value):
            raise ValueError(f"{attr.name} must be {n} finite numbers, got {list(value)}")

    return check


@attrs.frozen(kw_only=True)
class RobotState:
    """One reading of the end effector (the TCP, tool centre point) in the robot's base frame."""

    tcp_pose: tuple[float, ...] = attrs.field(converter=_floats, validator=_length(7))
    """Position (m) and orientation as a quaternion ``x, y, z, w``."""
    tcp_vel: tuple[float, ...] = attrs.field(default=(0.0,) * 6, converter=_floats, validator=_length(6))
    """Linear (m/s) and angular (rad/s) velocity."""
    tcp_force: tuple[float, ...] = attrs.field(default=(0.0,) * 3, converter=_floats, validator=_length(3))
    """External force on the TCP (N), e.g. the push back of a surface."""
    tcp_torque: tuple[float, ...] = attrs.field(default=(0.0,) * 3, converter=_floats, validator=_length(3))
    """External torque on the TCP (N m)."""
    gripper: float = attrs.field(default=0.0, converter=float)
    """Gripper opening in ``[0, 1]`` (0: closed)."""

    @gripper.validator
    def _check_gripper(self, _attr: attrs.Attribute[float], value: float) -> None:
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"gripper must be in [0, 1], got {value}")

    def state_vector(self) -> np.ndarray:
        """``[19]`` float32: ``tcp_pose`` (7), ``tcp_vel`` (6), ``tcp_force`` (3), ``tcp_torque`` (3)."""
        return np.array(self.tcp_pose + self.tcp_vel + self.tcp_force + self.tcp_torque, dtype=np.float32)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (lists of floats)."""
        return {
            "tcp_pose": list(self.tcp_pose),
            "tcp_vel": list(self.tcp_vel),
            "tcp_force": list(self.tcp_force),
            "tcp_torque": list(self.tcp_torque),
            "gripper": self.gripper,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RobotState:
        """Read :meth:`to_dict`'s form; raises ``ValueError`` naming a missing or malformed field."""
        fields = ("tcp_pose", "tcp_vel", "tcp_force", "tcp_torque", "gripper")
        missing = [f for f in fields if f not in data]
        if missing:
            raise ValueError(f"robot state lacks {missing}; got keys {sorted(data)}")
        return cls(**{f: data[f] for f in fields})


# -- errors --------------------------------------------------------------------------------------------------


class SafetyViolation(ValueError):
    """A command outside the :class:`SafetyLimits`; refused before anything was sent to the robot.

    Attributes:
        robot: the robot's name (type and unit index).
        limit: the limit that refused it, e.g. ``"workspace z (xyz_min[2], xyz_max[2])"``.
        value: the commanded value.
        allowed: the allowed range, as text with its unit.
    """

    def __init__(self, robot: str, limit: str, value: float, allowed: str) -> None:
        super().__init__(
            f"{robot}: command refused, nothing sent: {limit} = {value:.6g} is outside the allowed {allowed}"
        )
        self.robot, self.limit, self.value, self.allowed = robot, limit, value, allowed

    def __reduce__(self) -> tuple[type[SafetyViolation], tuple[str, str, float, str]]:
        return (type(self), (self.robot, self.limit, self.value, self.allowed))


class EmergencyStopped(RuntimeError):
    """The robot's emergency stop is latched: it refuses every motion until ``clear_estop``."""


class RobotFault(RuntimeError):
    """The robot refused a request on its own: a latched fault (its hard limits) or a malformed request."""


class RobotUnreachable(ConnectionError):
    """A robot did not answer a request: connection refused or closed, or no reply within the timeout.

    Attributes:
        robot: the robot's name (type and unit index).
        address: ``(host, port)`` of its server.
        request: the op that was waiting (``"connect"`` while connecting).
        timeout_s: the request's timeout.
    """

    def __init__(
        self, robot: str, address: tuple[str, int], request: str, timeout_s: float, reason: str
    ) -> None:
        host, port = address
        super().__init__(
            f"{robot} at {host}:{port} did not answer the {request!r} request within {timeout_s:g} s: {reason}"
        )
        self.robot, self.address, self.request, self.timeout_s = robot, address, request, timeout_s
        self.reason = reason

    def __reduce__(self) -> tuple[type[RobotUnreachable], tuple[str, tuple[str, int], str, float, str]]:
        return (type(self), (self.robot, self.address, self.request, self.timeout_s, self.reason))


# -- safety limits -------------------------------------------------------------------------------------------


def _triple(_inst: object, attr: attrs.Attribute[tuple[float, ...]], value: tuple[float, ...]) -> None:
    if len(value) != 3 or not all(math.isfinite(x) for x in value):
        raise ValueError(f"SafetyLimits.{attr.name} must be 3 finite numbers, got {list(value)}")


def _angles(_inst: object, attr: attrs.Attribute[tuple[float, ...]], value: tuple[float, ...]) -> None:
    _triple(_inst, attr, value)
    if any(abs(x) > math.pi + 1e-9 for x in value):
        raise ValueError(f"SafetyLimits.{attr.name} must be angles in [-π, π] (radians), got {list(value)}")


def _positive(_inst: object, attr: attrs.Attribute[float], value: float) -> None:
    if not math.isfinite(value) or value <= 0.0:
        raise ValueError(f"SafetyLimits.{attr.name} must be a finite number > 0, got {value}")


def _unit(_inst: object, attr: attrs.Attribute[float], value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"SafetyLimits.{attr.name} must be in [0, 1], got {value}")


_AXES = ("x", "y", "z")
_ANGLE_NAMES = ("roll", "pitch", "yaw")
_TOOL_DOWN_ROLL = math.pi - 0.5


@attrs.frozen(kw_only=True)
class SafetyLimits:
    """What a client lets a robot do: a workspace box, per-command step sizes and a gripper range.

    Checked by :meth:`check` before a command leaves the client; the robot's own limits (a real arm's
    reflexes, the dummy's envelope) stay in force behind it. The defaults fit the dummy Franka's peg-insertion
    scene (hole at x=0.5, y=0, gripper pointing down); a real robot's must be measured for its cell.
    """

    xyz_min: tuple[float, ...] = attrs.field(
        default=(0.40, -0.10, 0.05), converter=_floats, validator=_triple
    )
    """Lower corner of the TCP position box (m, base frame)."""
    xyz_max: tuple[float, ...] = attrs.field(default=(0.60, 0.10, 0.25), converter=_floats, validator=_triple)
    """Upper corner of the TCP position box (m)."""
    rpy_min: tuple[float, ...] = attrs.field(
        default=(_TOOL_DOWN_ROLL, -0.5, -0.5), converter=_floats, validator=_angles
    )
    """Lower ends of the roll, pitch, yaw intervals (rad, extrinsic xyz); an end above its ``rpy_max`` makes the
    interval wrap through ±π (the default roll: within 0.5 rad of pointing down, ``[π-0.5, π] ∪ [-π, -π+0.5]``)."""
    rpy_max: tuple[float, ...] = attrs.field(
        default=(-_TOOL_DOWN_ROLL, 0.5, 0.5), converter=_floats, validator=_angles
    )
    """Upper ends of the roll, pitch, yaw intervals (rad)."""
    max_translation_m: float = attrs.field(default=0.03, converter=float, validator=_positive)
    """Largest distance between the current TCP position and one command's target (m)."""
    max_rotation_rad: float = attrs.field(default=0.15, converter=float, validator=_positive)
    """Largest rotation between the current TCP orientation and one command's target (rad)."""
    gripper_min: float = attrs.field(default=0.0, converter=float, validator=_unit)
    """Smallest gripper command (0: closed)."""
    gripper_max: float = attrs.field(default=1.0, converter=float, validator=_unit)
    """Largest gripper command (1: open)."""

    def __attrs_post_init__(self) -> None:
        for i, axis in enumerate(_AXES):
            if self.xyz_min[i] >= self.xyz_max[i]:
                raise ValueError(
                    f"SafetyLimits.xyz_min[{i}] ({axis}: {self.xyz_min[i]}) must be below "
                    f"xyz_max[{i}] ({self.xyz_max[i]})"
                )
        if self.gripper_min > self.gripper_max:
            raise ValueError(
                f"SafetyLimits.gripper_min ({self.gripper_min}) must not exceed gripper_max ({self.gripper_max})"
            )

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> SafetyLimits:
        """Build from a config mapping; raises ``ValueError`` listing the allowed keys on an unknown one."""
        allowed = [a.name for a in attrs.fields(cls)]
        unknown = sorted(str(k) for k in data if k not in allowed)
        if unknown:
            raise ValueError(f"safety_limits: unknown key(s) {unknown}; allowed: {', '.join(allowed)}")
        return cls(**{str(k): v for k, v in data.items()})

    def _arc_text(self, i: int) -> str:
        lo, hi = self.rpy_min[i], self.rpy_max[i]
        if lo <= hi:
            return f"[{lo:.4g}, {hi:.4g}] rad"
        return f"[{lo:.4g}, π] ∪ [-π, {hi:.4g}] rad"

    def check(self, target_pose: Vector, gripper: float, current_pose: Vector, *, robot: str) -> None:
        """Refuse a target outside the box, too far from ``current_pose`` or with the gripper out of range.

        Args:
            target_pose: ``[7]`` commanded TCP pose (xyz + quaternion ``x, y, z, w``).
            gripper: commanded gripper opening.
            current_pose: ``[7]`` the TCP pose the command starts from.
            robot: the robot's name, for the error.

        Raises:
            SafetyViolation: naming the first limit the command breaks.
        """
        target = np.asarray(target_pose, dtype=np.float64)
        if target.shape != (7,) or not np.isfinite(target).all() or not math.isfinite(gripper):
            raise SafetyViolation(robot, "finite pose [7] and gripper", math.nan, "finite numbers")
        if float(np.linalg.norm(target[3:])) < 1e-9:
            raise SafetyViolation(robot, "quaternion norm", 0.0, "a non-zero quaternion")
        for i, axis in enumerate(_AXES):
            if not self.xyz_min[i] <= target[i] <= self.xyz_max[i]:
                raise SafetyViolation(
                    robot,
                    f"workspace {axis} (xyz_min[{i}], xyz_max[{i}])",
                    float(target[i]),
                    f"[{self.xyz_min[i]:.4g}, {self.xyz_max[i]:.4g}] m",
                )
        rpy = quat_to_euler(target[3:])
        for i, angle in enumerate(_ANGLE_NAMES):
            if not in_arc(float(rpy[i]), self.rpy_min[i], self.rpy_max[i]):
                raise SafetyViolation(
                    robot, f"workspace {angle} (rpy_min[{i}], rpy_max[{i}])", float(rpy[i]), self._arc_text(i)
                )
        current = np.asarray(current_pose, dtype=np.float64)
        step = float(np.linalg.norm(target[:3] - current[:3]))
        if step > self.max_translation_m:
            raise SafetyViolation(
                robot,
                "translation per command (max_translation_m)",
                step,
                f"[0, {self.max_translation_m:g}] m",
            )
        turn = rotation_angle(current[3:], target[3:])
        if turn > self.max_rotation_rad:
            raise SafetyViolation(
                robot, "rotation per command (max_rotation_rad)", turn, f"[0, {self.max_rotation_rad:g}] rad"
            )
        if not self.gripper_min <= gripper <= self.gripper_max:
            raise SafetyViolation(
                robot,
                "gripper (gripper_min, gripper_max)",
                gripper,
                f"[{self.gripper_min:g}, {self.gripper_max:g}]",
            )

    def check_pose(self, pose: Vector, *, robot: str) -> None:
        """:meth:`check` without the per-command step limits (a reset pose, reached by a planned motion)."""
        self.check(pose, self.gripper_min, pose, robot=robot)

    def clip_pose(self, pose: Vector) -> np.ndarray:
        """``[7]`` ``pose`` with its position clipped into the box and its roll/pitch/yaw into their intervals."""
        p = np.asarray(pose, dtype=np.float64)
        xyz = np.clip(p[:3], self.xyz_min, self.xyz_max)
        rpy = quat_to_euler(p[3:])
        clipped = [clip_arc(float(rpy[i]), self.rpy_min[i], self.rpy_max[i]) for i in range(3)]
        if all(
            c == r for c, r in zip(clipped, rpy, strict=True)
        ):  # nothing clipped: keep the quaternion as given
            return np.concatenate([xyz, p[3:] / np.linalg.norm(p[3:])])
        return np.concatenate([xyz, euler_to_quat(clipped)])


# -- framing -------------------------------------------------------------------------------------------------


def encode_message(header: Mapping[str, Any], payload: bytes = b"") -> bytes:
    """One frame: the ``!II`` prefix, the JSON header, the payload."""
    head = json.dumps(header, separators=(",", ":"), allow_nan=False).encode()
    if len(head) > MAX_HEADER_BYTES or len(payload) > MAX_PAYLOAD_BYTES:
        raise ValueError(f"message too large: header {len(head)} bytes, payload {len(payload)} bytes")
    return _PREFIX.pack(len(head), len(payload)) + head + payload


def send_message(sock: socket.socket, header: Mapping[str, Any], payload: bytes = b"") -> None:
    """Write one frame (blocking, within the socket's timeout)."""
    sock.sendall(encode_message(header, payload))


def _recv_exact(sock: socket.socket, n: int, deadline: float | None) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"timed out with {got} of {n} bytes received")
            sock.settimeout(left)
        k = sock.recv_into(view[got:])
        if k == 0:
            raise EOFError(f"connection closed by the peer ({got} of {n} bytes received)")
        got += k
    return bytes(buf)


def recv_message(sock: socket.socket, deadline: float | None = None) -> tuple[dict[str, Any], bytes]:
    """Read one frame; ``deadline`` is a ``time.monotonic()`` value (``None``: the socket's own timeout).

    Raises:
        EOFError: the peer closed the connection.
        TimeoutError: the deadline passed.
        ValueError: a malformed frame (oversized lengths, a header that is not a JSON object).
    """
    n_head, n_payload = _PREFIX.unpack(_recv_exact(sock, _PREFIX.size, deadline))
    if n_head > MAX_HEADER_BYTES or n_payload > MAX_PAYLOAD_BYTES:
        raise ValueError(f"frame announces a {n_head}-byte header and a {n_payload}-byte payload: too large")
    header = json.loads(_recv_exact(sock, n_head, deadline))
    if not isinstance(header, dict):
        raise ValueError(f"frame header is not a JSON object: {header!r}")
    payload = _recv_exact(sock, n_payload, deadline) if n_payload else b""
    return cast(dict[str, Any], header), payload


def pack_arrays(arrays: Mapping[str, np.ndarray]) -> tuple[list[dict[str, Any]], bytes]:
    """The header's ``arrays`` list and the payload holding ``arrays`` (C order, native little-endian dtypes)."""
    meta: list[dict[str, Any]] = []
    parts: list[bytes] = []
    offset = 0
    for name, arr in arrays.items():
        a = np.ascontiguousarray(arr)
        data = a.tobytes()
        meta.append(
            {
                "name": name,
                "dtype": a.dtype.str,
                "shape": list(a.shape),
                "offset": offset,
                "nbytes": len(data),
            }
        )
        parts.append(data)
        offset += len(data)
    return meta, b"".join(parts)


def unpack_arrays(meta: Sequence[Mapping[str, Any]], payload: bytes) -> dict[str, np.ndarray]:
    """Invert :func:`pack_arrays`; raises ``ValueError`` when an entry does not fit the payload."""
    out: dict[str, np.ndarray] = {}
    for entry in meta:
        dtype = np.dtype(str(entry["dtype"]))
        shape = tuple(int(s) for s in entry["shape"])
        start, nbytes = int(entry["offset"]), int(entry["nbytes"])
        if nbytes != dtype.itemsize * math.prod(shape) or start < 0 or start + nbytes > len(payload):
            raise ValueError(f"array entry {dict(entry)} does not fit the {len(payload)}-byte payload")
        out[str(entry["name"])] = np.frombuffer(payload, dtype, math.prod(shape), start).reshape(shape).copy()
    return out
