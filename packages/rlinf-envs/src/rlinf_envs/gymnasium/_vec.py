"""Any registered gymnasium id as an RLinf :class:`~rlinf_envs.VecEnv`."""

from __future__ import annotations

import pickle
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

try:
    import gymnasium as gym
except ImportError as e:  # pragma: no cover - exercised by the extra-missing test
    raise ImportError('the gymnasium backend needs: pip install "rlinf-envs[gymnasium]"') from e

from rlinf_core.protocols import ChunkStepResult, EnvSpec, EpisodeStats

__all__ = ["INTERVENTION_ACTION_KEY", "INTERVENTION_KEY", "GymnasiumVecEnv", "gymnasium_spec"]


def _spec_of(env: Any) -> EnvSpec:
    obs_space, act_space = env.observation_space, env.action_space
    if not isinstance(obs_space, gym.spaces.Box):
        raise ValueError(f"observation space {obs_space} is not a Box; only array observations are supported")
    if isinstance(act_space, gym.spaces.Discrete):
        return EnvSpec(tuple(obs_space.shape), "discrete", 1, num_actions=int(act_space.n))
    if isinstance(act_space, gym.spaces.Box) and len(act_space.shape) == 1:
        return EnvSpec(
            tuple(obs_space.shape),
            "continuous",
            int(act_space.shape[0]),
            action_low=tuple(float(x) for x in act_space.low),
            action_high=tuple(float(x) for x in act_space.high),
        )
    raise ValueError(f"action space {act_space} is not supported (Discrete or 1-D Box)")


def _snapshot(env: Any) -> bytes:
    """One env's full state: the wrapper chain (time-limit counters, ...), its RNG and its MuJoCo data.

    Pickling the wrapper chain alone is not enough for every env: MuJoCo envs pickle as their constructor
    arguments (gymnasium's ``EzPickle``), so the physics state (``MjData``: positions, velocities, warm start,
    time) and the env's ``np_random`` are stored beside it and copied into the rebuilt env on restore.
    """
    base = env.unwrapped
    data = getattr(base, "data", None)
    return pickle.dumps(
        {
            "env": env,
            "np_random": base.np_random,
            "mj_data": data if type(data).__module__.startswith("mujoco") else None,
        }
    )


def _restore(blob: bytes) -> Any:
    snap = pickle.loads(blob)
    env = snap["env"]
    base = env.unwrapped
    base.np_random = snap["np_random"]
    if snap["mj_data"] is not None:
        _copy_mj_data(sys.modules["mujoco"], base.model, snap["mj_data"], base.data)
    return env


def _copy_mj_data(mujoco: Any, model: Any, src: Any, dst: Any) -> None:
    """Copy MuJoCo ``src`` into ``dst``: every field with ``mj_copyData`` (mujoco 4), else the full integration state.

    mujoco 3.x has no ``mj_copyData`` binding; ``mjSTATE_INTEGRATION`` (time, positions, velocities, actuator
    activations, warm start, controls, applied forces, mocap, user data) is everything ``mj_step`` reads, so the
    following steps are bit-identical either way.
    """
    copy = getattr(mujoco, "mj_copyData", None)
    if copy is not None:
        copy(dst, model, src)
        return
    spec = mujoco.mjtState.mjSTATE_INTEGRATION
    state = np.empty(mujoco.mj_stateSize(model, spec))
    mujoco.mj_getState(model, src, state, spec)
    mujoco.mj_setState(model, dst, state, spec)


def gymnasium_spec(env_id: str, env_kwargs: Mapping[str, Any] | None = None) -> EnvSpec:
    """The :class:`EnvSpec` of a registered gymnasium id: one env made, read and closed in this process.

    The spec :class:`GymnasiumVecEnv` reports for the same id and ``env_kwargs`` (the time limit does not
    change it).

    Raises:
        ValueError: for an unsupported observation or action space.
    """
    env = gym.make(env_id, **dict(env_kwargs or {}))
    try:
        return _spec_of(env)
    finally:
        env.close()


INTERVENTION_KEY = "is_intervention"
"""Step-info key of a human-in-the-loop env: a person controlled this step (gym-hil's name)."""
INTERVENTION_ACTION_KEY = "teleop_action"
"""Step-info key of the action executed at an intervention (gym-hil's name)."""


class GymnasiumVecEnv:
    """``num_envs`` copies of a gymnasium env, stepped in-process with action chunks and auto-reset.

    Args:
        env_id: a registered id, e.g. ``"CartPole-v1"``, ``"HalfCheetah-v5"``.
        num_envs: number of environments (a multiple of ``group_size``).
        group_size: consecutive envs sharing initial states on ``reset``.
        auto_reset: reset an env as soon as its episode ends (otherwise it stays finished until ``reset``,
            returning zero rewards and ``done`` flags).
        max_episode_steps: time limit override (``None`` keeps the registered one).
        env_kwargs: extra keyword arguments for ``gymnasium.make``.
    """

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        *,
        group_size: int = 1,
        auto_reset: bool = True,
        max_episode_steps: int | None = None,
        env_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if group_size < 1 or num_envs % group_size:
            raise ValueError(
                f"group_size must divide num_envs: got group_size={group_size}, num_envs={num_envs}"
            )
        if env_id not in gym.registry:
            close = [k for k in gym.registry if k.lower().startswith(env_id.split("-")[0].lower())][:5]
            raise ValueError(
                f"env id {env_id!r} is not registered with gymnasium; similar: {close or 'none'}"
            )
        kwargs = dict(env_kwargs or {})
        if max_episode_steps is not None:
            kwargs["max_episode_steps"] = max_episode_steps
        self.env_id = env_id
        self.num_envs = num_envs
        self.group_size = group_size
        self.auto_reset = auto_reset
        self._envs = [gym.make(env_id, **kwargs) for _ in range(num_envs)]
        self.spec = _spec_of(self._envs[0])
        self._obs = np.zeros((num_envs, *self.spec.obs_shape), dtype=np.float32)
        self._ret = np.zeros(num_envs, dtype=np.float64)
        self._len = np.zeros(num_envs, dtype=np.int64)
        self._finished = np.zeros(num_envs, dtype=bool)
        self._was_reset = False

    def reset(self, *, seed: int | None = None) -> np.ndarray:
        """Reset every env; env ``i`` uses seed ``seed + i // group_size`` (shared within a group)."""
        for i, env in enumerate(self._envs):
            s = None if seed is None else seed + i // self.group_size
            obs, _ = env.reset(seed=s)
            self._obs[i] = obs
        self._ret[:] = 0.0
        self._len[:] = 0
        self._finished[:] = False
        self._was_reset = True
        return self._obs.copy()

    def _check_actions(self, actions: np.ndarray) -> np.ndarray:
        actions = np.asarray(actions)
        n = self.num_envs
        if self.spec.action_type == "discrete":
            if actions.ndim == 3 and actions.shape[-1] == 1:
                actions = actions[..., 0]
            if actions.ndim != 2 or actions.shape[0] != n:
                raise ValueError(f"actions must be [num_envs={n}, chunk] integers, got shape {actions.shape}")
        elif actions.ndim != 3 or actions.shape[0] != n or actions.shape[2] != self.spec.action_dim:
            raise ValueError(
                f"actions must be [num_envs={n}, chunk, action_dim={self.spec.action_dim}], got shape {actions.shape}"
            )
        return actions

    def chunk_step(self, actions: np.ndarray) -> ChunkStepResult:
        """Execute a chunk of actions ``[N, C]`` (discrete) or ``[N, C, action_dim]`` (continuous).

        A human-in-the-loop env that reports ``info["is_intervention"]`` (and the executed action in
        ``info["teleop_action"]``, as gym-hil's input-control wrapper does) fills the result's
        ``interventions`` and ``intervention_actions``.
        """
        if not self._was_reset:
            raise RuntimeError("call reset() before chunk_step()")
        actions = self._check_actions(actions)
        n, c = actions.shape[:2]
        rewards = np.zeros((n, c), dtype=np.float32)
        terms = np.zeros((n, c), dtype=bool)
        truncs = np.zeros((n, c), dtype=bool)
        final_obs = self._obs.copy()
        stats = EpisodeStats()
        low = np.asarray(self.spec.action_low) if self.spec.action_low is not None else None
        high = np.asarray(self.spec.action_high) if self.spec.action_high is not None else None
        human: np.ndarray | None = None
        executed: np.ndarray | None = None
        for i, env in enumerate(self._envs):
            for k in range(c):
                if self._finished[i]:
                    terms[i, k:] = True
                    break
                a = actions[i, k]
                a = int(a) if low is None else np.clip(a, low, high)
                obs, r, term, trunc, info = env.step(a)
                if INTERVENTION_KEY in info:
                    if human is None:
                        human = np.zeros((n, c), dtype=bool)
                        executed = np.array(actions, dtype=np.float32, copy=True)
                    assert executed is not None
                    human[i, k] = bool(info[INTERVENTION_KEY])
                    if human[i, k]:
                        executed[i, k] = np.asarray(info.get(INTERVENTION_ACTION_KEY, a), dtype=np.float32)
                rewards[i, k] = r
                terms[i, k], truncs[i, k] = term, trunc
                self._ret[i] += r
                self._len[i] += 1
                self._obs[i] = obs
                if term or trunc:
                    stats.returns.append(float(self._ret[i]))
                    stats.lengths.append(int(self._len[i]))
                    flag = info.get("success", info.get("is_success"))
                    if flag is not None:  # an env without a notion of success (CartPole) reports none
                        stats.successes.append(bool(flag))
                        stats.successes_at_end.append(bool(flag))
                    self._ret[i], self._len[i] = 0.0, 0
                    final_obs[i] = obs
                    if self.auto_reset:
                        self._obs[i], _ = env.reset()
                    else:
                        self._finished[i] = True
                        terms[i, k + 1 :] = True
                        break
            if not (terms[i, -1] or truncs[i, -1]):
                final_obs[i] = self._obs[i]
        return ChunkStepResult(
            self._obs.copy(),
            rewards,
            terms,
            truncs,
            final_obs,
            stats,
            interventions=human,
            intervention_actions=executed,
        )

    def get_state(self) -> dict[str, Any]:
        """Every env (wrappers, RNG, simulator state) and the running episode bookkeeping, picklable.

        Works for any env whose wrapper chain pickles (every gymnasium env registered by class, e.g. the
        classic-control and MuJoCo ones); :meth:`set_state` of a fresh ``GymnasiumVecEnv`` built with the same
        arguments then continues the in-progress episodes bit for bit.
        """
        return {
            "env_id": self.env_id,
            "num_envs": self.num_envs,
            "envs": [_snapshot(env) for env in self._envs],
            "obs": self._obs.copy(),
            "ret": self._ret.copy(),
            "len": self._len.copy(),
            "finished": self._finished.copy(),
            "was_reset": self._was_reset,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`get_state`; raises ``ValueError`` if it is the state of another env id or size."""
        mine = (self.env_id, self.num_envs)
        theirs = (state.get("env_id"), state.get("num_envs"))
        if theirs != mine:
            raise ValueError(
                f"env state of (env_id, num_envs)={theirs} cannot be loaded into a GymnasiumVecEnv of {mine}"
            )
        envs = [_restore(blob) for blob in state["envs"]]
        for env in self._envs:
            env.close()
        self._envs = envs
        self._obs[:] = state["obs"]
        self._ret[:] = state["ret"]
        self._len[:] = state["len"]
        self._finished[:] = state["finished"]
        self._was_reset = bool(state["was_reset"])

    def close(self) -> None:
        """Close every env."""
        for env in self._envs:
            env.close()
        self._envs.clear()
