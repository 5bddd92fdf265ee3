"""Observations as one array or as a flat dict of named arrays, and the few operations every stage needs on them.

A vector task (CartPole, ManiSkill ``state``) observes one float32 array per env. A vision task observes several
arrays per env: camera images (``[H, W, C]`` uint8, channels last, as the simulators render them), depth maps,
and the robot's proprioceptive state (a float32 vector). Those travel as a flat ``dict[str, array]`` with the same
leading dimensions on every entry, and are never packed into one float array (that would copy every image
and quadruple its size).

The helpers here take either form, numpy or torch, and apply one operation to every entry, so that the env
worker, the rollout worker, the trajectories and the replay buffer handle both forms with the same code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np

__all__ = [
    "OBS_DTYPES",
    "NpObs",
    "ObsSpec",
    "flatten_obs",
    "obs_concat",
    "obs_index",
    "obs_len",
    "obs_map",
    "obs_stack",
    "obs_zeros",
    "unflatten_obs",
]

OBS_DTYPES = ("float32", "uint8", "int16")
"""Element types an observation entry may have: float32 vectors, uint8 images, int16 depth (millimetres)."""

NpObs: TypeAlias = "np.ndarray | dict[str, np.ndarray]"
"""A batch of observations as the envs return them: one array, or a dict of named arrays."""


@dataclass(frozen=True)
class ObsSpec:
    """One named observation entry: its shape per env and element type.

    Attributes:
        shape: per-env shape: ``(D,)`` for a vector, ``(H, W, C)`` for an image (channels last).
        dtype: one of :data:`OBS_DTYPES`.
    """

    shape: tuple[int, ...]
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.dtype not in OBS_DTYPES:
            raise ValueError(
                f"ObsSpec.dtype: {self.dtype!r} is not allowed; choose one of {', '.join(OBS_DTYPES)}"
            )

    @property
    def is_image(self) -> bool:
        """A ``[H, W, C]`` entry (camera image or depth map)."""
        return len(self.shape) == 3


def obs_map(fn: Callable[[Any], Any], obs: Any) -> Any:
    """``fn`` applied to the array ``obs`` or to every array of the (possibly nested) dict ``obs``, keys kept.

    Batches holding a dict observation among other arrays (``{"obs": {"rgb": ..., "state": ...}, "rewards":
    ...}``) are such nested dicts: ``obs_map(lambda x: x[idx], batch)`` selects rows of all of them.
    """
    if isinstance(obs, Mapping):
        return {k: obs_map(fn, v) for k, v in obs.items()}
    return fn(obs)


def _join(parts: Sequence[Any], axis: int, np_fn: Callable[..., Any], torch_name: str) -> Any:
    if not parts:
        raise ValueError("no observations to join")
    first = parts[0]
    if isinstance(first, Mapping):
        keys = list(first)
        for p in parts[1:]:
            if list(p) != keys:
                raise ValueError(f"observation keys differ: {keys} vs {list(p)}")
        return {k: _join([p[k] for p in parts], axis, np_fn, torch_name) for k in keys}
    if isinstance(first, np.ndarray):
        return np_fn([np.asarray(p) for p in parts], axis=axis)
    import torch  # only when the observations are tensors (rlinf_core itself does not need torch)

    return getattr(torch, torch_name)([torch.as_tensor(p) for p in parts], dim=axis)


def obs_concat(parts: Sequence[Any], axis: int = 0) -> Any:
    """Concatenate observations (arrays, tensors, or dicts of them with equal keys) along ``axis``."""
    return _join(parts, axis, np.concatenate, "cat")


def obs_stack(parts: Sequence[Any], axis: int = 0) -> Any:
    """Stack observations along a new ``axis`` (e.g. the time steps of a trajectory)."""
    return _join(parts, axis, np.stack, "stack")


def obs_index(obs: Any, index: Any) -> Any:
    """``obs[index]`` on the leading dimensions of every entry."""
    return obs_map(lambda x: x[index], obs)


def obs_len(obs: Any) -> int:
    """Size of the leading dimension (the same on every entry of a dict)."""
    if isinstance(obs, Mapping):
        sizes = {obs_len(v) for v in obs.values()}
        if len(sizes) != 1:
            raise ValueError(f"observation entries have different leading sizes: {sorted(sizes)}")
        return sizes.pop()
    return int(obs.shape[0])


def obs_zeros(spec: ObsSpec | Mapping[str, ObsSpec], n: int) -> Any:
    """``n`` zero observations of ``spec`` (one :class:`ObsSpec` or a dict of them), as numpy arrays."""
    if isinstance(spec, Mapping):
        return {k: np.zeros((n, *s.shape), dtype=s.dtype) for k, s in spec.items()}
    return np.zeros((n, *spec.shape), dtype=spec.dtype)


_SEP = "/"


def flatten_obs(tree: Mapping[str, Any]) -> dict[str, Any]:
    """A nested dict of arrays as a flat one: ``{"obs": {"rgb": x}}`` becomes ``{"obs/rgb": x}``.

    Raises:
        ValueError: when a key already contains ``/`` (the flat form could not be undone).
    """
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if _SEP in key:
            raise ValueError(f"key {key!r} contains {_SEP!r}, which nested observation keys cannot have")
        if isinstance(value, Mapping):
            for sub, leaf in flatten_obs(value).items():
                out[f"{key}{_SEP}{sub}"] = leaf
        else:
            out[key] = value
    return out


def unflatten_obs(flat: Mapping[str, Any]) -> dict[str, Any]:
    """Undo :func:`flatten_obs`."""
    out: dict[str, Any] = {}
    for key, leaf in flat.items():
        *parents, last = key.split(_SEP)
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = leaf
    return out
