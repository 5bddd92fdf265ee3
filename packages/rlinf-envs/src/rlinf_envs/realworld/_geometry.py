"""Poses of an end effector: quaternions (``x, y, z, w``), roll/pitch/yaw and angle intervals that wrap at ±π.

Roll, pitch and yaw are extrinsic ``xyz`` angles (rotate about the base frame's x, then y, then z:
``R = Rz(yaw) Ry(pitch) Rx(roll)``), the convention of RLinf's Franka envs (scipy ``Rotation.as_euler("xyz")``).
A gripper pointing straight down is the quaternion ``(1, 0, 0, 0)``: roll ``±π``, pitch 0, yaw 0. Because roll
sits on the ±π seam there, an angle interval ``[lo, hi]`` with ``lo > hi`` means the arc that wraps through ±π
(``[lo, π] ∪ [-π, hi]``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeAlias

import numpy as np

__all__ = [
    "Vector",
    "clip_arc",
    "euler_to_quat",
    "in_arc",
    "pose_from_config",
    "quat_mul",
    "quat_to_euler",
    "rotation_angle",
    "slerp",
    "wrap_angle",
]

Vector: TypeAlias = "Sequence[float] | np.ndarray"
"""A flat run of floats: a list, a tuple or a 1-D array."""

_ANGLE_TOL = 1e-6
"""Slack of the arc checks: an angle clipped onto an interval's end must pass the check after a quaternion round trip."""


def wrap_angle(a: float) -> float:
    """``a`` wrapped into ``[-π, π)``."""
    return (a + math.pi) % (2.0 * math.pi) - math.pi


def in_arc(a: float, lo: float, hi: float) -> bool:
    """Whether angle ``a`` lies in ``[lo, hi]`` (``lo <= hi``) or in the arc wrapping through ±π (``lo > hi``)."""
    a = wrap_angle(a)
    if lo <= hi:
        # a = -π and hi = π are the same angle: test the shifted copies too.
        return any(lo - _ANGLE_TOL <= x <= hi + _ANGLE_TOL for x in (a, a + 2 * math.pi, a - 2 * math.pi))
    return a >= lo - _ANGLE_TOL or a <= hi + _ANGLE_TOL


def clip_arc(a: float, lo: float, hi: float) -> float:
    """``a`` if it lies in the arc ``[lo, hi]`` (see :func:`in_arc`), else the arc's nearer end."""
    if in_arc(a, lo, hi):
        return a
    to_lo = abs(wrap_angle(a - lo))
    to_hi = abs(wrap_angle(a - hi))
    return lo if to_lo <= to_hi else hi


def euler_to_quat(rpy: Vector) -> np.ndarray:
    """``[4]`` quaternion ``x, y, z, w`` of extrinsic ``xyz`` angles ``(roll, pitch, yaw)``."""
    r, p, y = (float(v) / 2.0 for v in rpy)
    cr, sr, cp, sp, cy, sy = math.cos(r), math.sin(r), math.cos(p), math.sin(p), math.cos(y), math.sin(y)
    return np.array(
        [
            sr * cp * cy - cr * sp * sy,
            cr * sp * cy + sr * cp * sy,
            cr * cp * sy - sr * sp * cy,
            cr * cp * cy + sr * sp * sy,
        ]
    )


def quat_to_euler(q: Vector) -> np.ndarray:
    """``[3]`` extrinsic ``xyz`` angles ``(roll, pitch, yaw)`` of quaternion ``x, y, z, w`` (normalised first)."""
    x, y, z, w = np.asarray(q, dtype=np.float64) / np.linalg.norm(q)
    roll = math.atan2(2.0 * (w * x + y * z), 1.0 - 2.0 * (x * x + y * y))
    pitch = math.asin(max(-1.0, min(1.0, 2.0 * (w * y - z * x))))
    yaw = math.atan2(2.0 * (w * z + x * y), 1.0 - 2.0 * (y * y + z * z))
    return np.array([roll, pitch, yaw])


def quat_mul(a: Vector, b: Vector) -> np.ndarray:
    """The Hamilton product ``a * b`` of quaternions ``x, y, z, w`` (rotate by ``b``, then by ``a``)."""
    x1, y1, z1, w1 = a
    x2, y2, z2, w2 = b
    return np.array(
        [
            w1 * x2 + x1 * w2 + y1 * z2 - z1 * y2,
            w1 * y2 - x1 * z2 + y1 * w2 + z1 * x2,
            w1 * z2 + x1 * y2 - y1 * x2 + z1 * w2,
            w1 * w2 - x1 * x2 - y1 * y2 - z1 * z2,
        ]
    )


def rotation_angle(a: Vector, b: Vector) -> float:
    """The angle (radians, in ``[0, π]``) of the rotation taking orientation ``a`` to ``b``."""
    qa = np.asarray(a, dtype=np.float64) / np.linalg.norm(a)
    qb = np.asarray(b, dtype=np.float64) / np.linalg.norm(b)
    return 2.0 * math.acos(min(1.0, abs(float(qa @ qb))))


def slerp(a: Vector, b: Vector, t: float) -> np.ndarray:
    """The orientation a fraction ``t`` of the way from ``a`` to ``b`` along the shorter arc (unit quaternion)."""
    qa = np.asarray(a, dtype=np.float64) / np.linalg.norm(a)
    qb = np.asarray(b, dtype=np.float64) / np.linalg.norm(b)
    dot = float(qa @ qb)
    if dot < 0.0:  # q and -q are the same orientation: go the short way
        qb, dot = -qb, -dot
    if dot > 1.0 - 1e-9:
        out = qa + t * (qb - qa)
    else:
        theta = math.acos(dot)
        out = (math.sin((1.0 - t) * theta) * qa + math.sin(t * theta) * qb) / math.sin(theta)
    normed: np.ndarray = out / np.linalg.norm(out)
    return normed


def pose_from_config(value: Vector, *, name: str) -> np.ndarray:
    """``[7]`` pose (xyz + quaternion ``x, y, z, w``) from a config's 6 values (xyz + roll/pitch/yaw) or 7.

    RLinf's Franka configs write poses as xyz + euler angles (``target_ee_pose``); the wire format uses
    quaternions.

    Raises:
        ValueError: naming ``name`` for another length, non-finite values or a zero quaternion.
    """
    arr = np.asarray(value, dtype=np.float64).reshape(-1)
    if arr.size not in (6, 7) or not np.isfinite(arr).all():
        raise ValueError(
            f"{name} must be 6 finite numbers (x, y, z, roll, pitch, yaw) or 7 (x, y, z, qx, qy, qz, qw), "
            f"got {list(value)}"
        )
    if arr.size == 6:
        return np.concatenate([arr[:3], euler_to_quat(arr[3:])])
    norm = float(np.linalg.norm(arr[3:]))
    if norm < 1e-9:
        raise ValueError(f"{name}: the quaternion (last 4 values) must not be zero, got {list(value)}")
    return np.concatenate([arr[:3], arr[3:] / norm])
