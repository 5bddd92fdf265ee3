"""``LiberoSlot``: one LIBERO environment as a single gymnasium env that :class:`~rlinf_envs._vector.SubEnvs` steps.

A slot holds the LIBERO simulation of one task at a time. A reset names a (task, initial state) pair through the
reset options; the slot builds the task's simulation if it holds another one (seconds: the scene's MJCF is
compiled), resets it, loads the initial state from the task's file, then runs the settle steps. Rewards,
terminations and time limits are the vector env's business: a step reports the observation and ``success``.
A step with a NaN action is skipped (the vector env sends one for an env whose episode has ended). With camera
observations each slot makes its own GL context current for each reset, step or render and releases it afterwards,
so that several slots can share a process and be stepped from any thread.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import sys
import weakref
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

try:
    import gymnasium as gym
    import mujoco
except ImportError as e:  # pragma: no cover - exercised by the extra-missing test
    raise ImportError(f'the LIBERO backend needs: pip install "rlinf-envs[libero]" ({e})') from e

from ._suites import OBJECT_STATE_DIM, LiberoTask, init_states, suite_tasks

__all__ = ["PROPRIO_DIM", "RESERVED_ENV_KWARGS", "RGB_STATE_DIM", "LiberoSlot", "SlotConfig"]

PROPRIO_DIM = 39
"""robosuite's ``robot0_proprio-state`` for LIBERO's Panda: joint positions, their cosines and sines, joint
velocities (7 each), end-effector position 3 and quaternion 4, gripper joint positions and velocities (2 each)."""

RGB_STATE_DIM = 8
"""The ``state`` entry of ``rgb`` observations: end-effector position 3, axis-angle 3, gripper joint positions 2."""

CAMERAS = ("agentview", "robot0_eye_in_hand")
"""The third-person and wrist cameras (observation entries ``rgb`` and ``wrist_rgb``)."""

RESERVED_ENV_KWARGS = frozenset(
    {
        "bddl_file_name",
        "use_camera_obs",
        "has_offscreen_renderer",
        "has_renderer",
        "camera_names",
        "camera_heights",
        "camera_widths",
        "hard_reset",
        "ignore_done",
    }
)
"""``ControlEnv`` arguments the slot sets itself (``env_kwargs`` may not override them)."""


@dataclass(frozen=True)
class SlotConfig:
    """What every slot of a vector env shares (picklable: spawned workers receive it)."""

    suite: str
    obs_mode: str
    image_size: tuple[int, int]
    """``(height, width)`` of the camera images (and of :meth:`LiberoSlot.rlinf_render`)."""
    settle_steps: int
    env_kwargs: dict[str, Any]

    @property
    def max_objects(self) -> int:
        """Movable objects of the suite's most crowded task: the ``object-state`` part is padded to it."""
        return max(t.num_objects for t in suite_tasks(self.suite))

    @property
    def state_dim(self) -> int:
        """Length of a ``state`` observation: proprioception, padded object state, one-hot task id."""
        return PROPRIO_DIM + OBJECT_STATE_DIM * self.max_objects + len(suite_tasks(self.suite))


def placement_seed(task: LiberoTask, init_id: int) -> int:
    """The seed of the fixtures' placement for a pair (the initial-state files hold joints, not fixture poses).

    LIBERO's reset jitters the fixtures (cabinets, stoves) with NumPy's global generator; seeding it per pair
    makes a pair's initial scene one fixed scene, in every process.
    """
    return zlib.crc32(f"{task.source}/{task.name}/{init_id}".encode())


_EGL_MODULE = "robosuite.renderers.context.egl_context"
"""robosuite's EGL context (its GL backend unless ``MUJOCO_GL`` is ``osmesa`` or ``glx``, which are left alone)."""


def _current_context() -> tuple[Any, ...] | None:
    """The EGL context current in this thread with its display and surfaces (``None``: none, or not EGL)."""
    module = sys.modules.get(_EGL_MODULE)
    if module is None:
        return None
    egl = module.EGL
    context = egl.eglGetCurrentContext()
    if not context:
        return None
    draw, read = egl.eglGetCurrentSurface(egl.EGL_DRAW), egl.eglGetCurrentSurface(egl.EGL_READ)
    return (egl.eglGetCurrentDisplay(), draw, read, context)


def _make_current_again(previous: tuple[Any, ...] | None) -> None:
    """Make ``previous`` (of :func:`_current_context`) current again, or no context at all in this thread.

    An EGL context can be current in one thread at a time and Ray runs an actor's calls on a thread pool, so a
    slot never leaves its own context current; a context that was current before (gymnasium's MuJoCo renderer
    makes its context current once and relies on it) is current again afterwards.
    """
    module = sys.modules.get(_EGL_MODULE)
    if module is None or module.EGL_DISPLAY is None:
        return
    egl = module.EGL
    if previous is None:
        egl.eglMakeCurrent(module.EGL_DISPLAY, egl.EGL_NO_SURFACE, egl.EGL_NO_SURFACE, egl.EGL_NO_CONTEXT)
    else:
        egl.eglMakeCurrent(*previous)


_LIVE: weakref.WeakSet[LiberoSlot] = weakref.WeakSet()
_ATEXIT_REGISTERED = False


def _close_all() -> None:
    # Registered after robosuite registers eglTerminate (at its first context), so it runs first (atexit is
    # LIFO): scenes still open at exit free their GL contexts while the display lives, not noisily in __del__.
    for slot in list(_LIVE):
        slot.close()


def _integration_state(env: Any) -> np.ndarray:
    model, data = env.sim.model._model, env.sim.data._data
    spec = mujoco.mjtState.mjSTATE_INTEGRATION
    out = np.empty(mujoco.mj_stateSize(model, spec))
    mujoco.mj_getState(model, data, out, spec)
    return out


def _quat2axisangle(quat: np.ndarray) -> np.ndarray:
    """Robosuite's ``(x, y, z, w)`` quaternion as an axis-angle vector (on a copy: robosuite's clips in place)."""
    from robosuite.utils.transform_utils import quat2axisangle

    return np.asarray(quat2axisangle(np.array(quat, dtype=np.float64)))


class LiberoSlot(gym.Env[Any, np.ndarray]):
    """One environment of a :class:`~rlinf_envs.libero.LiberoVecEnv`; see the module docstring.

    Args:
        index: the slot's position in the vector env (it picks its pair from the reset options by it).
        cfg: suite, observation mode and LIBERO arguments shared by all slots.
    """

    def __init__(self, index: int, cfg: SlotConfig) -> None:
        self.index = index
        self.cfg = cfg
        self._tasks = suite_tasks(cfg.suite)
        self._env: Any = None  # the LIBERO ControlEnv of the current task, built on the first reset
        self._task: LiberoTask | None = None
        self._init_id = -1
        self._obs: Any = None
        self._state_dim = cfg.state_dim
        self._object_width = OBJECT_STATE_DIM * cfg.max_objects
        self.action_space = gym.spaces.Box(-1.0, 1.0, (7,), np.float32)
        if cfg.obs_mode == "rgb":
            size = (*cfg.image_size, 3)
            self.observation_space: gym.Space[Any] = gym.spaces.Dict(
                {
                    "rgb": gym.spaces.Box(0, 255, size, np.uint8),
                    "wrist_rgb": gym.spaces.Box(0, 255, size, np.uint8),
                    "state": gym.spaces.Box(-np.inf, np.inf, (RGB_STATE_DIM,), np.float32),
                    "task_index": gym.spaces.Box(0, np.iinfo(np.int16).max, (1,), np.int16),
                }
            )
        else:
            self.observation_space = gym.spaces.Box(-np.inf, np.inf, (self._state_dim,), np.float32)

    # ------------------------------------------------------------------------------------------ simulation
    def _build(self, task: LiberoTask) -> None:
        # robosuite picks its GL context class when first imported (the vector env set MUJOCO_GL before).
        from libero.libero.envs.env_wrapper import ControlEnv

        global _ATEXIT_REGISTERED
        self.close()
        rgb = self.cfg.obs_mode == "rgb"
        previous = _current_context()
        env = ControlEnv(
            bddl_file_name=str(task.bddl_file),
            use_camera_obs=rgb,
            has_offscreen_renderer=rgb,
            camera_names=list(CAMERAS),
            camera_heights=self.cfg.image_size[0],
            camera_widths=self.cfg.image_size[1],
            # The vector env resets the sim's data itself; a hard reset would recompile the scene every episode.
            hard_reset=False,
            # Time limits are the vector env's: robosuite's horizon would otherwise refuse steps after 1000.
            ignore_done=True,
            **self.cfg.env_kwargs,
        )
        _make_current_again(previous)  # robosuite made the new context current in this thread; see _gl
        self._env = env
        self._task = task
        _LIVE.add(self)
        if not _ATEXIT_REGISTERED:
            atexit.register(_close_all)
            _ATEXIT_REGISTERED = True

    @contextlib.contextmanager
    def _gl(self) -> Iterator[None]:
        """This slot's GL context current in this thread for the block (no-op without a render context).

        Every robosuite env has its own GL context, but robosuite renders into (and frees its GL objects from)
        whichever context is current: the last one created, or none once another env was closed. And an EGL
        context current in one thread cannot be made current in another (a Ray actor builds its envs in one
        thread and steps them in others). So each use selects the slot's context and afterwards makes current
        again what was current before (see :func:`_make_current_again`).
        """
        context = getattr(self._env.sim, "_render_context_offscreen", None) if self._env is not None else None
        if context is None:
            yield
            return
        gl_ctx = context.gl_ctx
        del context  # closing the env in the block must be able to collect it (with this context current)
        previous = _current_context()
        mine = getattr(gl_ctx, "_context", None)
        if (
            previous is not None
            and mine is not None
            and getattr(previous[3], "address", None) == mine.address
        ):
            previous = None  # ours was left current: leave none
        gl_ctx.make_current()
        try:
            yield
        finally:
            _make_current_again(previous)

    def _reset_to(self, task: LiberoTask, init_id: int) -> Any:
        if self._task is None or self._task.index != task.index or self._env is None:
            self._build(task)
        env = self._env
        with self._gl():
            saved = np.random.get_state()
            np.random.seed(placement_seed(task, init_id))
            try:
                env.reset()
            finally:
                np.random.set_state(saved)
            # robosuite keeps the gripper's integrated command across soft resets: start every episode from zero.
            gripper = env.env.robots[0].gripper
            gripper.current_action = np.zeros(gripper.dof)
            raw = env.set_init_state(np.array(init_states(task)[init_id]))
            zero = np.zeros(7)
            for _ in range(self.cfg.settle_steps):
                raw, _, _, _ = env.step(zero)
        self._init_id = init_id
        return raw

    def _convert(self, raw: dict[str, np.ndarray]) -> Any:
        assert self._task is not None
        if self.cfg.obs_mode == "rgb":
            # LIBERO's cameras render upside down: rotate by 180 degrees, as RLinf and OpenVLA do.
            return {
                "rgb": np.ascontiguousarray(raw["agentview_image"][::-1, ::-1]),
                "wrist_rgb": np.ascontiguousarray(raw["robot0_eye_in_hand_image"][::-1, ::-1]),
                "state": np.concatenate(
                    [
                        raw["robot0_eef_pos"],
                        _quat2axisangle(raw["robot0_eef_quat"]),
                        raw["robot0_gripper_qpos"],
                    ]
                ).astype(np.float32),
                # Which instruction of EnvSpec.task_descriptions the env is posed (what a VLA is prompted with).
                "task_index": np.array([self._task.index], dtype=np.int16),
            }
        out = np.zeros(self._state_dim, dtype=np.float32)
        proprio = np.asarray(raw["robot0_proprio-state"], dtype=np.float32)
        objects = np.asarray(raw["object-state"], dtype=np.float32)
        width = self._object_width
        if proprio.shape != (PROPRIO_DIM,) or objects.size > width:
            raise RuntimeError(
                f"LIBERO task {self._task.name!r}: proprio-state {proprio.shape} / object-state {objects.shape} "
                f"do not fit the observation layout ({PROPRIO_DIM},) / (<= {width},)"
            )
        out[:PROPRIO_DIM] = proprio
        out[PROPRIO_DIM : PROPRIO_DIM + objects.size] = objects
        out[PROPRIO_DIM + width + self._task.index] = 1.0
        return out

    # ------------------------------------------------------------------------------------- gymnasium API
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset to the pair ``options["pairs"][index]``: ``(task id, initial-state id)``."""
        if not options or "pairs" not in options:
            raise ValueError("LiberoSlot.reset needs options={'pairs': [(task_id, init_state_id), ...]}")
        task_id, init_id = options["pairs"][self.index]
        self._obs = self._convert(self._reset_to(self._tasks[int(task_id)], int(init_id)))
        return copy.deepcopy(self._obs), {}

    def step(self, action: np.ndarray) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """One control step (20 Hz); a NaN action leaves the simulation untouched."""
        if self._env is None:
            raise RuntimeError("LiberoSlot.step before reset")
        action = np.asarray(action, dtype=np.float64)
        if np.isnan(action).any():
            return copy.deepcopy(self._obs), 0.0, False, False, {"success": False}
        with self._gl():
            raw, _, success, _ = self._env.step(action)  # LIBERO reports the task's success check as `done`
        self._obs = self._convert(raw)
        return copy.deepcopy(self._obs), float(success), False, False, {"success": bool(success)}

    def rlinf_render(self) -> np.ndarray:
        """``[H, W, 3]`` uint8: the third-person camera now, upright (videos; called through the vector env).

        In ``state`` mode the first call creates the render context the cameras of ``rgb`` mode use.
        """
        if self._env is None:
            raise RuntimeError("LiberoSlot.rlinf_render before reset")
        sim = self._env.sim
        if getattr(sim, "_render_context_offscreen", None) is None:
            from robosuite.utils.binding_utils import MjRenderContextOffscreen

            previous = _current_context()
            context = MjRenderContextOffscreen(sim, device_id=-1)  # registers itself with the sim
            context.vopt.geomgroup[0] = 0  # visual meshes only, as robosuite's cameras show them
            context.vopt.geomgroup[1] = 1
            _make_current_again(previous)
        height, width = self.cfg.image_size
        with self._gl():
            image = sim.render(width=width, height=height, camera_name=CAMERAS[0])
        return np.ascontiguousarray(np.asarray(image)[::-1, ::-1])

    def close(self) -> None:
        """Free the simulation (and its render context)."""
        if self._env is not None:
            # robosuite frees the render context's GL objects in the current context: it must be this slot's.
            with self._gl():
                self._env.close()
            self._env = None
            self._task = None
            _LIVE.discard(self)

    # ------------------------------------------------------------------------------- state and inspection
    @property
    def flat_sim_state(self) -> np.ndarray | None:
        """MuJoCo's ``[time, qpos, qvel]``, the layout of the initial-state files (``None`` before a reset)."""
        return None if self._env is None else np.array(self._env.get_sim_state())

    @property
    def task_env(self) -> Any:
        """The LIBERO ``ControlEnv`` of the current task (``None`` before a reset)."""
        return self._env

    @property
    def rlinf_state(self) -> dict[str, Any] | None:
        """Everything the following steps depend on (read and written through the vector env's get/set_attr).

        MuJoCo's integration state (positions, velocities, actuator and warm-start state, controls, applied
        forces, time), the fixtures' placement in the model, robosuite's step counters, gripper command and
        observable sampling state, and the last observation.
        """
        if self._env is None or self._task is None:
            return None
        base = self._env.env
        model = self._env.sim.model._model
        return copy.deepcopy(
            {
                "task_id": self._task.index,
                "init_id": self._init_id,
                "integration": _integration_state(self._env),
                "body_pos": np.array(model.body_pos),
                "body_quat": np.array(model.body_quat),
                "gripper_action": np.array(base.robots[0].gripper.current_action),
                "counters": (base.timestep, base.cur_time, base.done),
                "obs_cache": base._obs_cache,
                "observables": {
                    name: (o._time_since_last_sample, o._sampled, o._current_delay, o._current_observed_value)
                    for name, o in base._observables.items()
                },
                "obs": self._obs,
            }
        )

    @rlinf_state.setter
    def rlinf_state(self, state: dict[str, Any] | None) -> None:
        if state is None:
            self.close()
            self._obs = None
            return
        state = copy.deepcopy(state)
        task = self._tasks[int(state["task_id"])]
        if self._task is None or self._task.index != task.index or self._env is None:
            self._build(task)
        env = self._env
        base = env.env
        model, data = env.sim.model._model, env.sim.data._data
        mujoco.mj_resetData(model, data)
        model.body_pos[:] = state["body_pos"]
        model.body_quat[:] = state["body_quat"]
        mujoco.mj_setState(model, data, state["integration"], mujoco.mjtState.mjSTATE_INTEGRATION)
        mujoco.mj_forward(model, data)
        robot = base.robots[0]
        robot.gripper.current_action = state["gripper_action"]
        robot.controller.new_update = True  # the controller re-reads the restored simulation at the next step
        base.timestep, base.cur_time, base.done = state["counters"]
        base._obs_cache = state["obs_cache"]
        for name, values in state["observables"].items():
            o = base._observables[name]
            o._time_since_last_sample, o._sampled, o._current_delay, o._current_observed_value = values
        base._post_process()  # object states derived from the joints (a stove's burner), as after a step
        self._init_id = int(state["init_id"])
        self._obs = state["obs"]
