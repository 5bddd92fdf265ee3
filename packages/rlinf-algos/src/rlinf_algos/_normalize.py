"""Masked normalisation, distributable sufficient statistics and critic explained variance (RLinf numerics).

Distributed training reduces the sufficient statistics, not the arrays: compute :func:`masked_stats` (or
:func:`compute_critic_explained_variance_stats`) per rank, all-reduce them with SUM (e.g.
``torch.distributed.all_reduce``), then finish with :func:`normalize_from_stats` /
:func:`masked_normalization` ``(stats=...)`` / :func:`compute_critic_explained_variance_from_stats`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import array_api_compat

from ._array import Array, namespace, to_bool

__all__ = [
    "CRITIC_EXPLAINED_VARIANCE_KEY",
    "CRITIC_EXPLAINED_VARIANCE_STAT_KEYS",
    "MaskedStats",
    "compute_critic_explained_variance_from_stats",
    "compute_critic_explained_variance_stats",
    "masked_normalization",
    "masked_stats",
    "normalize_from_stats",
]

_EV_PREFIX = "__sum__/_critic_explained_variance/"
CRITIC_EXPLAINED_VARIANCE_KEY = "critic/explained_variance"
"""The metric workers emit after reducing the statistics below."""
CRITIC_EXPLAINED_VARIANCE_STAT_KEYS = (
    f"{_EV_PREFIX}count",
    f"{_EV_PREFIX}returns_sum",
    f"{_EV_PREFIX}returns_sq_sum",
    f"{_EV_PREFIX}errors_sum",
    f"{_EV_PREFIX}errors_sq_sum",
)
"""Metric keys of the five explained-variance sufficient statistics (summed across ranks / micro-batches)."""


@dataclass(frozen=True)
class MaskedStats:
    """Sufficient statistics of the masked entries: ``count``, ``sum`` and ``sum_sq`` (same shapes).

    All three are additive across shards, so a SUM all-reduce of each gives the global statistics.
    """

    count: Array
    sum: Array
    sum_sq: Array

    @property
    def mean(self) -> Array:
        """``sum / count``."""
        return self.sum / self.count

    @property
    def var(self) -> Array:
        """Population (biased) variance ``E[x²] - E[x]²``."""
        mean = self.mean
        return self.sum_sq / self.count - mean * mean


def _axes(ndim: int, axis: int | tuple[int, ...] | None) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    return (axis,) if isinstance(axis, int) else tuple(axis)


def masked_stats(
    values: Array,
    mask: Array | None = None,
    *,
    axis: int | tuple[int, ...] | None = None,
    keepdims: bool = False,
    high_precision: bool = True,
) -> MaskedStats:
    """Count, sum and sum of squares of ``values`` where ``mask`` is true.

    Args:
        values: any shape ``[...]``.
        mask: boolean/0-1 array of ``values``'s shape (or broadcastable); ``None`` counts every entry.
        axis: axes to reduce (``None`` = all).
        keepdims: keep reduced axes as size 1 (for broadcasting back onto ``values``).
        high_precision: accumulate in float64 (RLinf default) instead of float32.

    Returns:
        :class:`MaskedStats` of arrays in the accumulation dtype.
    """
    xp = namespace(values, mask)
    dtype = xp.float64 if high_precision else xp.float32
    x = xp.astype(values, dtype)
    axes = _axes(x.ndim, axis)
    if mask is not None:
        m = xp.astype(mask, dtype)
        if m.shape != x.shape:
            m = xp.broadcast_to(m, x.shape)
        x = x * m
    total = xp.sum(x, axis=axes, keepdims=keepdims)
    if mask is None:
        n = math.prod(int(x.shape[a]) for a in axes)
        count = xp.full(total.shape, float(n), dtype=dtype, device=array_api_compat.device(x))
    else:
        count = xp.sum(m, axis=axes, keepdims=keepdims)
    return MaskedStats(count=count, sum=total, sum_sq=xp.sum(x * x, axis=axes, keepdims=keepdims))


def masked_normalization(
    values: Array,
    mask: Array | None = None,
    *,
    axis: int | tuple[int, ...] | None = None,
    unbiased: bool = False,
    eps: float = 1e-5,
    high_precision: bool = True,
    stats: MaskedStats | None = None,
) -> Array:
    """Standardise ``values`` with masked statistics (RLinf/AReaL ``masked_normalization``).

    ``x = values * mask``; ``mean = Σx / Σmask``; ``var = E[x²] - mean²`` (times ``n/(n-1)`` if
    ``unbiased``); returns ``(x - mean) / (sqrt(var) + eps)`` as float32. Masked entries become
    ``-mean / std`` (not re-masked). Pass globally reduced ``stats`` (from :func:`masked_stats` with
    ``keepdims=True``, summed across ranks) to reproduce RLinf's data-parallel all-reduce.

    Args:
        values: any shape ``[...]`` (e.g. advantages ``[B, L]``).
        mask: boolean/0-1 of the same shape, or ``None``.
        axis: axes of the statistics (``None`` = all).
        unbiased: Bessel-correct the variance.
        eps: added to the std.
        high_precision: compute in float64.
        stats: precomputed (e.g. all-reduced) statistics replacing the local ones.

    Returns:
        float32 array of ``values``'s shape.
    """
    xp = namespace(values, mask)
    dtype = xp.float64 if high_precision else xp.float32
    x = xp.astype(values, dtype)
    if mask is not None:
        x = x * xp.astype(mask, dtype)
    st = (
        stats
        if stats is not None
        else masked_stats(values, mask, axis=axis, keepdims=True, high_precision=high_precision)
    )
    count = xp.astype(st.count, dtype)
    mean = xp.astype(st.sum, dtype) / count
    var = xp.astype(st.sum_sq, dtype) / count - mean**2
    if unbiased:
        var = var * (count / (count - 1))
    return xp.astype((x - mean) / (xp.sqrt(var) + eps), xp.float32)


def normalize_from_stats(values: Array, stats: MaskedStats, *, eps: float = 1e-5) -> Array:
    """``(values - mean) * rsqrt(max(var_pop, 0) + eps)`` from (globally reduced) statistics.

    The embodied env-worker pipeline normalises advantages this way after summing :func:`masked_stats`
    across ranks. Computed in float64, returned in ``values``'s dtype.

    Args:
        values: any shape.
        stats: statistics broadcastable to ``values`` (``keepdims=True`` or 0-d).
        eps: added to the variance.

    Returns:
        Array of ``values``'s shape and dtype.
    """
    xp = namespace(values, stats.count)
    count = xp.astype(stats.count, xp.float64)
    mean = xp.astype(stats.sum, xp.float64) / count
    var = xp.astype(stats.sum_sq, xp.float64) / count - mean * mean
    var = xp.clip(var, min=0.0)
    out = (xp.astype(values, xp.float64) - mean) / xp.sqrt(var + eps)
    return xp.astype(out, values.dtype)


def _detach(x: Array) -> Array:
    detach = getattr(x, "detach", None)
    return detach() if callable(detach) else x


def compute_critic_explained_variance_stats(
    returns: Array, values: Array, loss_mask: Array | None = None
) -> dict[str, Array]:
    """Sufficient statistics of the critic's explained variance over the masked entries (detached, float32).

    Args:
        returns: ``[N, ...]`` value targets.
        values: same shape, predictions.
        loss_mask: boolean/0-1 broadcastable to ``returns``; ``None`` uses every entry.

    Returns:
        ``{key: 0-d float32}`` for the keys in :data:`CRITIC_EXPLAINED_VARIANCE_STAT_KEYS`: count, Σ returns,
        Σ returns², Σ errors, Σ errors² with ``errors = returns - values``.
    """
    xp = namespace(returns, values, loss_mask)
    r = xp.astype(_detach(returns), xp.float32)
    v = xp.astype(_detach(values), xp.float32)
    if loss_mask is not None:
        m = to_bool(xp, loss_mask)
        if m.shape != r.shape:
            m = xp.broadcast_to(m, r.shape)
        r, v = r[m], v[m]
    else:
        r, v = xp.reshape(r, (-1,)), xp.reshape(v, (-1,))
    err = r - v
    count_key, r_key, r2_key, e_key, e2_key = CRITIC_EXPLAINED_VARIANCE_STAT_KEYS
    return {
        count_key: xp.asarray(float(r.shape[0]), dtype=xp.float32, device=array_api_compat.device(r)),
        r_key: xp.sum(r),
        r2_key: xp.sum(r * r),
        e_key: xp.sum(err),
        e2_key: xp.sum(err * err),
    }


def compute_critic_explained_variance_from_stats(stats: Mapping[str, Any]) -> Any:
    """``1 - Var_pop(errors) / Var_pop(returns)`` from summed sufficient statistics.

    Args:
        stats: the five :data:`CRITIC_EXPLAINED_VARIANCE_STAT_KEYS` entries (arrays or floats), typically
            summed across micro-batches and ranks.

    Returns:
        A 0-d float32 array (in the namespace of the first array value), or a Python float when every value
        is a number. NaN when a statistic is not finite, ``count < 2`` or the returns have zero variance.

    Raises:
        KeyError: naming a missing statistic.
    """
    missing = [k for k in CRITIC_EXPLAINED_VARIANCE_STAT_KEYS if k not in stats]
    if missing:
        raise KeyError(
            f"missing explained-variance statistics {missing}; expected {CRITIC_EXPLAINED_VARIANCE_STAT_KEYS}"
        )
    values = [stats[k] for k in CRITIC_EXPLAINED_VARIANCE_STAT_KEYS]
    arrays = [v for v in values if not isinstance(v, int | float)]
    if not arrays:
        return _explained_variance(*(float(v) for v in values), isfinite=math.isfinite)
    xp = namespace(*arrays)
    dev = array_api_compat.device(arrays[0])
    # RLinf finishes in float32 on the device of the statistics.
    as32 = [xp.asarray(float(v), dtype=xp.float32, device=dev) for v in values]
    return _explained_variance(*as32, isfinite=lambda a: bool(xp.isfinite(a)))


def _explained_variance(count: Any, r_sum: Any, r_sq: Any, e_sum: Any, e_sq: Any, *, isfinite: Any) -> Any:
    nan = count * float("nan")
    if not all(isfinite(v) for v in (count, r_sum, r_sq, e_sum, e_sq)) or count < 2:
        return nan
    r_centered = r_sq - r_sum * r_sum / count
    if not isfinite(r_centered) or r_centered == 0:
        return nan
    e_centered = e_sq - e_sum * e_sum / count
    if not isfinite(e_centered):
        return nan
    return 1 - e_centered / r_centered
