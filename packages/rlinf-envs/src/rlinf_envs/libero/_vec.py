"""LIBERO task suites as an RLinf :class:`~rlinf_envs.VecEnv` (state or camera observations, 7-D EEF-delta actions)."""

from __future__ import annotations

import copy
import difflib
import os
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any, cast

import numpy as np
from rlinf_core.protocols import ChunkStepResult, EnvSpec, EpisodeStats, NpObs, ObsSpec

from .._process import libero_gl_env
from .._seeds import env_seeds
from .._vector import VECTOR_MODES, SubEnvs
from ._slot import RESERVED_ENV_KWARGS, RGB_STATE_DIM, LiberoSlot, SlotConfig
from ._suites import SUITES, LiberoTask, init_states, suite_tasks

__all__ = [
    "DEFAULT_IMAGE_SIZE",
    "INIT_STATE_SAMPLING",
    "OBS_MODES",
    "LiberoVecEnv",
    "libero_spec",
    "pool_problems",
]

OBS_MODES = ("state", "rgb")
INIT_STATE_SAMPLING = ("random", "sequential")
_RGB_KEYS = ("rgb", "wrist_rgb", "state", "task_index")
_ACTION_DIM = 7


DEFAULT_IMAGE_SIZE = (128, 128)
"""Camera images' ``(height, width)`` when ``image_size`` is not given."""


def _image_size(image_size: int | Sequence[int] | None) -> tuple[int, int]:
    if image_size is None:
        return DEFAULT_IMAGE_SIZE
    size = (
        (int(image_size), int(image_size))
        if isinstance(image_size, int)
        else tuple(int(x) for x in image_size)
    )
    if len(size) != 2 or min(size) < 8:
        raise ValueError(f"image_size must be (height, width) of at least 8 pixels each, got {image_size!r}")
    return (size[0], size[1])


def libero_spec(
    suite: str, obs_mode: str = "state", image_size: int | Sequence[int] | None = None
) -> EnvSpec:
    """The :class:`EnvSpec` of a LIBERO suite, computed from the task files (no simulator is built).

    ``state``: ``[39 + 14 * max_objects + num_tasks]`` float32; ``rgb``: ``{"rgb", "wrist_rgb": [H, W, 3] uint8,
    "state": [8] float32, "task_index": [1] int16}`` (``image_size`` ``(H, W)``, default 128x128). Actions: 7-D in
    ``[-1, 1]``. ``task_descriptions``: the suite's instructions, indexed by task id (``task_index``).
    """
    size = _image_size(image_size)
    if obs_mode == "rgb":
        image = ObsSpec((*size, 3), "uint8")
        obs: dict[str, Any] = {
            "obs_shape": (),
            "obs_dict": {
                "rgb": image,
                "wrist_rgb": image,
                "state": ObsSpec((RGB_STATE_DIM,)),
                "task_index": ObsSpec((1,), "int16"),
            },
        }
    else:
        obs = {"obs_shape": (SlotConfig(suite, obs_mode, size, 0, {}).state_dim,)}
    return EnvSpec(
        action_type="continuous",
        action_dim=_ACTION_DIM,
        task_descriptions=tuple(task.instruction for task in suite_tasks(suite)),
        action_low=(-1.0,) * _ACTION_DIM,
        action_high=(1.0,) * _ACTION_DIM,
        **obs,
    )


def _assign(dst: NpObs, src: NpObs, rows: np.ndarray) -> None:
    """``dst[rows] = src[rows]`` for an array or a dict of arrays."""
    if isinstance(dst, dict):
        assert isinstance(src, Mapping)
        for k in dst:
            dst[k][rows] = src[k][rows]
    else:
        dst[rows] = np.asarray(src)[rows]


def _copy(obs: NpObs) -> NpObs:
    return {k: v.copy() for k, v in obs.items()} if isinstance(obs, dict) else obs.copy()


class LiberoVecEnv:
    """``num_envs`` LIBERO environments of one task suite, stepped with action chunks.

    **Resets.** Every task of a suite comes with 50 fixed initial states (``init_states.npz`` of the package:
    MuJoCo time, joint positions and velocities). A reset puts an env in one (task, initial state) *pair* of the
    env set's pool: the tasks of ``task_ids`` (default: all) crossed with the initial states
    ``init_state_range`` (default: all 50), e.g. a ``[0, 40)`` / ``[40, 50)`` split between training and
    evaluation. The pair follows from the env's seed (``seed + i // group_size``, shared by a GRPO group):
    ``"random"`` draws it from a generator seeded with it, ``"sequential"`` takes pair ``seed mod len(pool)`` of
    the pool ordered initial-state-major (consecutive groups cycle through the tasks first, so an evaluation
    with fewer envs than pairs still sees every task, and one with ``len(pool)`` groups sees each pair once).
    After an automatic reset, ``"random"`` draws the next pair from the same generator (group members keep
    sharing), ``"sequential"`` repeats the pair.

    The reset loads the pair's state into the task's simulation (a slot that held another task rebuilds its
    scene first: about 1-5 s), places the fixtures with a seed of the pair (LIBERO jitters them at reset;
    the state files do not record them), then runs ``settle_steps`` zero actions (RLinf and OpenVLA wait 10
    steps for the objects to come to rest; they are not part of the episode). With ``settle_steps=0`` the
    simulation state after a reset is the file's entry exactly.

    **Observations.** ``obs_mode="state"``: one float32 vector per env, robosuite's proprioception (39: joint
    positions and their cos/sin, joint velocities, end-effector pose, gripper joints), the objects' poses in the
    world and relative to the end effector (14 per object, zero-padded to the suite's most crowded task) and
    a one-hot task id over the suite's tasks (the tasks of ``libero_spatial`` share one scene: only the id tells
    which bowl to move). ``obs_mode="rgb"``: ``{"rgb": agentview camera, "wrist_rgb": eye-in-hand camera,
    [height, width, 3] uint8 (``image_size``, default 128x128), upright (LIBERO renders upside down; rotated by 180
    degrees as RLinf does), "state": [eef position 3, eef axis-angle 3, gripper joints 2] float32, "task_index":
    [1] int16 the task id}``; the instruction is ``spec.task_descriptions[task_index]`` (also
    :meth:`task_descriptions`). :meth:`render` gives the third-person view in any mode (videos).

    **Actions** are LIBERO's 7-D OSC_POSE commands, end-effector position and orientation deltas plus the
    gripper (-1 open, +1 close), in ``[-1, 1]`` (clipped); a chunk runs open-loop. **Reward**: 1.0 at each
    step in which the task's goal holds (LIBERO's sparse reward), else 0. An episode terminates at its first
    success unless ``ignore_terminations``; it is truncated after ``max_episode_steps`` (default: the suite's,
    see :data:`~rlinf_envs.libero.MAX_EPISODE_STEPS`). ``EpisodeStats`` reports per episode whether the goal held
    at any step (``successes``) and at the last one (``successes_at_end``), and the task's name (``tasks``).

    **Execution.** ``vector_mode="sync"`` steps the envs in this process, ``"async"`` in one spawned process
    each (same results bit for bit). ``obs_mode="rgb"`` renders offscreen through robosuite's EGL context
    (``MUJOCO_GL=egl``; set here, before robosuite is imported, when unset; ``MUJOCO_GL=osmesa`` works with
    ``libosmesa6``). Each env holds its scene: about 0.5 GB of memory for ``state``, 1 GB for ``rgb``.

    Args:
        suite: one of :data:`~rlinf_envs.libero.SUITES` (``libero_spatial``, ..., ``libero_130``, LIBERO-PRO's).
        num_envs: number of environments (a multiple of ``group_size``).
        group_size: consecutive envs sharing their pair on ``reset``.
        auto_reset: reset an env as soon as its episode ends (otherwise it reports ``done`` with zero reward
            until the next ``reset``).
        max_episode_steps: time limit (``None``: the task's suite's default).
        obs_mode: ``"state"`` or ``"rgb"``.
        image_size: ``(height, width)`` of both cameras (and of :meth:`render`); an int for a square; ``None``:
            128x128.
        task_ids: tasks of the pool, by index in the suite (``None``: all).
        init_state_range: ``(start, stop)`` of each task's initial states in the pool (``None``: all).
        init_state_sampling: ``"random"`` or ``"sequential"`` (see above).
        settle_steps: zero-action steps after each reset.
        ignore_terminations: episodes end only at the time limit (success no longer terminates them).
        vector_mode: ``"sync"`` or ``"async"``.
        step_timeout_s: async mode: a worker that does not answer within this many seconds is an error.
        env_kwargs: extra keyword arguments for LIBERO's ``ControlEnv`` (e.g. ``control_freq``); the arguments
            listed in ``RESERVED_ENV_KWARGS`` are set by the backend.
    """

    def __init__(
        self,
        suite: str,
        num_envs: int,
        *,
        group_size: int = 1,
        auto_reset: bool = True,
        max_episode_steps: int | None = None,
        obs_mode: str = "state",
        image_size: int | Sequence[int] | None = None,
        task_ids: Sequence[int] | None = None,
        init_state_range: tuple[int, int] | None = None,
        init_state_sampling: str = "random",
        settle_steps: int = 10,
        ignore_terminations: bool = False,
        vector_mode: str = "sync",
        step_timeout_s: float = 300.0,
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
        for name, value, allowed in (
            ("obs_mode", obs_mode, OBS_MODES),
            ("init_state_sampling", init_state_sampling, INIT_STATE_SAMPLING),
            ("vector_mode", vector_mode, VECTOR_MODES),
        ):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        size = _image_size(image_size)
        if settle_steps < 0:
            raise ValueError(f"settle_steps must be >= 0, got {settle_steps}")
        reserved = sorted(RESERVED_ENV_KWARGS & set(env_kwargs or {}))
        if reserved:
            raise ValueError(f"env_kwargs may not set {reserved}: the LIBERO backend sets them")
        problems = pool_problems(suite, task_ids, init_state_range)
        if problems:
            raise ValueError("; ".join(problems))

        # robosuite reads MUJOCO_GL when first imported (here or in the spawned workers, which inherit it).
        os.environ.update(libero_gl_env(os.environ))

        self.suite = suite
        self.num_envs = num_envs
        self.group_size = group_size
        self.auto_reset = auto_reset
        self.ignore_terminations = ignore_terminations
        self.obs_mode = obs_mode
        self.init_state_sampling = init_state_sampling
        self._tasks = suite_tasks(suite)
        ids = list(range(len(self._tasks))) if task_ids is None else [int(t) for t in task_ids]
        start, stop = (
            init_state_range if init_state_range is not None else (0, _num_init_states(self._tasks, ids))
        )
        # Initial-state-major: pool[j] = (task ids[j % T], start + j // T).
        self._pool = np.array([(t, k) for k in range(start, stop) for t in ids], dtype=np.int64)
        self._max_steps = np.array(
            [max_episode_steps or t.max_episode_steps for t in self._tasks], dtype=np.int64
        )
        self.spec = libero_spec(suite, obs_mode, size)
        cfg = SlotConfig(suite, obs_mode, size, settle_steps, dict(env_kwargs or {}))
        fns = [partial(LiberoSlot, i, cfg) for i in range(num_envs)]
        self._sim = SubEnvs(fns, vector_mode, step_timeout_s)
        self._obs: NpObs = _zeros(self.spec, num_envs)
        self._pairs = np.zeros((num_envs, 2), dtype=np.int64)
        self._limit = np.zeros(num_envs, dtype=np.int64)
        self._ret = np.zeros(num_envs, dtype=np.float64)
        self._len = np.zeros(num_envs, dtype=np.int64)
        self._success = np.zeros(num_envs, dtype=bool)
        self._finished = np.zeros(num_envs, dtype=bool)
        self._seed_rngs: list[np.random.Generator] = []
        self._was_reset = False
        self._closed = False

    # ------------------------------------------------------------------------------------------- resets
    @property
    def num_pairs(self) -> int:
        """(task, initial state) pairs in the pool."""
        return len(self._pool)

    def _reset_sims(self, mask: np.ndarray, pairs: np.ndarray) -> NpObs:
        self._pairs[mask] = pairs[mask]
        self._limit[mask] = self._max_steps[pairs[mask, 0]]
        options = {"reset_mask": mask, "pairs": [tuple(int(x) for x in p) for p in pairs]}
        obs = self._sim.reset(None, options)
        return {k: np.asarray(obs[k]) for k in _RGB_KEYS} if self.obs_mode == "rgb" else np.asarray(obs)

    def reset(self, *, seed: int | None = None) -> NpObs:
        """Reset every env to the pair of its seed ``seed + i // group_size`` (shared within a group).

        Returns:
            ``[N, state_dim]`` float32, or for ``rgb`` a dict of ``[N, ...]`` arrays.
        """
        self._check_open()
        seeds = env_seeds(seed, self.num_envs, self.group_size)
        self._seed_rngs = [np.random.default_rng(s) for s in seeds]
        if self.init_state_sampling == "sequential":
            pairs = self._pool[[s % len(self._pool) for s in seeds]]
        else:
            pairs = self._pool[[int(rng.integers(len(self._pool))) for rng in self._seed_rngs]]
        self._obs = self._reset_sims(np.ones(self.num_envs, dtype=bool), pairs)
        self._ret[:] = 0.0
        self._len[:] = 0
        self._success[:] = False
        self._finished[:] = False
        self._was_reset = True
        return _copy(self._obs)

    def _next_pairs(self, mask: np.ndarray) -> np.ndarray:
        pairs = self._pairs.copy()
        if self.init_state_sampling == "random":
            for i in np.flatnonzero(mask):
                pairs[i] = self._pool[int(self._seed_rngs[i].integers(len(self._pool)))]
        return pairs

    # ------------------------------------------------------------------------------------------- steps
    def _check_actions(self, actions: np.ndarray) -> np.ndarray:
        actions = np.asarray(actions, dtype=np.float32)
        n, d = self.num_envs, _ACTION_DIM
        if actions.ndim != 3 or actions.shape[0] != n or actions.shape[2] != d or actions.shape[1] < 1:
            raise ValueError(
                f"actions must be [num_envs={n}, chunk, action_dim={d}], got shape {actions.shape}"
            )
        if not np.isfinite(actions).all():
            raise ValueError("actions contain NaN or inf")
        clipped: np.ndarray = np.clip(actions, -1.0, 1.0)
        return clipped

    def chunk_step(self, actions: np.ndarray) -> ChunkStepResult:
        """Execute a chunk of actions ``[N, C, 7]`` (clipped to ``[-1, 1]``).

        All envs advance together one step at a time; an env whose episode ends mid-chunk is reset at once
        (``auto_reset``) and continues the chunk in its new episode; without auto-reset it is no longer
        simulated and reports ``terminated`` with zero reward until :meth:`reset`. ``episodes`` lists the
        episodes that ended, by step of the chunk and, within a step, by env index.
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
            live = ~self._finished
            terms[~live, k] = True  # without auto-reset a finished env stays done with zero reward
            if not live.any():
                continue
            step_actions = actions[:, k].astype(np.float64)
            step_actions[~live] = np.nan  # the slot skips the simulation of an ended episode
            raw_obs, _, _, _, info = self._sim.step(step_actions)
            obs = {key: np.asarray(raw_obs[key]) for key in _RGB_KEYS} if self.obs_mode == "rgb" else raw_obs
            success = np.asarray(info.get("success", np.zeros(n, dtype=bool)), dtype=bool) & live
            self._len[live] += 1
            rewards[live, k] = success[live]
            self._ret[live] += success[live]
            self._success |= success
            term = success & (not self.ignore_terminations)
            trunc = live & (self._len >= self._limit) & ~term
            terms[live, k] = term[live]
            truncs[:, k] = trunc
            _assign(self._obs, obs, live)
            ended = term | trunc
            if not ended.any():
                continue
            for i in np.flatnonzero(ended):
                stats.returns.append(float(self._ret[i]))
                stats.lengths.append(int(self._len[i]))
                stats.successes.append(bool(self._success[i]))
                stats.successes_at_end.append(bool(success[i]))
                stats.tasks.append(self._tasks[int(self._pairs[i, 0])].name)
            _assign(final_obs, obs, ended)
            self._ret[ended], self._len[ended], self._success[ended] = 0.0, 0, False
            if self.auto_reset:
                _assign(self._obs, self._reset_sims(ended, self._next_pairs(ended)), ended)
            else:
                self._finished |= ended
        last_done = terms[:, -1] | truncs[:, -1]
        _assign(final_obs, self._obs, ~last_done)
        return ChunkStepResult(_copy(self._obs), rewards, terms, truncs, final_obs, stats)

    # ----------------------------------------------------------------------------------- introspection
    @property
    def tasks(self) -> tuple[LiberoTask, ...]:
        """The suite's tasks (files, instruction, default time limit), indexed by task id."""
        return self._tasks

    def render(self) -> np.ndarray:
        """``[N, H, W, 3]`` uint8: each env's third-person camera now, upright (evaluation videos, any obs mode)."""
        self._check_open()
        return np.stack(self._sim.call("rlinf_render"))

    def reset_pairs(self) -> np.ndarray:
        """``[N, 2]`` int64: each env's current (task id, initial-state id)."""
        return self._pairs.copy()

    def task_descriptions(self) -> list[str]:
        """The language instruction of each env's current task (what a VLA policy is given)."""
        return [self._tasks[int(t)].instruction for t in self._pairs[:, 0]]

    def initial_state(self, env_index: int) -> np.ndarray:
        """The initial-state file entry env ``env_index`` was last reset to (``[1 + nq + nv]``, read-only)."""
        task_id, init_id = self._pairs[env_index]
        return np.asarray(init_states(self._tasks[int(task_id)])[int(init_id)])

    def sim_states(self) -> list[np.ndarray]:
        """Each env's MuJoCo ``[time, qpos, qvel]`` now (the layout of the initial-state files)."""
        self._check_open()
        return [np.asarray(s) for s in self._sim.get_attr("flat_sim_state")]

    def task_envs(self) -> list[Any]:
        """Each env's LIBERO ``ControlEnv`` (its ``.env`` is the robosuite task), for tests and scripted experts.

        Read or change them between :meth:`chunk_step` calls only.

        Raises:
            RuntimeError: with ``vector_mode="async"`` (the envs live in other processes).
        """
        self._check_open()
        return [cast(LiberoSlot, slot).task_env for slot in self._sim.local_envs("use vector_mode='sync'")]

    # ---------------------------------------------------------------------------------------- state
    def get_state(self) -> dict[str, Any]:
        """Every env's simulation (see ``LiberoSlot.rlinf_state``), pairs, episode bookkeeping and RNGs.

        :meth:`set_state` of a ``LiberoVecEnv`` built with the same arguments (rebuilding a slot's scene where it
        holds another task) continues the in-progress episodes bit for bit.
        """
        self._check_open()
        return {
            "suite": self.suite,
            "num_envs": self.num_envs,
            "obs_mode": self.obs_mode,
            "sim": self._sim.get_attr("rlinf_state"),
            "obs": _copy(self._obs),
            "pairs": self._pairs.copy(),
            "limit": self._limit.copy(),
            "ret": self._ret.copy(),
            "len": self._len.copy(),
            "success": self._success.copy(),
            "finished": self._finished.copy(),
            "seed_rngs": copy.deepcopy(self._seed_rngs),
            "was_reset": self._was_reset,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`get_state`; raises ``ValueError`` if it is the state of another suite, size or obs mode."""
        self._check_open()
        mine = (self.suite, self.num_envs, self.obs_mode)
        theirs = (state.get("suite"), state.get("num_envs"), state.get("obs_mode"))
        if theirs != mine:
            raise ValueError(
                f"env state of (suite, num_envs, obs_mode)={theirs} cannot be loaded into a LiberoVecEnv of {mine}"
            )
        self._sim.set_attr("rlinf_state", state["sim"])
        self._obs = _copy(state["obs"])
        self._pairs[:] = state["pairs"]
        self._limit[:] = state["limit"]
        self._ret[:] = state["ret"]
        self._len[:] = state["len"]
        self._success[:] = state["success"]
        self._finished[:] = state["finished"]
        self._seed_rngs = copy.deepcopy(state["seed_rngs"])
        self._was_reset = bool(state["was_reset"])

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this LiberoVecEnv is closed")

    def close(self) -> None:
        """Close the simulations (and the worker processes in async mode); idempotent."""
        if not self._closed:
            self._closed = True
            self._sim.close()


def _zeros(spec: EnvSpec, n: int) -> NpObs:
    if spec.obs_dict is not None:
        return {k: np.zeros((n, *s.shape), dtype=s.dtype) for k, s in spec.obs_dict.items()}
    return np.zeros((n, *spec.obs_shape), dtype=np.float32)


def _num_init_states(tasks: Sequence[LiberoTask], ids: Sequence[int]) -> int:
    return min(len(init_states(tasks[i])) for i in ids)


def pool_problems(
    suite: str, task_ids: Sequence[int] | None, init_state_range: Sequence[int] | None, where: str = ""
) -> list[str]:
    """What is wrong with a suite name, task ids and initial-state range (``where`` prefixes the key names).

    Returns:
        One line per problem, naming the key and the allowed values.
    """
    if suite not in SUITES:
        close = difflib.get_close_matches(suite, SUITES, n=3)
        hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
        return [f"{where}env_id: {suite!r} is not a LIBERO suite{hint}; allowed: {', '.join(SUITES)}"]
    tasks = suite_tasks(suite)
    problems: list[str] = []
    ids = list(range(len(tasks))) if task_ids is None else list(task_ids)
    bad = [i for i in ids if not 0 <= i < len(tasks)]
    if bad:
        problems.append(
            f"{where}task_ids: {bad} out of range for {suite}, which has {len(tasks)} tasks; "
            f"allowed: 0..{len(tasks) - 1}"
        )
        ids = [i for i in ids if 0 <= i < len(tasks)]
    if not ids:
        problems.append(f"{where}task_ids: no task selected")
    elif init_state_range is not None:
        available = _num_init_states(tasks, ids)
        start, stop = init_state_range
        if not 0 <= start < stop <= available:
            problems.append(
                f"{where}init_state_range: [{start}, {stop}) is not within the {available} initial states of each "
                f"selected {suite} task; allowed: 0 <= start < stop <= {available}"
            )
    return problems
