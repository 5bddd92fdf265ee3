"""Loss aggregators: how a per-token (per-action) loss becomes one scalar (RLinf ``loss_agg_func``).

Every aggregator is called as ``agg(values, mask, third)``: the policy losses pass the embodied
``loss_mask_ratio`` (or ``None``) as the third positional argument, which the token/sequence aggregators
treat as their reduction axis (``None`` = default), exactly as RLinf does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, TypeAlias

from ._array import Array, as_float, namespace
from ._masked import masked_mean

__all__ = [
    "LOSS_AGG_FNS",
    "LossAggFn",
    "get_loss_agg_func",
    "masked_mean_ratio",
    "seq_mean_token_mean",
    "seq_mean_token_sum",
]

LossAggFn: TypeAlias = Callable[..., Array]
"""``agg(values, mask, third) -> scalar``; ``third`` is an axis or the embodied loss-mask ratio."""


def _ones_mask(xp: Any, values: Array) -> Array:
    return xp.ones_like(values)


def seq_mean_token_sum(values: Array, mask: Array | None = None, dim: int | None = -1) -> Array:
    """Mean over sequences of the masked per-sequence token SUM (``"seq-mean-token-sum"``).

    Args:
        values: ``[B, L]`` (or ``[..., L]``) per-token losses.
        mask: boolean/0-1 array broadcastable to ``values``; ``None`` keeps every token.
        dim: the token axis (``None`` means ``-1``; the losses pass ``None`` here positionally).

    Returns:
        ``mean_b(sum_t values * mask)`` as a 0-d array. Rows without valid tokens count as zero.
    """
    xp = namespace(values, mask)
    axis = -1 if dim is None else dim
    fmask = _ones_mask(xp, values) if mask is None else as_float(xp, mask, like=values)
    return xp.mean(xp.sum(values * fmask, axis=axis))


def seq_mean_token_mean(values: Array, mask: Array | None = None, dim: int | None = -1) -> Array:
    """Mean over sequences of the masked per-sequence token MEAN (``"seq-mean-token-mean"``).

    Args:
        values: ``[B, L]`` (or ``[..., L]``) per-token losses.
        mask: boolean/0-1 array broadcastable to ``values``; ``None`` keeps every token.
        dim: the token axis (``None`` means ``-1``).

    Returns:
        ``mean_b(sum_t values*mask / sum_t mask)``. A row with no valid token gives NaN (RLinf behaviour).
    """
    xp = namespace(values, mask)
    axis = -1 if dim is None else dim
    fmask = _ones_mask(xp, values) if mask is None else as_float(xp, mask, like=values)
    fmask = xp.broadcast_to(fmask, values.shape) if fmask.shape != values.shape else fmask
    return xp.mean(xp.sum(values * fmask, axis=axis) / xp.sum(fmask, axis=axis))


def masked_mean_ratio(values: Array, mask: Array | None, loss_mask_ratio: Array) -> Array:
    """Embodied aggregator: ``mean(values / loss_mask_ratio * mask)`` over the broadcast shape.

    ``loss_mask_ratio = loss_mask_sum / max_episode_steps`` is each trajectory's valid length as a
    fraction of the episode limit, so every valid step is weighted by ``max_episode_steps / len_traj`` and the
    mean runs over ALL broadcast elements (valid or not). A trajectory with ``loss_mask_sum == 0`` gives NaN
    (``x / 0 * 0``), as in RLinf.

    Args:
        values: ``[N, ...]`` per-step losses.
        mask: boolean/0-1 array broadcastable to ``values``; ``None`` keeps every entry.
        loss_mask_ratio: broadcastable to ``values``.

    Returns:
        The 0-d weighted mean.
    """
    xp = namespace(values, mask, loss_mask_ratio)
    scaled = values / loss_mask_ratio
    if mask is not None:
        scaled = scaled * as_float(xp, mask, like=values)
    return xp.mean(scaled)


LOSS_AGG_FNS: Mapping[str, LossAggFn] = MappingProxyType(
    {
        "token-mean": masked_mean,
        "seq-mean-token-sum": seq_mean_token_sum,
        "seq-mean-token-mean": seq_mean_token_mean,
    }
)
"""Built-in aggregators by their RLinf config name (``algorithm.loss_agg_func``)."""


def get_loss_agg_func(loss_agg: str) -> LossAggFn:
    """Return the aggregator named ``loss_agg`` (case-insensitive).

    Raises:
        ValueError: naming the unknown aggregator and listing the valid names.
    """
    fn = LOSS_AGG_FNS.get(loss_agg.lower()) if isinstance(loss_agg, str) else None
    if fn is None:
        raise ValueError(f"unknown loss_agg_func {loss_agg!r}; valid names: {', '.join(LOSS_AGG_FNS)}")
    return fn
