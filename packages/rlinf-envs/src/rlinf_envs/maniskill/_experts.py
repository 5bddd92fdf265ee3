"""Scripted experts for ManiSkill tasks: closed-loop controllers that read the task's true state.

An expert maps one task env (the ``unwrapped`` ManiSkill ``BaseEnv`` of a single CPU-sim env, from
:meth:`ManiSkillVecEnv.task_envs`) to the action of its next step, in the env's action box. Experts are for
making demonstrations (RLPD's offline data), not for training.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import numpy as np

__all__ = ["SCRIPTED_EXPERTS", "ScriptedExpert", "pickcube_expert", "scripted_expert"]

ScriptedExpert = Callable[[Any], np.ndarray]
"""``expert(task_env) -> action [action_dim]`` float32 for the task env's next step."""

_GAIN = 10.0
"""Normalised action per metre of position error: ``pd_ee_delta_pos`` moves at most 0.1 m per step (action 1)."""
_GRASP_RADIUS = 0.01
"""Close the gripper once the TCP is this near the cube's centre (m)."""
_ALIGN_RADIUS = 0.01
"""Descend onto the cube once the TCP is this near above it in the horizontal plane (m)."""
_APPROACH_HEIGHT = 0.05
"""Height above the cube's centre at which the TCP approaches it (m)."""
_OPEN, _CLOSE = 1.0, -1.0
"""Normalised gripper targets of the Panda's ``pd_joint_pos`` gripper."""


def _in_root_frame(task_env: Any, pose: Any) -> np.ndarray:
    """A pose's position in the robot's root frame: ``pd_ee_delta_pos`` moves the TCP along the root's axes."""
    p: np.ndarray = (task_env.agent.robot.pose.inv() * pose).p[0].cpu().numpy()
    return p.astype(np.float64)


def pickcube_expert(task_env: Any) -> np.ndarray:
    """PickCube-v1 with the Panda in ``pd_ee_delta_pos``: above the cube, down, grasp, carry to the goal, hold.

    Stateless: each step decides from the current poses (TCP, cube, goal) and whether the robot grasps the
    cube, so it recovers when the cube slips. Holding at the goal lets the arm come to rest, which PickCube's
    success needs (cube within 2.5 cm of the goal and joint speeds below 0.2). The gripper does not turn
    (position control only); the Panda's fingers close on the 4 cm cube at any yaw.

    Returns:
        ``[4]`` float32: the TCP displacement (x, y, z, normalised to [-1, 1] = ±0.1 m) and the gripper
        (1 open, -1 closed).
    """
    tcp = _in_root_frame(task_env, task_env.agent.tcp_pose)
    cube = _in_root_frame(task_env, task_env.cube.pose)
    goal = _in_root_frame(task_env, task_env.goal_site.pose)
    grasped = bool(task_env.agent.is_grasping(task_env.cube)[0])
    if grasped:
        target, gripper = goal, _CLOSE
    elif np.linalg.norm(tcp - cube) < _GRASP_RADIUS:
        target, gripper = cube, _CLOSE  # at the cube: close (the grasp registers a few steps later)
    elif np.linalg.norm(tcp[:2] - cube[:2]) < _ALIGN_RADIUS:
        target, gripper = cube, _OPEN  # straight down onto it
    else:
        # Above the cube first, never lower than the approach height while off to the side of it.
        height = max(tcp[2], cube[2] + _APPROACH_HEIGHT)
        target, gripper = np.array([cube[0], cube[1], height]), _OPEN
    move = np.clip(_GAIN * (target - tcp), -1.0, 1.0)
    return np.array([*move, gripper], dtype=np.float32)


SCRIPTED_EXPERTS: Mapping[tuple[str, str], ScriptedExpert] = MappingProxyType(
    {("PickCube-v1", "pd_ee_delta_pos"): pickcube_expert}
)
"""The scripted experts by ``(env_id, control_mode)``."""


def scripted_expert(env_id: str, control_mode: str | None) -> ScriptedExpert:
    """The scripted expert of a task and controller.

    Raises:
        ValueError: when there is none, listing the pairs that have one.
    """
    expert = SCRIPTED_EXPERTS.get((env_id, control_mode or ""))
    if expert is None:
        known = ", ".join(f"{e} with control_mode {c}" for e, c in SCRIPTED_EXPERTS)
        raise ValueError(
            f"no scripted expert for {env_id!r} with control_mode {control_mode!r}; experts exist for: {known}"
        )
    return expert
