"""Meta-World v3 benchmarks (MT1 / ML1 single tasks, MT10, MT25, MT50) as an RLinf :class:`~rlinf_envs.VecEnv`."""

from __future__ import annotations

import copy
import difflib
import functools
import pickle
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any, cast

import numpy as np

try:
    import gymnasium as gym
    import metaworld
    import mujoco
    from metaworld.env_dict import ALL_V3_ENVIRONMENTS, MT10_V3, MT25_V3, MT50_V3
    from metaworld.types import Task
except ImportError as e:  # pragma: no cover - exercised by the extra-missing test
    raise ImportError(f'the Meta-World backend needs: pip install "rlinf-envs[metaworld]" ({e})') from e

from rlinf_core.protocols import ChunkStepResult, EnvSpec, EpisodeStats, NpObs, ObsSpec

from .._seeds import env_seeds
from ._render import CameraRenderer

__all__ = [
    "CAMERAS",
    "DEFAULT_CAMERA",
    "DEFAULT_IMAGE_SIZE",
    "MULTI_TASK_BENCHMARKS",
    "NUM_VARIATIONS",
    "OBS_MODES",
    "REWARD_MODES",
    "SINGLE_TASK_BENCHMARKS",
    "VECTOR_MODES",
    "MetaWorldVecEnv",
    "benchmark_tasks",
    "env_ids",
    "metaworld_spec",
    "task_and_variation",
]

OBS_MODES = ("state", "rgb")
REWARD_MODES = ("dense", "normalized_dense", "sparse")
VECTOR_MODES = ("sync", "async")
SINGLE_TASK_BENCHMARKS = ("MT1", "ML1")
"""``MT1/<task>``: one task, goal position in the observation; ``ML1/<task>``: the same with the goal hidden."""
MULTI_TASK_BENCHMARKS: dict[str, Sequence[str]] = {
    "MT10": tuple(MT10_V3),
    "MT25": tuple(MT25_V3),
    "MT50": tuple(MT50_V3),
}
"""The multi-task benchmarks and their tasks, in the benchmark's order (task index = position)."""
CAMERAS = ("topview", "corner", "corner2", "corner3", "corner4", "behindGripper", "gripperPOV")
"""The cameras of the Meta-World scene (every task shares the Sawyer base scene)."""
DEFAULT_CAMERA = "corner4"
"""RLinf's Meta-World env renders ``corner2`` moved to (0.75, 0.075, 0.7): that is ``corner4`` in Meta-World v3."""
DEFAULT_IMAGE_SIZE = (128, 128)
STATE_DIM = 39
"""hand xyz, gripper opening, two objects' xyz + quaternion (padded), the same 18 values one step earlier, goal xyz."""
PROPRIO_DIM = 4
"""The ``state`` entry of ``rgb`` observations: hand xyz and gripper opening (the first 4 state values)."""
NUM_VARIATIONS = 50
"""Fixed variations (goal and object positions) per task, as the Meta-World benchmarks sample them."""
_MAX_REWARD = 10.0  # Meta-World's v2 reward functions return values in [0, 10]


def env_ids() -> list[str]:
    """Every ``env_id`` the backend accepts: ``MT1/<task>``, ``ML1/<task>`` for the 50 tasks, ``MT10``/``MT25``/``MT50``."""
    singles = [f"{b}/{t}" for b in SINGLE_TASK_BENCHMARKS for t in ALL_V3_ENVIRONMENTS]
    return [*MULTI_TASK_BENCHMARKS, *singles]


def benchmark_tasks(env_id: str) -> tuple[tuple[str, ...], bool]:
    """The tasks of ``env_id`` in benchmark order, and whether the goal position is observed.

    Raises:
        ValueError: for an id that is not in :func:`env_ids`.
    """
    if env_id in MULTI_TASK_BENCHMARKS:
        return tuple(MULTI_TASK_BENCHMARKS[env_id]), True
    bench, _, task = env_id.partition("/")
    if bench in SINGLE_TASK_BENCHMARKS and task in ALL_V3_ENVIRONMENTS:
        return (task,), bench == "MT1"
    close = difflib.get_close_matches(env_id, env_ids(), n=3)
    hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
    raise ValueError(
        f"Meta-World env_id {env_id!r} is not known{hint}; use MT10, MT25, MT50, MT1/<task> or ML1/<task> "
        f"with a task of {', '.join(ALL_V3_ENVIRONMENTS)}"
    )


def task_and_variation(seed: int, num_tasks: int, num_variations: int) -> tuple[int, int]:
    """Which task and which of its fixed variations an episode reset with ``seed`` runs.

    Task ``seed mod num_tasks`` (round-robin over the benchmark's tasks), variation
    ``(seed // num_tasks) mod num_variations``: consecutive seeds walk through every task, then through every
    variation, so ``num_tasks x num_variations`` consecutive seeds visit each (task, variation) pair once.
    """
    return seed % num_tasks, (seed // num_tasks) % num_variations


@functools.cache
def _variations(task: str, benchmark_seed: int, goal_observable: bool) -> tuple[Any, ...]:
    """The fixed variations (``metaworld.Task``: goal and object positions) of one task, built once per process.

    They are the tasks ``metaworld.MT1(task, seed=benchmark_seed)`` samples (50 per task); ``ML1`` uses the
    same positions with the goal hidden from the observation.
    """
    mt1: Any = metaworld.MT1  # unannotated constructor
    tasks = mt1(task, seed=benchmark_seed).train_tasks
    if len(tasks) != NUM_VARIATIONS:
        raise RuntimeError(
            f"metaworld.MT1({task!r}) sampled {len(tasks)} variations, expected {NUM_VARIATIONS}"
        )
    if goal_observable:
        return tuple(tasks)
    out = []
    for t in tasks:
        data = pickle.loads(t.data)
        data["partially_observable"] = True
        out.append(Task(env_name=t.env_name, data=pickle.dumps(data)))
    return tuple(out)


def metaworld_spec(obs_mode: str = "state", image_size: Sequence[int] | None = None) -> EnvSpec:
    """The :class:`EnvSpec` of every Meta-World env (no simulator needed: it depends on the obs mode only)."""
    if obs_mode not in OBS_MODES:
        raise ValueError(f"obs_mode must be one of {OBS_MODES}, got {obs_mode!r}")
    low, high = (-1.0,) * 4, (1.0,) * 4
    if obs_mode == "state":
        return EnvSpec((STATE_DIM,), "continuous", 4, action_low=low, action_high=high)
    h, w = _image_size(image_size)
    obs = {"rgb": ObsSpec((h, w, 3), "uint8"), "state": ObsSpec((PROPRIO_DIM,), "float32")}
    return EnvSpec((), "continuous", 4, action_low=low, action_high=high, obs_dict=obs)


def _image_size(image_size: Sequence[int] | None) -> tuple[int, int]:
    if image_size is None:
        return DEFAULT_IMAGE_SIZE
    size = tuple(int(x) for x in image_size)
    if len(size) != 2 or min(size) < 1:
        raise ValueError(f"image_size must be [height, width] with positive sizes, got {list(image_size)}")
    return size[0], size[1]


_SKIP_ATTRS = frozenset({"model", "data", "mujoco_renderer"})
"""Attributes of a Meta-World env that a slot's state does not pickle (MuJoCo objects, GL resources)."""


def _is_mujoco_view(value: Any) -> bool:
    """An array viewing MuJoCo's memory (e.g. Meta-World's ``init_left_pad``, a view of ``data.xipos``).

    Such an attribute follows the restored simulator state by itself; a pickled copy would freeze it.
    """
    if not isinstance(value, np.ndarray):
        return False
    while isinstance(value, np.ndarray) and value.base is not None:
        value = value.base
    return not isinstance(value, np.ndarray)


def _python_state(env: Any) -> bytes:
    return pickle.dumps(
        {k: v for k, v in env.__dict__.items() if k not in _SKIP_ATTRS and not _is_mujoco_view(v)}
    )


class _TaskSlot(gym.Env[Any, np.ndarray]):
    """One env of the vector: a Meta-World task env, rebuilt when a seeded reset selects another task.

    A seeded ``reset`` picks the task and variation from the seed (:func:`task_and_variation`) and seeds the
    generator that draws the variation of each later unseeded reset (auto-reset), which keeps the task.

    ``step`` reports the episode's end in ``info`` (``terminated``, ``truncated``, with ``success``) and returns
    ``False`` for both flags: a gymnasium vector with autoreset disabled refuses to step an env that returned
    ``True``, and this one must step finished envs (without auto-reset they wait for the next ``reset``); steps
    after the end return the last observation with zero reward and do not simulate.
    """

    def __init__(
        self,
        tasks: Sequence[str],
        goal_observable: bool,
        obs_mode: str,
        image_size: tuple[int, int],
        camera_name: str,
        reward_mode: str,
        ignore_terminations: bool,
        max_episode_steps: int,
        benchmark_seed: int,
        fast_render: bool,
        env_kwargs: Mapping[str, Any],
    ) -> None:
        self._tasks = tuple(tasks)
        self._goal_observable = goal_observable
        self._obs_mode = obs_mode
        self._image_size = image_size
        self._camera = camera_name
        self._reward_mode = reward_mode
        self._ignore_terminations = ignore_terminations
        self._max_steps = max_episode_steps
        self._benchmark_seed = benchmark_seed
        self._fast_render = fast_render
        self._env_kwargs = dict(env_kwargs)
        spec = metaworld_spec(obs_mode, image_size)
        self.observation_space: gym.Space[Any]
        if spec.obs_dict is None:
            self.observation_space = gym.spaces.Box(-np.inf, np.inf, (STATE_DIM,), np.float32)
        else:
            self.observation_space = gym.spaces.Dict(
                {
                    "rgb": gym.spaces.Box(0, 255, (*image_size, 3), np.uint8),
                    "state": gym.spaces.Box(-np.inf, np.inf, (PROPRIO_DIM,), np.float32),
                }
            )
        self.action_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
        self._env: Any = None
        self._renderer: CameraRenderer | None = None
        self._task = -1
        self._variation = -1
        self._rng = np.random.default_rng(0)
        self._len = 0
        self._ended = False
        self._last_obs: Any = None

    # -- task selection ------------------------------------------------------------------------------------

    def _load(self, task: int, variation: int) -> None:
        """Make the env run ``variation`` of ``task`` (a new MuJoCo env when the task changes)."""
        if task != self._task:
            self._close_env()
            cls = ALL_V3_ENVIRONMENTS[self._tasks[task]]
            env = cls(**self._env_kwargs)
            env.max_path_length = self._max_steps  # the package refuses steps past it; our limit rules
            self._env, self._task = env, task
        variations = _variations(self._tasks[task], self._benchmark_seed, self._goal_observable)
        self._env.set_task(variations[variation])
        self._variation = variation

    @property
    def task(self) -> tuple[str, int]:
        """``(task name, variation index)`` of the current episode (``("", -1)`` before the first reset)."""
        return (self._tasks[self._task], self._variation) if self._task >= 0 else ("", -1)

    @property
    def task_env(self) -> Any:
        """The Meta-World env (``SawyerXYZEnv``) of the current task, ``None`` before the first reset."""
        return self._env

    # -- gymnasium API -----------------------------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        if seed is not None:
            task, variation = task_and_variation(int(seed), len(self._tasks), NUM_VARIATIONS)
            self._rng = np.random.default_rng(int(seed))
        else:
            task, variation = max(self._task, 0), int(self._rng.integers(NUM_VARIATIONS))
        self._load(task, variation)
        raw, _ = self._env.reset()
        self._len = 0
        self._ended = False
        self._last_obs = self._observe(raw)
        return self._last_obs, {}

    def step(self, action: np.ndarray) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        if self._ended:
            return (
                self._last_obs,
                0.0,
                False,
                False,
                {"success": False, "terminated": False, "truncated": False},
            )
        a = np.clip(np.asarray(action, dtype=np.float32), -1.0, 1.0)
        raw, reward, _, _, info = self._env.step(a)
        success = bool(info["success"])
        self._len += 1
        if self._reward_mode == "sparse":
            reward = float(success)
        elif self._reward_mode == "normalized_dense":
            reward = float(reward) / _MAX_REWARD
        term = success and not self._ignore_terminations
        trunc = self._len >= self._max_steps
        self._ended = term or trunc
        self._last_obs = self._observe(raw)
        return (
            self._last_obs,
            float(reward),
            False,
            False,
            {"success": success, "terminated": term, "truncated": trunc},
        )

    def _observe(self, raw: np.ndarray) -> Any:
        if self._obs_mode == "state":
            return np.asarray(raw, dtype=np.float32)
        return {"rgb": self.rlinf_render(), "state": np.asarray(raw[:PROPRIO_DIM], dtype=np.float32)}

    def rlinf_render(self) -> np.ndarray:
        """``[H, W, 3]`` uint8: the camera's view of the current scene (the ``rgb`` observation's image)."""
        if self._env is None:
            raise RuntimeError("call reset() before rendering")
        if self._renderer is None:
            h, w = self._image_size
            self._renderer = CameraRenderer(self._env.model, self._camera, h, w, fast=self._fast_render)
        return self._renderer.render(self._env.model, self._env.data)

    # -- state -------------------------------------------------------------------------------------------

    @property
    def rlinf_state(self) -> dict[str, Any]:
        """This env's full state (read and written through the vector env's ``get_attr``/``set_attr``)."""
        env = self._env
        snap = None
        if env is not None:
            spec = mujoco.mjtState.mjSTATE_INTEGRATION
            physics = np.empty(mujoco.mj_stateSize(env.model, spec))
            mujoco.mj_getState(env.model, env.data, physics, spec)
            snap = {"attrs": _python_state(env), "physics": physics}
        return {
            "task": self._task,
            "variation": self._variation,
            "rng": copy.deepcopy(self._rng),
            "len": self._len,
            "ended": self._ended,
            "last_obs": copy.deepcopy(self._last_obs),
            "env": snap,
        }

    @rlinf_state.setter
    def rlinf_state(self, state: Mapping[str, Any]) -> None:
        if state["env"] is not None:
            # Re-running the variation's reset re-applies what it writes into the MuJoCo model (goal sites,
            # object bodies) and re-creates the attributes that view MuJoCo's memory; the other Python
            # attributes and the integration state (what mj_step reads) then overwrite everything else.
            self._load(int(state["task"]), int(state["variation"]))
            self._env.reset()
            self._env.__dict__.update(pickle.loads(state["env"]["attrs"]))
            model, data, physics = self._env.model, self._env.data, state["env"]["physics"]
            spec = mujoco.mjtState.mjSTATE_INTEGRATION
            mujoco.mj_setState(model, data, physics, spec)
            # Positions, contacts, ... for readers of data; mj_forward also rewrites the solver's warm start
            # (mujoco 3.3), which the next step reads: set the saved state once more.
            mujoco.mj_forward(model, data)
            mujoco.mj_setState(model, data, physics, spec)
        self._rng = copy.deepcopy(state["rng"])
        self._len = int(state["len"])
        self._ended = bool(state["ended"])
        self._last_obs = copy.deepcopy(state["last_obs"])

    def _close_env(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
        if self._env is not None:
            self._env.close()
            self._env, self._task, self._variation = None, -1, -1

    def close(self) -> None:
        self._close_env()


def _make_slot(kwargs: Mapping[str, Any]) -> _TaskSlot:
    """Module level so that spawned ``AsyncVectorEnv`` workers can unpickle the env factory."""
    return _TaskSlot(**kwargs)


def _set_rows(dst: NpObs, mask: np.ndarray, src: NpObs) -> None:
    """``dst[mask] = src[mask]`` on an array or on every entry of a dict of arrays."""
    if isinstance(dst, dict):
        src_d = cast(dict[str, np.ndarray], src)
        for k, v in dst.items():
            v[mask] = src_d[k][mask]
    else:
        dst[mask] = cast(np.ndarray, src)[mask]


def _copy(obs: NpObs) -> NpObs:
    if isinstance(obs, dict):
        return {k: v.copy() for k, v in obs.items()}
    return obs.copy()


def _stack_obs(per_env: Sequence[Any]) -> NpObs:
    """The slots' observations as one ``[N, ...]`` array (state) or dict of arrays (``rgb``)."""
    first = per_env[0]
    if isinstance(first, Mapping):
        return {k: np.stack([o[k] for o in per_env]) for k in first}
    return np.stack(per_env).astype(np.float32, copy=False)


def _as_obs(obs: Any) -> NpObs:
    if isinstance(obs, Mapping):
        return {k: np.asarray(v) for k, v in obs.items()}
    return np.asarray(obs, dtype=np.float32)


class MetaWorldVecEnv:
    """``num_envs`` Meta-World v3 envs stepped with action chunks, in-process or one process per env.

    **Tasks.** ``env_id`` names a benchmark: ``"MT1/<task>"`` (one task, e.g. ``"MT1/reach-v3"``, goal position
    in the last 3 state values), ``"ML1/<task>"`` (the same positions, goal hidden: zeros), or ``"MT10"``,
    ``"MT25"``, ``"MT50"`` (several tasks, goal observed). Each task has 50 fixed variations (goal and object
    positions), those ``metaworld.MT1(task, seed=benchmark_seed)`` samples. A reset with seed ``s`` runs task
    ``s mod T`` (the benchmark's order) in variation ``(s // T) mod 50`` (:func:`task_and_variation`); env ``i``
    resets with ``seed + i // group_size``, so the envs of a group share task and variation and consecutive
    groups run consecutive tasks (round-robin; every task runs once ``num_envs / group_size >= T``, over all env
    workers). An auto-reset keeps the env's task and draws the next variation from a generator seeded with the
    env's reset seed (the same sequence for every member of a group).

    **Observations.** ``obs_mode="state"``: the 39-D state vector, float32 ``[N, 39]``. ``obs_mode="rgb"``:
    ``{"rgb": [N, H, W, 3] uint8, "state": [N, 4] float32}``, the image of ``camera_name`` (upright) and the
    hand position and gripper opening. Images are rendered offscreen with ``MUJOCO_GL`` (``egl`` when unset,
    see :mod:`rlinf_envs.metaworld._render`).

    **Actions and rewards.** ``[N, C, 4]`` (hand xyz delta, gripper), clipped to [-1, 1] and executed open-loop.
    ``reward_mode``: ``"dense"`` (Meta-World's reward, in [0, 10]), ``"normalized_dense"`` (the same / 10) or
    ``"sparse"`` (1 at steps where the task is solved). A success (``info["success"]``) terminates the episode
    unless ``ignore_terminations``; :class:`EpisodeStats` ``successes`` is True if the task was solved at any
    step of the episode, ``successes_at_end`` if it was solved at the last step, ``tasks`` holds the task names.
    Episodes are cut at ``max_episode_steps`` (default 500, Meta-World's ``max_path_length``). :meth:`render`
    draws the same camera in any ``obs_mode`` (evaluation videos).

    Args:
        env_id: ``"MT1/<task>"``, ``"ML1/<task>"``, ``"MT10"``, ``"MT25"`` or ``"MT50"`` (:func:`env_ids`).
        num_envs: number of environments (a multiple of ``group_size``).
        group_size: consecutive envs sharing task and variation on ``reset``.
        auto_reset: reset an env as soon as its episode ends (otherwise it reports ``done`` with zero reward
            until the next ``reset``).
        max_episode_steps: time limit (``None``: 500).
        obs_mode: ``"state"`` or ``"rgb"``.
        image_size: ``(height, width)`` of ``rgb`` images (``None``: 128x128).
        camera_name: one of :data:`CAMERAS` (``None``: :data:`DEFAULT_CAMERA`).
        reward_mode: one of :data:`REWARD_MODES`.
        ignore_terminations: a success does not end the episode (only the time limit does).
        vector_mode: ``"sync"`` (in-process) or ``"async"`` (a spawned process per env).
        benchmark_seed: seed of the 50 fixed variations of each task.
        fast_render: render without shadows, reflections and multisampling (~10x faster on a CPU renderer).
        step_timeout_s: async mode: a worker that does not answer within this many seconds is an error.
        env_kwargs: keyword arguments for the Meta-World task class (e.g. ``reward_function_version``).
    """

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        *,
        group_size: int = 1,
        auto_reset: bool = True,
        max_episode_steps: int | None = None,
        obs_mode: str = "state",
        image_size: Sequence[int] | None = None,
        camera_name: str | None = None,
        reward_mode: str = "dense",
        ignore_terminations: bool = False,
        vector_mode: str = "sync",
        benchmark_seed: int = 0,
        fast_render: bool = True,
        step_timeout_s: float = 120.0,
        env_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if group_size < 1 or num_envs % group_size:
            raise ValueError(
                f"group_size must divide num_envs: got group_size={group_size}, num_envs={num_envs}"
            )
        if max_episode_steps is not None and max_episode_steps < 1:
            raise ValueError(f"max_episode_steps must be >= 1 or None, got {max_episode_steps}")
        if reward_mode not in REWARD_MODES:
            raise ValueError(f"reward_mode must be one of {REWARD_MODES}, got {reward_mode!r}")
        if vector_mode not in VECTOR_MODES:
            raise ValueError(f"vector_mode must be one of {VECTOR_MODES}, got {vector_mode!r}")
        camera = DEFAULT_CAMERA if camera_name is None else camera_name
        if camera not in CAMERAS:
            raise ValueError(f"camera_name must be one of {', '.join(CAMERAS)}, got {camera!r}")
        self.spec = metaworld_spec(obs_mode, image_size)  # validates obs_mode and image_size
        tasks, goal_observable = benchmark_tasks(env_id)
        self.env_id = env_id
        self.num_envs = num_envs
        self.group_size = group_size
        self.auto_reset = auto_reset
        self.obs_mode = obs_mode
        self.task_names = tasks
        self._timeout = step_timeout_s
        slot = {
            "tasks": tasks,
            "goal_observable": goal_observable,
            "obs_mode": obs_mode,
            "image_size": _image_size(image_size),
            "camera_name": camera,
            "reward_mode": reward_mode,
            "ignore_terminations": ignore_terminations,
            "max_episode_steps": max_episode_steps or int(ALL_V3_ENVIRONMENTS[tasks[0]].max_path_length),
            "benchmark_seed": benchmark_seed,
            "fast_render": fast_render,
            "env_kwargs": dict(env_kwargs or {}),
        }
        fns = [partial(_make_slot, slot)] * num_envs
        mode = gym.vector.AutoresetMode.DISABLED
        self._vec: gym.vector.AsyncVectorEnv | gym.vector.SyncVectorEnv
        if vector_mode == "async":
            # spawn, not fork: a forked child would inherit the parent's OpenGL and thread state mid-flight.
            self._vec = gym.vector.AsyncVectorEnv(fns, context="spawn", autoreset_mode=mode)
        else:
            self._vec = gym.vector.SyncVectorEnv(fns, autoreset_mode=mode)
        self._obs: NpObs = (
            {k: np.zeros((num_envs, *s.shape), dtype=s.dtype) for k, s in self.spec.obs_dict.items()}
            if self.spec.obs_dict is not None
            else np.zeros((num_envs, STATE_DIM), dtype=np.float32)
        )
        self._ret = np.zeros(num_envs, dtype=np.float64)
        self._len = np.zeros(num_envs, dtype=np.int64)
        self._success = np.zeros(num_envs, dtype=bool)
        self._finished = np.zeros(num_envs, dtype=bool)
        self._task = np.zeros(num_envs, dtype=np.int64)  # each env's task index (fixed until a seeded reset)
        self._was_reset = False
        self._closed = False

    # -- vector plumbing -----------------------------------------------------------------------------------

    def _reset_vec(self, seeds: list[int | None] | None, mask: np.ndarray | None) -> NpObs:
        options = None if mask is None else {"reset_mask": mask}
        if isinstance(self._vec, gym.vector.AsyncVectorEnv):
            self._vec.reset_async(seed=seeds, options=options)
            obs, _ = self._vec.reset_wait(timeout=self._timeout)
        else:
            obs, _ = self._vec.reset(seed=seeds, options=options)
        return _as_obs(obs)

    def _step_vec(self, actions: np.ndarray) -> tuple[NpObs, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        if isinstance(self._vec, gym.vector.AsyncVectorEnv):
            self._vec.step_async(actions)
            obs, rew, _, _, info = self._vec.step_wait(timeout=self._timeout)
        else:
            # The slots one after another, without SyncVectorEnv.step's observation copy and info merging: the
            # slots never return True flags or need its autoreset, and the episode ends come from the three info
            # flags read here.
            steps = [env.step(a) for env, a in zip(self._vec.envs, actions, strict=True)]
            infos = [out[4] for out in steps]
            flags = [
                np.array([i[k] for i in infos], dtype=bool) for k in ("terminated", "truncated", "success")
            ]
            rew = np.array([out[1] for out in steps], dtype=np.float64)
            return _stack_obs([out[0] for out in steps]), rew, flags[0], flags[1], flags[2]
        flags = [np.asarray(info[k], dtype=bool) for k in ("terminated", "truncated", "success")]
        return _as_obs(obs), np.asarray(rew), flags[0], flags[1], flags[2]

    # -- VecEnv --------------------------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None) -> NpObs:
        """Reset every env; env ``i`` uses seed ``seed + i // group_size`` (its task and variation).

        Returns:
            ``[N, 39]`` float32 states, or the ``rgb``/``state`` dict of ``obs_mode="rgb"``.
        """
        self._check_open()
        seeds: list[int | None] = list(env_seeds(seed, self.num_envs, self.group_size))
        self._obs = self._reset_vec(seeds, None)
        self._task[:] = [
            task_and_variation(int(s or 0), len(self.task_names), NUM_VARIATIONS)[0] for s in seeds
        ]
        self._ret[:] = 0.0
        self._len[:] = 0
        self._success[:] = False
        self._finished[:] = False
        self._was_reset = True
        return _copy(self._obs)

    def _check_actions(self, actions: np.ndarray) -> np.ndarray:
        actions = np.asarray(actions, dtype=np.float32)
        n = self.num_envs
        if actions.ndim != 3 or actions.shape[0] != n or actions.shape[2] != 4 or actions.shape[1] < 1:
            raise ValueError(
                f"actions must be [num_envs={n}, chunk, action_dim=4], got shape {actions.shape}"
            )
        if not np.isfinite(actions).all():
            raise ValueError("actions contain NaN or inf")
        clipped: np.ndarray = np.clip(actions, -1.0, 1.0)
        return clipped

    def chunk_step(self, actions: np.ndarray) -> ChunkStepResult:
        """Execute a chunk of actions ``[N, C, 4]`` (clipped to [-1, 1]) open-loop.

        All envs advance together one step at a time; an env whose episode ends mid-chunk is reset at once
        (``auto_reset``) and continues the chunk in its new episode. ``episodes`` lists the episodes that ended,
        by step of the chunk and, within a step, by env index.
        """
        self._check_open()
        if not self._was_reset:
            raise RuntimeError("call reset() before chunk_step()")
        actions = self._check_actions(actions)
        n, c = actions.shape[:2]
        rewards = np.zeros((n, c), dtype=np.float32)
        terms = np.zeros((n, c), dtype=bool)
        truncs = np.zeros((n, c), dtype=bool)
        final_obs = _copy(self._obs)
        stats = EpisodeStats()
        for k in range(c):
            obs, rew, term, trunc, success = self._step_vec(actions[:, k])
            live = ~self._finished
            terms[~live, k] = True  # without auto-reset a finished env stays done with zero reward
            rewards[live, k] = rew[live]
            terms[live, k] = term[live]
            truncs[live, k] = trunc[live]
            self._ret[live] += rew[live]
            self._len[live] += 1
            self._success[live] |= success[live]
            _set_rows(self._obs, live, obs)
            ended = live & (term | trunc)
            if ended.any():
                for i in np.flatnonzero(ended):
                    stats.returns.append(float(self._ret[i]))
                    stats.lengths.append(int(self._len[i]))
                    stats.successes.append(bool(self._success[i]))
                    stats.successes_at_end.append(bool(success[i]))
                    stats.tasks.append(self.task_names[self._task[i]])
                _set_rows(final_obs, ended, obs)
                self._ret[ended], self._len[ended], self._success[ended] = 0.0, 0, False
                if self.auto_reset:
                    _set_rows(self._obs, ended, self._reset_vec(None, ended))
                else:
                    self._finished |= ended
        last_done = terms[:, -1] | truncs[:, -1]
        _set_rows(final_obs, ~last_done, self._obs)
        return ChunkStepResult(_copy(self._obs), rewards, terms, truncs, final_obs, stats)

    def render(self) -> np.ndarray:
        """``[N, H, W, 3]`` uint8: each env's scene from ``camera_name`` at ``image_size`` (any ``obs_mode``; videos)."""
        self._check_open()
        return np.stack(list(self._vec.call("rlinf_render")))

    def tasks(self) -> list[tuple[str, int]]:
        """``(task name, variation index)`` of each env's current episode."""
        self._check_open()
        return [(str(name), int(variation)) for name, variation in self._vec.get_attr("task")]

    def task_envs(self) -> list[Any]:
        """Each env's Meta-World task env (``SawyerXYZEnv``: ``data``, ``_target_pos``, ...), ``vector_mode="sync"`` only.

        Read or place things between :meth:`chunk_step` calls; stepping or resetting them directly
        desynchronises this wrapper's bookkeeping.

        Raises:
            RuntimeError: with ``vector_mode="async"`` (the envs live in other processes).
        """
        self._check_open()
        if not isinstance(self._vec, gym.vector.SyncVectorEnv):
            raise RuntimeError(
                "the task envs live in worker processes with vector_mode='async'; use vector_mode='sync'"
            )
        return [cast(_TaskSlot, env).task_env for env in self._vec.envs]

    def get_state(self) -> dict[str, Any]:
        """Every env (task, variation, Python and MuJoCo state, episode generator) and the bookkeeping, picklable.

        :meth:`set_state` of a ``MetaWorldVecEnv`` built with the same arguments (in either vector mode)
        continues the in-progress episodes bit for bit.
        """
        self._check_open()
        return {
            "env_id": self.env_id,
            "num_envs": self.num_envs,
            "obs_mode": self.obs_mode,
            "slots": list(self._vec.get_attr("rlinf_state")),
            "obs": _copy(self._obs),
            "ret": self._ret.copy(),
            "len": self._len.copy(),
            "success": self._success.copy(),
            "finished": self._finished.copy(),
            "task": self._task.copy(),
            "was_reset": self._was_reset,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`get_state`; raises ``ValueError`` if it is the state of another benchmark, size or obs mode."""
        self._check_open()
        mine = (self.env_id, self.num_envs, self.obs_mode)
        theirs = (state.get("env_id"), state.get("num_envs"), state.get("obs_mode"))
        if theirs != mine:
            raise ValueError(
                f"env state of (env_id, num_envs, obs_mode)={theirs} cannot be loaded into a MetaWorldVecEnv "
                f"of {mine}"
            )
        self._vec.set_attr("rlinf_state", list(state["slots"]))
        self._obs = _copy(state["obs"])
        self._ret[:] = state["ret"]
        self._len[:] = state["len"]
        self._success[:] = state["success"]
        self._finished[:] = state["finished"]
        self._task[:] = state["task"]
        self._was_reset = bool(state["was_reset"])

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this MetaWorldVecEnv is closed")

    def close(self) -> None:
        """Close the envs (and the worker processes in async mode); idempotent."""
        if not self._closed:
            self._closed = True
            self._vec.close()
