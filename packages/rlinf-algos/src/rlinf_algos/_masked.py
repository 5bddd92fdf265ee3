"""Masked reductions and normalisation shared by advantages and losses (RLinf 0.4 numerics)."""

from __future__ import annotations

from ._array import Array, as_float, namespace, to_bool

__all__ = ["masked_mean", "masked_sum", "safe_normalize"]


def masked_sum(values: Array, mask: Array | None = None, axis: int | tuple[int, ...] | None = None) -> Array:
    """Sum of ``values`` where ``mask`` is true.

    Args:
        values: any shape ``[...]``.
        mask: boolean (or 0/1) array broadcastable to ``values``; ``None`` sums everything.
        axis: axis or axes to reduce; ``None`` reduces all.

    Returns:
        The masked sum, reduced over ``axis``.
    """
    xp = namespace(values, mask)
    if mask is None:
        return xp.sum(values, axis=axis)
    return xp.sum(values * as_float(xp, mask, like=values), axis=axis)


def masked_mean(values: Array, mask: Array | None = None, axis: int | tuple[int, ...] | None = None) -> Array:
    """Mean of ``values`` over the entries where ``mask`` is true (RLinf ``masked_mean``).

    With no mask this is the plain mean. When the mask selects nothing the result is the masked sum, i.e.
    zero (not NaN), so a micro-batch of padding contributes a zero loss.

    Args:
        values: any shape ``[...]``.
        mask: boolean (or 0/1) array broadcastable to ``values``; ``None`` averages everything.
        axis: axis or axes to reduce; ``None`` reduces all.

    Returns:
        ``sum(values * mask, axis) / sum(mask, axis)``. The denominator counts mask entries, so a mask
        broadcast over a trailing axis is counted once per mask entry (RLinf behaviour).
    """
    xp = namespace(values, mask)
    if mask is None:
        return xp.mean(values, axis=axis)
    fmask = as_float(xp, mask, like=values)
    total = xp.sum(values * fmask, axis=axis)
    if not bool(xp.any(to_bool(xp, mask))):
        return total
    # The denominator counts MASK entries (RLinf): a [N, C, 1] mask over [N, C, D] values divides by N*C.
    return total / xp.sum(fmask, axis=axis)


def safe_normalize(values: Array, mask: Array | None = None, eps: float = 1e-5) -> Array:
    """Standardise ``values`` with the mean and unbiased std of the masked entries (RLinf ``safe_normalize``).

    The statistics come from the entries where ``mask`` is true; ALL entries are shifted and scaled (padding
    is not re-masked). When the mask selects nothing the input is returned unchanged.

    Args:
        values: any shape ``[...]``.
        mask: boolean array of the same shape, or ``None`` for global statistics.
        eps: added to the std.

    Returns:
        ``(values - mean) / (std + eps)``, same shape as ``values``.
    """
    xp = namespace(values, mask)
    if mask is None:
        selected = xp.reshape(values, (-1,))
    else:
        bmask = to_bool(xp, mask)
        if bmask.shape != values.shape:
            bmask = xp.broadcast_to(bmask, values.shape)
        selected = values[bmask]
    if selected.shape[0] == 0:
        return values
    return (values - xp.mean(selected)) / (xp.std(selected, correction=1) + eps)
