"""ManiSkill observations as numpy: the flat state vector, or RLinf's dict of camera images and robot vectors."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch


def _to_numpy(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def _flat_vector(tree: Any) -> np.ndarray:
    """The leaves of a (nested) dict of ``[B, ...]`` tensors as ``[B, D]`` float32, concatenated in order."""
    if isinstance(tree, Mapping):
        return np.concatenate([_flat_vector(v) for v in tree.values()], axis=1)
    x = _to_numpy(tree)
    return x.reshape(x.shape[0], -1).astype(np.float32)


def _camera_obs(raw: Mapping[str, Any], base: Any) -> dict[str, np.ndarray]:
    """ManiSkill's batched camera-mode observation as RLinf's flat dict of ``[B, ...]`` arrays (:data:`OBS_MODES`).

    With ``+state`` ManiSkill replaces the robot and extra entries by the flat privileged vector; the robot's
    joint positions and velocities are then read from the task (``_get_obs_agent``) and there is no ``extra``.
    """
    out: dict[str, np.ndarray] = {}
    for j, (camera, data) in enumerate(raw["sensor_data"].items()):
        prefix = "" if j == 0 else f"{camera}_"
        for texture in ("rgb", "depth"):
            if texture in data:
                out[prefix + texture] = _to_numpy(data[texture])
    out["state"] = _flat_vector(raw["agent"] if "agent" in raw else base._get_obs_agent())
    if raw.get("extra"):
        out["extra"] = _flat_vector(raw["extra"])
    if "state" in raw:
        out["privileged_state"] = _to_numpy(raw["state"]).astype(np.float32)
    return out


def _batch_obs(raw: Any, base: Any) -> Any:
    """A batched ManiSkill observation as numpy: ``[B, D]`` float32 (state mode) or the flat dict."""
    if base.obs_mode == "state":
        return _to_numpy(raw).astype(np.float32, copy=False)
    return _camera_obs(raw, base)


def _as_obs(obs: Any) -> Any:
    """A vector env's observation as numpy: float32 vectors, images as they are."""
    if isinstance(obs, Mapping):
        return {k: np.asarray(v) for k, v in obs.items()}
    return np.asarray(obs, dtype=np.float32)


def _set_rows(dst: Any, rows: np.ndarray | slice, src: Any) -> None:
    """``dst[rows] = src[rows]`` for an array or each entry of a dict observation."""
    if isinstance(dst, dict):
        for k, v in dst.items():
            v[rows] = src[k][rows]
    else:
        dst[rows] = src[rows]


def _copy_obs(obs: Any) -> Any:
    return {k: v.copy() for k, v in obs.items()} if isinstance(obs, dict) else obs.copy()


def _box(shape: tuple[int, ...], dtype: Any) -> gym.spaces.Box:
    if np.dtype(dtype) == np.uint8:
        return gym.spaces.Box(0, 255, shape, np.uint8)
    if np.dtype(dtype) == np.int16:
        return gym.spaces.Box(-32768, 32767, shape, np.int16)
    return gym.spaces.Box(-np.inf, np.inf, shape, np.float32)
