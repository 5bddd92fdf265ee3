"""``FrameStack``: observe the last ``k`` policy-step observations of any vectorised env.

Each entry of the observation (the array, or every entry of a dict observation) is concatenated along its last
axis, oldest first: an image ``[H, W, C]`` becomes ``[H, W, k*C]`` (what a conv torso takes as channels), a
vector ``[D]`` becomes ``[k*D]``. Frames are the observations the policy sees, one per chunk step; at the start
of an episode the history is the first observation repeated ``k`` times.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
from rlinf_core.protocols import ChunkStepResult, EnvSpec, NpObs, ObsSpec, VecEnv, obs_map

__all__ = ["FrameStack", "stacked_spec"]


def stacked_spec(spec: EnvSpec, k: int) -> EnvSpec:
    """The spec of ``spec``'s observations with ``k`` frames stacked (``spec`` itself for ``k == 1``)."""
    if k == 1:
        return spec

    def grow(s: ObsSpec) -> ObsSpec:
        return ObsSpec((*s.shape[:-1], s.shape[-1] * k), s.dtype)

    if spec.obs_dict is not None:
        return replace(spec, obs_dict={name: grow(s) for name, s in spec.obs_dict.items()})
    grown = grow(ObsSpec(spec.obs_shape, spec.obs_dtype))
    return replace(spec, obs_shape=grown.shape)


class FrameStack:
    """Wraps ``env`` so that its observations hold the last ``k`` frames (see the module docstring).

    Args:
        env: any :class:`~rlinf_core.protocols.VecEnv`.
        k: frames per observation (>= 1).
    """

    def __init__(self, env: VecEnv, k: int) -> None:
        if k < 1:
            raise ValueError(f"frame_stack must be >= 1, got {k}")
        self.env = env
        self.k = k
        self.num_envs = env.num_envs
        self.group_size = env.group_size
        self.spec = stacked_spec(env.spec, k)
        self._history: Any = None  # per entry: [N, k, *shape], oldest frame first

    def _stack(self, history: Any) -> Any:
        return obs_map(lambda h: np.concatenate([h[:, j] for j in range(self.k)], axis=-1), history)

    def _fill(self, obs: NpObs) -> Any:
        return obs_map(lambda x: np.repeat(np.asarray(x)[:, None], self.k, axis=1), obs)

    def reset(self, *, seed: int | None = None) -> NpObs:
        """Reset ``env``; the history is the first observation ``k`` times."""
        self._history = self._fill(self.env.reset(seed=seed))
        out: NpObs = self._stack(self._history)
        return out

    def chunk_step(self, actions: np.ndarray) -> ChunkStepResult:
        """Step ``env``; envs whose episode ended in the chunk start a new history (``final_obs`` keeps the old one)."""
        if self._history is None:
            raise RuntimeError("call reset() before chunk_step()")
        res = self.env.chunk_step(actions)
        old = self._history
        shifted = _zip(old, res.obs, lambda h, x: np.concatenate([h[:, 1:], np.asarray(x)[:, None]], axis=1))
        final = _zip(
            old, res.final_obs, lambda h, x: np.concatenate([h[:, 1:], np.asarray(x)[:, None]], axis=1)
        )
        restart: np.ndarray = np.asarray(res.dones.any(axis=1))
        if restart.any():
            fresh = self._fill(res.obs)
            shifted = _zip(shifted, fresh, lambda h, f: np.where(_rows(restart, h), f, h))
        last_done: np.ndarray = np.asarray(res.dones[:, -1])
        final = _zip(final, shifted, lambda f, s: np.where(_rows(last_done, f), f, s))
        self._history = shifted
        return ChunkStepResult(
            self._stack(shifted),
            res.rewards,
            res.terminations,
            res.truncations,
            self._stack(final),
            res.episodes,
        )

    def get_state(self) -> dict[str, Any]:
        """``env``'s state and the frame history."""
        history = None if self._history is None else obs_map(np.copy, self._history)
        return {"env": self.env.get_state(), "frame_stack": self.k, "history": history}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`get_state`."""
        if state.get("frame_stack") != self.k:
            raise ValueError(
                f"env state of frame_stack={state.get('frame_stack')} cannot be loaded with frame_stack={self.k}"
            )
        self.env.set_state(state["env"])
        self._history = None if state["history"] is None else obs_map(np.copy, state["history"])

    def close(self) -> None:
        """Close ``env``."""
        self.env.close()

    def __getattr__(self, name: str) -> Any:
        # Backend-specific methods (task_envs, task_descriptions, ...) pass through.
        if name.startswith("_") or name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)


def _rows(mask: np.ndarray, like: np.ndarray) -> np.ndarray:
    return mask.reshape(-1, *([1] * (like.ndim - 1)))


def _zip(a: Any, b: Any, fn: Any) -> Any:
    if isinstance(a, dict):
        return {k: fn(a[k], b[k]) for k in a}
    return fn(a, b)
