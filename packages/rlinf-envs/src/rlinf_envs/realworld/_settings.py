"""The real-world env's settings (``env_kwargs``) and robots (the cluster's ``hardware.configs`` entries), validated."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import attrs
import numpy as np

from ._dummy import PegScene, tool_down_pose
from ._geometry import pose_from_config
from ._protocol import SafetyLimits

__all__ = [
    "DEFAULT_ROBOT_PORT",
    "RealWorldSettings",
    "RewardSettings",
    "RobotUnit",
    "check_main_camera",
    "robot_units",
]

DEFAULT_ROBOT_PORT = 5555
"""Port of a robot server when its hardware entry names ``robot_ip`` only."""

_DEFAULT_TARGET = tool_down_pose(0.5, 0.0, PegScene().bottom_z)
_DEFAULT_RESET = tool_down_pose(0.5, 0.0, PegScene().surface_z + 0.05)


def _finite_positive(_inst: object, attr: attrs.Attribute[float], value: float) -> None:
    if not math.isfinite(value) or value <= 0.0:
        raise ValueError(f"env_kwargs.{attr.name} must be a finite number > 0, got {value}")


def _finite_non_negative(_inst: object, attr: attrs.Attribute[float], value: float) -> None:
    if not math.isfinite(value) or value < 0.0:
        raise ValueError(f"env_kwargs.{attr.name} must be a finite number >= 0, got {value}")


def _reward_positive(_inst: object, attr: attrs.Attribute[float], value: float) -> None:
    if not math.isfinite(value) or value <= 0.0:
        raise ValueError(f"env_kwargs.reward.{attr.name} must be a finite number > 0, got {value}")


def _checked(data: Mapping[str, Any], cls: type, where: str) -> dict[str, Any]:
    allowed = [a.name for a in attrs.fields(cls)]
    unknown = sorted(str(k) for k in data if k not in allowed)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; allowed: {', '.join(allowed)}")
    return {str(k): v for k, v in data.items()}


@attrs.frozen(kw_only=True)
class RewardSettings:
    """``env_kwargs.reward``: how the distance of the TCP to ``target_pose`` becomes a reward."""

    type: Literal["dense", "sparse"] = attrs.field(default="dense")
    """``dense``: ``exp(-distance / dense_scale_m)`` (1 at the target); ``sparse``: 1 at steps that succeed."""
    success_threshold_m: float = attrs.field(default=0.005, converter=float, validator=_reward_positive)
    """A step succeeds when the TCP is this close to the target position ..."""
    success_threshold_rad: float = attrs.field(default=0.1, converter=float, validator=_reward_positive)
    """... and its orientation this close to the target's."""
    dense_scale_m: float = attrs.field(default=0.05, converter=float, validator=_reward_positive)
    """Distance at which the dense reward has fallen to ``1/e``."""

    @type.validator
    def _check_type(self, _attr: attrs.Attribute[str], value: str) -> None:
        if value not in ("dense", "sparse"):
            raise ValueError(f"env_kwargs.reward.type must be one of dense, sparse; got {value!r}")


def _target_pose(value: Any) -> tuple[float, ...]:
    return tuple(float(x) for x in pose_from_config(value, name="env_kwargs.target_pose"))


def _reset_pose(value: Any) -> tuple[float, ...]:
    return tuple(float(x) for x in pose_from_config(value, name="env_kwargs.reset_pose"))


def _action_scale(value: Any) -> tuple[float, float]:
    vals = [float(x) for x in np.asarray(value, dtype=np.float64).reshape(-1)]
    if len(vals) not in (2, 3) or not all(math.isfinite(v) and v > 0 for v in vals[:2]):
        raise ValueError(
            "env_kwargs.action_scale must be [translation_m, rotation_rad] (RLinf's third, gripper, value is "
            f"accepted and unused: the peg stays grasped), both > 0; got {list(vals)}"
        )
    return vals[0], vals[1]


def _limits(value: Any) -> SafetyLimits:
    if isinstance(value, SafetyLimits):
        return value
    if not isinstance(value, Mapping):
        raise ValueError(f"env_kwargs.safety_limits must be a mapping of SafetyLimits fields, got {value!r}")
    return SafetyLimits.from_mapping(value)


def _reward(value: Any) -> RewardSettings:
    if isinstance(value, RewardSettings):
        return value
    if not isinstance(value, Mapping):
        raise ValueError(f"env_kwargs.reward must be a mapping, got {value!r}")
    return RewardSettings(**_checked(value, RewardSettings, "env_kwargs.reward"))


@attrs.frozen(kw_only=True)
class RealWorldSettings:
    """``env.*.env_kwargs`` of ``env_type: realworld``."""

    is_dummy: bool = False
    """Start a dummy robot server (a subprocess on 127.0.0.1) for every env without a ``robot_ip``."""
    safety_limits: SafetyLimits = attrs.field(factory=SafetyLimits, converter=_limits)
    """What a command may ask of a robot (:class:`SafetyLimits` fields); checked before anything is sent."""
    action_scale: tuple[float, float] = attrs.field(default=(0.01, 0.05), converter=_action_scale)
    """Metres and radians of a full (±1) action: ``[translation, rotation]``."""
    target_pose: tuple[float, ...] = attrs.field(default=tuple(_DEFAULT_TARGET), converter=_target_pose)
    """TCP pose with the peg fully inserted: xyz + roll/pitch/yaw (6) or xyz + quaternion xyzw (7)."""
    reset_pose: tuple[float, ...] = attrs.field(default=tuple(_DEFAULT_RESET), converter=_reset_pose)
    """Where an episode starts (before ``reset_noise_m``); same forms as ``target_pose``."""
    reset_noise_m: float = attrs.field(default=0.02, converter=float, validator=_finite_non_negative)
    """Half-width of the uniform x/y offset added to ``reset_pose`` at every reset (drawn per group)."""
    reward: RewardSettings = attrs.field(factory=RewardSettings, converter=_reward)
    step_frequency: float = attrs.field(default=0.0, converter=float, validator=_finite_non_negative)
    """Env steps per second at most (Hz; a real robot's control rate, e.g. 10); 0: as fast as the robots answer."""
    request_timeout_s: float = attrs.field(default=5.0, converter=float, validator=_finite_positive)
    """Longest wait for a robot's reply; a robot that does not answer raises ``RobotUnreachable``."""
    main_camera: str = "wrist"
    """The camera whose frames are the ``rgb`` observation."""
    dummy_seed: int = attrs.field(default=0, converter=int)
    """Dummy robots: env ``i``'s server runs with seed ``dummy_seed + i`` (its sensor noise)."""
    dummy_startup_timeout_s: float = attrs.field(default=30.0, converter=float, validator=_finite_positive)
    """Dummy robots: longest wait for a server to listen."""

    @classmethod
    def from_kwargs(cls, env_kwargs: Mapping[str, Any]) -> RealWorldSettings:
        """Validate ``env_kwargs``; raises ``ValueError`` naming the key (unknown keys list the allowed ones)."""
        return cls(**_checked(env_kwargs, cls, "env_kwargs"))

    def check_against_limits(self) -> None:
        """Refuse an ``action_scale`` that could exceed the per-command limits, and poses outside the box."""
        lim = self.safety_limits
        worst_step = self.action_scale[0] * math.sqrt(3.0)
        if worst_step > lim.max_translation_m:
            raise ValueError(
                f"env_kwargs.action_scale[0] = {self.action_scale[0]} m allows {worst_step:.4g} m per step "
                f"(all three axes at ±1), more than safety_limits.max_translation_m = {lim.max_translation_m}"
            )
        worst_turn = self.action_scale[1] * math.sqrt(3.0)
        if worst_turn > lim.max_rotation_rad:
            raise ValueError(
                f"env_kwargs.action_scale[1] = {self.action_scale[1]} rad allows {worst_turn:.4g} rad per step, "
                f"more than safety_limits.max_rotation_rad = {lim.max_rotation_rad}"
            )
        for name in ("reset_pose", "target_pose"):
            try:
                lim.check_pose(getattr(self, name), robot="config")
            except ValueError as e:
                raise ValueError(f"env_kwargs.{name} lies outside env_kwargs.safety_limits: {e}") from e


@attrs.frozen(kw_only=True)
class RobotUnit:
    """One env's robot: where its server listens (``None``: a dummy to start) and what it should be."""

    index: int
    address: tuple[str, int] | None = None
    robot_type: str = "Franka"
    camera_serials: tuple[str, ...] = ()
    node_rank: int | None = None

    @property
    def name(self) -> str:
        return f"{self.robot_type} unit {self.index}"


_HARDWARE_KEYS = (
    "node_rank",
    "robot_ip",
    "robot_port",
    "robot_type",
    "camera_serials",
    "controller_node_rank",
)


def _unit(entry: Mapping[str, Any], index: int) -> RobotUnit:
    where = f"hardware[{index}]"
    if not isinstance(entry, Mapping):
        raise ValueError(f"{where} must be a mapping, got {entry!r}")
    unknown = sorted(str(k) for k in entry if k not in _HARDWARE_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; allowed: {', '.join(_HARDWARE_KEYS)}")
    ip, port = entry.get("robot_ip"), entry.get("robot_port", DEFAULT_ROBOT_PORT)
    if ip is not None and not (isinstance(ip, str) and ip):
        raise ValueError(f"{where}.robot_ip must be a host name or address, got {ip!r}")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"{where}.robot_port must be an integer in 1..65535, got {port!r}")
    serials = entry.get("camera_serials", ())
    if isinstance(serials, str) or not isinstance(serials, Sequence):
        raise ValueError(f"{where}.camera_serials must be a list of serial numbers, got {serials!r}")
    robot_type = entry.get("robot_type", "Franka")
    if not isinstance(robot_type, str) or not robot_type:
        raise ValueError(f"{where}.robot_type must be a non-empty string, got {robot_type!r}")
    rank = entry.get("node_rank")
    return RobotUnit(
        index=index,
        address=None if ip is None else (ip, port),
        robot_type=robot_type,
        camera_serials=tuple(str(s) for s in serials),
        node_rank=None if rank is None else int(rank),
    )


def robot_units(hardware: Sequence[Mapping[str, Any]], num_envs: int, *, is_dummy: bool) -> list[RobotUnit]:
    """One :class:`RobotUnit` per env: entry ``i`` of ``hardware`` drives env ``i``.

    Raises:
        ValueError: more entries than envs, or an env without a ``robot_ip`` while ``is_dummy`` is false.
    """
    if isinstance(hardware, Mapping | str):
        raise ValueError(f"hardware must be a list of per-robot mappings, got {hardware!r}")
    if len(hardware) > num_envs:
        raise ValueError(f"hardware lists {len(hardware)} robots for {num_envs} envs: give one entry per env")
    units = [_unit(entry, i) for i, entry in enumerate(hardware)]
    units += [RobotUnit(index=i) for i in range(len(units), num_envs)]
    missing = [u.index for u in units if u.address is None]
    if missing and not is_dummy:
        raise ValueError(
            f"envs {missing} have no robot: give each a hardware entry with robot_ip (and robot_port, default "
            f"{DEFAULT_ROBOT_PORT}), or set env_kwargs.is_dummy: true to start dummy robots for them"
        )
    return units


def check_main_camera(main_camera: str, available: Sequence[str], robot: str) -> None:
    """Raise ``ValueError`` when ``main_camera`` is not among the robot's cameras."""
    if main_camera not in available:
        raise ValueError(
            f"env_kwargs.main_camera {main_camera!r} is not a camera of {robot}; allowed: {', '.join(available)}"
        )
