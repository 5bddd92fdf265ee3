"""A scripted expert for LIBERO's bowl-on-plate tasks (all ten of ``libero_spatial``): demonstrations for SFT.

The expert reads the true state of the scene (object poses from the simulator, the goal from the task's BDDL
problem) and drives the OSC_POSE controller through a fixed sequence of phases: above the bowl's rim, down,
close, lift, over the target, down, open. It is for making demonstrations, not for training, and it fails on
some initial states (it does not plan around obstacles); collection keeps the successful episodes.

The expert has the shape of ManiSkill's (``expert(task_env) -> action``) with one difference: it keeps its phase
between calls, per task env, and notices a new episode by the simulator's step counter going back.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["EXPERT_TASKS", "LiberoPickPlaceExpert", "scripted_expert"]

_POS_SCALE = 0.05
"""Metres of end-effector displacement per unit of OSC_POSE's position action (robosuite's ``output_max``)."""
_ROT_SCALE = 0.5
"""Radians of rotation per unit of the orientation action."""
_RIM_RADIUS = 0.034
"""Distance of the bowl's wall from its centre (m): the fingers pinch the wall there."""
_GRASP_HEIGHT = 0.05
"""Height of the end-effector site above the bowl's origin (its base) when closing (m): the fingertips then
reach about 1 cm above the table, below the rim's top."""
_HOVER = 0.08
"""Approach height above the grip point (m)."""
_CARRY_HEIGHT = 0.14
"""Height above the table at which the bowl is carried (m)."""
_PLACE_HEIGHT = 0.065
"""Height of the end-effector site above the target's origin when opening (m)."""
_OPEN, _CLOSE = -1.0, 1.0


def _axis_angle(rotation: np.ndarray) -> np.ndarray:
    """The rotation vector of a 3x3 rotation matrix."""
    cos = np.clip((np.trace(rotation) - 1.0) / 2.0, -1.0, 1.0)
    angle = float(np.arccos(cos))
    if angle < 1e-6:
        return np.zeros(3)
    axis = np.array(
        [rotation[2, 1] - rotation[1, 2], rotation[0, 2] - rotation[2, 0], rotation[1, 0] - rotation[0, 1]]
    ) / (2.0 * np.sin(angle))
    return np.asarray(axis * angle, dtype=np.float64)


class LiberoPickPlaceExpert:
    """Pick the goal's first object by its rim and put it on the second (``(On <object> <target>)`` goals).

    Call it with a LIBERO ``ControlEnv`` (:meth:`LiberoVecEnv.task_envs`) before each step; it returns the
    7-D action in ``[-1, 1]``. Its phases, with the end-effector's orientation held at the episode's start:

    ``approach`` above the rim point (the bowl's wall on the side facing away from the robot's fingers'
    closing axis), ``descend`` to it, ``close`` for a few steps, ``lift`` to the carry height (back to
    ``approach`` when the object did not come along), ``carry`` over the target (the rim offset kept, so the
    object's centre ends over the target's), ``lower``, ``release`` and ``retreat`` upwards.
    """

    _PHASES = ("approach", "descend", "close", "lift", "carry", "lower", "release", "retreat")

    def __init__(self, *, gain: float = 10.0, tolerance: float = 0.008) -> None:
        self.gain = gain
        self.tolerance = tolerance
        self._episodes: dict[int, dict[str, Any]] = {}

    def _episode(self, task_env: Any) -> dict[str, Any]:
        env = task_env.env
        key = id(task_env)
        state = self._episodes.get(key)
        if state is None or env.timestep < state["timestep"]:
            goal = env.parsed_problem["goal_state"]
            if len(goal) != 1 or goal[0][0].lower() != "on":
                raise ValueError(
                    f"the scripted LIBERO expert handles one (On object target) goal, not {goal}"
                )
            robot = env.robots[0]
            state = {
                "object": goal[0][1],
                "target": goal[0][2],
                "phase": 0,
                "steps": 0,
                "orientation": env.sim.data.site_xmat[robot.eef_site_id].reshape(3, 3).copy(),
                "table_z": float(env.sim.data.body_xpos[env.obj_body_id[goal[0][1]]][2]),
            }
            self._episodes[key] = state
        state["timestep"] = env.timestep
        return state

    def __call__(self, task_env: Any) -> np.ndarray:
        """The action of ``task_env``'s next step."""
        env = task_env.env
        data = env.sim.data
        state = self._episode(task_env)
        robot = env.robots[0]
        eef = np.array(data.site_xpos[robot.eef_site_id])
        obj = np.array(data.body_xpos[env.obj_body_id[state["object"]]])
        target = np.array(data.body_xpos[env.obj_body_id[state["target"]]])
        # The fingers close along the end effector's x axis: pinch the wall lying along that axis.
        closing_axis = state["orientation"][:, 0].copy()
        closing_axis[2] = 0.0
        closing_axis /= np.linalg.norm(closing_axis)
        rim = -_RIM_RADIUS * closing_axis
        grip = obj + rim + np.array([0.0, 0.0, _GRASP_HEIGHT])
        carry_z = state["table_z"] + _CARRY_HEIGHT
        phase = self._PHASES[state["phase"]]
        gripper = _CLOSE if phase in ("close", "lift", "carry", "lower") else _OPEN
        if phase == "approach":
            goal = grip + np.array([0.0, 0.0, _HOVER])
        elif phase == "descend":
            goal = grip
        elif phase == "close":
            goal = eef
        elif phase == "lift":
            goal = np.array([eef[0], eef[1], carry_z])
        elif phase in ("carry", "lower"):
            over = target + rim
            z = carry_z if phase == "carry" else target[2] + _PLACE_HEIGHT
            goal = np.array([over[0], over[1], z])
        elif phase == "release":
            goal = eef
        else:
            goal = np.array([eef[0], eef[1], carry_z])
        error = goal - eef
        state["steps"] += 1
        reached = np.linalg.norm(error) < self.tolerance
        if phase == "carry":
            reached = np.linalg.norm(error[:2]) < self.tolerance
        advance = (
            (phase in ("approach", "carry") and reached)
            or (phase == "descend" and (reached or state["steps"] > 40))
            or (phase in ("close", "release") and state["steps"] >= 12)
            or (phase == "lower" and (reached or state["steps"] > 40))
            or (phase == "lift" and abs(error[2]) < 0.02)
        )
        if phase == "lift" and advance and obj[2] < state["table_z"] + 0.03:
            state["phase"], state["steps"] = 0, 0  # the object stayed behind: try again
        elif advance and state["phase"] < len(self._PHASES) - 1:
            state["phase"] += 1
            state["steps"] = 0
        current = data.site_xmat[robot.eef_site_id].reshape(3, 3)
        rotation = _axis_angle(state["orientation"] @ current.T)
        move = np.clip(self.gain * error, -1.0, 1.0)
        action = np.concatenate([move, np.clip(rotation / _ROT_SCALE, -1.0, 1.0), [gripper]])
        return action.astype(np.float32)


EXPERT_TASKS = {"libero_spatial": (0, 1, 2, 3, 5, 7, 8)}
"""Per suite, the tasks on which the expert succeeds from the initial states tried (``libero_spatial``: the
bowls that start on the table; it fails where the bowl starts in the drawer, on the cabinet or on the stove,
tasks 4, 6 and 9)."""


def scripted_expert(env_id: str, control_mode: str | None = None) -> LiberoPickPlaceExpert:
    """A fresh scripted expert for a LIBERO suite (``control_mode`` is LIBERO's fixed OSC_POSE: leave it unset).

    Raises:
        ValueError: for a suite without one, listing those that have one.
    """
    if env_id not in EXPERT_TASKS or control_mode is not None:
        raise ValueError(
            f"no scripted expert for LIBERO suite {env_id!r} with control_mode {control_mode!r}; experts exist for: "
            f"{', '.join(EXPERT_TASKS)} (control_mode unset)"
        )
    return LiberoPickPlaceExpert()
