"""A simulated Franka end effector holding a peg over a board with a hole: what the dummy robot server runs.

Kinematics only, deterministic given the seed: each ``move`` is one control period in which the TCP follows the
commanded pose to first order (``x += α (x_cmd - x)``, ``α = 1 - exp(-dt / τ)``; orientation by slerp). The peg
tip is the TCP. The board's top face (``surface_z``) stops it unless its axis is within ``clearance`` of the
hole's, in which case it can go down to the hole's bottom; inside the hole the wall keeps it within the
clearance. Pressing into a surface gives a contact force proportional to how far the commanded pose lies
beyond it (an impedance controller's spring), plus seeded sensor noise.

Two cameras render with numpy: ``wrist`` looks straight down from above the gripper (the hole's offset from
the peg, the board's checker texture for motion, the fingers' opening) and ``front`` is fixed, an oblique view
of the board, the hole and the peg.

The simulated arm keeps its own hard envelope, like a real arm's reflexes: a move beyond it latches a fault that
refuses every move until a reset. An emergency stop latches until ``clear_estop``.
"""

from __future__ import annotations

import math

import attrs
import numpy as np

from ._geometry import Vector, euler_to_quat, quat_mul, quat_to_euler, slerp
from ._protocol import RobotState, SafetyLimits, SafetyViolation

__all__ = ["CAMERAS", "DUMMY_ENVELOPE", "DummyFranka", "PegScene", "Refused"]

CAMERAS = ("front", "wrist")
DUMMY_ENVELOPE = SafetyLimits(
    xyz_min=(0.2, -0.4, 0.0),
    xyz_max=(0.8, 0.4, 0.6),
    rpy_min=(-math.pi, -math.pi / 2, -math.pi),
    rpy_max=(math.pi, math.pi / 2, math.pi),
    max_translation_m=0.1,
    max_rotation_rad=0.5,
)
"""The dummy arm's hard limits (wider than the default client :class:`SafetyLimits`)."""

_STIFFNESS = 2000.0  # N/m, a Franka Cartesian impedance controller's usual translational stiffness
_PEG_LENGTH = 0.06  # m, tip (TCP) to gripper
_PEG_RADIUS = 0.008
_FORCE_NOISE = 0.05  # N, standard deviation
_TORQUE_NOISE = 0.005  # N m


class Refused(Exception):
    """A request the dummy refuses: ``error`` is one of the protocol's ``ERRORS``."""

    def __init__(self, error: str, message: str) -> None:
        super().__init__(message)
        self.error = error


@attrs.frozen(kw_only=True)
class PegScene:
    """Where the hole is (base frame, metres)."""

    hole_xy: tuple[float, float] = (0.5, 0.0)
    surface_z: float = 0.10
    """Height of the board's top face."""
    hole_depth: float = 0.03
    clearance: float = 0.004
    """Largest offset of the peg axis from the hole axis that still enters the hole."""
    hole_radius: float = 0.012
    """Drawn radius of the hole (the peg's radius plus the clearance)."""

    @classmethod
    def from_target(cls, target_pose: Vector) -> PegScene:
        """The scene whose fully inserted TCP pose is ``target_pose`` (the hole's bottom under its xy)."""
        x, y, z = (float(v) for v in target_pose[:3])
        depth = cls().hole_depth
        return cls(hole_xy=(x, y), surface_z=z + depth, hole_depth=depth)

    @property
    def bottom_z(self) -> float:
        return self.surface_z - self.hole_depth


def _angular_velocity(prev: np.ndarray, new: np.ndarray, dt: float) -> np.ndarray:
    """``[3]`` rad/s of the rotation from ``prev`` to ``new`` (quaternions) over ``dt``."""
    conj = np.array([-prev[0], -prev[1], -prev[2], prev[3]])
    dq = quat_mul(new, conj)
    if dq[3] < 0:
        dq = -dq
    s = float(np.linalg.norm(dq[:3]))
    if s < 1e-12:
        return np.zeros(3)
    angle = 2.0 * math.atan2(s, float(dq[3]))
    out: np.ndarray = dq[:3] / s * angle / dt
    return out


class DummyFranka:
    """The simulated arm, peg and cameras (no sockets: :mod:`rlinf_envs.realworld._server` serves it).

    Args:
        scene: the hole's placement.
        seed: seeds the force/torque sensor noise (and names the robot's serial).
        image_size: ``(height, width)`` of the camera frames.
        control_hz: control periods per second (the simulated time of one ``move``).
        tau_s: time constant of the pose tracking.
        envelope: the arm's hard limits.
    """

    def __init__(
        self,
        scene: PegScene,
        *,
        seed: int = 0,
        image_size: tuple[int, int] = (64, 64),
        control_hz: float = 10.0,
        tau_s: float = 0.05,
        envelope: SafetyLimits = DUMMY_ENVELOPE,
    ) -> None:
        self.scene = scene
        self.seed = seed
        self.image_size = image_size
        self.dt = 1.0 / control_hz
        self.alpha = 1.0 - math.exp(-self.dt / tau_s)
        self.envelope = envelope
        self._rng = np.random.default_rng(seed)
        self._pos = np.array([scene.hole_xy[0], scene.hole_xy[1], scene.surface_z + 0.07])
        self._quat = np.array([1.0, 0.0, 0.0, 0.0])  # pointing down
        self._vel = np.zeros(6)
        self._force = np.zeros(3)
        self._torque = np.zeros(3)
        self._gripper = 0.0
        self.estopped = False
        self.fault: str | None = None
        self.counts = {"moves_received": 0, "moves_executed": 0, "moves_refused": 0, "resets": 0, "estops": 0}

    # -- state ---------------------------------------------------------------------------------------------

    def state(self) -> RobotState:
        return RobotState(
            tcp_pose=np.concatenate([self._pos, self._quat]),
            tcp_vel=self._vel,
            tcp_force=self._force,
            tcp_torque=self._torque,
            gripper=self._gripper,
        )

    def _pose_and_gripper(self, pose: Vector, gripper: float) -> tuple[np.ndarray, float]:
        p = np.asarray(pose, dtype=np.float64)
        if p.shape != (7,) or not np.isfinite(p).all() or not math.isfinite(gripper):
            raise Refused("bad_request", f"pose must be 7 finite numbers and gripper finite, got {list(p)}")
        if float(np.linalg.norm(p[3:])) < 1e-9:
            raise Refused("bad_request", "pose quaternion must not be zero")
        return np.concatenate([p[:3], p[3:] / np.linalg.norm(p[3:])]), float(gripper)

    # -- commands ------------------------------------------------------------------------------------------

    def move(self, pose: Vector, gripper: float) -> RobotState:
        """Track ``pose`` for one control period; raises :class:`Refused` when e-stopped, faulted or out of bounds."""
        self.counts["moves_received"] += 1
        try:
            target, grip = self._pose_and_gripper(pose, gripper)
            if self.estopped:
                raise Refused("estopped", "emergency stop is latched: clear_estop before moving")
            if self.fault is not None:
                raise Refused("fault", f"fault latched ({self.fault}): reset the robot before moving")
            try:
                self.envelope.check(
                    target,
                    min(max(grip, 0.0), 1.0),
                    np.concatenate([self._pos, self._quat]),
                    robot="dummy Franka",
                )
            except SafetyViolation as e:
                self.fault = f"hard limit: {e.limit} = {e.value:.6g}, allowed {e.allowed}"
                raise Refused(
                    "fault", f"move beyond the arm's hard limits latched a fault ({self.fault})"
                ) from e
        except Refused:
            self.counts["moves_refused"] += 1
            raise
        self._track(target, min(max(grip, 0.0), 1.0))
        self.counts["moves_executed"] += 1
        return self.state()

    def _track(self, target: np.ndarray, gripper: float) -> None:
        prev_pos, prev_quat = self._pos.copy(), self._quat.copy()
        want = prev_pos + self.alpha * (target[:3] - prev_pos)
        self._quat = slerp(prev_quat, target[3:], self.alpha)
        self._pos, self._force = self._contact(prev_pos, want, target[:3])
        lever = np.array([0.0, 0.0, _PEG_LENGTH])
        self._torque = np.cross(lever, self._force)
        self._force = self._force + self._rng.normal(0.0, _FORCE_NOISE, 3)
        self._torque = self._torque + self._rng.normal(0.0, _TORQUE_NOISE, 3)
        self._vel = np.concatenate(
            [(self._pos - prev_pos) / self.dt, _angular_velocity(prev_quat, self._quat, self.dt)]
        )
        self._gripper = gripper

    def _contact(
        self, prev: np.ndarray, want: np.ndarray, commanded: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Where the tip ends up given the board and the hole, and the contact force (N) on it."""
        sc = self.scene
        hole = np.asarray(sc.hole_xy)
        pos = want.copy()
        force = np.zeros(3)
        inside = prev[2] < sc.surface_z - 1e-9
        offset = pos[:2] - hole
        r = float(np.linalg.norm(offset))
        if inside and r > sc.clearance:
            # The hole's wall keeps the peg within the clearance; the commanded pose beyond it pushes sideways.
            pos[:2] = hole + offset * (sc.clearance / r)
            cmd_off = commanded[:2] - hole
            cmd_r = float(np.linalg.norm(cmd_off))
            if cmd_r > sc.clearance:
                force[:2] = -_STIFFNESS * cmd_off * (1.0 - sc.clearance / cmd_r)
            r = sc.clearance
        floor = sc.bottom_z if (inside or r <= sc.clearance) else sc.surface_z
        if pos[2] < floor:
            pos[2] = floor
            force[2] = _STIFFNESS * max(floor - float(commanded[2]), 0.0)
        return pos, force

    def reset(self, pose: Vector, gripper: float, seed: int | None = None) -> RobotState:
        """Go to ``pose`` at rest (lifted clear of the board first) and clear a fault; refused while e-stopped."""
        target, grip = self._pose_and_gripper(pose, gripper)
        if self.estopped:
            raise Refused("estopped", "emergency stop is latched: clear_estop before resetting")
        try:
            self.envelope.check_pose(target, robot="dummy Franka")
        except SafetyViolation as e:
            raise Refused("bad_request", f"reset pose outside the arm's hard limits: {e}") from e
        if seed is not None:
            self._rng = np.random.default_rng([self.seed, int(seed)])
        # A reset below the board's surface would put the peg inside it: rest on the surface instead.
        floor = self.scene.bottom_z if self._over_hole(target[:2]) else self.scene.surface_z
        self._pos = np.array([target[0], target[1], max(float(target[2]), floor)])
        self._quat = target[3:].copy()
        self._vel[:] = 0.0
        self._force[:] = 0.0
        self._torque[:] = 0.0
        self._gripper = min(max(grip, 0.0), 1.0)
        self.fault = None
        self.counts["resets"] += 1
        return self.state()

    def _over_hole(self, xy: np.ndarray) -> bool:
        return float(np.linalg.norm(xy - np.asarray(self.scene.hole_xy))) <= self.scene.clearance

    def estop(self) -> None:
        self.estopped = True
        self.counts["estops"] += 1

    def clear_estop(self) -> None:
        self.estopped = False

    # -- cameras -------------------------------------------------------------------------------------------

    def frames(self) -> dict[str, np.ndarray]:
        """One ``[H, W, 3]`` uint8 image per camera of :data:`CAMERAS`."""
        return {"front": self._render_front(), "wrist": self._render_wrist()}

    def _grid(self) -> tuple[np.ndarray, np.ndarray]:
        """Pixel centres as ``[H, 1]`` and ``[1, W]`` coordinates in ``[-1, 1]``."""
        h, w = self.image_size
        rows = (np.arange(h, dtype=np.float64)[:, None] + 0.5) / h * 2.0 - 1.0
        cols = (np.arange(w, dtype=np.float64)[None, :] + 0.5) / w * 2.0 - 1.0
        return rows, cols

    def _render_wrist(self) -> np.ndarray:
        """Looking down the peg from 6 cm above its tip: the board around the hole, rotated with the gripper's yaw."""
        sc = self.scene
        rows, cols = self._grid()
        height = max(float(self._pos[2]) + _PEG_LENGTH - sc.surface_z, 0.02)
        extent = height * 0.6  # half-width of the view on the board (a ~62° field of view)
        yaw = float(quat_to_euler(self._quat)[2])
        c, s = math.cos(yaw), math.sin(yaw)
        du, dv = -rows * extent, cols * extent  # image up = +x, image right = +y, before the yaw
        wx = self._pos[0] + c * du - s * dv
        wy = self._pos[1] + s * du + c * dv
        checker = (np.floor(wx / 0.02) + np.floor(wy / 0.02)) % 2
        img = np.empty((*self.image_size, 3), dtype=np.float64)
        img[...] = np.array([200.0, 165.0, 115.0])
        img -= (checker * 25.0)[..., None]
        hole_d = np.hypot(wx - sc.hole_xy[0], wy - sc.hole_xy[1])
        img[hole_d < sc.hole_radius] = (25.0, 25.0, 30.0)
        img[np.abs(hole_d - sc.hole_radius) < extent / self.image_size[0] * 1.5] = (90.0, 60.0, 30.0)
        peg_r = _PEG_RADIUS / (_PEG_LENGTH * 0.6)  # the peg is always 6 cm below the camera
        img[rows**2 + cols**2 < peg_r**2] = (170.0, 175.0, 185.0)
        finger = 0.55 + 0.35 * self._gripper  # the fingers' distance from the image centre, at the sides
        img[(np.abs(np.abs(cols) - finger) < 0.06) & (np.abs(rows) < 0.25)] = (60.0, 60.0, 65.0)
        return img.astype(np.uint8)

    def _render_front(self) -> np.ndarray:
        """A fixed oblique view from the front (+x): ``v = z - 0.4 (x - hole_x)`` up, ``y`` to the right."""
        sc = self.scene
        hx, hy = sc.hole_xy
        rows, cols = self._grid()
        v = sc.surface_z + 0.07 - rows * 0.15  # image rows span surface - 0.08 .. surface + 0.22
        y = hy + cols * 0.15
        img = np.empty((*self.image_size, 3), dtype=np.float64)
        img[...] = np.array([95.0, 105.0, 125.0])
        x_on_top = hx - (v - sc.surface_z) / 0.4  # the board's top face: z = surface
        top = np.abs(x_on_top - hx) <= 0.1
        front_face = (v < sc.surface_z - 0.04) & (v >= sc.surface_z - 0.04 - 0.06)
        img[np.broadcast_to(top, img.shape[:2])] = (200.0, 165.0, 115.0)
        img[np.broadcast_to(front_face, img.shape[:2])] = (150.0, 115.0, 75.0)
        hole = top & ((x_on_top - hx) ** 2 + (y - hy) ** 2 < sc.hole_radius**2)
        img[hole] = (25.0, 25.0, 30.0)
        tx, ty, tz = (float(a) for a in self._pos)
        shift = 0.4 * (tx - hx)
        peg_col = np.abs(y - ty) <= _PEG_RADIUS
        z_at_row = v + shift  # the height a point of the peg at this row has
        peg = peg_col & (z_at_row >= max(tz, sc.surface_z)) & (z_at_row <= tz + _PEG_LENGTH)
        img[peg] = (170.0, 175.0, 185.0)
        half = 0.012 + 0.02 * self._gripper
        body = (
            (np.abs(y - ty) <= half) & (z_at_row > tz + _PEG_LENGTH) & (z_at_row <= tz + _PEG_LENGTH + 0.03)
        )
        img[body] = (60.0, 60.0, 65.0)
        return img.astype(np.uint8)


def tool_down_pose(x: float, y: float, z: float, yaw: float = 0.0) -> np.ndarray:
    """``[7]`` pose at ``(x, y, z)`` with the gripper pointing down, turned by ``yaw`` about the vertical."""
    return np.concatenate([[x, y, z], quat_mul(euler_to_quat((0.0, 0.0, yaw)), [1.0, 0.0, 0.0, 0.0])])
