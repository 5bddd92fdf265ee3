"""Embodied (chunked-action) layouts around the advantage functions (RLinf ``algorithms/utils.py``).

An embodied rollout stores one row per chunk step: ``rewards [T, E, C]`` (T chunk steps, E environments x
rollout epochs, C actions per chunk), ``dones [T+1, E, C]`` (row 0 = state before the first step) and
``prev_values [T+1, E, 1]``. The advantage functions work on a flat time axis of ``n_steps = T * C`` steps
(step index ``t * C + k``); these helpers convert between the two layouts and build the masks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import array_api_compat

from ._advantages import check_group_size, scan_block
from ._array import Array, as_float, check_ndim, namespace, to_bool

__all__ = [
    "EmbodiedAdvantageInputs",
    "calculate_scores",
    "compute_loss_mask",
    "filter_rewards",
    "postprocess_embodied_advantages_outputs",
    "preprocess_embodied_advantages_inputs",
]


def _shape(x: Array) -> list[int]:
    return [int(d) for d in x.shape]


def _flatten_time(xp: Any, x: Array, rows: int, batch: int) -> Array:
    """``[N, E, c] -> [N*c, E]`` time-major (``x.transpose(1, 2).reshape(N*c, E)``)."""
    return xp.reshape(xp.permute_dims(x, (0, 2, 1)), (rows, batch))


@dataclass(frozen=True)
class EmbodiedAdvantageInputs:
    """Embodied batch flattened to the time-major layout the advantage functions take.

    Attributes:
        rewards: ``[n_steps, E]``.
        dones: ``[n_steps+1, E]`` bool; ``dones[s+1]`` closes step ``s``.
        values: ``[n_steps+1, E]`` or ``None``.
        loss_mask: ``[n_steps, E]`` bool or ``None``.
        loss_mask_sum: the input ``loss_mask_sum`` (chunk-reduced for ``chunk_level``), not reshaped.
        num_chunk: ``T``, the number of chunk steps.
        batch_size: ``E``.
        chunk_size: ``C`` (1 for ``reward_type="chunk_level"``).
        n_steps: ``T * chunk_size``.
    """

    rewards: Array
    dones: Array
    values: Array | None
    loss_mask: Array | None
    loss_mask_sum: Array | None
    num_chunk: int
    batch_size: int
    chunk_size: int
    n_steps: int


def preprocess_embodied_advantages_inputs(
    rewards: Array,
    dones: Array,
    values: Array | None = None,
    loss_mask: Array | None = None,
    loss_mask_sum: Array | None = None,
    *,
    reward_type: str,
) -> EmbodiedAdvantageInputs:
    """Flatten chunked embodied tensors to ``[n_steps, E]`` (RLinf ``preprocess_embodied_advantages_inputs``).

    For ``reward_type="chunk_level"`` each chunk is first reduced to one step: rewards summed, dones /
    loss_mask / loss_mask_sum max-reduced over the chunk axis. Any other ``reward_type`` keeps ``C`` steps
    per chunk. ``dones`` keep their LAST ``n_steps + 1`` flattened rows and ``values`` their FIRST
    ``n_steps + 1`` rows (RLinf), so the bootstrap value is ``V[T, k=0]``.

    Args:
        rewards: ``[T, E, C]``.
        dones: ``[T+1, E, C]`` bool (any last size for ``chunk_level``).
        values: ``[T+1, E, chunk_size]`` (``chunk_size`` = 1 for ``chunk_level``, else ``C``), or ``None``.
            Only GAE uses values; pass ``None`` for the other estimators.
        loss_mask: ``[T, E, C]`` bool (``[T, E, 1]`` allowed for ``chunk_level``), or ``None``.
        loss_mask_sum: ``[T, E, C]`` or ``[T, E, 1]`` valid-step counts, or ``None``; passed through.
        reward_type: ``"chunk_level"``, ``"action_level"``, ... (only ``"chunk_level"`` changes anything).

    Returns:
        The flattened inputs plus ``num_chunk``, ``batch_size``, ``chunk_size``, ``n_steps``.

    Raises:
        ValueError: naming the argument and both shapes when a layout does not fit ``rewards``.
    """
    xp = namespace(rewards, dones, values, loss_mask, loss_mask_sum)
    check_ndim("rewards", rewards, 3, "[T, E, C]")
    check_ndim("dones", dones, 3, "[T+1, E, C]")
    num_chunk, batch, n_act = _shape(rewards)
    chunk_level = reward_type == "chunk_level"
    if _shape(dones)[:2] != [num_chunk + 1, batch] or (not chunk_level and _shape(dones)[2] != n_act):
        raise ValueError(
            f"dones must have layout [T+1, E, C] = {[num_chunk + 1, batch, n_act]} for rewards of shape "
            f"{_shape(rewards)}, got shape {_shape(dones)}"
        )
    for name, arr in (("loss_mask", loss_mask), ("loss_mask_sum", loss_mask_sum)):
        if arr is None:
            continue
        allowed_last = (n_act, 1) if chunk_level else (n_act,)
        if arr.ndim != 3 or _shape(arr)[:2] != [num_chunk, batch] or _shape(arr)[2] not in allowed_last:
            raise ValueError(
                f"{name} must have layout [T, E, C] = {[num_chunk, batch, n_act]}"
                f"{' (or [T, E, 1])' if chunk_level else ''} like rewards {_shape(rewards)} "
                f"for reward_type={reward_type!r}, got shape {_shape(arr)}"
            )
    if chunk_level:
        rewards = xp.sum(rewards, axis=-1, keepdims=True)
        dones = xp.any(to_bool(xp, dones), axis=-1, keepdims=True)
        if loss_mask is not None:
            loss_mask = xp.any(to_bool(xp, loss_mask), axis=-1, keepdims=True)
        if loss_mask_sum is not None:
            loss_mask_sum = xp.max(loss_mask_sum, axis=-1, keepdims=True)
    chunk_size = int(rewards.shape[-1])
    n_steps = num_chunk * chunk_size

    flat_rewards = _flatten_time(xp, rewards, n_steps, batch)
    flat_mask = None if loss_mask is None else _flatten_time(xp, loss_mask, n_steps, batch)
    flat_dones = _flatten_time(xp, to_bool(xp, dones), (num_chunk + 1) * chunk_size, batch)[
        -(n_steps + 1) :, ...
    ]
    flat_values = None
    if values is not None:
        if _shape(values) != [num_chunk + 1, batch, chunk_size]:
            raise ValueError(
                f"values must have layout [T+1, E, chunk_size] = {[num_chunk + 1, batch, chunk_size]} for rewards "
                f"of shape {_shape(rewards)} and reward_type={reward_type!r}, got shape {_shape(values)}"
            )
        flat_values = _flatten_time(xp, values, (num_chunk + 1) * chunk_size, batch)[: n_steps + 1, ...]
    return EmbodiedAdvantageInputs(
        rewards=flat_rewards,
        dones=flat_dones,
        values=flat_values,
        loss_mask=flat_mask,
        loss_mask_sum=loss_mask_sum,
        num_chunk=num_chunk,
        batch_size=batch,
        chunk_size=chunk_size,
        n_steps=n_steps,
    )


def calculate_scores(rewards: Array, dones: Array, *, group_size: int) -> Array:
    """Undiscounted return of each environment's FIRST episode segment, grouped (RLinf ``calculate_scores``).

    ``s = 0; for t in reversed(range(n_steps)): s = s * (1 - done[t+1]) + r[t]``; the accumulator is reset
    at every done, so what is left at ``t = 0`` covers steps up to and including the first done. Computed in
    float32, as RLinf does.

    Args:
        rewards: ``[n_steps, E]``.
        dones: ``[n_steps+1, E]`` bool.
        group_size: environments per group (``E`` must be divisible by it).

    Returns:
        ``[E / group_size, group_size]`` float32 scores.
    """
    xp = namespace(rewards, dones)
    check_ndim("rewards", rewards, 2, "[n_steps, E]")
    n_steps, batch = _shape(rewards)
    if _shape(dones) != [n_steps + 1, batch]:
        raise ValueError(
            f"dones must have layout [n_steps+1, E] = {[n_steps + 1, batch]} for rewards of shape "
            f"{_shape(rewards)}, got shape {_shape(dones)}"
        )
    group_size = check_group_size(group_size, batch, "the environment axis E of rewards")
    r32 = rewards if rewards.dtype == xp.float32 else xp.astype(rewards, xp.float32)
    not_done = as_float(xp, ~to_bool(xp, dones[1:, ...]), like=r32)
    scores = (
        scan_block(xp, r32, not_done, keep_all=False)[1]
        if n_steps > 0
        else xp.zeros((batch,), dtype=xp.float32, device=array_api_compat.device(r32))
    )
    return xp.reshape(scores, (-1, group_size))


def postprocess_embodied_advantages_outputs(
    advantages: Array,
    *,
    num_chunk: int,
    chunk_size: int,
    returns: Array | None = None,
) -> tuple[Array, Array | None]:
    """Unflatten ``[n_steps, E]`` back to ``[T, E, chunk_size]`` (RLinf ``postprocess_embodied_advantages_outputs``).

    Args:
        advantages: ``[n_steps, E]`` with ``n_steps = num_chunk * chunk_size``.
        num_chunk: ``T``.
        chunk_size: actions per chunk step in the flattened layout.
        returns: ``[n_steps, E]`` or ``None``.

    Returns:
        ``(advantages [T, E, chunk_size], returns [T, E, chunk_size] | None)``.
    """
    xp = namespace(advantages, returns)

    def unflatten(name: str, x: Array) -> Array:
        if x.ndim < 1 or int(x.shape[0]) != num_chunk * chunk_size:
            raise ValueError(
                f"{name} must have layout [n_steps, E] with n_steps = num_chunk * chunk_size = "
                f"{num_chunk * chunk_size}, got shape {_shape(x)}"
            )
        return xp.permute_dims(xp.reshape(x, (num_chunk, chunk_size, -1)), (0, 2, 1))

    return unflatten("advantages", advantages), None if returns is None else unflatten("returns", returns)


def compute_loss_mask(dones: Array) -> tuple[Array, Array]:
    """Valid-step mask for rollouts without auto-reset (RLinf ``compute_loss_mask``).

    A step is valid until and including the step whose done flag is raised; everything after the first
    done of an environment is masked out.

    Args:
        dones: ``[T+1, E, C]`` bool (row 0 = state before the first step).

    Returns:
        ``(loss_mask [T, E, C] bool, loss_mask_sum [T, E, C] int)``; ``loss_mask_sum`` is the number of
        valid steps of each environment, broadcast to every position.
    """
    xp = namespace(dones)
    check_ndim("dones", dones, 3, "[T+1, E, C]")
    rows, batch, n_act = _shape(dones)
    if rows < 1:
        raise ValueError(f"dones must have at least one row (layout [T+1, E, C]), got shape {_shape(dones)}")
    num_chunk = rows - 1
    n_steps = num_chunk * n_act
    flat = _flatten_time(xp, to_bool(xp, dones), rows * n_act, batch)[-(n_steps + 1) :, ...]
    seen_done = xp.cumulative_sum(xp.astype(flat, xp.int64), axis=0)
    flat_mask = (seen_done == 0)[:-1, ...]
    loss_mask = xp.permute_dims(xp.reshape(flat_mask, (num_chunk, n_act, batch)), (0, 2, 1))
    per_env = xp.sum(xp.astype(loss_mask, xp.int64), axis=(0, 2), keepdims=True)
    return loss_mask, xp.broadcast_to(per_env, tuple(_shape(loss_mask)))


def filter_rewards(
    rewards: Array,
    loss_mask: Array | None,
    *,
    group_size: int,
    rewards_lower_bound: float,
    rewards_upper_bound: float,
) -> Array:
    """DAPO-like group filter of the embodied actor (RLinf ``algorithm.filter_rewards``).

    Each environment's return is the sum of its (masked) rewards over all steps; a group of ``group_size``
    consecutive environments is kept when the mean return of its members lies in
    ``[rewards_lower_bound, rewards_upper_bound]``. Dropped groups get ``False`` at every step.

    Args:
        rewards: ``[T, E, C]``.
        loss_mask: ``[T, E, C]`` or ``[T, E, 1]`` bool, or ``None``.
        group_size: environments per group.
        rewards_lower_bound: smallest kept group-mean return.
        rewards_upper_bound: largest kept group-mean return.

    Returns:
        The new loss mask: ``[T, E, 1]`` group mask AND-ed with ``loss_mask`` (broadcast shape).
    """
    xp = namespace(rewards, loss_mask)
    check_ndim("rewards", rewards, 3, "[T, E, C]")
    num_chunk, batch, _ = _shape(rewards)
    group_size = check_group_size(group_size, batch, "the environment axis E of rewards")
    if loss_mask is not None:
        check_ndim("loss_mask", loss_mask, 3, "[T, E, C]")
        if _shape(loss_mask)[:2] != [num_chunk, batch] or _shape(loss_mask)[2] not in (1, _shape(rewards)[2]):
            raise ValueError(
                f"loss_mask must have layout [T, E, C] or [T, E, 1] matching rewards {_shape(rewards)}, "
                f"got shape {_shape(loss_mask)}"
            )
        rewards = rewards * as_float(xp, loss_mask, like=rewards)
    per_env = xp.sum(xp.reshape(xp.permute_dims(rewards, (1, 0, 2)), (batch, -1)), axis=-1)
    group_mean = xp.mean(xp.reshape(per_env, (-1, group_size)), axis=1)
    keep = (group_mean >= rewards_lower_bound) & (group_mean <= rewards_upper_bound)
    keep_env = xp.reshape(xp.broadcast_to(keep[:, None], (batch // group_size, group_size)), (batch,))
    keep_steps = xp.broadcast_to(keep_env[None, :, None], (num_chunk, batch, 1))
    if loss_mask is None:
        return keep_steps
    return keep_steps & to_bool(xp, loss_mask)
