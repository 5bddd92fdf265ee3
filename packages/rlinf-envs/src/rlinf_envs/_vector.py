"""``SubEnvs``: single-env gymnasium envs stepped together in this process or in one spawned process each.

The CPU backends (ManiSkill's ``physx_cpu``, LIBERO) run one simulator per environment and vectorise them with
gymnasium's ``SyncVectorEnv`` (``vector_mode="sync"``) or ``AsyncVectorEnv`` (``"async"``). This wraps the two
behind one interface: no auto-reset (the RLinf vector env decides when an episode ends and resets it), worker
processes started with ``spawn`` and every wait bounded by a timeout.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

try:
    import gymnasium as gym
except ImportError as e:  # pragma: no cover - every backend using this installs gymnasium
    raise ImportError("the CPU vector env needs gymnasium (installed by the simulator's extra)") from e

__all__ = ["VECTOR_MODES", "SubEnvs"]

VECTOR_MODES = ("sync", "async")

StepOut = tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]


class SubEnvs:
    """``len(env_fns)`` single gymnasium envs behind a ``SyncVectorEnv`` or an ``AsyncVectorEnv`` (no auto-reset).

    Args:
        env_fns: one constructor per env; module-level callables (or ``functools.partial`` of them) so that
            spawned workers can unpickle them. In async mode the first one is also called once here, by
            gymnasium, to read the spaces: keep construction cheap (build the simulator on the first reset).
        vector_mode: ``"sync"`` (in this process) or ``"async"`` (one spawned process per env).
        timeout_s: async mode: a worker that does not answer a reset or step within this many seconds is an error.
    """

    def __init__(
        self, env_fns: Sequence[Callable[[], gym.Env[Any, Any]]], vector_mode: str, timeout_s: float
    ) -> None:
        if vector_mode not in VECTOR_MODES:
            raise ValueError(f"vector_mode must be one of {VECTOR_MODES}, got {vector_mode!r}")
        mode = gym.vector.AutoresetMode.DISABLED
        self._timeout = timeout_s
        self._vec: gym.vector.AsyncVectorEnv | gym.vector.SyncVectorEnv
        if vector_mode == "async":
            # spawn, not fork: the parent may hold GL/Vulkan/LLVM threads that a forked child would inherit mid-state.
            self._vec = gym.vector.AsyncVectorEnv(list(env_fns), context="spawn", autoreset_mode=mode)
        else:
            self._vec = gym.vector.SyncVectorEnv(list(env_fns), autoreset_mode=mode)
        self.num_envs = len(env_fns)
        self.single_observation_space: gym.Space[Any] = self._vec.single_observation_space
        self.single_action_space: gym.Space[Any] = self._vec.single_action_space

    @property
    def is_async(self) -> bool:
        """The envs live in worker processes."""
        return isinstance(self._vec, gym.vector.AsyncVectorEnv)

    def reset(self, seeds: list[int | None] | None = None, options: dict[str, Any] | None = None) -> Any:
        """Reset the envs (only those of ``options["reset_mask"]`` when given); the batched observations."""
        options = None if options is None else dict(options)  # gymnasium pops reset_mask from it
        if isinstance(self._vec, gym.vector.AsyncVectorEnv):
            self._vec.reset_async(seed=seeds, options=options)
            obs, _ = self._vec.reset_wait(timeout=self._timeout)
        else:
            obs, _ = self._vec.reset(seed=seeds, options=options)
        return obs

    def step(self, actions: np.ndarray) -> StepOut:
        """Step every env once; ``(obs, rewards, terminations, truncations, infos)`` batched by gymnasium."""
        if isinstance(self._vec, gym.vector.AsyncVectorEnv):
            self._vec.step_async(actions)
            obs, rew, term, trunc, info = self._vec.step_wait(timeout=self._timeout)
        else:
            obs, rew, term, trunc, info = self._vec.step(actions)
        return obs, np.asarray(rew), np.asarray(term), np.asarray(trunc), info

    def local_envs(self, hint: str) -> list[gym.Env[Any, Any]]:
        """The env objects themselves (sync mode only; ``hint`` completes the error in async mode)."""
        if not isinstance(self._vec, gym.vector.SyncVectorEnv):
            raise RuntimeError(f"the envs live in worker processes with vector_mode='async'; {hint}")
        return list(self._vec.envs)

    def call(self, name: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Call method ``name`` of every env (in the workers in async mode); their results in env order."""
        return list(self._vec.call(name, *args, **kwargs))

    def get_attr(self, name: str) -> list[Any]:
        """Attribute ``name`` of every env (pickled back from the workers in async mode)."""
        return list(self._vec.get_attr(name))

    def set_attr(self, name: str, values: Sequence[Any]) -> None:
        """Set attribute ``name`` of env ``i`` to ``values[i]``."""
        self._vec.set_attr(name, list(values))

    def close(self) -> None:
        """Close the envs (and end the worker processes)."""
        self._vec.close()
