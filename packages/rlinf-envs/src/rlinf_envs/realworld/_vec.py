"""Robot arms reached over TCP (real ones through their bridge, or dummy servers) as an RLinf :class:`~rlinf_envs.VecEnv`."""

from __future__ import annotations

import copy
import math
import shutil
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
from rlinf_core.protocols import ChunkStepResult, EnvSpec, EpisodeStats, NpObs, ObsSpec

from .._seeds import env_seeds
from ._client import RobotClient
from ._geometry import euler_to_quat, quat_mul, rotation_angle
from ._launch import DummyServer, start_dummy_servers
from ._protocol import STATE_DIM, RobotState
from ._settings import RealWorldSettings, RobotUnit, check_main_camera, robot_units

__all__ = [
    "ACTION_DIM",
    "DEFAULT_IMAGE_SIZE",
    "DEFAULT_MAX_EPISODE_STEPS",
    "ENV_IDS",
    "OBS_MODES",
    "RealWorldVecEnv",
    "realworld_spec",
]

ENV_IDS = ("FrankaPegInsertion-v1",)
"""The tasks the backend knows: a Franka inserting a grasped peg into a hole at ``target_pose``."""
OBS_MODES = ("state", "rgb")
DEFAULT_IMAGE_SIZE = (64, 64)
DEFAULT_MAX_EPISODE_STEPS = 100
ACTION_DIM = 6
"""End-effector deltas: x, y, z (scaled by ``action_scale[0]`` m), roll, pitch, yaw (``action_scale[1]`` rad)."""
_GRIPPER_CLOSED = 0.0  # the peg stays grasped: actions have no gripper dimension


def _check_env_id(env_id: str) -> None:
    if env_id not in ENV_IDS:
        raise ValueError(f"realworld env_id {env_id!r} is not known; allowed: {', '.join(ENV_IDS)}")


def _image_size(image_size: Sequence[int] | None) -> tuple[int, int]:
    if image_size is None:
        return DEFAULT_IMAGE_SIZE
    size = tuple(int(x) for x in image_size)
    if len(size) != 2 or min(size) < 1:
        raise ValueError(f"image_size must be [height, width] with positive sizes, got {list(image_size)}")
    return size[0], size[1]


def realworld_spec(
    env_id: str = "FrankaPegInsertion-v1", obs_mode: str = "state", image_size: Sequence[int] | None = None
) -> EnvSpec:
    """The :class:`EnvSpec` of a real-world env, computed without contacting any robot.

    ``state``: ``[19]`` float32 (TCP pose, velocity, force, torque); ``rgb``: ``{"rgb": [H, W, 3] uint8,
    "state": [19] float32}`` (the same keys and dtypes as Meta-World's ``rgb`` mode). Actions: 6 in [-1, 1].
    """
    _check_env_id(env_id)
    if obs_mode not in OBS_MODES:
        raise ValueError(f"obs_mode must be one of {', '.join(OBS_MODES)}, got {obs_mode!r}")
    low, high = (-1.0,) * ACTION_DIM, (1.0,) * ACTION_DIM
    if obs_mode == "state":
        return EnvSpec((STATE_DIM,), "continuous", ACTION_DIM, action_low=low, action_high=high)
    h, w = _image_size(image_size)
    obs = {"rgb": ObsSpec((h, w, 3), "uint8"), "state": ObsSpec((STATE_DIM,), "float32")}
    return EnvSpec((), "continuous", ACTION_DIM, action_low=low, action_high=high, obs_dict=obs)


def _resize_nearest(img: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """``img`` ``[h, w, 3]`` resampled to ``size`` by nearest neighbour (cameras rarely match the policy's size)."""
    h, w = img.shape[:2]
    if (h, w) == size:
        return img
    rows = (np.arange(size[0]) * h // size[0]).astype(np.intp)
    cols = (np.arange(size[1]) * w // size[1]).astype(np.intp)
    out: np.ndarray = img[rows][:, cols]
    return out


def _release(clients: list[RobotClient], dummies: list[DummyServer], workdir: list[Path]) -> None:
    """Close the connections and stop the dummy servers (``close()``, or the garbage collector's finaliser)."""
    for client in clients:
        client.close()
    for server in dummies:
        server.stop()
    for path in workdir:
        shutil.rmtree(path, ignore_errors=True)
    clients.clear()
    dummies.clear()
    workdir.clear()


class RealWorldVecEnv:
    """``num_envs`` robot arms, one per env, each behind a robot server reached over TCP.

    **Robots.** Entry ``i`` of ``hardware`` (the cluster config's node group ``hardware.configs`` entries, e.g.
    ``{"node_rank": 0, "robot_ip": "10.0.0.2", "robot_port": 5555, "camera_serials": ["..."]}``) is env ``i``'s
    robot. With ``env_kwargs.is_dummy`` every env without a ``robot_ip`` gets a dummy Franka server, started
    here as a child process on 127.0.0.1 and driven over its socket exactly like a real robot's
    (:mod:`rlinf_envs.realworld._server`); :meth:`close` stops them. The envs talk to their robots one after
    another within a step.

    **Actions.** ``[N, C, 6]`` end-effector deltas in [-1, 1] (clipped): xyz times ``action_scale[0]`` metres,
    roll/pitch/yaw times ``action_scale[1]`` radians, applied to the measured TCP pose in the base frame. The
    target is clipped into the :class:`SafetyLimits` workspace box, then the client refuses anything still
    unsafe (:class:`SafetyViolation`, raised out of :meth:`chunk_step`: nothing reached the robot). The peg
    stays grasped (gripper closed). ``step_frequency`` > 0 holds the steps to that rate.

    **Observations.** ``obs_mode="state"``: ``[N, 19]`` float32 (TCP pose xyz + quaternion xyzw, velocity 6,
    force 3, torque 3). ``"rgb"``: ``{"rgb": [N, H, W, 3] uint8, "state": [N, 19] float32}``, the image of
    ``env_kwargs.main_camera`` resized to ``image_size``.

    **Rewards and episodes.** ``reward.type`` ``dense``: ``exp(-d / dense_scale_m)`` with ``d`` the distance of
    the TCP to ``target_pose``; ``sparse``: 1 at a success (within ``success_threshold_m`` and
    ``success_threshold_rad`` of the target). A success terminates the episode unless ``ignore_terminations``;
    episodes are cut at ``max_episode_steps`` (default 100). :class:`EpisodeStats` and auto-reset behave as in
    the simulator backends: ``successes`` (at any step), ``successes_at_end``, ``final_obs`` before an auto-reset;
    without auto-reset a finished env reports ``done`` with zero reward and its robot is not moved. A reset moves
    every robot of a group to ``reset_pose`` plus the same x/y offset (``reset_noise_m``) drawn from the group's
    generator (seeded with ``seed + i // group_size``); an auto-reset draws the next offset from it.

    **State.** A physical robot cannot be put back where it was: :meth:`get_state` holds the episode
    bookkeeping (step counters, returns, successes) and each env's generator, and :meth:`set_state` restores
    those and then *resets every robot* to ``reset_pose`` (without offset). The restored episodes continue with
    their step counts and returns but from the reset pose, not from the saved robot poses, so unlike a
    simulator's the results after a restore are not those the saved run would have produced. Two envs restored
    from the same state do behave alike (the dummy's sensor noise is reseeded from the state).

    Args:
        env_id: one of :data:`ENV_IDS`.
        num_envs: number of envs (robots), a multiple of ``group_size``.
        group_size: consecutive envs sharing their reset offset.
        auto_reset: reset an env's robot as soon as its episode ends.
        max_episode_steps: time limit (``None``: 100).
        obs_mode: ``"state"`` or ``"rgb"``.
        image_size: ``(height, width)`` of ``rgb`` images (``None``: 64x64).
        ignore_terminations: a success does not end the episode (only the time limit does).
        hardware: one mapping per robot (see above).
        env_kwargs: :class:`RealWorldSettings` fields (``is_dummy``, ``safety_limits``, ``action_scale``,
            ``target_pose``, ``reset_pose``, ``reset_noise_m``, ``reward``, ``step_frequency``,
            ``request_timeout_s``, ``main_camera``, ``dummy_seed``, ``dummy_startup_timeout_s``).
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
        ignore_terminations: bool = False,
        hardware: Sequence[Mapping[str, Any]] = (),
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
        self.spec = realworld_spec(env_id, obs_mode, image_size)
        self.settings = RealWorldSettings.from_kwargs(env_kwargs or {})
        self.settings.check_against_limits()
        self.units: list[RobotUnit] = robot_units(hardware, num_envs, is_dummy=self.settings.is_dummy)
        self.env_id = env_id
        self.num_envs = num_envs
        self.group_size = group_size
        self.auto_reset = auto_reset
        self.obs_mode = obs_mode
        self.image_size = _image_size(image_size)
        self.max_episode_steps = max_episode_steps or DEFAULT_MAX_EPISODE_STEPS
        self.ignore_terminations = ignore_terminations
        self._target = np.asarray(self.settings.target_pose)
        self._clients: list[RobotClient] = []
        self._dummies: list[DummyServer] = []
        self._workdirs: list[Path] = []
        self._finalizer = weakref.finalize(self, _release, self._clients, self._dummies, self._workdirs)
        try:
            self._connect()
        except BaseException:
            self._finalizer()
            raise
        self._rngs = [np.random.default_rng(i // group_size) for i in range(num_envs)]
        self._obs: NpObs = (
            {k: np.zeros((num_envs, *s.shape), dtype=s.dtype) for k, s in self.spec.obs_dict.items()}
            if self.spec.obs_dict is not None
            else np.zeros((num_envs, STATE_DIM), dtype=np.float32)
        )
        self._ret = np.zeros(num_envs, dtype=np.float64)
        self._len = np.zeros(num_envs, dtype=np.int64)
        self._success = np.zeros(num_envs, dtype=bool)
        self._finished = np.zeros(num_envs, dtype=bool)
        self._was_reset = False
        self._next_step_at = 0.0

    # -- robots --------------------------------------------------------------------------------------------

    def _connect(self) -> None:
        s = self.settings
        need = [u for u in self.units if u.address is None]
        addresses: dict[int, tuple[str, int]] = {
            u.index: u.address for u in self.units if u.address is not None
        }
        if need:
            servers, workdir = start_dummy_servers(
                [s.dummy_seed + u.index for u in need],
                image_size=self.image_size,
                target_pose=s.target_pose,
                timeout_s=s.dummy_startup_timeout_s,
            )
            self._dummies += servers
            self._workdirs.append(workdir)
            addresses.update({u.index: srv.address for u, srv in zip(need, servers, strict=True)})
        for unit in self.units:
            client = RobotClient(
                addresses[unit.index], name=unit.name, limits=s.safety_limits, timeout_s=s.request_timeout_s
            )
            self._clients.append(client)
            cameras = dict(client.info.get("cameras", {}))
            if self.obs_mode == "rgb":
                check_main_camera(s.main_camera, list(cameras), unit.name)
            unknown = [c for c in unit.camera_serials if c not in cameras.values()]
            if unknown:
                raise ValueError(
                    f"hardware[{unit.index}].camera_serials {unknown} are not cameras of {unit.name} "
                    f"(serial {client.info.get('serial')!r}); its cameras: {cameras}"
                )

    @property
    def dummy_pids(self) -> list[int]:
        """Process ids of the dummy robot servers this env started (empty after :meth:`close`)."""
        return [d.pid for d in self._dummies]

    @property
    def clients(self) -> list[RobotClient]:
        """Each env's :class:`RobotClient` (for ``estop``, ``stats``, ...)."""
        return list(self._clients)

    def _reset_robot(self, i: int, *, jitter: bool) -> RobotState:
        s = self.settings
        pose = np.asarray(s.reset_pose, dtype=np.float64).copy()
        rng = self._rngs[i] if jitter else copy.deepcopy(self._rngs[i])
        if jitter and s.reset_noise_m > 0:
            pose[:2] += rng.uniform(-s.reset_noise_m, s.reset_noise_m, 2)
        noise_seed = int(rng.integers(2**31 - 1))
        pose = s.safety_limits.clip_pose(pose)
        return self._clients[i].reset(pose, _GRIPPER_CLOSED, seed=noise_seed)

    def _observe(self, states: Mapping[int, RobotState]) -> NpObs:
        """Observation rows ``[len(states), ...]`` of the envs ``states`` holds, in its order."""
        vectors = np.stack([states[i].state_vector() for i in states]).astype(np.float32)
        if self.obs_mode == "state":
            return vectors
        camera = self.settings.main_camera
        images = np.stack(
            [_resize_nearest(self._clients[i].frames()[camera], self.image_size) for i in states]
        )
        return {"rgb": images.astype(np.uint8, copy=False), "state": vectors}

    def _write_obs(self, dst: NpObs, rows: Sequence[int], src: NpObs) -> None:
        idx = np.asarray(rows, dtype=np.intp)
        if isinstance(dst, dict):
            src_d = cast(dict[str, np.ndarray], src)
            for k, v in dst.items():
                v[idx] = src_d[k]
        else:
            dst[idx] = cast(np.ndarray, src)

    def _goal(self, state: RobotState) -> tuple[float, bool]:
        """The reward of ``state`` and whether it is a success."""
        r = self.settings.reward
        pose = np.asarray(state.tcp_pose)
        dist = float(np.linalg.norm(pose[:3] - self._target[:3]))
        success = (
            dist <= r.success_threshold_m
            and rotation_angle(pose[3:], self._target[3:]) <= r.success_threshold_rad
        )
        reward = float(success) if r.type == "sparse" else math.exp(-dist / r.dense_scale_m)
        return reward, success

    def _command(self, state: RobotState, action: np.ndarray) -> np.ndarray:
        """``[7]`` target pose: ``action`` scaled and applied to ``state``'s pose, clipped into the workspace."""
        s = self.settings
        pose = np.asarray(state.tcp_pose, dtype=np.float64)
        xyz = pose[:3] + action[:3] * s.action_scale[0]
        quat = quat_mul(euler_to_quat(action[3:6] * s.action_scale[1]), pose[3:])
        return s.safety_limits.clip_pose(np.concatenate([xyz, quat]))

    def _throttle(self) -> None:
        hz = self.settings.step_frequency
        if hz <= 0:
            return
        now = time.monotonic()
        if now < self._next_step_at:
            time.sleep(self._next_step_at - now)
        self._next_step_at = max(now, self._next_step_at) + 1.0 / hz

    # -- VecEnv --------------------------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None) -> NpObs:
        """Move every robot to its reset pose; env ``i`` draws its offset with seed ``seed + i // group_size``.

        Returns:
            ``[N, 19]`` float32 states, or the ``rgb``/``state`` dict of ``obs_mode="rgb"``.
        """
        self._check_open()
        self._rngs = [np.random.default_rng(s) for s in env_seeds(seed, self.num_envs, self.group_size)]
        states = {i: self._reset_robot(i, jitter=True) for i in range(self.num_envs)}
        self._obs = self._observe(states)
        self._ret[:] = 0.0
        self._len[:] = 0
        self._success[:] = False
        self._finished[:] = False
        self._was_reset = True
        self._next_step_at = 0.0
        return _copy(self._obs)

    def _check_actions(self, actions: np.ndarray) -> np.ndarray:
        actions = np.asarray(actions, dtype=np.float64)
        n = self.num_envs
        if (
            actions.ndim != 3
            or actions.shape[0] != n
            or actions.shape[2] != ACTION_DIM
            or actions.shape[1] < 1
        ):
            raise ValueError(
                f"actions must be [num_envs={n}, chunk, action_dim={ACTION_DIM}], got shape {actions.shape}"
            )
        if not np.isfinite(actions).all():
            raise ValueError("actions contain NaN or inf")
        clipped: np.ndarray = np.clip(actions, -1.0, 1.0)
        return clipped

    def chunk_step(self, actions: np.ndarray) -> ChunkStepResult:
        """Execute a chunk ``[N, C, 6]`` of end-effector deltas (clipped to [-1, 1]), one control step at a time.

        An env whose episode ends mid-chunk has its robot reset at once (``auto_reset``) and continues the chunk
        in its new episode. ``episodes`` lists the episodes that ended, by step of the chunk and, within a step,
        by env index.

        Raises:
            SafetyViolation: a target the safety limits refuse after clipping (nothing was sent).
            EmergencyStopped, RobotFault: a robot refused the motion.
            RobotUnreachable: a robot did not answer within ``request_timeout_s``.
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
            self._throttle()
            live = [i for i in range(n) if not self._finished[i]]
            terms[self._finished, k] = True  # without auto-reset a finished env stays done with zero reward
            states: dict[int, RobotState] = {}
            for i in live:
                client = self._clients[i]
                current = client.last_state or client.state()
                states[i] = client.move(self._command(current, actions[i, k]), _GRIPPER_CLOSED)
            if not live:
                continue
            obs = self._observe(states)
            self._write_obs(self._obs, live, obs)
            ended: list[int] = []
            for i in live:
                reward, success = self._goal(states[i])
                self._len[i] += 1
                self._ret[i] += reward
                self._success[i] |= success
                rewards[i, k] = reward
                terms[i, k] = success and not self.ignore_terminations
                truncs[i, k] = self._len[i] >= self.max_episode_steps
                if terms[i, k] or truncs[i, k]:
                    ended.append(i)
                    stats.returns.append(float(self._ret[i]))
                    stats.lengths.append(int(self._len[i]))
                    stats.successes.append(bool(self._success[i]))
                    stats.successes_at_end.append(success)
            if ended:
                self._write_obs(final_obs, ended, _rows(self._obs, ended))
                self._ret[ended], self._len[ended], self._success[ended] = 0.0, 0, False
                if self.auto_reset:
                    fresh = {i: self._reset_robot(i, jitter=True) for i in ended}
                    self._write_obs(self._obs, ended, self._observe(fresh))
                else:
                    self._finished[ended] = True
        last_done = terms[:, -1] | truncs[:, -1]
        keep = [i for i in range(n) if not last_done[i]]
        if keep:
            self._write_obs(final_obs, keep, _rows(self._obs, keep))
        return ChunkStepResult(_copy(self._obs), rewards, terms, truncs, final_obs, stats)

    def render(self) -> np.ndarray:
        """``[N, H, W, 3]`` uint8: each robot's ``main_camera`` at ``image_size`` (any ``obs_mode``; videos)."""
        self._check_open()
        camera = self.settings.main_camera
        return np.stack([_resize_nearest(c.frames()[camera], self.image_size) for c in self._clients])

    def get_state(self) -> dict[str, Any]:
        """The episode bookkeeping and each env's generator (the robots' poses cannot be restored; see the class)."""
        self._check_open()
        return {
            "env_id": self.env_id,
            "num_envs": self.num_envs,
            "obs_mode": self.obs_mode,
            "rngs": [copy.deepcopy(rng) for rng in self._rngs],
            "ret": self._ret.copy(),
            "len": self._len.copy(),
            "success": self._success.copy(),
            "finished": self._finished.copy(),
            "was_reset": self._was_reset,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`get_state`'s bookkeeping and generators, then reset every robot to ``reset_pose``.

        Raises:
            ValueError: the state of another env id, size or obs mode.
        """
        self._check_open()
        mine = (self.env_id, self.num_envs, self.obs_mode)
        theirs = (state.get("env_id"), state.get("num_envs"), state.get("obs_mode"))
        if theirs != mine:
            raise ValueError(
                f"env state of (env_id, num_envs, obs_mode)={theirs} cannot be loaded into a RealWorldVecEnv of {mine}"
            )
        self._rngs = [copy.deepcopy(rng) for rng in state["rngs"]]
        self._ret[:] = state["ret"]
        self._len[:] = state["len"]
        self._success[:] = state["success"]
        self._finished[:] = state["finished"]
        self._was_reset = bool(state["was_reset"])
        states = {i: self._reset_robot(i, jitter=False) for i in range(self.num_envs)}
        self._obs = self._observe(states)
        self._next_step_at = 0.0

    def _check_open(self) -> None:
        if not self._finalizer.alive:
            raise RuntimeError("this RealWorldVecEnv is closed")

    def close(self) -> None:
        """Close the robot connections and stop the dummy servers this env started; idempotent."""
        self._finalizer()


def _rows(obs: NpObs, rows: Sequence[int]) -> NpObs:
    idx = np.asarray(rows, dtype=np.intp)
    if isinstance(obs, dict):
        return {k: v[idx].copy() for k, v in obs.items()}
    return obs[idx].copy()


def _copy(obs: NpObs) -> NpObs:
    if isinstance(obs, dict):
        return {k: v.copy() for k, v in obs.items()}
    return obs.copy()
