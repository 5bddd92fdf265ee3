"""Array-namespace plumbing shared by every rlinf_algos function.

Every public function takes arrays from one namespace (numpy, torch, or any array-API library) and returns
arrays from the same namespace. Torch tensors keep autograd because `array_api_compat.torch` wraps torch ops.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

import array_api_compat

__all__ = ["Array", "as_float", "check_ndim", "check_same_shape", "namespace", "to_bool"]

Array: TypeAlias = Any
"""An array of any array-API namespace (``numpy.ndarray``, ``torch.Tensor``, ...)."""


def namespace(*arrays: Array | None) -> Any:
    """Return the array-API namespace shared by ``arrays`` (``None`` entries are skipped).

    Raises:
        TypeError: if no array is given or the arrays come from different libraries.
    """
    present = [a for a in arrays if a is not None and not isinstance(a, int | float | bool)]
    if not present:
        raise TypeError("expected at least one array argument, got only None/scalars")
    return array_api_compat.array_namespace(*present)


def to_bool(xp: Any, x: Array) -> Array:
    """``x`` as a boolean array (non-zero is True)."""
    if x.dtype == xp.bool:
        return x
    return x != 0


def as_float(xp: Any, x: Array, like: Array | None = None) -> Array:
    """``x`` cast to ``like``'s floating dtype (or float32 when ``x`` is not floating and no ``like``)."""
    if like is not None:
        target = like.dtype if xp.isdtype(like.dtype, "real floating") else xp.float32
    elif xp.isdtype(x.dtype, "real floating"):
        return x
    else:
        target = xp.float32
    return x if x.dtype == target else xp.astype(x, target)


def _shape(x: Array) -> tuple[int, ...]:
    return tuple(int(d) for d in x.shape)


def check_ndim(name: str, x: Array, ndims: int | Sequence[int], layout: str) -> None:
    """Raise ValueError naming ``name`` when ``x.ndim`` is not one of ``ndims``.

    Args:
        name: the argument name to quote in the message.
        x: the array to check.
        ndims: allowed number(s) of dimensions.
        layout: the expected layout in words, e.g. ``"[T, B]"``.
    """
    allowed = (ndims,) if isinstance(ndims, int) else tuple(ndims)
    if x.ndim not in allowed:
        raise ValueError(f"{name} must have layout {layout} (ndim in {allowed}), got shape {_shape(x)}")


def check_same_shape(**arrays: Array | None) -> None:
    """Raise ValueError naming every argument when the given (non-None) arrays differ in shape."""
    present = {k: _shape(v) for k, v in arrays.items() if v is not None}
    if len(set(present.values())) > 1:
        described = ", ".join(f"{k}{list(s)}" for k, s in present.items())
        raise ValueError(f"arguments must have the same shape, got {described}")
