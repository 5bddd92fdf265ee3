"""Polyak (soft) target-network updates over arrays of any library, with a one-pass path for torch tensors."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

from .._array import Array
from ._losses import _shape

__all__ = ["soft_target_update"]


def soft_target_update(targets: Iterable[Array], sources: Iterable[Array], *, tau: float) -> None:
    """In-place Polyak update ``θ' ← (1 - τ) θ' + τ θ`` of every target array (RLinf ``soft_update_target_model``).

    Works on any mutable arrays, pair by pair:

    * torch tensors / ``nn.Parameter`` (anything with ``.data`` and ``mul_``/``add_``): updated through
      ``.data`` with ``mul_(1 - τ)`` then ``add_(θ · τ)`` exactly like RLinf, so no autograd graph is recorded
      and ``requires_grad`` leaves can be updated (the equivalent of ``torch.no_grad()``);
    * numpy and other array-API arrays that support item assignment: ``θ'[...] = (1 - τ) θ' + τ θ``.

    Immutable arrays (e.g. JAX) raise TypeError: compute ``(1 - τ) θ' + τ θ`` functionally instead.
    ``tau=1.0`` copies the sources (RLinf's initial sync and ``target_update_type: q_head_only`` for the
    non-head parameters). Typical call: ``soft_target_update(target.parameters(), model.parameters(), tau=0.005)``.

    Args:
        targets: target arrays, updated in place.
        sources: online arrays, one per target, same shapes (read only).
        tau: interpolation factor in ``[0, 1]``.

    Raises:
        ValueError: on a length mismatch, a shape mismatch (naming the pair index) or ``tau`` outside [0, 1].
        TypeError: when a target cannot be updated in place.
    """
    if not 0.0 <= tau <= 1.0:
        raise ValueError(f"tau must lie in [0, 1], got {tau!r}")
    target_list = list(targets)
    source_list = list(sources)
    if len(target_list) != len(source_list):
        raise ValueError(
            f"targets and sources must have the same length, got {len(target_list)} and {len(source_list)}"
        )
    for i, (t, s) in enumerate(zip(target_list, source_list, strict=True)):
        if _shape(t) != _shape(s):
            raise ValueError(
                f"targets[{i}] has shape {list(_shape(t))} but sources[{i}] has shape {list(_shape(s))}"
            )
    if _foreach_torch_update(target_list, source_list, tau):
        return
    for i, (t, s) in enumerate(zip(target_list, source_list, strict=True)):
        data = getattr(t, "data", None)
        if data is not None and hasattr(data, "mul_") and hasattr(data, "add_"):
            src = getattr(s, "data", s)
            if getattr(src, "dtype", data.dtype) != data.dtype and hasattr(src, "to"):
                src = src.to(data.dtype)  # e.g. a float32 shadow of bf16 online weights (RLinf DSRL)
            if tau == 1.0:
                data.copy_(src)
            else:
                data.mul_(1.0 - tau)
                data.add_(src * tau)
            continue
        try:
            t[...] = s if tau == 1.0 else (1.0 - tau) * t + tau * s
        except (TypeError, ValueError) as e:
            raise TypeError(
                f"targets[{i}] ({type(t).__name__}) cannot be updated in place; use (1 - tau) * target + tau * "
                "source for immutable arrays"
            ) from e


def _foreach_torch_update(targets: list[Any], sources: list[Any], tau: float) -> bool:
    """The update as one ``torch._foreach_*`` pass when every array is a plain torch tensor of one dtype and device.

    The same element-wise operations in the same order as the pair-by-pair path (``mul_(1 - τ)`` then
    ``add_(θ · τ)``), so the same bits, without a Python-level loop of kernel calls. Returns whether it applied
    (not to tensor subclasses such as FSDP2's sharded ``DTensor`` parameters, nor to mixed dtypes or devices).
    """
    torch: Any = sys.modules.get("torch")
    if torch is None or not targets:
        return False
    plain = (torch.Tensor, torch.nn.Parameter)
    first = targets[0]
    for x in (*targets, *sources):
        if type(x) not in plain or x.dtype != first.dtype or x.device != first.device:
            return False
    data = [t.detach() for t in targets]
    src = [s.detach() for s in sources]
    if tau == 1.0:
        torch._foreach_copy_(data, src)
    else:
        torch._foreach_mul_(data, 1.0 - tau)
        torch._foreach_add_(data, torch._foreach_mul(src, tau))
    return True
