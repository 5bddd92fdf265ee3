"""ManiSkill3 tasks as an RLinf :class:`~rlinf_envs.VecEnv` (state or camera observations, continuous actions)."""

from __future__ import annotations

import copy
import difflib
import inspect
from collections.abc import Mapping
from functools import partial
from typing import Any, cast

import numpy as np

try:
    import gymnasium as gym
    import mani_skill.envs  # noqa: F401  (registers the ManiSkill tasks with gymnasium)
    import torch
    from mani_skill.agents.registration import REGISTERED_AGENTS
    from mani_skill.envs.utils.randomization.batched_rng import BatchedRNG
    from mani_skill.utils import assets as ms_assets
    from mani_skill.utils.registration import REGISTERED_ENVS
except ImportError as e:  # pragma: no cover - exercised by the extra-missing test
    raise ImportError(f'the ManiSkill backend needs: pip install "rlinf-envs[maniskill]" ({e})') from e

from rlinf_core.protocols import ChunkStepResult, EnvSpec, EpisodeStats, ObsSpec, obs_zeros

from .._seeds import env_seeds
from .._vector import VECTOR_MODES, SubEnvs
from ._obs import _as_obs, _batch_obs, _box, _camera_obs, _copy_obs, _set_rows, _to_numpy
from ._vulkan import ensure_vulkan

__all__ = [
    "CPU_SIM_BACKENDS",
    "GPU_SIM_BACKENDS",
    "OBS_MODES",
    "REWARD_MODES",
    "VECTOR_MODES",
    "ManiSkillVecEnv",
    "supported_control_modes",
]

#: ``sim_backend`` values that run one CPU (PhysX) simulation per environment.
CPU_SIM_BACKENDS = ("physx_cpu", "cpu")
#: ``sim_backend`` values that run all environments in one GPU-batched PhysX scene (``"physx_cuda:1"`` too).
GPU_SIM_BACKENDS = ("physx_cuda", "gpu", "cuda")
REWARD_MODES = ("normalized_dense", "dense", "sparse")
OBS_MODES = ("state", "rgb", "depth", "rgbd", "rgb+state", "depth+state", "rgbd+state")
"""``state``: ManiSkill's flat privileged state vector. The camera modes give a dict observation: ``rgb``
``[H, W, 3]`` uint8 and/or ``depth`` ``[H, W, 1]`` int16 (millimetres) of the task's first camera (other cameras
as ``<camera>_rgb`` / ``<camera>_depth``), ``state`` (the robot's joint positions and velocities), ``extra``
(the task's non-privileged extras, e.g. the TCP pose; not in ``+state`` modes) and, with ``+state``,
``privileged_state`` (the flat vector of ``state`` mode: object poses, goal; for experts and critics, not for a
vision policy)."""


def _to_cpu(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _to_cpu(v) for k, v in tree.items()}
    return tree.detach().cpu().clone() if isinstance(tree, torch.Tensor) else copy.deepcopy(tree)


def _base_state(base: Any) -> dict[str, Any]:
    """A ManiSkill env's state: simulator (actors, articulations), controller, step counters and RNGs."""
    return {
        "sim": _to_cpu(base.get_state_dict()),
        "elapsed_steps": base._elapsed_steps.detach().cpu().clone(),
        "rng": _rng_state(base),
    }


def _set_base_state(base: Any, state: Mapping[str, Any]) -> None:
    sim = dict(state["sim"])
    controller = sim.pop("controller", None)
    base.set_state_dict(sim)  # actors and articulations only; the controller's targets separately
    if controller is not None:
        base.agent.set_controller_state(controller)
    base._elapsed_steps[:] = state["elapsed_steps"].to(base._elapsed_steps.device)
    _set_rng_state(base, state["rng"])


def _rng_state(base: Any) -> dict[str, Any]:
    """ManiSkill's seeds and generators; its ``BatchedRNG`` cannot be copied whole, its ``rngs`` list can."""
    return copy.deepcopy(
        {
            "main_seed": base._main_seed,
            "main_rng": base._main_rng,
            "episode_seed": base._episode_seed,
            "batched_main": None if base._batched_main_rng is None else list(base._batched_main_rng.rngs),
            "batched_episode": (
                None if base._batched_episode_rng is None else list(base._batched_episode_rng.rngs)
            ),
        }
    )


def _set_rng_state(base: Any, state: Mapping[str, Any]) -> None:
    state = copy.deepcopy(dict(state))
    base._main_seed, base._main_rng, base._episode_seed = (
        state["main_seed"],
        state["main_rng"],
        state["episode_seed"],
    )
    if state["batched_main"] is not None:
        base._batched_main_rng = BatchedRNG.from_rngs(state["batched_main"])
    if state["batched_episode"] is not None:
        base._batched_episode_rng = BatchedRNG.from_rngs(state["batched_episode"])
        base._episode_rng = base._batched_episode_rng[0]  # an alias, as ManiSkill sets it


class _SingleEnv(gym.Wrapper[Any, np.ndarray, Any, Any]):
    """One ManiSkill env (``num_envs=1``, CPU sim) as a plain gymnasium env: unbatched numpy in and out.

    Observations are a float32 vector (``state`` mode) or RLinf's flat dict of images and vectors (camera
    modes, see :data:`OBS_MODES`). ``info`` carries only ``success`` (bool), so the vector env's info aggregation
    stays cheap. With ``ignore_terminations`` the episode ends only at the time limit.
    """

    def __init__(self, env: gym.Env[Any, Any], ignore_terminations: bool = False) -> None:
        super().__init__(env)
        self._ignore_terminations = ignore_terminations
        base: Any = env.unwrapped  # ManiSkill's BaseEnv (untyped): batched spaces under single_*
        self._camera = base.obs_mode != "state"
        if self._camera:
            # The layout of the flat dict, from one observation (the spaces of nested dicts differ per task).
            sample = _camera_obs(base.get_obs(), base)
            self.observation_space: gym.spaces.Space[Any] = gym.spaces.Dict(
                {k: _box(v.shape[1:], v.dtype) for k, v in sample.items()}
            )
        else:
            self.observation_space = gym.spaces.Box(
                -np.inf, np.inf, tuple(base.single_observation_space.shape), np.float32
            )
        self.action_space = base.single_action_space

    def _obs(self, raw: Any) -> Any:
        obs = _batch_obs(raw, self.env.unwrapped)
        return {k: v[0] for k, v in obs.items()} if self._camera else obs[0]

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        obs, _ = self.env.reset(seed=seed, options=options)
        return self._obs(obs), {}

    def rlinf_render(self) -> np.ndarray:
        """``[H, W, 3]`` uint8 from the human render camera (called through the vector env's ``call``)."""
        base: Any = self.env.unwrapped  # ManiSkill's BaseEnv (untyped)
        frame: np.ndarray = _to_numpy(base.render_rgb_array())[0]
        return frame

    @property
    def rlinf_state(self) -> dict[str, Any]:
        """This env's full state (read and written through the vector env's ``get_attr``/``set_attr``)."""
        return _base_state(self.env.unwrapped)

    @rlinf_state.setter
    def rlinf_state(self, state: Mapping[str, Any]) -> None:
        _set_base_state(self.env.unwrapped, state)

    def step(self, action: np.ndarray) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, rew, term, trunc, info = self.env.step(np.asarray(action, dtype=np.float32)[None])
        out = {"success": bool(_to_numpy(info["success"]).reshape(-1)[0])} if "success" in info else {}
        return (
            self._obs(obs),
            float(_to_numpy(rew).reshape(-1)[0]),
            bool(_to_numpy(term).reshape(-1)[0]) and not self._ignore_terminations,
            bool(_to_numpy(trunc).reshape(-1)[0]),
            out,
        )


def _make_single(
    env_id: str, make_kwargs: Mapping[str, Any], ignore_terminations: bool, torch_threads: int
) -> _SingleEnv:
    """Build one CPU-sim env; module level so that spawned AsyncVectorEnv workers can unpickle it."""
    if torch_threads > 0:
        torch.set_num_threads(torch_threads)  # a worker process of ours: one thread per env process
    return _SingleEnv(gym.make(env_id, num_envs=1, **make_kwargs), ignore_terminations)


_StepOut = tuple[Any, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


class _CpuSim:
    """``num_envs`` single-env CPU simulations behind :class:`~rlinf_envs._vector.SubEnvs` (no auto-reset)."""

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        make_kwargs: Mapping[str, Any],
        ignore_terminations: bool,
        vector_mode: str,
        timeout_s: float,
    ) -> None:
        threads = 1 if vector_mode == "async" else 0
        fns = [partial(_make_single, env_id, dict(make_kwargs), ignore_terminations, threads)] * num_envs
        self._vec = SubEnvs(fns, vector_mode, timeout_s)
        # Both are boxes: _SingleEnv builds the observation box; continuous ManiSkill controllers act in a box.
        self.single_observation_space = self._vec.single_observation_space
        self.single_action_space = cast(gym.spaces.Box, self._vec.single_action_space)

    def reset(self, seeds: list[int | None], group_size: int) -> Any:
        # Same seed → same initial state: ManiSkill seeds its episode RNG (and torch) from the reset seed.
        return _as_obs(self._vec.reset(seeds))

    def reset_done(self, mask: np.ndarray, seeds: list[int | None]) -> Any:
        # Explicit seeds: without one ManiSkill draws the new episode from the process-global torch RNG, which
        # differs between sync (one shared RNG) and async (one per process, all starting equal) execution.
        return _as_obs(self._vec.reset(seeds, {"reset_mask": mask}))

    def step(self, actions: np.ndarray) -> _StepOut:
        obs, rew, term, trunc, info = self._vec.step(actions)
        success = np.asarray(info.get("success", np.zeros(len(rew), dtype=bool)), dtype=bool)
        return _as_obs(obs), rew, term, trunc, success

    def render(self) -> np.ndarray:
        return np.stack(self._vec.call("rlinf_render"))

    def task_envs(self) -> list[Any]:
        return [env.unwrapped for env in self._vec.local_envs("use vector_mode='sync'")]

    def get_state(self) -> list[dict[str, Any]]:
        return self._vec.get_attr("rlinf_state")

    def set_state(self, states: list[dict[str, Any]]) -> None:
        self._vec.set_attr("rlinf_state", states)

    def close(self) -> None:
        self._vec.close()


class _GpuSim:
    """All envs in one GPU-batched ManiSkill scene (``num_envs`` sub-scenes, partial resets by index).

    Written against ManiSkill's batched API (``gym.make(..., num_envs=N, sim_backend="physx_cuda")``,
    ``reset(options={"env_idx": ...})``, ``get_state``/``reset_to_env_states``); not run on the CPU-only
    development machine.
    """

    def __init__(
        self, env_id: str, num_envs: int, make_kwargs: Mapping[str, Any], ignore_terminations: bool
    ) -> None:
        self._ignore_terminations = ignore_terminations
        # ManiSkill's batched env (untyped): reset takes a list of seeds; get_state, device and single_* spaces.
        self._env = cast(Any, gym.make(env_id, num_envs=num_envs, **make_kwargs))
        self._base = self._env.unwrapped
        self._n = num_envs
        self._device = self._base.device
        self._camera = self._base.obs_mode != "state"
        self.single_observation_space: gym.spaces.Space[Any] = (
            gym.spaces.Dict(
                {
                    k: _box(v.shape[1:], v.dtype)
                    for k, v in _camera_obs(self._base.get_obs(), self._base).items()
                }
            )
            if self._camera
            else self._base.single_observation_space
        )
        self.single_action_space: gym.spaces.Box = self._base.single_action_space

    def reset(self, seeds: list[int | None], group_size: int) -> Any:
        obs, _ = self._env.reset(seed=[int(s or 0) for s in seeds])
        if group_size > 1:
            # The batched scene draws every sub-scene's initial state from one torch generator, so equal seeds do
            # not give equal states: copy each group leader's simulator state to its members instead.
            state = self._base.get_state()
            idx = torch.arange(self._n, device=self._device)
            leaders = idx // group_size * group_size
            obs, _ = self._env.reset(
                options={"env_idx": idx, "reset_to_env_states": {"env_states": state[leaders]}}
            )
        return _batch_obs(obs, self._base)

    def reset_done(self, mask: np.ndarray, seeds: list[int | None]) -> Any:
        # A partial reset with seeds would replace every sub-scene's episode seed; instead seed the torch RNG the
        # batched scene draws from with the first reset env's seed (reproducible, independent of other state).
        idx = torch.as_tensor(np.flatnonzero(mask), device=self._device)
        devices = [self._device] if self._device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(int(seeds[int(idx[0])] or 0))
            obs, _ = self._env.reset(options={"env_idx": idx})
        return _batch_obs(obs, self._base)

    def step(self, actions: np.ndarray) -> _StepOut:
        a = torch.as_tensor(actions, dtype=torch.float32, device=self._device)
        obs, rew, term, trunc, info = self._env.step(a)
        success = _to_numpy(info["success"]).astype(bool) if "success" in info else np.zeros(self._n, bool)
        term_np = _to_numpy(term).astype(bool).reshape(self._n) & (not self._ignore_terminations)
        trunc_np = _to_numpy(trunc).astype(bool).reshape(self._n)
        return _batch_obs(obs, self._base), _to_numpy(rew), term_np, trunc_np, success

    def render(self) -> np.ndarray:
        return _to_numpy(self._base.render_rgb_array())

    def task_envs(self) -> list[Any]:
        raise RuntimeError(
            "the GPU sim holds all envs in one batched scene; task_envs() needs sim_backend='physx_cpu'"
        )

    def get_state(self) -> list[dict[str, Any]]:
        return [_base_state(self._base)]

    def set_state(self, states: list[dict[str, Any]]) -> None:
        _set_base_state(self._base, states[0])

    def close(self) -> None:
        self._env.close()


def _check_sizes(num_envs: int, group_size: int, max_episode_steps: int | None) -> None:
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    if group_size < 1 or num_envs % group_size:
        raise ValueError(f"group_size must divide num_envs: got group_size={group_size}, num_envs={num_envs}")
    if max_episode_steps is not None and max_episode_steps < 1:
        raise ValueError(f"max_episode_steps must be >= 1 or None, got {max_episode_steps}")


def _check_env_id(env_id: str) -> None:
    if env_id not in REGISTERED_ENVS:
        close = difflib.get_close_matches(env_id, list(REGISTERED_ENVS), n=5)
        raise ValueError(f"env id {env_id!r} is not a registered ManiSkill task; similar: {close or 'none'}")
    # ManiSkill would otherwise prompt on stdin and exit() for tasks whose assets are not downloaded yet.
    missing = []
    for asset_id in REGISTERED_ENVS[env_id].asset_download_ids or []:
        ids = (
            ms_assets.expand_data_group_into_individual_data_source_ids(asset_id)
            if asset_id in ms_assets.DATA_GROUPS
            else [asset_id]
        )
        missing += [a for a in ids if not ms_assets.is_data_source_downloaded(a)]
    if missing:
        raise ValueError(
            f"ManiSkill task {env_id!r} needs assets that are not downloaded: {missing[:5]}"
            f"{' ...' if len(missing) > 5 else ''}; fetch them with `python -m mani_skill.utils.download_asset "
            f"{env_id}` where the asset hosts are reachable, or pick a procedural task such as PushCube-v1 or PickCube-v1"
        )


def supported_control_modes(env_id: str, robot_uids: str | None = None) -> tuple[str, ...] | None:
    """The control modes of a registered task's robot, read without building the env (no simulator, no Vulkan).

    Args:
        env_id: a registered ManiSkill task id.
        robot_uids: the robot (``env_kwargs["robot_uids"]``); ``None``: the task's default robot.

    Returns:
        The mode names, sorted; ``None`` when they cannot be read this way (an unknown task, a multi-robot task,
        or a robot whose controller table needs a built instance): the env's constructor checks them then.
    """
    spec = REGISTERED_ENVS.get(env_id)
    if spec is None:
        return None
    if robot_uids is None:
        param = inspect.signature(spec.cls.__init__).parameters.get("robot_uids")
        robot_uids = spec.default_kwargs.get("robot_uids", None if param is None else param.default)
    if not isinstance(robot_uids, str) or robot_uids not in REGISTERED_AGENTS:
        return None
    agent_cls = REGISTERED_AGENTS[robot_uids].agent_cls
    table = getattr(agent_cls, "_controller_configs", None)
    if not isinstance(table, property) or table.fget is None:
        return None
    try:
        # The table reads only class attributes (joint names, gains) for ManiSkill's single-arm robots.
        configs = table.fget(object.__new__(agent_cls))
    except Exception:  # a robot whose table needs a built instance: leave the check to the constructor
        return None
    return tuple(sorted(configs))


class ManiSkillVecEnv:
    """``num_envs`` ManiSkill3 environments stepped with action chunks, auto-reset and group-shared seeds.

    Two simulation paths behind one interface:

    * ``sim_backend="physx_cpu"`` (the only one this CPU-only machine runs): one single-env ManiSkill instance
      per environment (the CPU PhysX scene holds one env), vectorised by a gymnasium ``SyncVectorEnv``
      (in-process) or ``AsyncVectorEnv`` (one spawned process per env, ``vector_mode="async"``). Roughly
      500-850 env-steps/s for PushCube-v1 on one core of the 2-core development machine; sync beat async there
      (spawned workers start in 5-10 s each and add IPC per step); see ``bench/maniskill_cpu.py``.
    * ``sim_backend="physx_cuda"``/``"gpu"``: one GPU-batched ManiSkill scene with ``num_envs`` sub-scenes in
      this process, partial resets by index. Needs CUDA and the NVIDIA Vulkan driver; it is written against
      ManiSkill's documented batched API but has NOT been run here (no GPU on the development machine) and its
      test is skipped without CUDA. Group sharing (``group_size > 1``) copies the simulator state of each group's
      first env to the others after the reset (equal seeds do not give equal states in a batched scene).

    SAPIEN needs a Vulkan driver even for state observations; on a machine without a GPU that is Mesa lavapipe
    >= 24 (``scripts/install_vulkan_cpu.sh``, then ``export VK_ICD_FILENAMES=...``). Construction checks it in a
    subprocess first and raises :class:`~rlinf_envs.maniskill.VulkanUnavailableError` naming what to install.

    Observations are ManiSkill's flat ``"state"`` vector, ``[N, obs_dim]`` float32 (``obs_dim=35`` for
    PushCube-v1, ``42`` for PickCube-v1 with the default Panda), or in camera modes a dict of camera images and
    robot vectors (see :data:`OBS_MODES`). The CPU renderer (lavapipe) is the cost there: ~15 env-steps/s per
    core for one 128x128 camera, against ~400 in state mode. Actions are continuous ``[N, C, action_dim]``
    (``action_dim=8`` for the Panda's default ``pd_joint_delta_pos``), clipped to the action box. An episode's
    ``success`` in :class:`~rlinf_envs.EpisodeStats` is True if ManiSkill's ``info["success"]`` was True at any
    step of it (by default a success also terminates the episode).

    Args:
        env_id: a ManiSkill task id whose assets ship with the package, e.g. ``"PushCube-v1"``, ``"PickCube-v1"``.
        num_envs: number of environments (a multiple of ``group_size``).
        group_size: consecutive envs sharing initial states on ``reset``.
        auto_reset: reset an env as soon as its episode ends (otherwise it reports ``done`` with zero reward
            until the next ``reset``).
        max_episode_steps: time limit (``None`` keeps the task's registered one, 50 for PushCube/PickCube).
        sim_backend: one of ``CPU_SIM_BACKENDS`` or ``GPU_SIM_BACKENDS`` (``"physx_cuda:N"`` selects a device).
        obs_mode: one of :data:`OBS_MODES`: ``"state"`` (a float32 vector) or a camera mode (a dict observation).
        image_size: camera modes: ``(height, width)`` of every camera (``None``: the task's default, 128x128 for
            PushCube/PickCube).
        control_mode: the robot's controller, e.g. ``"pd_joint_delta_pos"`` or ``"pd_ee_delta_pose"``
            (``None`` = the task's default).
        reward_mode: ``"normalized_dense"`` (default, rewards in [0, 1]), ``"dense"`` or ``"sparse"``.
        ignore_terminations: episodes end only at the time limit (success no longer terminates them).
        vector_mode: CPU only: ``"sync"`` (in-process) or ``"async"`` (a spawned process per env).
        render_backend: SAPIEN render device; ``None`` = ``"gpu"`` if CUDA is available else ``"cpu"``.
        step_timeout_s: async mode: a worker that does not answer within this many seconds is an error.
        env_kwargs: extra keyword arguments for ``gymnasium.make`` (e.g. ``robot_uids``).
    """

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        *,
        group_size: int = 1,
        auto_reset: bool = True,
        max_episode_steps: int | None = None,
        sim_backend: str = "physx_cpu",
        obs_mode: str = "state",
        image_size: tuple[int, int] | None = None,
        control_mode: str | None = None,
        reward_mode: str = "normalized_dense",
        ignore_terminations: bool = False,
        vector_mode: str = "sync",
        render_backend: str | None = None,
        step_timeout_s: float = 120.0,
        env_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        _check_sizes(num_envs, group_size, max_episode_steps)
        for name, value, allowed in (
            ("obs_mode", obs_mode, OBS_MODES),
            ("reward_mode", reward_mode, REWARD_MODES),
            ("vector_mode", vector_mode, VECTOR_MODES),
        ):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        backend = sim_backend.split(":")[0]
        if backend not in CPU_SIM_BACKENDS + GPU_SIM_BACKENDS:
            raise ValueError(
                f"sim_backend must be one of {CPU_SIM_BACKENDS + GPU_SIM_BACKENDS}, got {sim_backend!r}"
            )
        gpu = backend in GPU_SIM_BACKENDS
        if gpu and not torch.cuda.is_available():
            raise RuntimeError(
                f"sim_backend={sim_backend!r} needs a CUDA device and none is available; "
                f"use sim_backend='physx_cpu' on this machine"
            )
        _check_env_id(env_id)
        if render_backend is None:
            render_backend = "gpu" if torch.cuda.is_available() else "cpu"
        ensure_vulkan("cuda" if render_backend in ("gpu", "cuda", "sapien_cuda") else "cpu")

        make_kwargs: dict[str, Any] = {
            "obs_mode": obs_mode.replace("rgbd+", "rgb+depth+"),  # ManiSkill spells the combination that way
            "reward_mode": reward_mode,
            "sim_backend": sim_backend,
            "render_backend": render_backend,
            **(env_kwargs or {}),
        }
        if image_size is not None and obs_mode != "state":
            make_kwargs["sensor_configs"] = {"height": int(image_size[0]), "width": int(image_size[1])}
        if control_mode is not None:
            make_kwargs["control_mode"] = control_mode
        if max_episode_steps is not None:
            make_kwargs["max_episode_steps"] = max_episode_steps

        self.env_id = env_id
        self.num_envs = num_envs
        self.group_size = group_size
        self.auto_reset = auto_reset
        self.ignore_terminations = ignore_terminations
        self.sim_backend = sim_backend
        try:
            self._sim: _CpuSim | _GpuSim = (
                _GpuSim(env_id, num_envs, make_kwargs, ignore_terminations)
                if gpu
                else _CpuSim(env_id, num_envs, make_kwargs, ignore_terminations, vector_mode, step_timeout_s)
            )
        except AssertionError as e:  # ManiSkill checks the control mode with an assert
            if "supported modes" in str(e):
                raise ValueError(f"control_mode {control_mode!r} is not supported: {e}") from e
            raise
        obs_space, act_space = self._sim.single_observation_space, self._sim.single_action_space
        entries: dict[str, ObsSpec] | None = None
        obs_shape: tuple[int, ...] = ()
        if isinstance(obs_space, gym.spaces.Dict):
            entries = {
                k: ObsSpec(tuple(int(d) for d in box.shape or ()), np.dtype(box.dtype).name)
                for k, box in obs_space.spaces.items()
            }
        else:
            obs_shape = tuple(int(d) for d in obs_space.shape or ())
        self.spec = EnvSpec(
            obs_shape,
            "continuous",
            int(act_space.shape[0]),
            action_low=tuple(float(x) for x in act_space.low),
            action_high=tuple(float(x) for x in act_space.high),
            obs_dict=entries,
        )
        self._low = np.asarray(self.spec.action_low, dtype=np.float32)
        self._high = np.asarray(self.spec.action_high, dtype=np.float32)
        self._obs: Any = obs_zeros(self.spec.observation, num_envs)
        self._ret = np.zeros(num_envs, dtype=np.float64)
        self._len = np.zeros(num_envs, dtype=np.int64)
        self._success = np.zeros(num_envs, dtype=bool)
        self._finished = np.zeros(num_envs, dtype=bool)
        self._seed_rngs: list[np.random.Generator] = []
        self._was_reset = False
        self._closed = False

    def reset(self, *, seed: int | None = None) -> Any:
        """Reset every env; env ``i`` uses seed ``seed + i // group_size`` (shared within a group).

        Returns:
            ``[N, obs_dim]`` float32 initial observations (a dict of ``[N, ...]`` arrays in camera modes).
        """
        self._check_open()
        seeds: list[int | None] = list(env_seeds(seed, self.num_envs, self.group_size))
        # Later episodes of env i are seeded from a generator seeded with its reset seed: reproducible runs,
        # and group members keep sharing their sequence of initial states (as in GymnasiumVecEnv).
        self._seed_rngs = [np.random.default_rng(s) for s in seeds]
        _set_rows(self._obs, slice(None), self._sim.reset(seeds, self.group_size))
        self._ret[:] = 0.0
        self._len[:] = 0
        self._success[:] = False
        self._finished[:] = False
        self._was_reset = True
        return _copy_obs(self._obs)

    def _check_actions(self, actions: np.ndarray) -> np.ndarray:
        actions = np.asarray(actions, dtype=np.float32)
        n, d = self.num_envs, self.spec.action_dim
        if actions.ndim != 3 or actions.shape[0] != n or actions.shape[2] != d or actions.shape[1] < 1:
            raise ValueError(
                f"actions must be [num_envs={n}, chunk, action_dim={d}], got shape {actions.shape}"
            )
        if not np.isfinite(actions).all():
            raise ValueError("actions contain NaN or inf")
        clipped: np.ndarray = np.clip(actions, self._low, self._high)
        return clipped

    def chunk_step(self, actions: np.ndarray) -> ChunkStepResult:
        """Execute a chunk of actions ``[N, C, action_dim]`` (clipped to the action box).

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
        final_obs = _copy_obs(self._obs)
        stats = EpisodeStats()
        for k in range(c):
            obs, rew, term, trunc, success = self._sim.step(actions[:, k])
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
            # A finished env is reset in the simulator too (the vector env refuses to step an ended episode);
            # without auto-reset its new episode is simply not reported.
            need_reset = ended | (self._finished & (term | trunc))
            if ended.any():
                for i in np.flatnonzero(ended):
                    stats.returns.append(float(self._ret[i]))
                    stats.lengths.append(int(self._len[i]))
                    stats.successes.append(bool(self._success[i]))
                    stats.successes_at_end.append(bool(success[i]))
                _set_rows(final_obs, ended, obs)
                self._ret[ended], self._len[ended], self._success[ended] = 0.0, 0, False
            if need_reset.any():
                reset_seeds: list[int | None] = [
                    int(self._seed_rngs[i].integers(2**31 - 1)) if need_reset[i] else None for i in range(n)
                ]
                new_obs = self._sim.reset_done(need_reset, reset_seeds)
                if self.auto_reset:
                    _set_rows(self._obs, ended, new_obs)
                else:
                    self._finished |= ended
        last_done = terms[:, -1] | truncs[:, -1]
        _set_rows(final_obs, ~last_done, self._obs)
        return ChunkStepResult(_copy_obs(self._obs), rewards, terms, truncs, final_obs, stats)

    def render(self) -> np.ndarray:
        """``[N, H, W, 3]`` uint8: each env's scene from ManiSkill's human render camera (512x512 by default).

        For videos of any observation mode; the first call compiles the renderer's shaders (~10 s on the CPU).
        """
        self._check_open()
        return self._sim.render()

    def task_envs(self) -> list[Any]:
        """The ManiSkill task env of each env (its ``unwrapped`` ``BaseEnv``: cube, goal, robot), for scripted experts.

        Read them between :meth:`chunk_step` calls; stepping or resetting them directly desynchronises this
        wrapper's bookkeeping.

        Raises:
            RuntimeError: on the GPU sim (one batched scene) or with ``vector_mode="async"`` (other processes).
        """
        self._check_open()
        return self._sim.task_envs()

    def get_state(self) -> dict[str, Any]:
        """Simulator, controller, step counters and RNGs of every env plus the episode bookkeeping, picklable.

        :meth:`set_state` of a ``ManiSkillVecEnv`` built with the same arguments continues the in-progress
        episodes. On the CPU sim (tested) the episode in progress matches to float32 rounding (~1e-7: SAPIEN
        recomputes the robot's link poses from the restored joint positions) and every later episode bit for
        bit; the GPU-batched path uses the same ManiSkill state API but was not run here.
        """
        self._check_open()
        return {
            "env_id": self.env_id,
            "num_envs": self.num_envs,
            "sim_backend": self.sim_backend,
            "sim": self._sim.get_state(),
            "obs": _copy_obs(self._obs),
            "ret": self._ret.copy(),
            "len": self._len.copy(),
            "success": self._success.copy(),
            "finished": self._finished.copy(),
            "seed_rngs": copy.deepcopy(self._seed_rngs),
            "was_reset": self._was_reset,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`get_state`; raises ``ValueError`` if it is the state of another task, size or backend."""
        self._check_open()
        mine = (self.env_id, self.num_envs, self.sim_backend)
        theirs = (state.get("env_id"), state.get("num_envs"), state.get("sim_backend"))
        if theirs != mine:
            raise ValueError(
                f"env state of (env_id, num_envs, sim_backend)={theirs} cannot be loaded into a ManiSkillVecEnv "
                f"of {mine}"
            )
        self._sim.set_state(state["sim"])
        _set_rows(self._obs, slice(None), state["obs"])
        self._ret[:] = state["ret"]
        self._len[:] = state["len"]
        self._success[:] = state["success"]
        self._finished[:] = state["finished"]
        self._seed_rngs = copy.deepcopy(state["seed_rngs"])
        self._was_reset = bool(state["was_reset"])

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this ManiSkillVecEnv is closed")

    def close(self) -> None:
        """Close the simulators (and the worker processes in async mode); idempotent."""
        if not self._closed:
            self._closed = True
            self._sim.close()
