"""Multi-agent loss scales (RLinf ``algorithm.loss_scales``): group, agent and turn level re-weighting.

A scale function takes ``(context, batch)`` and returns the updated batch, as in RLinf, but it never writes
into the caller's arrays: it returns a NEW dict whose ``advantages`` / ``loss_scales`` are fresh arrays. The
only state it updates is ``context["folding_scale"]``, the list RLinf uses to enforce the order
``group_level`` → ``agent_level`` → ``turn_level`` (each at most once).

Batch keys: ``advantages [S, L]``, ``loss_scales [S, L]`` (start from ``ones_like(advantages) * response_mask``),
``response_mask [S, L]``, ``idx_to_traj`` (length-S list: turn → trajectory id) and
``extra:idx_to_sub_traj`` (length-S array/list: turn → agent (sub-trajectory) id). Context keys:
``folding_scale`` (list), ``actor_global_batch_size``, ``data_parallel_world_size`` (default 1).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping, Sequence
from types import MappingProxyType
from typing import Any, TypeAlias, TypeVar

import array_api_compat

from .._array import Array, namespace
from .._registry import Registry

__all__ = [
    "LOSS_SCALE_FNS",
    "LossScaleFn",
    "agent_scale",
    "get_loss_scales",
    "group_scale",
    "loss_scale_registry",
    "register_loss_scale",
    "turn_scale",
]

LossScaleFn: TypeAlias = Callable[[MutableMapping[str, Any], Mapping[str, Any]], dict[str, Any]]
"""``fn(context, batch) -> new batch``."""

F = TypeVar("F", bound=LossScaleFn)


def _fold(context: MutableMapping[str, Any], name: str, requires: Sequence[str]) -> None:
    folded = context.get("folding_scale")
    if not isinstance(folded, list):
        raise ValueError(f"context['folding_scale'] must be a list (start with []), got {folded!r}")
    missing = [r for r in requires if r not in folded]
    if missing or name in folded:
        raise ValueError(
            f"loss scale {name!r} must run once, after {list(requires) or 'nothing'}; already applied: {folded}"
        )
    folded.append(name)


def _as_list(x: Any) -> list[Any]:
    tolist = getattr(x, "tolist", None)
    return list(tolist()) if callable(tolist) else list(x)


def _groups(batch: Mapping[str, Any]) -> list[list[list[int]]]:
    """Turn indices grouped by trajectory, then by agent (sub-trajectory), in first-seen order."""
    idx_to_traj = _as_list(batch["idx_to_traj"])
    idx_to_sub = _as_list(batch["extra:idx_to_sub_traj"])
    if len(idx_to_sub) != len(idx_to_traj):
        raise ValueError(
            f"extra:idx_to_sub_traj has {len(idx_to_sub)} entries but idx_to_traj has {len(idx_to_traj)}"
        )
    trajs: dict[Any, dict[Any, list[int]]] = {}
    for idx, traj in enumerate(idx_to_traj):
        trajs.setdefault(traj, {}).setdefault(idx_to_sub[idx], []).append(idx)
    return [list(subs.values()) for subs in trajs.values()]


def _scale_rows(values: Array, row_scales: list[float]) -> Array:
    """``values[i] * row_scales[i]`` for every row, as a new array (float scales cast to the array dtype)."""
    xp = namespace(values)
    if len(row_scales) != int(values.shape[0]):
        raise ValueError(f"loss_scales has {values.shape[0]} rows but the batch has {len(row_scales)} turns")
    s = xp.asarray(row_scales, dtype=values.dtype, device=array_api_compat.device(values))
    return values * xp.reshape(s, (-1,) + (1,) * (values.ndim - 1))


def group_scale(context: MutableMapping[str, Any], batch: Mapping[str, Any]) -> dict[str, Any]:
    """``"group_level"``: ``advantages *= len(idx_to_traj) * dp_world_size / actor_global_batch_size``.

    Must be the first scale. Returns a new batch dict with new ``advantages``.
    """
    _fold(context, "group_level", ())
    num_sequence = len(_as_list(batch["idx_to_traj"]))
    dp = context.get("data_parallel_world_size", 1)
    scale = num_sequence * dp / context["actor_global_batch_size"]
    return {**batch, "advantages": batch["advantages"] * scale}


def agent_scale(context: MutableMapping[str, Any], batch: Mapping[str, Any]) -> dict[str, Any]:
    """``"agent_level"``: each turn of agent ``a`` in trajectory ``i`` is scaled by ``1 / A_i / T_{i,a}``.

    ``A_i`` = number of agents in trajectory ``i``; ``T_{i,a}`` = that agent's number of turns. Requires
    ``group_level`` first. Returns a new batch dict with new ``loss_scales``.
    """
    _fold(context, "agent_level", ("group_level",))
    n = len(_as_list(batch["idx_to_traj"]))
    scales = [1.0] * n
    for agents in _groups(batch):
        for turns in agents:
            for idx in turns:
                scales[idx] = 1 / len(agents) / len(turns)
    return {**batch, "loss_scales": _scale_rows(batch["loss_scales"], scales)}


def turn_scale(context: MutableMapping[str, Any], batch: Mapping[str, Any]) -> dict[str, Any]:
    """``"turn_level"``: turn ``t`` of agent ``a`` is scaled by ``T_{i,a} · |o_t| / Σ_t |o_t|``.

    ``|o_t|`` = valid tokens of the turn (``response_mask`` row sum). Requires ``group_level`` and
    ``agent_level`` first. Returns a new batch dict with new ``loss_scales``.
    """
    _fold(context, "turn_level", ("group_level", "agent_level"))
    mask = batch["response_mask"]
    xp = namespace(mask)
    counts = _as_list(xp.sum(xp.astype(mask, xp.int64), axis=tuple(range(1, mask.ndim))))
    scales = [1.0] * len(counts)
    for agents in _groups(batch):
        for turns in agents:
            total = sum(counts[idx] for idx in turns)
            for idx in turns:
                scales[idx] = 1 * len(turns) * counts[idx] / total
    return {**batch, "loss_scales": _scale_rows(batch["loss_scales"], scales)}


LOSS_SCALE_FNS: Mapping[str, LossScaleFn] = MappingProxyType(
    {"group_level": group_scale, "agent_level": agent_scale, "turn_level": turn_scale}
)
"""The built-in loss scales by RLinf name (read-only)."""

loss_scale_registry: Registry[LossScaleFn] = Registry("loss scale", LOSS_SCALE_FNS)
"""Built-in plus user-registered loss scales."""


def register_loss_scale(name: str) -> Callable[[F], F]:
    """Decorator registering a loss scale ``fn(context, batch) -> batch`` under ``name`` (case-insensitive).

    Raises:
        ValueError: if ``name`` is taken by a different function.
    """
    register = loss_scale_registry.register(name)

    def decorator(fn: F) -> F:
        register(fn)
        return fn

    return decorator


def get_loss_scales(names: Sequence[str]) -> list[LossScaleFn]:
    """The loss-scale functions for ``names``, in order (case-insensitive; RLinf's lookup is case-sensitive).

    Raises:
        ValueError: naming an unknown scale and listing the valid names.
    """
    if isinstance(names, str):
        raise ValueError(f"get_loss_scales expects a list of names, got the string {names!r}")
    return [loss_scale_registry.get_fn(n) for n in names]
