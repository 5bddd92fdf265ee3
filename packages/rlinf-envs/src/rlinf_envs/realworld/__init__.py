"""Real-world robot backend: robot arms (end-effector control, camera frames) reached over TCP, and a dummy Franka.

Numpy and the standard library only: no extra to install. Each env drives one robot server through a
:class:`RobotClient` (a small framed protocol: JSON headers, raw image payloads; see
:mod:`rlinf_envs.realworld._protocol`). A real robot runs a bridge speaking that protocol; for tests and
dry runs ``env_kwargs.is_dummy`` starts a simulated Franka (peg insertion, numpy-rendered cameras) per env as a
child process on 127.0.0.1 (``python -m rlinf_envs.realworld.dummy_robot``).
"""

from ._client import RobotClient
from ._dummy import CAMERAS, DUMMY_ENVELOPE, DummyFranka, PegScene
from ._protocol import (
    OPS,
    PROTOCOL_VERSION,
    STATE_DIM,
    EmergencyStopped,
    RobotFault,
    RobotState,
    RobotUnreachable,
    SafetyLimits,
    SafetyViolation,
    encode_message,
    pack_arrays,
    recv_message,
    send_message,
    unpack_arrays,
)
from ._settings import DEFAULT_ROBOT_PORT, RealWorldSettings, RewardSettings
from ._vec import (
    ACTION_DIM,
    DEFAULT_IMAGE_SIZE,
    DEFAULT_MAX_EPISODE_STEPS,
    ENV_IDS,
    OBS_MODES,
    RealWorldVecEnv,
    realworld_spec,
)

__all__ = [
    "ACTION_DIM",
    "CAMERAS",
    "DEFAULT_IMAGE_SIZE",
    "DEFAULT_MAX_EPISODE_STEPS",
    "DEFAULT_ROBOT_PORT",
    "DUMMY_ENVELOPE",
    "ENV_IDS",
    "OBS_MODES",
    "OPS",
    "PROTOCOL_VERSION",
    "STATE_DIM",
    "DummyFranka",
    "EmergencyStopped",
    "PegScene",
    "RealWorldSettings",
    "RealWorldVecEnv",
    "RewardSettings",
    "RobotClient",
    "RobotFault",
    "RobotState",
    "RobotUnreachable",
    "SafetyLimits",
    "SafetyViolation",
    "encode_message",
    "pack_arrays",
    "realworld_spec",
    "recv_message",
    "send_message",
    "unpack_arrays",
]
